#include "app.hpp"

#include <algorithm>
#include <iostream>

#include "commands.hpp"
#include "flash_attention/error.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"

namespace flash_attention::cli {

namespace {

// A message as one line: the places that build messages escape the text they quote, and
// this catches any that did not (CLI11's own quote values as given).
std::string one_line(std::string_view message) {
    return tools::printable(message, std::string_view::npos);
}

bool is_bad_argument(ErrorCode code) {
    return code == ErrorCode::invalid_argument || code == ErrorCode::dtype ||
           code == ErrorCode::unsupported || code == ErrorCode::not_built;
}

}  // namespace

int run_cli(int argc, char** argv) {
    CLI::App app{
        "FlashAttention forward kernels: list the compiled configs; run, benchmark and tune them "
        "on a GPU."};
    app.name("flash_attention");
    app.set_version_flag("--version", "flash_attention " + std::string(version()));
    app.require_subcommand(1);
    Action action;
    add_list_command(app, action);
    add_run_command(app, action);
    add_bench_command(app, action);
    add_tune_command(app, action);
    add_progression_command(app, action);
    add_choose_command(app, action);

    // CLI11 would only say "A subcommand is required" for a misspelt one.
    if (argc > 1 && argv[1][0] != '-') {
        const std::string name = argv[1];
        const auto commands = app.get_subcommands({});
        if (std::none_of(commands.begin(), commands.end(),
                         [&](const CLI::App* c) { return c->get_name() == name; })) {
            std::cerr << "flash_attention: unknown command \"" << tools::printable(name, 40)
                      << "\" (expected list, choose, run, bench, tune or progression)\n";
            return exit_usage;
        }
    }

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        // CLI11's messages quote the values given as they are.
        std::cerr << "flash_attention: " << one_line(e.what()) << " (see flash_attention --help)\n";
        return exit_usage;
    }

    try {
        return action();
    } catch (const UsageError& e) {
        std::cerr << "flash_attention: " << one_line(e.what()) << "\n";
        return exit_usage;
    } catch (const Error& e) {
        std::cerr << "flash_attention: " << one_line(e.what()) << "\n";
        return is_bad_argument(e.code()) ? exit_usage : exit_failure;
    } catch (const std::exception& e) {
        std::cerr << "flash_attention: " << one_line(e.what()) << "\n";
        return exit_failure;
    }
}

}  // namespace flash_attention::cli
