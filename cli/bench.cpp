#include <iostream>
#include <map>
#include <memory>

#include "commands.hpp"
#include "flash_attention/tools.hpp"
#include "options.hpp"
#include "report.hpp"
#include "sweep.hpp"

namespace flash_attention::cli {

namespace {

struct BenchOptions {
    std::string set;
    std::vector<std::string> configs;
    std::string splits;
    bool best = false;
    GridOptions grid;
    TimingOptions timing;
    std::string format = "table";
    std::string svg;
};

int bench(const BenchOptions& o) {
    // The serving entry points choose their kernel: a set or config is refused by name.
    if (o.grid.api() != Api::dense && (!o.set.empty() || !o.configs.empty())) {
        throw UsageError(std::string(o.set.empty() ? "--config" : "--set") +
                         ": expected none with --kvcache or --varlen (their entry points choose "
                         "the kernel; --splits picks the split-KV kernel's key ranges), got " +
                         tools::printable(o.set.empty() ? o.configs.front() : o.set));
    }
    std::vector<Candidate> candidates;
    if (!o.set.empty())
        candidates = built_configs_of(o.set, "--set", o.grid.backward);
    for (const std::string& s : o.configs)
        candidates.push_back(built_config(s, "--config", o.grid.backward));
    if (!o.splits.empty()) {
        for (const int n : parse_int_list(o.splits, "--splits", 1, k_max_splits))
            candidates.push_back(Candidate::with_splits(n));
    }
    if (o.best || candidates.empty())
        candidates.push_back(std::nullopt);
    const std::vector<Job> jobs = plan(candidates, o.grid);
    // Before the run: a chart that cannot be written fails now, not after it.
    if (!o.svg.empty())
        check_output_path(o.svg, "--svg");
    print_notes();
    if (!gpu_available())
        return exit_failure;
    if (o.grid.backward) {
        // What each shape's backward call takes besides its tensors (D, one float a query row).
        std::map<Shape, int> shapes;
        for (const Job& job : jobs)
            shapes[job.shape] = 0;
        for (const auto& [s, unused] : shapes) {
            std::cerr << "# backward workspace " << backward_workspace_bytes(s.problem())
                      << " bytes: " << std::string(to_string(s.dtype)) << " d_head " << s.d_head
                      << ", batch " << s.batch << ", heads " << s.heads << ", seq " << s.seq_q
                      << "\n";
        }
    }
    const SweepResult result = sweep(candidates, jobs, o.timing);
    const std::string device = DeviceProperties::current().description();
    std::cout << format_report(result.measurements, o.format, device);
    if (!o.svg.empty()) {
        // Replaced in one step: a failure leaves the last chart as it was.
        const std::string problem = tools::write_file_atomically(
            o.svg, svg_chart(result.measurements, "flash_attention bench on " + device));
        if (!problem.empty()) {
            std::cerr << "flash_attention: --svg: writing " << tools::printable(o.svg, 4096)
                      << " failed: " << problem << "\n";
            return exit_failure;
        }
    }
    return result.exit_code();
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action) {
    auto o = std::make_shared<BenchOptions>();
    CLI::App* cmd = app.add_subcommand(
        "bench",
        "Time configs over sequence lengths: median of timed runs on L2-cold random inputs");
    cmd->add_option("--set", o->set,
                    "the built configs of a named set (e.g. tune, or tune,progression)")
        ->check(non_empty("a set name"))
        ->check(set_name_validator());
    cmd->add_option("--config", o->configs, "a config short form (repeatable)")
        ->check(non_empty("a config short form"));
    cmd->add_flag("--best", o->best,
                  "the library's automatic choice (the default without --set/--config)");
    cmd->add_option("--splits", o->splits,
                    "with --kvcache or --varlen: the split-KV kernel with these numbers of key "
                    "ranges per sequence (comma-separated)")
        ->check(non_empty("comma-separated split counts"));
    o->grid.add_to(*cmd);
    o->grid.add_serving_to(*cmd);
    add_backward_option(*cmd, o->grid.backward);
    o->timing.add_to(*cmd);
    add_format_option(*cmd, o->format, {"table", "csv", "json"}, "output");
    cmd->add_option("--svg", o->svg, "also write a chart of TFLOP/s against sequence length")
        ->check(non_empty("a file name"));
    cmd->callback([o, &action] { action = [o] { return bench(*o); }; });
}

}  // namespace flash_attention::cli
