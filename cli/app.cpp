#include "app.hpp"

#include <algorithm>
#include <iostream>

#include "commands.hpp"
#include "flash_attention/error.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "options.hpp"

namespace flash_attention::cli {

namespace {

// A message as one line: the places that build messages escape the text they quote, and
// this catches any that did not (CLI11's own quote values as given).
std::string one_line(std::string_view message) {
    // Cut too: CLI11's messages quote a whole value (a 100 kB --device in its membership error).
    return tools::printable(message, 1000);
}

// The flag (--causal) of CLI11's refusal of a value given to one (disable_flag_override:
// "causal was given a disallowed flag override"), else empty.
std::string flag_given_a_value(std::string_view message) {
    constexpr std::string_view refusal = " was given a disallowed flag override";
    if (!message.ends_with(refusal))
        return {};
    return "--" + std::string(message.substr(0, message.size() - refusal.size()));
}

// The value of the last `FLAG=VALUE` among the arguments.
std::string value_given(int argc, char** argv, const std::string& flag) {
    std::string value;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.starts_with(flag) && arg.size() > flag.size() && arg[flag.size()] == '=')
            value = arg.substr(flag.size() + 1);
    }
    return value;
}

// The commands, as messages list them.
constexpr const char* k_commands = "list, choose, run, bench, tune or progression";

// The options the program itself takes, before a command.
bool is_top_level_option(std::string_view arg) {
    return arg == "-h" || arg == "--help" || arg == "--version";
}

}  // namespace

int run_cli(int argc, char** argv) {
    CLI::App app{
        "FlashAttention kernels, forward and backward: list the compiled configs; run, benchmark "
        "and tune them on a GPU."};
    app.name("flash_attention");
    app.set_version_flag("--version", "flash_attention " + std::string(version()));
    app.require_subcommand(1);
    // A flag takes no value: `--causal=no` would set it (CLI11 reads a flag's value as a count
    // or a boolean), and a value that reads as false would unset it silently. Subcommands
    // copy the defaults when created.
    app.option_defaults()->disable_flag_override();
    Action action;
    add_list_command(app, action);
    add_run_command(app, action);
    add_bench_command(app, action);
    add_tune_command(app, action);
    add_progression_command(app, action);
    add_choose_command(app, action);

    // CLI11 would only say "A subcommand is required" for a misspelt one, or for an option
    // given before any command (`flash_attention -x`).
    if (argc > 1 && argv[1][0] == '-' && !is_top_level_option(argv[1])) {
        std::cerr << "flash_attention: unknown option \"" << tools::printable(argv[1], 40)
                  << "\" before the command (expected " << k_commands
                  << ", or --help, --version)\n";
        return exit_usage;
    }
    if (argc > 1 && argv[1][0] != '-') {
        const std::string name = argv[1];
        const auto commands = app.get_subcommands({});
        if (std::none_of(commands.begin(), commands.end(),
                         [&](const CLI::App* c) { return c->get_name() == name; })) {
            std::cerr << "flash_attention: unknown command \"" << tools::printable(name, 40)
                      << "\" (expected " << k_commands << ")\n";
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
        if (const std::string flag = flag_given_a_value(e.what()); !flag.empty()) {
            std::cerr << "flash_attention: " << flag << ": expected no value (a flag), got \""
                      << tools::printable(value_given(argc, argv, flag), 40) << "\"\n";
            return exit_usage;
        }
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
