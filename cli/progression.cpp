#include <cstdio>
#include <iostream>
#include <map>
#include <memory>

#include "commands.hpp"
#include "flash_attention/tools.hpp"
#include "report.hpp"
#include "sweep.hpp"

namespace flash_attention::cli {

namespace {

struct ProgressionOptions {
    std::string family = "sm80";
    bool all_block_sizes = false;
    GridOptions grid;
    TimingOptions timing{.runs = 30};
    std::string format = "table";
};

// The ladder's steps, once per block shape with --all-block-sizes (shapes the config
// rules reject are left out). The sm90 ladder changes its warpgroups along the way, so
// only its B_c varies.
std::vector<std::vector<KernelConfig>> ladders(const std::string& family, bool all_block_sizes) {
    const bool sm90 = family == "sm90";
    const std::vector<KernelConfig> steps =
        tools::kernel_set(sm90 ? "progression-sm90" : "progression");
    if (!all_block_sizes)
        return {steps};
    std::vector<std::vector<KernelConfig>> out;
    const auto add_if_valid = [&](auto reshape) {
        std::vector<KernelConfig> ladder;
        for (KernelConfig c : steps) {
            reshape(c);
            if (tools::instantiable(c))
                ladder.push_back(c);
        }
        if (ladder.size() == steps.size())
            out.push_back(ladder);
    };
    if (sm90) {
        for (const int B_c : {64, 128})
            add_if_valid([&](KernelConfig& c) { c.B_c = B_c; });
        return out;
    }
    for (const int B_r : {64, 128}) {
        for (const int B_c : {32, 64, 128}) {
            for (const int n_warps : {4, 8}) {
                add_if_valid([&](KernelConfig& c) {
                    c.B_r = B_r;
                    c.B_c = B_c;
                    c.n_warps = n_warps;
                });
            }
        }
    }
    return out;
}

std::string flags_of(const KernelConfig& c) {
    const std::string s = c.to_string();
    return s.substr(s.find(": ") + 2);
}

// Every step of every ladder, as the sweep's candidates; a step this build lacks is a
// usage error that names the kernel set to configure.
std::vector<Candidate> ladder_candidates(const std::vector<std::vector<KernelConfig>>& all,
                                         const std::string& set_name) {
    std::vector<Candidate> candidates;
    for (const auto& ladder : all) {
        for (const KernelConfig& c : ladder) {
            if (!is_built(c)) {
                throw UsageError(
                    std::string("progression: expected the ladder's configs in this build, got ") +
                    "kernel set \"" + std::string(tools::built_kernel_set()) + "\" without " +
                    c.to_string() + " (configure with -DFLASH_KERNELS=" + set_name +
                    ", or add it to a list such as tune," + set_name + ")");
            }
            candidates.push_back(c);
        }
    }
    return candidates;
}

// One table per ladder, one row per step: TFLOP/s at each sequence length, their harmonic
// mean, and the gain of that mean over the previous step.
void print_ladders(const std::vector<std::vector<KernelConfig>>& all, const SweepResult& result,
                   const std::string& device, int runs) {
    std::map<std::size_t, std::vector<Measurement>> by_candidate;
    std::vector<int> seqs;
    for (std::size_t i = 0; i < result.measurements.size(); ++i) {
        by_candidate[result.candidate_of[i]].push_back(result.measurements[i]);
        const int seq = result.measurements[i].shape.seq_q;
        if (std::find(seqs.begin(), seqs.end(), seq) == seqs.end())
            seqs.push_back(seq);
    }
    std::sort(seqs.begin(), seqs.end());
    std::printf(
        "# device: %s; TFLOP/s, median of %d runs; spread is the largest (max-min)/median of a "
        "row\n",
        device.c_str(), runs);
    std::size_t index = 0;
    for (const auto& ladder : all) {
        const KernelConfig& first = ladder.front();
        // A ladder whose steps change the tile shape prints each step's whole config.
        const bool one_shape =
            std::all_of(ladder.begin(), ladder.end(), [&](const KernelConfig& c) {
                return c.B_r == first.B_r && c.B_c == first.B_c && c.n_warps == first.n_warps;
            });
        const auto step_name = [&](const KernelConfig& c) {
            return one_shape ? flags_of(c) : c.to_string();
        };
        if (one_shape) {
            std::printf("\n(%s, %d, %d, %d, %d)\n", std::string(to_string(first.dtype)).c_str(),
                        first.d_head, first.B_r, first.B_c, first.n_warps);
        } else {
            std::printf("\n%s, d_head %d\n", std::string(to_string(first.dtype)).c_str(),
                        first.d_head);
        }
        std::printf("%-4s %-58s", "step", one_shape ? "flags" : "config");
        for (const int seq : seqs)
            std::printf(" %8d", seq);
        std::printf(" %8s %8s %7s\n", seqs.size() > 1 ? "harmonic" : "", "gain", "spread");
        double previous = 0;
        for (std::size_t step = 0; step < ladder.size(); ++step, ++index) {
            const auto& ms = by_candidate[index];
            std::printf("%-4zu %-58s", step + 1, step_name(ladder[step]).c_str());
            double spread = 0;
            for (const int seq : seqs) {
                const auto it = std::find_if(ms.begin(), ms.end(), [&](const Measurement& m) {
                    return m.shape.seq_q == seq;
                });
                if (it == ms.end()) {
                    std::printf(" %8s", "-");
                } else {
                    std::printf(" %8.1f", it->tflops());
                    spread = std::max(spread, it->spread());
                }
            }
            const double mean = harmonic_mean_tflops(ms);
            std::printf(" %8s", seqs.size() > 1 && !ms.empty()
                                    ? std::to_string(static_cast<int>(mean + 0.5)).c_str()
                                    : "");
            if (previous > 0 && mean > 0) {
                std::printf(" %+7.1f%%", 100 * (mean / previous - 1));
            } else {
                std::printf(" %8s", "");
            }
            std::printf(" %6.1f%%\n", 100 * spread);
            previous = mean;
        }
    }
}

int progression(const ProgressionOptions& o) {
    const auto all = ladders(o.family, o.all_block_sizes);
    const std::string set_name = o.family == "sm90"  ? "progression-sm90"
                                 : o.all_block_sizes ? "progression-all"
                                                     : "progression";
    const std::vector<Candidate> candidates = ladder_candidates(all, set_name);
    const std::vector<Job> jobs = plan(candidates, o.grid);
    print_notes();
    if (!gpu_available())
        return exit_failure;
    for (const Candidate& c : candidates) {
        if (!is_supported(*c.config)) {
            throw UsageError("--family: expected a family this GPU runs, got " + o.family + " (" +
                             c.config->to_string() +
                             " cannot run here; sm90 kernels need compute capability 9.0)");
        }
    }
    const SweepResult result = sweep(candidates, jobs, o.timing);
    const std::string device = DeviceProperties::current().description();
    if (o.format == "table")
        print_ladders(all, result, device, o.timing.runs);
    else
        std::cout << format_report(result.measurements, o.format, device);
    return result.exit_code();
}

}  // namespace

void add_progression_command(CLI::App& app, Action& action) {
    auto o = std::make_shared<ProgressionOptions>();
    o->grid.seqs = "4096";
    CLI::App* cmd = app.add_subcommand(
        "progression",
        "The optimisation ladder: each technique added one at a time, and what it gains");
    cmd->add_option("--family", o->family,
                    "sm80 (mma.sync ladder) or sm90 (Hopper ladder: TMA + wgmma, warpgroups, "
                    "pipeline, overlap, ping-pong)")
        ->check(non_empty("sm80 or sm90"))
        ->check(CLI::IsMember({"sm80", "sm90"}))
        ->capture_default_str();
    cmd->add_flag("--all-block-sizes", o->all_block_sizes,
                  "repeat the ladder over B_r 64/128, B_c 32/64/128, 4/8 warps (sm90: B_c 64/128)");
    o->grid.add_to(*cmd);
    o->timing.add_to(*cmd);
    add_format_option(*cmd, o->format, {"table", "csv", "json"}, "output");
    cmd->callback([o, &action] { action = [o] { return progression(*o); }; });
}

}  // namespace flash_attention::cli
