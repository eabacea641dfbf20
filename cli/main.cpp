// flash_attention: list, run (and benchmark) the library's attention kernels.

#include <iostream>

#include "commands.hpp"
#include "flash_attention/error.hpp"

namespace fa = flash_attention;

namespace {

bool is_bad_argument(fa::ErrorCode code) {
    return code == fa::ErrorCode::invalid_argument || code == fa::ErrorCode::dtype ||
           code == fa::ErrorCode::unsupported || code == fa::ErrorCode::not_built;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "FlashAttention forward kernels: list the compiled configs, run and benchmark them on a "
        "GPU."};
    app.name("flash_attention");
    app.require_subcommand(1);
    fa::cli::Action action;
    fa::cli::add_list_command(app, action);
    fa::cli::add_run_command(app, action);
    fa::cli::add_bench_command(app, action);

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "flash_attention: " << e.what() << " (see flash_attention --help)\n";
        return fa::cli::exit_usage;
    }

    try {
        return action();
    } catch (const fa::cli::UsageError& e) {
        std::cerr << "flash_attention: " << e.what() << "\n";
        return fa::cli::exit_usage;
    } catch (const fa::Error& e) {
        std::cerr << "flash_attention: " << e.what() << "\n";
        return is_bad_argument(e.code()) ? fa::cli::exit_usage : fa::cli::exit_failure;
    } catch (const std::exception& e) {
        std::cerr << "flash_attention: " << e.what() << "\n";
        return fa::cli::exit_failure;
    }
}
