#include "options.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string_view>
#include <utility>

#include "flash_attention/error.hpp"
#include "flash_attention/tools.hpp"

namespace flash_attention::cli {

namespace {

// The value of a decimal integer in [minimum, maximum], or nullopt.
std::optional<long long> integer(const std::string& text, long long minimum, long long maximum) {
    long long value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < minimum ||
        value > maximum)
        return std::nullopt;
    return value;
}

// "2147483647", "1e+06", "60000": bounds people can read.
std::string readable(double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", x);
    return text;
}

std::string excerpt(const std::string& text) {
    return tools::printable(text, 40);
}

// A comma-separated list's items, empty ones included ("1," is "1" and ""), so that a stray
// comma is refused rather than dropped.
std::vector<std::string> list_items(const std::string& text) {
    std::vector<std::string> items;
    for (std::size_t start = 0;;) {
        const std::size_t end = text.find(',', start);
        items.push_back(text.substr(start, end - start));
        if (end == std::string::npos)
            return items;
        start = end + 1;
    }
}

}  // namespace

CLI::Validator integer_in(long long minimum, long long maximum) {
    return CLI::Validator(
        [=](std::string& text) -> std::string {
            const std::optional<long long> value = integer(text, minimum, maximum);
            if (!value) {
                return "expected an integer from " + std::to_string(minimum) + " to " +
                       std::to_string(maximum) + ", got \"" + excerpt(text) + "\"";
            }
            // Handed on in its plain decimal form (the option adds this with transform(), which
            // may rewrite the text; check() hands it a copy): CLI11 reads a leading 0 as octal
            // ("0100" as 64), which the lists and every message read as decimal.
            text = std::to_string(*value);
            return "";
        },
        "INT in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]");
}

CLI::Validator number_in(double minimum, double maximum, bool as_float) {
    return CLI::Validator(
        [=](std::string& text) -> std::string {
            double value = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
            // as_float: kept in a float, so a value other than 0 must not round to 0 or lose
            // precision below the normal range (a softcap of 1e-300 would turn it off).
            const bool ok = !text.empty() && ec == std::errc() &&
                            end == text.data() + text.size() && std::isfinite(value) &&
                            value >= minimum && value <= maximum &&
                            (!as_float || value == 0 || std::isnormal(static_cast<float>(value)));
            return ok ? ""
                      : "expected a number from " + readable(minimum) + " to " + readable(maximum) +
                            (as_float ? " (0, or a normal float)" : "") + ", got \"" +
                            excerpt(text) + "\"";
        },
        "NUMBER in [" + readable(minimum) + ", " + readable(maximum) + "]");
}

CLI::Validator non_empty(const std::string& expected) {
    return CLI::Validator(
        [=](std::string& text) -> std::string {
            return text.empty() ? "expected " + expected + ", got \"\"" : "";
        },
        "");
}

CLI::Validator softmax_scale_bounds() {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%.4g", k_max_softmax_scale);  // as the library says it
    const std::string expected =
        std::string("a positive finite number below ") + bound + " (a normal float)";
    return CLI::Validator(
        [=](std::string& text) -> std::string {
            double value = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
            const bool ok = !text.empty() && ec == std::errc() &&
                            end == text.data() + text.size() && std::isfinite(value) && value > 0 &&
                            value < k_max_softmax_scale && std::isnormal(static_cast<float>(value));
            return ok ? "" : "expected " + expected + ", got \"" + excerpt(text) + "\"";
        },
        "NUMBER in (0, " + std::string(bound) + ")");
}

CLI::Validator batch_size() {
    return integer_in(1, k_max_batch);
}
CLI::Validator head_count() {
    return integer_in(1, k_max_heads);
}
CLI::Validator seq_length() {
    return integer_in(1, k_max_seq);
}

std::vector<int> parse_int_list(const std::string& text, const std::string& option,
                                long long minimum, long long maximum) {
    if (text.empty())
        throw UsageError(option + ": expected at least one value, got \"\"");
    std::vector<int> values;
    for (const std::string& item : list_items(text)) {
        const std::optional<long long> v = integer(item, minimum, maximum);
        if (!v) {
            throw UsageError(option + ": expected a comma-separated list of integers from " +
                             std::to_string(minimum) + " to " + std::to_string(maximum) +
                             ", got \"" + excerpt(text) + "\"");
        }
        values.push_back(static_cast<int>(*v));
    }
    return values;
}

void check_output_path(const std::string& path, const std::string& option) {
    if (const std::string problem = tools::write_problem(path, false); !problem.empty()) {
        throw UsageError(option + ": expected a file that can be written, got \"" + excerpt(path) +
                         "\" (" + problem + ")");
    }
}

std::vector<DType> parse_dtype_list(const std::string& text, const std::string& option) {
    std::vector<DType> values;
    for (const std::string& item : list_items(text)) {
        if (item == "fp16") {
            values.push_back(DType::FP16);
        } else if (item == "bf16") {
            values.push_back(DType::BF16);
        } else if (item == "e4m3") {
            values.push_back(DType::E4M3);
        } else {
            throw UsageError(option +
                             ": expected a comma-separated list of fp16, bf16 and e4m3, got \"" +
                             excerpt(text) + "\"");
        }
    }
    return values;
}

KernelConfig parse_config(const std::string& short_form, const std::string& option) {
    try {
        return KernelConfig::parse(short_form);
    } catch (const Error& e) {
        throw UsageError(option + ": " + e.what());
    }
}

CLI::Validator set_name_validator() {
    return CLI::Validator(
        [](std::string& name) -> std::string {
            try {
                tools::kernel_set(name);
            } catch (const Error& e) {
                return e.what();
            }
            return {};
        },
        "SET");
}

void TimingOptions::add_to(CLI::App& cmd) {
    // Bounds: enough for any measurement, small enough that runs x entries cannot overflow
    // and a typo cannot ask for days.
    cmd.add_option("--warmup", warmup, "untimed runs per measurement")
        ->transform(integer_in(0, 1000))
        ->capture_default_str();
    cmd.add_option("--warmup-ms", warmup_ms,
                   "repeat the warm-up until this many milliseconds have passed (the GPU's clock "
                   "settles under load)")
        ->check(number_in(0, 60000))
        ->capture_default_str();
    cmd.add_option("--runs", runs, "timed runs per measurement")
        ->transform(integer_in(1, 10000))
        ->capture_default_str();
    cmd.add_option(
           "--rounds", rounds,
           "rounds that interleave the timed runs of every shape and config (drift control; "
           "0: one run of each per round)")
        ->transform(integer_in(0, 10000))
        ->capture_default_str();
}

void add_format_option(CLI::App& cmd, std::string& format, const std::vector<std::string>& allowed,
                       const std::string& what) {
    std::string names;
    for (const auto& a : allowed)
        names += (names.empty() ? "" : ", ") + a;
    cmd.add_option("--format", format, what + ": " + names)
        ->check(non_empty("one of " + names))
        ->check(CLI::IsMember(allowed))
        ->capture_default_str();
}

bool gpu_available() {
    if (device_count() > 0)
        return true;
    std::cerr << "flash_attention: no CUDA device found\n";
    return false;
}

void GridOptions::add_to(CLI::App& cmd) {
    cmd.add_option("--seq", seqs, "comma-separated query sequence lengths")
        ->check(non_empty("comma-separated sequence lengths"))
        ->capture_default_str();
    cmd.add_option("--seq-k", seq_k, "key/value sequence length (default: the query length)")
        ->transform(seq_length());
    cmd.add_option("--d-head", d_heads,
                   "comma-separated head dims (default: those of the configs, else 128)")
        ->check(non_empty("comma-separated head dims"));
    cmd.add_option("--d-v", d_v,
                   "V's head dim where it differs from Q's and K's: 128 with --d-head 192 "
                   "(default: the configs', else d_head)")
        ->transform(integer_in(1, k_most_d_head));
    cmd.add_option(
           "--dtype", dtypes,
           "comma-separated dtypes, fp16/bf16/e4m3 (e4m3: FP8 with random descales, dense forward "
           "and --kvcache; default: those of the configs, else bf16)")
        ->check(non_empty("comma-separated dtypes"));
    cmd.add_option("--batch", batch, "batch size (default 16384/seq: 16k tokens)")
        ->transform(batch_size());
    cmd.add_option("--heads", heads, "query heads (default 2048/d_head: hidden size 2048)")
        ->transform(head_count());
    cmd.add_option("--heads-kv", heads_kv,
                   "key/value heads, dividing the query heads (grouped-query attention)")
        ->transform(head_count());
    cmd.add_flag("--causal", causal, "causal masking, aligned at the bottom right");
    cmd.add_option("--scale", scale, "softmax scale, positive (default 1/sqrt(d_head))")
        ->check(softmax_scale_bounds());
    variants.add_to(cmd);
}

void VariantOptions::add_to(CLI::App& cmd) {
    // Checked as it is parsed, so a malformed window exits 2 before anything runs.
    const CLI::Validator window_sides(
        [](std::string& text) -> std::string {
            const auto comma = text.find(',');
            const bool ok = comma != std::string::npos &&
                            text.find(',', comma + 1) == std::string::npos &&
                            integer(text.substr(0, comma), -1, k_max_seq) &&
                            integer(text.substr(comma + 1), -1, k_max_seq);
            return ok ? ""
                      : "expected LEFT,RIGHT, two integers from -1 (unbounded) to " +
                            std::to_string(k_max_seq) + ", got \"" + excerpt(text) + "\"";
        },
        "LEFT,RIGHT");
    cmd.add_option("--window", window,
                   "sliding window LEFT,RIGHT around each query's diagonal position (-1: "
                   "unbounded; with --causal RIGHT is -1 or 0)")
        ->check(window_sides);
    cmd.add_option("--softcap", softcap, "logit softcap: scores become softcap * tanh(s / softcap)")
        ->check(number_in(0, 1e6, true));
    cmd.add_flag("--sinks", sinks, "attention sinks: a random logit per query head");
    cmd.add_flag(
        "--alibi", alibi,
        "ALiBi: a bias -slope * |position - key| with the standard slopes 2^(-8 h / heads)");
}

void VariantOptions::apply(Shape& shape) const {
    if (!window.empty()) {  // checked when parsed (add_to)
        const std::vector<int> sides = parse_int_list(window, "--window", -1, k_max_seq);
        shape.window_left = sides.at(0);
        shape.window_right = sides.at(1);
    }
    shape.softcap = softcap;
    shape.sinks = sinks;
    shape.alibi = alibi;
}

bool is_bad_argument(ErrorCode code) {
    return code == ErrorCode::invalid_argument || code == ErrorCode::dtype ||
           code == ErrorCode::unsupported || code == ErrorCode::not_built;
}

std::string in_option_names(const std::string& message) {
    static constexpr std::pair<std::string_view, std::string_view> names[] = {
        {"d_head", "--d-head"},
        {"d_v", "--d-v"},
        {"dtype", "--dtype"},
        {"batch", "--batch"},
        {"seq_q", "--seq"},
        {"seq_k", "--seq-k"},
        {"heads_kv", "--heads-kv"},
        {"heads", "--heads"},
        {"softmax_scale", "--scale"},
        {"variants.window_left", "--window"},
        {"variants.window_right", "--window"},
        {"variants.softcap", "--softcap"},
        {"window_or_softcap", "--window/--softcap/--alibi"},  // the shape's variants bit
        {"q", "--dtype/--d-head"},  // no built kernel for q's dtype and head dim
    };
    for (const auto& [api, option] : names) {
        if (message.starts_with(api) && message.size() > api.size() && message[api.size()] == ':')
            return std::string(option) + message.substr(api.size());
    }
    return message;
}

void validate_shape(const Shape& shape) {
    try {
        validate(shape.problem(), shape.scale,
                 {shape.window_left, shape.window_right, shape.softcap});
    } catch (const Error& e) {
        throw UsageError(in_option_names(e.what()));
    }
    // forward_varlen packs the sequences into one tensor of at most k_max_seq rows; their
    // lengths are drawn up to --seq, so --batch of --seq each must fit.
    if (shape.api == Api::varlen && std::int64_t{shape.batch} * shape.seq_q > k_max_seq) {
        throw UsageError("--batch: expected at most " + std::to_string(k_max_seq / shape.seq_q) +
                         " sequences of up to --seq " + std::to_string(shape.seq_q) +
                         " with --varlen (packed, at most " + std::to_string(k_max_seq) +
                         " rows), got " + std::to_string(shape.batch));
    }
    if (shape.backward && shape.api != Api::dense) {
        throw UsageError(
            "--backward: expected a dense problem (no --kvcache, --page-size or "
            "--varlen: the backward pass runs through backward()), got " +
            api_name(shape));
    }
    if (shape.backward && (shape.window_left != -1 || shape.window_right != -1 ||
                           shape.softcap != 0 || shape.sinks || shape.alibi)) {
        throw UsageError(
            "--backward: expected no --window, --softcap, --sinks or --alibi (the command line's "
            "backward and its check take no variants yet), got some");
    }
}

void add_backward_option(CLI::App& cmd, bool& backward) {
    cmd.add_flag("--backward", backward,
                 "the backward pass: dQ, dK and dV of the forward's output for a random dO "
                 "(the forward runs first, with the automatic choice); TFLOP/s count 2.5x the "
                 "forward's FLOPs");
}

void add_deterministic_option(CLI::App& cmd, bool& deterministic) {
    cmd.add_flag("--deterministic", deterministic,
                 "with --backward: deterministic kernels only, whose gradients are bitwise "
                 "identical from run to run (sm80, or sm90 with ordered), as "
                 "BackwardParams::deterministic asks for");
}

void check_deterministic(bool deterministic, bool backward) {
    if (deterministic && !backward) {
        throw UsageError(
            "--deterministic: expected with --backward (only backward kernels differ in "
            "determinism), got it without --backward");
    }
}

void add_serving_options(CLI::App& cmd, bool& kvcache, int& page_size, bool& varlen) {
    cmd.add_flag("--kvcache", kvcache,
                 "through forward_kvcache: a cache of --seq-k keys per sequence (decoding with "
                 "--seq 1)");
    cmd.add_option("--page-size", page_size,
                   "a paged cache (implies --kvcache): rows per page, a multiple of 16, pages "
                   "in a random order")
        ->transform(integer_in(16, 1 << 20));
    cmd.add_flag("--varlen", varlen,
                 "through forward_varlen: --batch sequences of random lengths from 1 to --seq, "
                 "packed");
}

Api serving_api(bool kvcache, int page_size, bool varlen, bool seq_k_given) {
    if (page_size % 16 != 0) {
        throw UsageError("--page-size: expected a multiple of 16, got " +
                         std::to_string(page_size));
    }
    if (varlen && (kvcache || page_size > 0)) {
        throw UsageError(std::string(kvcache ? "--kvcache" : "--page-size") +
                         ": expected no cache with --varlen (its keys are packed like its "
                         "queries), got both");
    }
    if (varlen && seq_k_given) {
        throw UsageError(
            "--seq-k: expected none with --varlen (each sequence has as many keys as queries)");
    }
    if (varlen)
        return Api::varlen;
    return kvcache || page_size > 0 ? Api::kvcache : Api::dense;
}

void GridOptions::add_serving_to(CLI::App& cmd) {
    add_serving_options(cmd, kvcache, page_size, varlen);
}

Api GridOptions::api() const {
    return serving_api(kvcache, page_size, varlen, seq_k > 0);
}

Shape GridOptions::shape(DType dtype, int d_head, int seq) const {
    const int h = heads > 0 ? heads : std::max(1, 2048 / d_head);
    const int h_kv = heads_kv > 0 ? heads_kv : h;
    if (h % h_kv != 0) {
        throw UsageError("--heads-kv: expected a divisor of the query heads (" + std::to_string(h) +
                         "), got " + std::to_string(h_kv));
    }
    Shape s{.dtype = dtype,
            .d_head = d_head,
            .batch = batch > 0 ? batch : std::max(1, 16384 / seq),
            .heads = h,
            .seq_q = seq,
            .seq_k = seq_k > 0 ? seq_k : seq,
            .heads_kv = h_kv,
            .causal = causal,
            .scale = scale,
            .api = api(),
            .page_size = page_size};
    variants.apply(s);
    s.backward = backward;
    s.d_v = d_v == d_head ? 0 : d_v;
    validate_shape(s);
    return s;
}

}  // namespace flash_attention::cli
