#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>

#include "commands.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "options.hpp"
#include "report.hpp"
#include "sweep.hpp"

namespace flash_attention::cli {

namespace {

struct TuneOptions {
    static constexpr const char* default_splits = "1,2,4,8,16,32,64,128";
    std::string set = "tune";
    bool set_given = false;
    bool splits_given = false;
    std::vector<std::string> configs;
    std::string splits = default_splits;
    GridOptions grid;  // grid.backward: tune the backward pass
    bool deterministic = false;
    TimingOptions timing;
    std::string cache;
    int lock_timeout_s = 60;
    std::string format = "table";
};

std::string utc_now() {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return text;
}

// The winner and runner-up of every key that was measured: configs of forward()'s
// problems, split counts of the serving entry points' (Key::of_splits), backward configs of
// backward()'s (Key::of_backward, the deterministic kernels' keys when only they ran).
std::vector<tuning::Entry> winners(const SweepResult& result,
                                   const std::vector<Candidate>& candidates,
                                   const DeviceProperties& device, bool deterministic) {
    struct Run {
        const Measurement* m;
        const Candidate* c;
    };
    std::map<tuning::Key, std::vector<Run>> by_key;
    for (std::size_t i = 0; i < result.measurements.size(); ++i) {
        const Measurement& m = result.measurements[i];
        const ProblemShape problem = m.shape.problem();
        const tuning::Key key =
            m.shape.backward ? tuning::Key::of_backward(device, problem, deterministic)
            : m.shape.api == Api::dense
                ? tuning::Key::of(device, problem)
                : tuning::Key::of_splits(device, problem, m.shape.page_size > 0);
        by_key[key].push_back({&m, &candidates[result.candidate_of[i]]});
    }
    std::vector<tuning::Entry> entries;
    const std::string now = utc_now();
    for (auto& [key, list] : by_key) {
        std::sort(list.begin(), list.end(),
                  [](const Run& a, const Run& b) { return a.m->tflops() > b.m->tflops(); });
        tuning::Entry e;
        e.key = key;
        e.tflops = list[0].m->tflops();
        e.measured = now;
        if (key.rows_bucket > 0)
            e.splits = list[0].c->splits;
        else
            e.config = *list[0].m->kernel.config;
        if (list.size() > 1) {
            e.runner_up_tflops = list[1].m->tflops();
            if (key.rows_bucket > 0)
                e.runner_up_splits = list[1].c->splits;
            else
                e.runner_up = list[1].m->kernel.config;
        }
        entries.push_back(e);
    }
    return entries;
}

// --deterministic: the candidates a deterministic backward() may run, of the set or of each
// --config; UsageError when the set has none or a --config is not one.
std::vector<Candidate> deterministic_only(const std::vector<Candidate>& candidates,
                                          const TuneOptions& o) {
    constexpr const char* what = "deterministic backward config (sm80, or sm90 with ordered)";
    std::vector<Candidate> kept;
    for (const Candidate& c : candidates) {
        if (is_deterministic(*c.config))
            kept.push_back(c);
        else if (!o.configs.empty())
            throw UsageError(std::string("--config: expected a ") + what +
                             " with --deterministic, got " + c.config->to_string());
    }
    if (kept.empty()) {
        throw UsageError(std::string("--set: expected a set with a ") + what +
                         " in this build with --deterministic (kernel set \"" +
                         std::string(tools::built_kernel_set()) + "\"), got \"" +
                         tools::printable(o.set) + "\"");
    }
    return kept;
}

int tune(const TuneOptions& o) {
    check_deterministic(o.deterministic, o.grid.backward);
    std::vector<Candidate> candidates;
    if (o.grid.api() != Api::dense) {
        // The serving entry points choose their kernel; what tuning sets is the split count.
        if (o.set_given || !o.configs.empty()) {
            throw UsageError(std::string(o.set_given ? "--set" : "--config") +
                             ": expected none with --kvcache or --varlen (tune measures split "
                             "counts there; see --splits)");
        }
        for (const int n : parse_int_list(o.splits, "--splits", 1, k_max_splits))
            candidates.push_back(Candidate::with_splits(n));
    } else if (o.splits_given) {
        throw UsageError("--splits: expected with --kvcache or --varlen only");
    } else {
        // --set's configs (the default set without --config) and --config's, as bench takes
        // them.
        if (o.configs.empty() || o.set_given)
            candidates = built_configs_of(o.set, "--set", o.grid.backward);
        for (const std::string& s : o.configs)
            candidates.push_back(built_config(s, "--config", o.grid.backward));
        if (o.deterministic)
            candidates = deterministic_only(candidates, o);
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
    // Before an hour of tuning: a cache that cannot be written. What can be told without
    // creating anything is told first, so that a machine without a GPU is left as it was.
    try {
        tuning::check_path(path);
        print_notes();
        if (!gpu_available())
            return exit_failure;
        tuning::check_writable(path);
    } catch (const Error& e) {
        // Without --cache the path came from the environment: named as such.
        throw UsageError(
            std::string(o.cache.empty() ? "--cache (not given: the default path)" : "--cache") +
            ": " + e.what());
    }
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

    const auto entries = winners(result, candidates, DeviceProperties::current(), o.deterministic);
    std::printf("\n%-48s %8s %9s  %s\n", "key", "TFLOP/s", "margin", "winner");
    for (const tuning::Entry& e : entries) {
        char margin[16] = "-";
        if (e.runner_up || e.runner_up_splits > 0)
            std::snprintf(margin, sizeof margin, "+%.1f%%",
                          100 * (e.tflops / e.runner_up_tflops - 1));
        const std::string winner = e.key.rows_bucket > 0
                                       ? "split-KV, " + std::to_string(e.splits) + " splits"
                                       : e.config.to_string();
        std::printf("%-48s %8.1f %9s  %s\n", e.key.to_string().c_str(), e.tflops, margin,
                    winner.c_str());
    }
    tuning::LockWait wait;
    wait.timeout = std::chrono::seconds(o.lock_timeout_s);
    wait.waiting = [](const std::string& lock_path) {
        std::cerr << "flash_attention: waiting for the lock " << lock_path
                  << " (another tune run is writing the cache; up to --lock-timeout)\n";
    };
    wait.interrupted = [] { return interrupted(); };
    std::vector<std::string> warnings;
    try {
        const InterruptGuard guard;
        warnings = tuning::update(path, entries, wait);
    } catch (const tuning::LockNotTaken& e) {
        std::cerr << "flash_attention: " << e.what() << "; tuning cache " << path.string()
                  << " left untouched\n";
        return e.interrupted ? exit_interrupted : exit_failure;
    }
    for (const std::string& w : warnings)
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
        "in the tuning cache that the automatic choice reads (with --backward: the backward "
        "pass's, under keys of their own)");
    CLI::Option* set =
        cmd->add_option("--set", o->set, "configs to try: the built ones of this set")
            ->check(non_empty("a set name"))
            ->check(set_name_validator())
            ->capture_default_str();
    cmd->add_option("--config", o->configs,
                    "try these configs (repeatable; with --set, beside the set's)")
        ->check(non_empty("a config short form"));
    CLI::Option* splits =
        cmd->add_option("--splits", o->splits,
                        "with --kvcache or --varlen: the split counts to try (comma-separated); "
                        "the winner per (dtype, d_head, key-length bucket, query rows per K/V "
                        "head) is what those calls then use")
            ->check(non_empty("comma-separated split counts"))
            ->capture_default_str();
    o->grid.add_to(*cmd);
    o->grid.add_serving_to(*cmd);
    add_backward_option(*cmd, o->grid.backward);
    add_deterministic_option(*cmd, o->deterministic);
    o->timing.add_to(*cmd);
    cmd->add_option("--cache", o->cache,
                    "tuning cache to update (default: $FLASH_ATTENTION_TUNING, else "
                    "$XDG_CACHE_HOME/flash_attention/tuning.json, else "
                    "~/.cache/flash_attention/tuning.json)")
        ->check(non_empty("a file name"));
    cmd->add_option("--lock-timeout", o->lock_timeout_s,
                    "seconds to wait, at the end, for another tune run's lock on the cache")
        ->transform(integer_in(0, 24 * 3600))
        ->capture_default_str();
    add_format_option(*cmd, o->format, {"table", "csv", "json", "none"},
                      "how to print every measurement");
    cmd->callback([o, set, splits, &action] {
        o->set_given = set->count() > 0;
        o->splits_given = splits->count() > 0;
        action = [o] { return tune(*o); };
    });
}

}  // namespace flash_attention::cli
