#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>

#include "commands.hpp"
#include "flash_attention/flash_attention.hpp"
#include "registry/registry.hpp"
#include "report.hpp"
#include "sweep.hpp"
#include "tuning/tuning_cache.hpp"

namespace flash_attention::cli {

namespace {

struct TuneOptions {
    std::string set = "tune";
    std::vector<std::string> configs;
    GridOptions grid;
    TimingOptions timing;
    std::string cache;
    std::string format = "table";
};

std::string utc_now() {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return text;
}

// The winner and runner-up of every (dtype, d_head, seq) that was measured.
std::vector<tuning::Entry> winners(const std::vector<Measurement>& measured,
                                   const DeviceProperties& device) {
    std::map<tuning::Key, std::vector<const Measurement*>> by_key;
    for (const Measurement& m : measured)
        by_key[tuning::Key::of(device, m.shape.problem())].push_back(&m);
    std::vector<tuning::Entry> entries;
    const std::string now = utc_now();
    for (auto& [key, list] : by_key) {
        std::sort(list.begin(), list.end(),
                  [](auto* a, auto* b) { return a->tflops() > b->tflops(); });
        tuning::Entry e{key, list[0]->config, list[0]->tflops(), std::nullopt, 0, now};
        if (list.size() > 1) {
            e.runner_up = list[1]->config;
            e.runner_up_tflops = list[1]->tflops();
        }
        entries.push_back(e);
    }
    return entries;
}

int tune(const TuneOptions& o) {
    std::vector<Candidate> candidates;
    if (o.configs.empty()) {
        candidates = built_configs_of(o.set, "--set");
    } else {
        for (const std::string& s : o.configs)
            candidates.push_back(built_config(s, "--config"));
    }
    const std::vector<Job> jobs = plan(candidates, o.grid);
    const auto default_path = tuning::default_path();
    if (o.cache.empty() && !default_path) {
        throw UsageError(
            "--cache: expected a file (no FLASH_ATTENTION_TUNING, XDG_CACHE_HOME or HOME to put "
            "the default one under), got none");
    }
    const std::filesystem::path path =
        o.cache.empty() ? *default_path : std::filesystem::path(o.cache);
    // Before an hour of tuning: a cache that cannot be written, or a corrupt one.
    try {
        tuning::check_writable(path);
    } catch (const Error& e) {
        throw UsageError(std::string("--cache: ") + e.what());
    }
    if (!gpu_available())
        return exit_failure;
    for (const std::string& w : tuning::load(path).warnings)
        std::cerr << "flash_attention: warning: " << w << "\n";

    const SweepResult result = sweep(candidates, jobs, o.timing);
    const std::string device = DeviceProperties::current().description();
    if (o.format != "none")
        std::cout << format_report(result.measurements, o.format, device);
    if (result.interrupted) {
        std::cerr << "flash_attention: tuning cache " << path.string() << " left untouched\n";
        return result.exit_code();
    }

    const auto entries = winners(result.measurements, DeviceProperties::current());
    std::printf("\n%-48s %8s %9s  %s\n", "key", "TFLOP/s", "margin", "winner");
    for (const tuning::Entry& e : entries) {
        char margin[16] = "-";
        if (e.runner_up)
            std::snprintf(margin, sizeof margin, "+%.1f%%",
                          100 * (e.tflops / e.runner_up_tflops - 1));
        std::printf("%-48s %8.1f %9s  %s\n", e.key.to_string().c_str(), e.tflops, margin,
                    e.config.to_string().c_str());
    }
    for (const std::string& w : tuning::update(path, entries))
        std::cerr << "flash_attention: warning: " << w << "\n";
    reload_tuning_cache();
    std::printf("wrote %zu entries to %s\n", entries.size(), path.string().c_str());
    return exit_ok;
}

}  // namespace

void add_tune_command(CLI::App& app, Action& action) {
    auto o = std::make_shared<TuneOptions>();
    CLI::App* cmd = app.add_subcommand(
        "tune",
        "Find the fastest built config per (dtype, d_head, sequence length) and record it "
        "in the tuning cache that the automatic choice reads");
    cmd->add_option("--set", o->set, "configs to try: the built ones of this set")
        ->check(set_name_validator())
        ->capture_default_str();
    cmd->add_option("--config", o->configs, "try only these configs (repeatable)");
    o->grid.add_to(*cmd);
    o->timing.add_to(*cmd);
    cmd->add_option("--cache", o->cache,
                    "tuning cache to update (default: $FLASH_ATTENTION_TUNING, else "
                    "~/.cache/flash_attention/tuning.json)");
    add_format_option(*cmd, o->format, {"table", "csv", "json", "none"},
                      "how to print every measurement");
    cmd->callback([o, &action] { action = [o] { return tune(*o); }; });
}

}  // namespace flash_attention::cli
