#include <fstream>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "common/device_buffer.hpp"
#include "report.hpp"
#include "sweep.hpp"

namespace flash_attention::cli {

namespace {

struct BenchOptions {
    std::string set;
    std::vector<std::string> configs;
    bool best = false;
    GridOptions grid;
    int warmup = 5;
    int runs = 20;
    int rounds = 5;
    std::string format = "table";
    std::string svg;
};

int bench(const BenchOptions& o) {
    std::vector<Candidate> candidates;
    if (!o.set.empty())
        candidates = built_configs_of(o.set, "--set");
    for (const std::string& s : o.configs)
        candidates.push_back(built_config(s, "--config"));
    if (o.best || candidates.empty())
        candidates.push_back(std::nullopt);
    const std::vector<Job> jobs = plan(candidates, o.grid);
    if (cuda_device_count() == 0) {
        std::cerr << "flash_attention: no CUDA device found\n";
        return exit_failure;
    }
    const SweepResult result = sweep(candidates, jobs, o.warmup, o.runs, o.rounds);
    const std::string device = current_device_description();
    std::cout << format_report(result.measurements, o.format, device);
    if (!o.svg.empty()) {
        std::ofstream(o.svg) << svg_chart(result.measurements,
                                          "flash_attention bench on " + device);
    }
    return result.interrupted ? exit_failure : exit_ok;
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action) {
    auto o = std::make_shared<BenchOptions>();
    CLI::App* cmd = app.add_subcommand(
        "bench",
        "Time configs over sequence lengths: median of timed runs on L2-cold random inputs");
    cmd->add_option("--set", o->set,
                    "the built configs of a named set (e.g. tune, or tune,progression)")
        ->check(set_name_validator());
    cmd->add_option("--config", o->configs, "a config short form (repeatable)");
    cmd->add_flag("--best", o->best,
                  "the library's automatic choice (the default without --set/--config)");
    o->grid.add_to(*cmd);
    cmd->add_option("--warmup", o->warmup, "untimed runs per measurement")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--runs", o->runs, "timed runs per measurement")
        ->check(positive_integer)
        ->capture_default_str();
    cmd->add_option("--rounds", o->rounds,
                    "rounds that interleave the timed runs of one shape's configs (drift control)")
        ->check(positive_integer)
        ->capture_default_str();
    cmd->add_option("--format", o->format, "table, csv or json")
        ->check(CLI::IsMember({"table", "csv", "json"}))
        ->capture_default_str();
    cmd->add_option("--svg", o->svg, "also write a chart of TFLOP/s against sequence length");
    cmd->callback([o, &action] { action = [o] { return bench(*o); }; });
}

}  // namespace flash_attention::cli
