#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "options.hpp"

namespace flash_attention::cli {

namespace {

struct ListOptions {
    std::string set;
    bool verbose = false;
};

int list(const ListOptions& options) {
    const std::vector<KernelConfig> listed =
        options.set.empty() ? configs() : tools::kernel_set(options.set);
    // CTAs/SM: the occupancy calculator when a GPU is here, else shared memory and
    // threads on the family's smallest target, an A100 or an H100 (registers are only
    // known on the device).
    const bool gpu = device_count() > 0;
    std::cerr << "# " << listed.size() << " configs ("
              << (options.set.empty()
                      ? "built, kernel set \"" + std::string(tools::built_kernel_set()) + "\""
                      : "set \"" + options.set + "\"")
              << "); CTAs/SM "
              << (gpu ? "from the occupancy calculator on " +
                            DeviceProperties::current().description()
                      : std::string("from shared memory and threads on an A100 (sm90: an H100; "
                                    "no GPU)"))
              << "\n";
    for (const KernelConfig& c : listed) {
        const tools::KernelInfo info = tools::kernel_info(c);
        std::printf("%s  smem=%zu  ctas_per_sm=%d", c.to_string().c_str(), info.smem_bytes,
                    info.ctas_per_sm);
        if (!info.built)
            std::printf("  (not built)");
        if (options.verbose && info.registers_per_thread >= 0) {
            std::printf("  registers=%d  local_bytes=%d", info.registers_per_thread,
                        info.local_bytes_per_thread);
        }
        std::printf("\n");
    }
    return exit_ok;
}

}  // namespace

void add_list_command(CLI::App& app, Action& action) {
    auto options = std::make_shared<ListOptions>();
    CLI::App* cmd =
        app.add_subcommand("list", "List kernel configs: the built ones, or a named set");
    std::string names;
    for (const std::string_view name : tools::kernel_set_names())
        names += std::string(name) + ", ";
    cmd->add_option("--set", options->set,
                    "named set to list instead of the built configs (" + names +
                        "or a comma-separated union)")
        ->check(non_empty("a set name"))
        ->check(set_name_validator());
    cmd->add_flag("--verbose", options->verbose, "also show registers and local memory per thread");
    cmd->callback([options, &action] { action = [options] { return list(*options); }; });
}

}  // namespace flash_attention::cli
