#pragma once

// Running many (config, shape) measurements in one go: which configs, on which
// shapes, in an order that builds each shape's inputs once, with a progress bar on a
// terminal and Ctrl-C ending the sweep early with what was measured.

#include <optional>
#include <string>
#include <vector>

#include "measurement.hpp"
#include "options.hpp"
#include "problem.hpp"

namespace flash_attention::cli {

// Ctrl-C sets a flag that interrupted() reads, for as long as the guard lives; Ctrl-C's
// default action (ending the process) is back afterwards. One guard at a time.
class InterruptGuard {
  public:
    InterruptGuard();
    ~InterruptGuard();
    InterruptGuard(const InterruptGuard&) = delete;
    InterruptGuard& operator=(const InterruptGuard&) = delete;

  private:
    void (*previous_)(int);
};
bool interrupted();

// A line for stderr ("flash_attention: note: ..."), held until print_notes(): a command whose
// later checks refuse an argument prints its one-line error alone.
void note(const std::string& text);
// The notes so far, on stderr; a command calls it once its arguments are all checked.
void print_notes();

// The configs of a set that this build holds for one pass, forward or backward (a note names
// how many are missing); UsageError if it holds none.
std::vector<Candidate> built_configs_of(const std::string& set, const std::string& option,
                                        bool backward);
// A config this build holds, of the pass asked for; UsageError otherwise.
KernelConfig built_config(const std::string& short_form, const std::string& option, bool backward);

struct Job {
    std::size_t candidate;
    Shape shape;
};

// Explicit configs run on the grid's sequence lengths at their own dtype and head dim
// (skipped when --dtype/--d-head filter them out); the automatic choice and split counts
// run on every (dtype, d_head, seq) of the grid. UsageError if nothing remains, or for a
// candidate the grid's entry point does not take (a config with --kvcache or --varlen,
// split counts without).
std::vector<Job> plan(const std::vector<Candidate>& candidates, const GridOptions& grid);

struct SweepResult {
    std::vector<Measurement> measurements;  // in plan order
    std::vector<std::size_t> candidate_of;
    std::size_t planned = 0;
    bool interrupted = false;

    // exit_interrupted after Ctrl-C (what was measured is still printed), else exit_ok.
    int exit_code() const { return interrupted ? exit_interrupted : exit_ok; }
};

SweepResult sweep(const std::vector<Candidate>& candidates, const std::vector<Job>& jobs,
                  const TimingOptions& timing);

}  // namespace flash_attention::cli
