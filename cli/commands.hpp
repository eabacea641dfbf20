#pragma once

// Subcommands of the flash_attention program. Each adds itself to the app and, when
// chosen, sets `action` to the work it does; the action returns the exit code.

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <string>

namespace flash_attention::cli {

using Action = std::function<int()>;

// Bad command-line input found after parsing (a config that does not parse, options
// that contradict each other): exit code 2 with a one-line message.
class UsageError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Exit codes: 0 success, 1 runtime failure (no GPU, CUDA error, failed check),
// 2 bad arguments, 130 interrupted by Ctrl-C (128 + SIGINT, as shells report it).
inline constexpr int exit_ok = 0;
inline constexpr int exit_failure = 1;
inline constexpr int exit_usage = 2;
inline constexpr int exit_interrupted = 130;

void add_list_command(CLI::App& app, Action& action);
void add_run_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);
void add_tune_command(CLI::App& app, Action& action);
void add_progression_command(CLI::App& app, Action& action);
void add_choose_command(CLI::App& app, Action& action);

}  // namespace flash_attention::cli
