#include "sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <random>

#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "measure.hpp"

namespace flash_attention::cli {

namespace {

std::atomic<bool> g_interrupted{false};

void show_progress(std::size_t done, std::size_t total) {
    if (!isatty(STDERR_FILENO))
        return;
    constexpr int width = 40;
    const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
    std::fprintf(stderr, "\r[%s%s] %zu/%zu", std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total);
    if (done == total)
        std::fprintf(stderr, "\r%s\r", std::string(width + 24, ' ').c_str());
    std::fflush(stderr);
}

}  // namespace

InterruptGuard::InterruptGuard() {
    g_interrupted = false;
    previous_ = std::signal(SIGINT, [](int) { g_interrupted = true; });
}

InterruptGuard::~InterruptGuard() {
    std::signal(SIGINT, previous_);
}

bool interrupted() {
    return g_interrupted;
}

namespace {

std::vector<std::string>& pending_notes() {
    static std::vector<std::string> notes;
    return notes;
}

}  // namespace

void note(const std::string& text) {
    pending_notes().push_back(text);
}

void print_notes() {
    for (const std::string& text : pending_notes())
        std::cerr << "flash_attention: note: " << text << "\n";
    pending_notes().clear();
}

std::vector<Candidate> built_configs_of(const std::string& set, const std::string& option,
                                        bool backward) {
    std::vector<Candidate> out;
    int missing = 0;
    int elsewhere = 0;  // built, but for another GPU (sm90 kernels off Hopper)
    const bool device = device_count() > 0;
    for (const KernelConfig& c : tools::kernel_set(set)) {
        if (c.backward != backward) {
            continue;  // the other pass's
        } else if (!is_built(c)) {
            ++missing;
        } else if (device && !is_supported(c)) {
            ++elsewhere;
        } else {
            out.push_back(c);
        }
    }
    if (elsewhere > 0) {
        note(std::to_string(elsewhere) + " configs of set \"" + set +
             "\" cannot run on this GPU (sm90 kernels need compute capability 9.0)");
    }
    if (out.empty()) {
        throw UsageError(option + ": expected a set with " + (backward ? "backward" : "forward") +
                         " configs in this build (kernel set \"" +
                         std::string(tools::built_kernel_set()) +
                         "\"; configure with -DFLASH_KERNELS=" + tools::printable(set) +
                         " to build it), got \"" + tools::printable(set) + "\"");
    }
    if (missing > 0) {
        note(std::to_string(missing) + " configs of set \"" + set +
             "\" are not in this build (kernel set \"" + std::string(tools::built_kernel_set()) +
             "\")");
    }
    return out;
}

KernelConfig built_config(const std::string& short_form, const std::string& option, bool backward) {
    const KernelConfig c = parse_config(short_form, option);
    if (c.backward != backward) {
        throw UsageError(option + ": expected a " +
                         (backward
                              ? "backward config (bwd) with --backward"
                              : "forward config (without bwd; --backward runs backward ones)") +
                         ", got " + c.to_string());
    }
    if (!is_built(c)) {
        throw UsageError(option +
                         ": expected a config in this build (see flash_attention list), got " +
                         c.to_string());
    }
    return c;
}

namespace {

// Whether forward()'s FP8 path takes the grid's shapes: dense, no variants, no backward. Asked
// before a shape of an FP8 config is made, whose checks would refuse the variants that the
// set's 16-bit configs run.
bool fp8_runs(const GridOptions& grid) {
    Shape s;
    grid.variants.apply(s);
    return grid.api() == Api::dense && !grid.backward && s.window_left == -1 &&
           s.window_right == -1 && s.softcap == 0 && !s.sinks && !s.alibi;
}

}  // namespace

std::vector<Job> plan(const std::vector<Candidate>& candidates, const GridOptions& grid) {
    const std::vector<int> seqs = parse_int_list(grid.seqs, "--seq");
    const auto d_filter = grid.d_heads.empty()
                              ? std::vector<int>{}
                              : parse_int_list(grid.d_heads, "--d-head", 1, k_most_d_head);
    const auto dtype_filter =
        grid.dtypes.empty() ? std::vector<DType>{} : parse_dtype_list(grid.dtypes, "--dtype");
    const auto kept = [](const auto& filter, auto value) {
        return filter.empty() || std::find(filter.begin(), filter.end(), value) != filter.end();
    };
    const bool serving = grid.api() != Api::dense;
    const bool fp8_grid = fp8_runs(grid);
    std::vector<Job> jobs;
    int cannot_run = 0;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
        const std::optional<KernelConfig>& c = candidates[i].config;
        if (c && serving) {
            throw UsageError(
                "--config: expected none with --kvcache or --varlen (their entry points choose "
                "the kernel; --splits picks the split-KV kernel's key ranges), got " +
                c->to_string());
        }
        if (candidates[i].splits > 0 && !serving)
            throw UsageError("--splits: expected with --kvcache or --varlen only");
        const auto dtypes =
            c ? std::vector<DType>{c->dtype}
              : (dtype_filter.empty() ? std::vector<DType>{DType::BF16} : dtype_filter);
        const auto ds =
            c ? std::vector<int>{c->d_head} : (d_filter.empty() ? std::vector<int>{128} : d_filter);
        for (const DType dtype : dtypes) {
            for (const int d : ds) {
                if (!kept(dtype_filter, dtype) || !kept(d_filter, d))
                    continue;
                // A config's own V head dim; --d-v, where given, keeps the configs of that one
                // as --d-head keeps those of its head dims.
                if (c && grid.d_v != 0 && c->v_head_dim() != grid.d_v)
                    continue;
                GridOptions of_config = grid;
                if (c)
                    of_config.d_v = c->d_v;
                for (const int seq : seqs) {
                    // An FP8 config on what forward()'s FP8 path does not take, and a packgqa
                    // config on heads it does not pack, or with variants: left out.
                    if (c && c->dtype == DType::E4M3 && !fp8_grid) {
                        ++cannot_run;
                        continue;
                    }
                    const Shape shape = of_config.shape(dtype, d, seq);
                    if (c && !shape_problem(*c, shape.problem(), shape.sinks).empty()) {
                        ++cannot_run;
                        continue;
                    }
                    jobs.push_back({i, shape});
                }
            }
        }
    }
    if (jobs.empty() && cannot_run > 0) {
        throw UsageError(
            "--config/--set: expected a config that runs these shapes and options (an FP8 config "
            "takes no --window, --softcap, --sinks, --alibi or --backward; a packgqa config needs "
            "grouped heads of few queries and no variants), got " +
            std::to_string(candidates.size()) + " config(s), none of which runs them");
    }
    if (jobs.empty()) {
        throw UsageError(
            "--seq/--d-head/--d-v/--dtype: expected shapes that a selected, built kernel "
            "supports, got --seq " +
            tools::printable(grid.seqs) +
            (grid.d_heads.empty() ? "" : " --d-head " + tools::printable(grid.d_heads)) +
            (grid.d_v == 0 ? "" : " --d-v " + std::to_string(grid.d_v)) +
            (grid.dtypes.empty() ? "" : " --dtype " + tools::printable(grid.dtypes)));
    }
    if (cannot_run > 0) {
        note(std::to_string(cannot_run) +
             " (config, shape) pairs left out: the config cannot run the shape (see "
             "flash_attention run --config)");
    }
    return jobs;
}

SweepResult sweep(const std::vector<Candidate>& candidates, const std::vector<Job>& jobs,
                  const TimingOptions& timing) {
    // Group by shape so each workspace (inputs in L2-defeating copies) is built once and
    // the configs of one shape are timed interleaved.
    std::map<Shape, std::vector<std::size_t>> by_shape;
    for (std::size_t j = 0; j < jobs.size(); ++j)
        by_shape[jobs[j].shape].push_back(j);

    // Every shape's inputs at once where they fit in half the free device memory, so that
    // the rounds of measure_interleaved cover the whole sweep; otherwise in groups of
    // shapes that fit, one after another.
    const std::size_t free_bytes = tools::free_device_bytes();
    std::vector<std::vector<Shape>> groups;
    std::size_t group_bytes = 0;
    for (const auto& [shape, list] : by_shape) {
        const std::size_t bytes = Workspace::bytes(shape);
        if (groups.empty() || group_bytes + bytes > free_bytes / 2) {
            groups.emplace_back();
            group_bytes = 0;
        }
        groups.back().push_back(shape);
        group_bytes += bytes;
    }

    const InterruptGuard guard;
    const std::uint64_t seed = std::random_device{}();
    std::vector<std::optional<Measurement>> measured(jobs.size());
    std::size_t done_before = 0;
    for (const std::vector<Shape>& group : groups) {
        if (g_interrupted)
            break;
        std::deque<Workspace> workspaces;
        std::vector<TimedEntry> entries;
        std::vector<std::size_t> job_of;
        for (const Shape& shape : group) {
            Workspace& w =
                workspaces.emplace_back(shape, seed + static_cast<std::uint64_t>(shape.seq_q));
            for (const std::size_t j : by_shape.at(shape)) {
                entries.push_back({&w, candidates[jobs[j].candidate]});
                job_of.push_back(j);
            }
        }
        const auto results = measure_interleaved(
            entries, timing, [] { return g_interrupted.load(); },
            [&](std::size_t done, std::size_t total) {
                show_progress(done_before + done * entries.size() / total, jobs.size());
            });
        for (std::size_t e = 0; e < results.size(); ++e)
            measured[job_of[e]] = results[e];
        done_before += entries.size();
    }
    SweepResult result;
    result.planned = jobs.size();
    result.interrupted = g_interrupted;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
        if (!measured[j])
            continue;
        result.measurements.push_back(*measured[j]);
        result.candidate_of.push_back(jobs[j].candidate);
    }
    if (result.interrupted) {
        std::cerr << "\nflash_attention: interrupted after " << result.measurements.size() << " of "
                  << jobs.size() << " measurements\n";
    }
    return result;
}

}  // namespace flash_attention::cli
