#pragma once

namespace flash_attention::cli {

// The flash_attention program: parses the command line, runs the subcommand and
// returns the exit code (0 ok, 1 runtime failure, 2 bad arguments).
int run_cli(int argc, char** argv);

}  // namespace flash_attention::cli
