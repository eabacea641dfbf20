#include "measure.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

namespace flash_attention::cli {

int Workspace::slots(const Shape& shape) {
    // Enough copies that one slot's inputs are long evicted from L2 when it comes round
    // again: at least 4x the L2 size in total, and at least 4 copies even when each
    // exceeds L2, so that no one allocation's placement in DRAM dominates the median.
    constexpr int min_slots = 4;
    const int l2_bytes = DeviceProperties::current().l2_bytes;
    const double slot_bytes = static_cast<double>(DeviceProblem::bytes(shape));
    return std::clamp(static_cast<int>(4.0 * l2_bytes / slot_bytes) + 1, min_slots, 64);
}

std::size_t Workspace::bytes(const Shape& shape) {
    return slots(shape) * DeviceProblem::bytes(shape);
}

Workspace::Workspace(const Shape& shape, std::uint64_t seed) : shape_(shape) {
    const HostProblem host = HostProblem::random(shape, seed);
    const int copies = slots(shape);
    copies_.reserve(static_cast<std::size_t>(copies));
    for (int s = 0; s < copies; ++s)
        copies_.emplace_back(shape, host);
}

std::vector<std::optional<Measurement>> measure_interleaved(
    const std::vector<TimedEntry>& entries, const TimingOptions& timing, bool (*stop)(),
    const std::function<void(std::size_t, std::size_t)>& progress) {
    const auto launch = [](const TimedEntry& e) { e.workspace->launch_next(e.candidate); };
    using clock = std::chrono::steady_clock;
    const auto warm_until =
        clock::now() + std::chrono::duration<double, std::milli>(timing.warmup_ms);
    do {
        for (const TimedEntry& e : entries) {
            for (int i = 0; i < timing.warmup; ++i)
                launch(e);
        }
        tools::synchronize();
    } while (timing.warmup > 0 && clock::now() < warm_until && !stop());

    const int rounds = timing.rounds > 0 ? std::clamp(timing.rounds, 1, timing.runs) : timing.runs;
    const int most_in_round = (timing.runs + rounds - 1) / rounds;
    // Two sets of events: round r is queued before round r-1's times are read, so the GPU
    // never waits for the host between rounds.
    struct Round {
        LaunchTimes timer;
        std::vector<std::size_t> entry_of;  // entry of each timed launch
    };
    Round timed[2] = {{LaunchTimes(static_cast<int>(entries.size()) * most_in_round), {}},
                      {LaunchTimes(static_cast<int>(entries.size()) * most_in_round), {}}};
    std::vector<std::vector<double>> ms(entries.size());
    const auto collect = [&](Round& r) {
        const std::vector<double> t = r.timer.elapsed_ms(static_cast<int>(r.entry_of.size()));
        for (std::size_t i = 0; i < t.size(); ++i)
            ms[r.entry_of[i]].push_back(t[i]);
        r.entry_of.clear();
    };
    for (int round = 0; round < rounds && !stop(); ++round) {
        Round& r = timed[round % 2];
        const int in_round = timing.runs * (round + 1) / rounds - timing.runs * round / rounds;
        // A fresh order each round, so no entry always runs first or after the same one.
        std::vector<std::size_t> order(entries.size());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(round)));
        for (const std::size_t e : order) {
            // A round of a large sweep can take many seconds: Ctrl-C ends it early too.
            if (stop())
                break;
            for (int i = 0; i < in_round; ++i) {
                const int k = static_cast<int>(r.entry_of.size());
                r.timer.before(k, nullptr);
                launch(entries[e]);
                r.timer.after(k, nullptr);
                r.entry_of.push_back(e);
            }
        }
        if (round > 0)
            collect(timed[(round - 1) % 2]);
        progress(round + 1, rounds);
    }
    for (Round& r : timed) {
        if (!r.entry_of.empty())
            collect(r);
    }
    std::vector<std::optional<Measurement>> out(entries.size());
    for (std::size_t e = 0; e < entries.size(); ++e) {
        if (ms[e].empty())
            continue;
        const Workspace& workspace = *entries[e].workspace;
        const Candidate& c = entries[e].candidate;
        const Shape& shape = workspace.shape();
        const std::string api =
            shape.api == Api::dense ? "" : api_name(shape) + ": ";  // its own harmonic mean
        std::string label = api + "automatic choice (" + std::string(to_string(shape.dtype)) +
                            ", d_head " + std::to_string(shape.d_head) + ")";
        if (c.config)
            label = c.config->to_string();
        else if (c.splits > 0)
            label = api + "split-KV, " + std::to_string(c.splits) + " splits";
        out[e] = Measurement::of(label, workspace.kernel(c), shape, ms[e]);
    }
    return out;
}

}  // namespace flash_attention::cli
