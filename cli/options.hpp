#pragma once

// Parsing helpers shared by the subcommands. Failures throw UsageError naming the
// option, what was expected and what was given.

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "flash_attention/flash_attention.hpp"
#include "measurement.hpp"

namespace flash_attention::cli {

// The largest --d-head or --d-v an option takes: past every built head dim, so that the library's
// message names the ones it runs.
inline constexpr int k_most_d_head = 1024;

// An integer option in [minimum, maximum]; the message names the bounds and what was given.
// Added with transform(): it hands the value on in plain decimal (CLI11 alone reads "010" as 8).
CLI::Validator integer_in(long long minimum, long long maximum);
// Whether a library error is the caller's (bad or unsupported arguments, no kernel built for
// them): the command line exits with its usage code.
bool is_bad_argument(ErrorCode code);
// A library error's message with the API's argument it names first ("d_head: expected ...")
// put as the command line's option (--d-head), where one stands for it.
std::string in_option_names(const std::string& message);
// A finite number in [minimum, maximum] (nan and inf are refused); as_float: one the command
// keeps in a float, which must be 0 or a normal float (nothing rounds silently to 0).
CLI::Validator number_in(double minimum, double maximum, bool as_float = false);
// A string option's value, which may not be empty: the commands read an empty string as
// the option not given (`run --config ""` ran the automatic choice). The message names
// `expected`.
CLI::Validator non_empty(const std::string& expected);

// --scale: positive, finite and below the library's k_max_softmax_scale.
CLI::Validator softmax_scale_bounds();

// The library's own limits on problem sizes (flash_attention.hpp).
CLI::Validator batch_size();
CLI::Validator head_count();
CLI::Validator seq_length();

// Comma-separated integers, each in [minimum, maximum].
std::vector<int> parse_int_list(const std::string& text, const std::string& option,
                                long long minimum = 1, long long maximum = k_max_seq);
std::vector<DType> parse_dtype_list(const std::string& text, const std::string& option);

// A config short form; UsageError naming the option and the offending token otherwise.
KernelConfig parse_config(const std::string& short_form, const std::string& option);

// A named set ("tune") or a comma-separated union ("tune,progression").
CLI::Validator set_name_validator();

// How each measurement of bench, tune and progression is timed (see measure_interleaved).
struct TimingOptions {
    int warmup = 5;
    double warmup_ms = 1000;  // at least this long under load before timing
    int runs = 20;
    int rounds = 0;  // 0: one timed run of each entry per round

    void add_to(CLI::App& cmd);
};

// Before a long run whose result goes to `path`: a UsageError naming the option if it
// cannot be written, judged without creating anything (a run that fails leaves an existing
// file as it was). tools::write_file_atomically writes it at the end.
void check_output_path(const std::string& path, const std::string& option);

// --format, one of `allowed` (the first is the default already in `format`).
void add_format_option(CLI::App& cmd, std::string& format, const std::vector<std::string>& allowed,
                       const std::string& what);

// False, after a one-line message on stderr, when this machine has no CUDA device.
bool gpu_available();

// --window, --softcap, --sinks and --alibi: the attention variants of a problem (Shape's
// fields).
struct VariantOptions {
    std::string window;  // "LEFT,RIGHT"
    float softcap = 0;
    bool sinks = false;
    bool alibi = false;

    void add_to(CLI::App& cmd);
    // Sets `shape`'s variant fields.
    void apply(Shape& shape) const;
};

// The problem grid of bench and tune: sequence lengths, and head dims and dtypes
// (filters for explicit configs, the grid itself for the automatic choice). Batch and
// heads default to 16k tokens in total and a hidden size of 2048, as in the
// FlashAttention benchmarks.
struct GridOptions {
    std::string seqs = "512,1024,2048,4096,8192,16384";
    std::string d_heads;
    int d_v = 0;  // V's head dim where it differs from d_head (0: d_head)
    std::string dtypes;
    int batch = 0;
    int heads = 0;
    int heads_kv = 0;  // 0: as many as query heads
    int seq_k = 0;     // 0: equal to the query length
    bool causal = false;
    std::optional<float> scale;
    // The serving entry points (add_serving_to): forward_kvcache on a contiguous cache or
    // one of pages of page_size rows, forward_varlen on sequences of random lengths.
    bool kvcache = false;
    int page_size = 0;
    bool varlen = false;
    VariantOptions variants;
    bool backward = false;  // time backward() (add_backward_option)

    void add_to(CLI::App& cmd);
    void add_serving_to(CLI::App& cmd);
    // The entry point the options name; UsageError for contradicting ones.
    Api api() const;
    // The shape for one (dtype, d_head, seq) of the grid; UsageError if --heads-kv does
    // not divide the heads.
    Shape shape(DType dtype, int d_head, int seq) const;
};

// The library's Error for a shape its entry point refuses whatever the GPU (head dim,
// sizes, scale, window, softcap), and a UsageError for a backward shape that is not a dense
// one without variants: the commands call it before they look for a GPU.
void validate_shape(const Shape& shape);

// --backward on a command: `backward` then runs the backward pass.
void add_backward_option(CLI::App& cmd, bool& backward);
// --deterministic on a command with --backward: deterministic backward kernels only
// (is_deterministic), as BackwardParams::deterministic asks for.
void add_deterministic_option(CLI::App& cmd, bool& deterministic);
// UsageError for --deterministic without --backward: only backward kernels differ in it.
void check_deterministic(bool deterministic, bool backward);

// --kvcache, --page-size and --varlen (GridOptions' serving fields) on a command.
void add_serving_options(CLI::App& cmd, bool& kvcache, int& page_size, bool& varlen);
// The entry point those options name; UsageError for contradicting ones.
Api serving_api(bool kvcache, int page_size, bool varlen, bool seq_k_given);

}  // namespace flash_attention::cli
