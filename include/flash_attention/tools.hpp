#pragma once

// The tools API: what the flash_attention command line, the tests and benchmarks use beyond
// forward(), for programs that measure, check or tune the library. Link
// flash_attention::tools. Plain C++: no CUDA headers are needed to include this file.
//
//   flash_attention::tools      the kernel sets and what a kernel asks of a GPU; device
//                               tensors and launch timers
//   flash_attention::reference  attention in double precision on the CPU, and the
//                               FlashAttention error rule that `run --check` and the tests apply
//   flash_attention::tuning     the tuning cache's file: what `tune` writes and the automatic
//                               choice reads
//
// The automatic choice itself is the public API's choose_config() / chosen_kernel().

#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention::reference {

// CPU reference attention in double precision, and the FlashAttention test rule: a kernel
// passes when max|out - ref| <= 2 * max|naive - ref| + slack, where "naive" is the textbook
// computation in the same 16-bit dtype (matmul rounded to dtype, softmax rounded to dtype,
// matmul rounded to dtype), as PyTorch would do it, and the slack 1e-3. FP8 inputs (E4M3 Q, K
// and V with their descales, a BF16 output) have FlashAttention-3's FP8 computation as their
// naive one and a slack of their own (k_fp8_output_slack).

// An element's encoding and its value. E4M3's byte is the low 8 bits; its values are e4m3fn's
// (no infinities, NaN 0x7F and 0xFF, largest finite 448).
float to_float(DType dtype, std::uint16_t bits);
// Round to nearest even. E4M3 saturates as cvt.rn.satfinite.e4m3x2.f32 does: a magnitude beyond
// 448 (infinity too) becomes 448 with its sign, and NaN becomes 0x7F.
std::uint16_t from_float(DType dtype, float value);

// A contiguous (batch, seq, heads, d_head) tensor on the host: each element's encoding
// (to_float's) and its exact float value.
struct HostTensor {
    DType dtype = DType::FP16;
    std::int64_t batch = 0, seq = 0, heads = 0, d_head = 0;
    std::vector<std::uint16_t> bits;
    std::vector<float> values;

    std::int64_t size() const { return batch * seq * heads * d_head; }
    std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h) const {
        return ((b * seq + s) * heads + h) * d_head;
    }

    // Standard normal values rounded to dtype, drawn in parallel from `seed`.
    static HostTensor random_normal(DType dtype, std::int64_t batch, std::int64_t seq,
                                    std::int64_t heads, std::int64_t d_head, std::uint64_t seed);
    static HostTensor from_bits(DType dtype, std::int64_t batch, std::int64_t seq,
                                std::int64_t heads, std::int64_t d_head,
                                std::vector<std::uint16_t> bits);
};

struct RowSample {
    std::int64_t batch, head, row;
};

// Up to rows_per_head query rows per (batch, head), one drawn from each of
// rows_per_head equal strata so every part of the sequence (every warp's and every
// CTA's rows, over many draws) gets checked; all rows when seq <= rows_per_head.
std::vector<RowSample> sample_rows(std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                   std::int64_t rows_per_head, std::uint64_t seed);

// A problem and a kernel's answer to it. K and V may have fewer heads than Q (GQA/MQA:
// query head h reads K/V head h / (q.heads / k.heads)). Query i's diagonal position is
// d = i + seq_k - seq_q (bottom-right aligned), or with `top_left` d = i; with `causal` it
// sees keys j <= d, and with a sliding window d - window_left <= j <= d + window_right (-1:
// unbounded). `softcap` (0: off) turns scores s into softcap * tanh(s / softcap), ALiBi then
// adds its bias; `sinks` (per query head) join each row's denominator. `lse`, when given, is the
// kernel's log-sum-exp, (batch, q.heads, q.seq) contiguous, natural log.
//
// FP8: q, k and v all E4M3 and out BF16, with descales, the fp32 factors that turn the stored
// values back into the inputs (input = value x descale), one per batch entry and K/V head:
// descale[b * k.heads + h] (flash_attn's (batch, heads_kv) layout; a query head takes its K/V
// head's). The reference attends over those inputs; the naive computation is the FP8 one
// FlashAttention-3 runs (reference.cpp). Softcap, ALiBi and sinks are refused with FP8: their
// place in that computation is not settled.
struct Problem {
    const HostTensor& q;
    const HostTensor& k;  // q's head dim
    const HostTensor& v;  // its own head dim (DeepSeek's MLA: 128 with 192), O's
    const HostTensor& out;
    double scale;
    bool causal = false;
    const std::vector<float>* lse = nullptr;
    bool top_left = false;
    int window_left = -1;
    int window_right = -1;
    double softcap = 0;
    const std::vector<float>* sinks = nullptr;
    // ALiBi: slopes[b * alibi_batch_stride + h] (0: one a head), -slope * |d - j| added to the
    // scaled (and softcapped) scores; null: none.
    const std::vector<float>* alibi_slopes = nullptr;
    std::int64_t alibi_batch_stride = 0;
    // E4M3 inputs' descales, each batch x k.heads values; null with 16-bit inputs.
    const std::vector<float>* q_descale = nullptr;
    const std::vector<float>* k_descale = nullptr;
    const std::vector<float>* v_descale = nullptr;
};

// The FP8 output's slack, relative to the largest |reference output| on the checked rows: one
// bf16 ulp there (an ulp is at most 2^-7 of the value). A kernel can differ from the naive FP8
// computation by the rounding of its own output, half an ulp, where the naive one's output
// rounding happened to land near the reference (its measured error then understates it), half
// an ulp more. An absolute 1e-3 suits neither end: descaled inputs have any magnitude (outputs
// of order 100 are 0.5 apart in bf16, of order 0.01 a thousandth of that), and the a priori
// bound |O| <= max|V| x v_descale, met by a row attending to one key, is far above the outputs
// of rows spread over many keys, of order max|V| x v_descale / sqrt(keys): at 4096 keys of
// normal inputs an ulp of it is a third of the largest output, and past some 50 000 keys more
// than the outputs themselves (an all-zero O would pass).
inline constexpr double k_fp8_output_slack = 0x1p-7;

// Hopper's FP8 tensor cores add each k-step's 32 products into the fp32 accumulator at about 14
// bits (DeepSeek-V3's measurement of FP8 GEMMs on H800), not fp32's 24: an error of up to this
// fraction of the magnitudes summed, a k-step. The naive FP8 computation sums in fp32, so FP8's
// LSE bound adds, per row, (d_head / 32) k-steps x this x the largest sum of |q x k| over the
// row's keys, in the scores' units: the kernel's S on an H100 was off by 1.7e-4 at 4.83 (sums of
// magnitude 84, a probe of one wgmma), and its LSE by up to 0.0029 against a naive error of
// 2e-6 (2026-12-06), while O stayed within its bound.
inline constexpr double k_fp8_accumulation = 0x1p-13;

// The LSE's slack: its error bound is 2 x the error of a naive fp32 LSE (scores accumulated
// and scaled in fp32) + this. The naive error carries the fp32 rounding of the scaled scores,
// which alone exceeds a fixed bound where a row's LSE is large (thousands at a scale of 100:
// one unit in the last place is 2.4e-4 to 4.9e-4 there, and the kernels' row max is fp32);
// at ordinary scales the kernels' error is about 1e-6. FP8's LSE takes the same: its row sum adds
// the fp32 probabilities before their rounding to e4m3, so its errors are the 16-bit path's
// (fp32 scores, exp2, the sum, log2).
inline constexpr double k_lse_tolerance = 1e-3;

struct CheckResult {
    double max_error = 0;        // max |out - ref| over the sampled rows
    double naive_max_error = 0;  // max |naive same-dtype - ref| over the same rows
    double tolerance = 0;        // 2 * naive_max_error + the slack (1e-3; FP8: see above)
    std::int64_t rows_checked = 0;
    std::int64_t non_finite = 0;  // NaN/Inf anywhere in out: unwritten (poisoned) or broken
    double lse_max_error = 0;     // max |lse - ref| (0 when not checked; -inf must match exactly)
    double lse_naive_max_error = 0;  // max |naive fp32 lse - ref| over the same rows
    double lse_tolerance = 0;        // 2 * lse_naive_max_error + k_lse_tolerance
    bool passed = false;

    std::string summary() const;
};

// Compares the kernel's output (and LSE) with the double-precision reference on the
// sampled rows and checks every element of the output is finite. Runs on all hardware
// threads. Throws std::invalid_argument, naming the argument, for head dims or dtypes that do
// not fit together (k and v of q's dtype; out of q's, BF16 for E4M3) and for descales missing,
// of the wrong size or given with 16-bit inputs.
CheckResult check_attention(const Problem& problem, const std::vector<RowSample>& rows);
// Full attention, no mask, equal heads.
CheckResult check_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                            const HostTensor& out, double softmax_scale,
                            const std::vector<RowSample>& rows);

// The gradients of attention (q, k, v with dO = ∂loss/∂O; causal at either alignment, a sliding
// window, sinks, a softcap and ALiBi, as Problem's) and a kernel's dQ, dK and dV (and dsinks),
// compared with double precision by the FlashAttention rule: each gradient's max|kernel - ref| <= 2
// * max|naive - ref| + k_gradient_slack * max(1, max|ref|), where the naive computation rounds
// every matmul and softmax product to the 16-bit dtype as PyTorch's math attention in that dtype
// would.
struct BackwardProblem {
    const HostTensor& q;
    const HostTensor& k;
    const HostTensor& v;
    const HostTensor& d_o;  // q's shape with v's head dim (O's)
    const HostTensor& dq;   // the kernel's, q's shape
    const HostTensor& dk;   // k's shape (summed over the query heads of a K/V head)
    const HostTensor& dv;   // v's shape
    double scale;
    bool causal = false;
    bool top_left = false;
    // Attention sinks, one logit per query head (the forward's), or null; with them, the
    // kernel's dsinks (one per query head) are checked too: every row of every head enters.
    const std::vector<float>* sinks = nullptr;
    const std::vector<float>* d_sinks = nullptr;
    // Logit softcap (0: none): scores become softcap · tanh(scores / softcap) after the scale.
    double softcap = 0;
    // Sliding window sides (-1: unbounded), and ALiBi, as Problem's.
    int window_left = -1;
    int window_right = -1;
    const std::vector<float>* alibi_slopes = nullptr;
    std::int64_t alibi_batch_stride = 0;
};

// The slack, relative to the largest reference gradient (at least 1): the same 1e-3 as the
// forward's absolute slack on outputs of order one.
inline constexpr double k_gradient_slack = 1e-3;

struct BackwardCheck {
    CheckResult dq, dk, dv;  // dq on the sampled query rows, dk and dv on the sampled key rows
    CheckResult d_sinks;     // with BackwardProblem::sinks: every head's (else passed, 0 rows)
    bool passed = false;

    std::string summary() const;
};

// query_rows: (batch, query head, row) samples; key_rows: (batch, K/V head, key) samples
// (sample_rows with k.heads and k.seq). Every query row of a sampled key's K/V head enters its
// dK and dV. Runs on all hardware threads.
BackwardCheck check_attention_backward(const BackwardProblem& problem,
                                       const std::vector<RowSample>& query_rows,
                                       const std::vector<RowSample>& key_rows);

}  // namespace flash_attention::reference

namespace flash_attention::tuning {

// The tuning cache: which config `flash_attention tune` measured fastest for a
// (GPU, dtype, d_head, sequence-length bucket) key, for decoding shapes on the split-KV
// kernel (`tune --kvcache`) which number of key ranges per sequence, and for the backward
// pass (`tune --backward [--deterministic]`) which backward config. A JSON file shared by
// the command line, which writes it, and the library's automatic choice, which reads it.
//
// The file: {"version": 1, "entries": [...]}, an entry an object of its key's fields and its
// winner: "gpu", "sm_count", "dtype" ("FP16" or "BF16"), "d_head", "seq_bucket", "causal",
// optionally "d_v" (V's head dim where it differs), "window_or_softcap" and "paged" (true),
// optionally "lengths" ("few-queries" or "short-keys": Lengths; absent, general),
// "rows_bucket" with "splits" for a split count, else "config" (a short form); "tflops",
// "measured", and optionally the runner-up
// ("runner_up" or "runner_up_splits", and "runner_up_tflops"). A backward entry adds
// "pass": "backward" or "backward-deterministic" and holds a backward config (`bwd`; for
// "backward-deterministic" one that is_deterministic()) and none of "window_or_softcap",
// "paged" or "rows_bucket"; an entry without "pass" is the forward's. A split count's entry has
// no "lengths" (its rows bucket tells the proportions). A malformed entry is
// skipped with a warning.
//
// Location: $FLASH_ATTENTION_TUNING, else $XDG_CACHE_HOME/flash_attention/tuning.json
// (an absolute XDG_CACHE_HOME: the XDG spec ignores a relative one), else
// $HOME/.cache/flash_attention/tuning.json, else none (the built-in table alone).

// The pass whose kernel a key's entry names. Each has keys of its own, so a backward winner
// never displaces a forward one, nor a deterministic one the fastest.
enum class Pass {
    forward,                 // forward() and the serving entry points' split counts
    backward,                // backward()
    backward_deterministic,  // backward() with BackwardParams::deterministic
};

// The pass's name in the file's "pass" field and in Key::to_string(): "forward", "backward" or
// "backward-deterministic".
std::string_view to_string(Pass pass);

// The proportions of a problem's lengths that the automatic choice's built-in table tells
// apart at one longest length (its packed-GQA and short-key rows): a key holds one of them, so
// that a winner tuned on a square problem never serves speculative decoding or cross-attention
// of the same bucket, nor theirs the square problem.
enum class Lengths {
    general,      // neither of the others
    few_queries,  // at most k_few_queries queries over more keys (speculative decoding)
    short_keys,   // at most k_short_keys keys under more queries (cross-attention)
};
inline constexpr long long k_few_queries = 64;
inline constexpr long long k_short_keys = 256;
Lengths lengths_of(long long seq_q, long long seq_k);
// "general", "few-queries" or "short-keys": the file's "lengths" field and Key::to_string().
std::string_view to_string(Lengths lengths);

struct Key {
    std::string gpu;  // device name as CUDA reports it
    int sm_count = 0;
    DType dtype = DType::FP16;
    int d_head = 0;
    int seq_bucket = 0;  // see seq_bucket()
    bool causal = false;
    // 0: a kernel config for forward()'s problems. Else a split count for the split-KV
    // kernel, and this the bucket of its query rows per K/V head (seq_q x heads / heads_kv,
    // the smallest power of two at least that): one key never depends on the batch.
    int rows_bucket = 0;
    // ProblemShape::window_or_softcap: a winner among the configs' variant kernels, kept
    // apart from the plain kernels' (read as a fallback).
    bool window_or_softcap = false;
    // A split count for a paged cache's keys (rows_bucket > 0): its plan differs from a
    // contiguous cache's (serving::plan_for), so their counts are kept apart.
    bool paged = false;
    // A backward key (Key::of_backward): a config of backward(), without variants or splits.
    Pass pass = Pass::forward;
    // ProblemShape::d_v: V's head dim where it differs from d_head, else 0.
    int d_v = 0;
    // lengths_of(seq_q, seq_k) for a config's key; general for a split count's.
    Lengths lengths = Lengths::general;

    friend auto operator<=>(const Key&, const Key&) = default;
    std::string to_string() const;
    // The key of a problem on a device: the one place that says what a key is made of.
    static Key of(const DeviceProperties& device, const ProblemShape& problem);
    // The key of a problem's split count on the split-KV kernel, its keys in a paged cache
    // or not.
    static Key of_splits(const DeviceProperties& device, const ProblemShape& problem, bool paged);
    // The key of a problem's backward kernel, the deterministic kernels' or any; a window or
    // softcap shares the plain problem's (its kernels are instances of the same configs).
    static Key of_backward(const DeviceProperties& device, const ProblemShape& problem,
                           bool deterministic);
};

// The bucket of a problem: the smallest power of two >= max(seq_q, seq_k), at least 64.
int seq_bucket(long long seq_q, long long seq_k);

// A key's winner: `config` when key.rows_bucket is 0 (a backward config for a backward key),
// else `splits` (and the runner-up likewise).
struct Entry {
    Key key;
    KernelConfig config;
    double tflops = 0;
    std::optional<KernelConfig> runner_up;
    double runner_up_tflops = 0;
    std::string measured;  // ISO 8601 UTC time of the measurement
    int splits = 0;
    int runner_up_splits = 0;  // 0: none
};

struct LoadResult {
    std::vector<Entry> entries;
    // One line per problem: unreadable or corrupt file, malformed entries skipped.
    std::vector<std::string> warnings;
    bool corrupt = false;  // the file exists but is not a tuning cache: nothing was read
};

// $FLASH_ATTENTION_TUNING, else under $XDG_CACHE_HOME (if absolute), else under $HOME;
// none when none of them is set (never a file of the working directory, which may be
// anyone's).
std::optional<std::filesystem::path> default_path();

// The largest cache file read: a real one holds a few hundred entries of ~300 bytes.
inline constexpr std::size_t k_max_file_bytes = 4 << 20;

// A missing file is an empty cache without warnings. Anything but a regular file (a FIFO,
// a device, a folder) and files over k_max_file_bytes are corrupt, read without blocking;
// so is text whose arrays and objects nest more than 32 levels deep (a cache has three).
LoadResult load(const std::filesystem::path& path);
LoadResult parse(const std::string& json_text, const std::string& source_name);
std::string to_json(const std::vector<Entry>& entries);

// `existing` with every entry whose key `updates` holds replaced; other keys kept.
std::vector<Entry> merge(std::vector<Entry> existing, const std::vector<Entry>& updates);

// Creates the folders it goes in, then writes through write_file_atomically
// (tools::write_file_atomically): readers and a crash mid-write see either the old file or the
// new one. Throws Error on failure.
void save_atomically(const std::filesystem::path& path, const std::vector<Entry>& entries);

// How update() waits while another process (another tune run) holds the lock.
struct LockWait {
    std::chrono::milliseconds timeout = std::chrono::seconds(60);
    // Called once, with the lock file's path, when the lock is found taken.
    std::function<void(const std::string& lock_path)> waiting;
    // Polled while waiting (every 50 ms): true gives up at once (Ctrl-C).
    std::function<bool()> interrupted;
};

// update() gave up waiting for the lock: `timeout` passed, or `interrupted` said so.
// Nothing was written.
class LockNotTaken : public std::runtime_error {
  public:
    LockNotTaken(const std::string& message, bool interrupted)
        : std::runtime_error(message), interrupted(interrupted) {}
    bool interrupted;
};

// Merges `entries` into the file as it is now: under an exclusive lock on `path`.lock
// (creating the folders and the lock file if missing), reads the file, merges, saves
// atomically. Concurrent writers (two tune runs) keep each other's entries. A corrupt file
// is first moved to `path`.corrupt. Returns the warnings of reading the file. Throws
// LockNotTaken as `wait` says, Error if the lock or the write fails.
std::vector<std::string> update(const std::filesystem::path& path,
                                const std::vector<Entry>& entries, const LockWait& wait = {});

// Throws the Error update() would for what can be told without creating anything (a run
// that fails before it measures leaves no folder or lock file behind): the path is no
// folder or device, the nearest existing folder above it can be written, and its lock file
// is not a link or anything but a regular file.
void check_path(const std::filesystem::path& path);

// check_path, then what only trying tells, before a long tune rather than after it:
// creates the folders and a temporary file in them, which it removes. Takes no lock and
// creates no lock file.
void check_writable(const std::filesystem::path& path);

}  // namespace flash_attention::tuning

namespace flash_attention::tools {

// Names accepted by kernel_set(): release (the built-in table's kernels: the default
// build), ci, progression, progression-all, progression-sm90, tune, tune-sm80, tune-sm90,
// tune-backward, all.
std::vector<std::string_view> kernel_set_names();

// The configs of a named set, sorted and unique (the progression ladders in step order), of
// "@FILE" (short forms, one per line, "#" starting a comment) or of a comma-separated union
// such as "tune,progression". Throws Error (invalid_argument) naming the set and the known
// names, or the file and line that is no short form.
std::vector<KernelConfig> kernel_set(std::string_view name);

// The name of the kernel set this build was generated from (-DFLASH_KERNELS).
std::string_view built_kernel_set();

// Whether the kernel template can be instantiated for the config (the config space's validity
// rules; its pruning rules, which drop configs not worth building, are not asked).
bool instantiable(const KernelConfig& config);

// What one config asks of a GPU, as `flash_attention list` shows it.
struct KernelInfo {
    bool built = false;
    std::size_t smem_bytes = 0;  // dynamic shared memory of one CTA
    // CTAs per SM: the occupancy calculator's on the current GPU for a built kernel
    // (measured), else bounded by shared memory and threads on the family's smallest
    // target, an A100 (sm90: an H100).
    int ctas_per_sm = 0;
    bool measured = false;
    // Registers and local memory (spills, stack) per thread: known only for a built kernel
    // with a GPU present, else -1.
    int registers_per_thread = -1;
    int local_bytes_per_thread = -1;
};
KernelInfo kernel_info(const KernelConfig& config);

class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return data_; }
    std::size_t bytes() const { return bytes_; }

    // Synchronous on the whole device: an upload or the poison has landed before any stream's
    // later work, and a download sees every stream's earlier work.
    void upload(const std::vector<std::uint16_t>& host);
    void upload(const std::vector<std::int32_t>& host);  // lengths, offsets, page tables
    void upload(const std::vector<std::uint8_t>& host);  // 8-bit (E4M3) tensors
    void upload(const std::vector<float>& host);         // attention sinks
    std::vector<std::uint16_t> download() const;
    std::vector<float> download_floats() const;  // a float buffer (the log-sum-exp)
    // Every byte 0xFF: NaN in both fp16 and bf16, so an element the kernel never
    // writes fails the check instead of passing as a stale value.
    void poison_with_nan();

  private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// A device copy of a contiguous host tensor (element_bytes(dtype) an element), and a view of it.
struct DeviceTensor {
    DeviceBuffer buffer;
    TensorView view;

    static DeviceTensor upload(const reference::HostTensor& host);
    static DeviceTensor empty_like(const reference::HostTensor& host);
    reference::HostTensor download(const reference::HostTensor& shape_of) const;
};

// Times up to `capacity` launches queued back to back on one stream: events around each,
// one synchronisation at the end, so the GPU never idles between the timed kernels.
class LaunchTimes {
  public:
    explicit LaunchTimes(int capacity);
    ~LaunchTimes();
    LaunchTimes(const LaunchTimes&) = delete;
    LaunchTimes& operator=(const LaunchTimes&) = delete;
    void before(int i, Stream stream);
    void after(int i, Stream stream);
    // Waits for launch n-1 to finish; milliseconds of launches 0..n-1.
    std::vector<double> elapsed_ms(int n);

  private:
    std::vector<void*> start_, stop_;
};

// `text` fit to quote in a one-line message: control characters written as escapes
// (\n, \t, \x00, ...) and bytes that are not UTF-8 as \xNN, cut after at most max_bytes at a
// character boundary with "..." appended when cut.
std::string printable(std::string_view text, std::size_t max_bytes = 100);

// Writes `text` to `path` through a fresh temporary file in the same folder, renamed over
// `path` when complete: readers and a crash mid-write see the old file or the new one, and a
// failure leaves the old file and no temporary file. Returns why it failed, or "".
std::string write_file_atomically(const std::filesystem::path& path, std::string_view text);

// Why write_file_atomically(path) would fail, as far as can be told without creating
// anything (with create_folders, the nearest existing folder above a missing one is
// checked), or "".
std::string write_problem(const std::filesystem::path& path, bool create_folders);

// Waits for the current device's work; throws Error (cuda) if any of it failed.
void synchronize();

// Device memory free on the current device, in bytes.
std::size_t free_device_bytes();

}  // namespace flash_attention::tools
