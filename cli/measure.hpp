#pragma once

// Timing kernels the way the benchmark rules ask: random inputs (never zeros),
// rotated among enough copies that L2 cannot hold them between runs, warm-up, then
// every run timed with CUDA events and the median reported with its spread.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "flash_attention/flash_attention.hpp"
#include "measurement.hpp"
#include "options.hpp"
#include "problem.hpp"

namespace flash_attention::cli {

// Device inputs for one shape, in as many copies as it takes to exceed the L2 cache
// four times over, and one output per copy.
class Workspace {
  public:
    Workspace(const Shape& shape, std::uint64_t seed);
    // Device bytes such a workspace takes (every copy of the inputs and outputs).
    static std::size_t bytes(const Shape& shape);
    const Shape& shape() const { return shape_; }
    // Runs the candidate on the next copy: successive calls rotate through the copies.
    void launch_next(const Candidate& candidate) {
        copies_[next_++ % copies_.size()].launch(candidate);
    }
    KernelChoice kernel(const Candidate& candidate) const { return copies_[0].kernel(candidate); }

  private:
    static int slots(const Shape& shape);
    Shape shape_;
    std::vector<DeviceProblem> copies_;
    std::size_t next_ = 0;
};

// One thing to time: a candidate on a workspace.
struct TimedEntry {
    Workspace* workspace;
    Candidate candidate;
};

// Times every entry: `warmup` untimed runs of each, repeated until `warmup_ms` of load
// has passed; then `runs` timed runs of each, each between its own pair of events, in
// rounds. A round visits every entry in a fresh order: once by default (`rounds` 0: as
// many rounds as runs), or with runs/rounds runs back to back.
//
// Why rounds over every shape and config rather than one shape after another: under full
// load an H100 sits at its 700 W power cap and its clock wanders between about 1500 and
// 1980 MHz over tenths of a second (nvidia-smi: "SW power cap"; docs/PERF.md). A
// measurement made in one short window catches whichever clock that window had, and
// repeated benches disagreed by up to 12% at one shape; runs spread over the whole sweep
// see the same mixture of clocks. The warm-up time brings the chip into that loaded
// regime first.
//
// Returns one measurement per entry, in order; after `stop()` turns true (checked before
// each entry's runs), entries hold the runs made so far. `progress(done, total)` counts
// rounds.
std::vector<std::optional<Measurement>> measure_interleaved(
    const std::vector<TimedEntry>& entries, const TimingOptions& timing, bool (*stop)(),
    const std::function<void(std::size_t, std::size_t)>& progress);

}  // namespace flash_attention::cli
