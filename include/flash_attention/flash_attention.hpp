#pragma once

// Public API: attention, O = softmax(Q·Kᵀ·scale)·V, fp16/bf16, and its gradients; an FP8 (e4m3)
// forward on Hopper (ForwardParams).
// Plain C++: no CUDA headers are needed to include this file.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flash_attention/error.hpp"
#include "flash_attention/kernel_config.hpp"

struct CUstream_st;

namespace flash_attention {

using Stream = CUstream_st*;  // the same type as cudaStream_t; nullptr is the default stream

// The largest sizes a call takes: batch and heads index grid dimensions of at most 65535;
// lengths and positions are 32-bit ints in the kernels, and 2^30 keeps a position plus a
// tile's overshoot far inside that range.
inline constexpr std::int64_t k_max_batch = 65535;
inline constexpr std::int64_t k_max_heads = 65535;
inline constexpr std::int64_t k_max_seq = std::int64_t{1} << 30;
// The softmax scale a call takes is positive, finite and below this: the kernels work in
// base 2, and scale * log2(e) must be a finite float.
inline constexpr double k_max_softmax_scale =
    std::numeric_limits<float>::max() / std::numbers::log2e;

// A 4-D tensor in device memory laid out (batch, seq, heads, d_head). Strides are in
// elements; d_head must have unit stride, the other three are free.
struct TensorView {
    void* data = nullptr;
    DType dtype = DType::FP16;
    std::array<std::int64_t, 4> shape{};   // batch, seq, heads, d_head
    std::array<std::int64_t, 4> stride{};  // in elements, same order

    // A densely packed (batch, seq, heads, d_head) tensor.
    static TensorView contiguous(void* data, DType dtype, std::int64_t batch, std::int64_t seq,
                                 std::int64_t heads, std::int64_t d_head);
};

// Where the causal mask's diagonal meets the keys when seq_q != seq_k. bottom_right: query i
// sees keys j <= i + seq_k - seq_q, the last query every key (FlashAttention >= 2.1, and
// decoding against a cache); top_left: query i sees keys j <= i (PyTorch SDPA's
// is_causal). The same when seq_q == seq_k.
enum class CausalAlignment : int { bottom_right, top_left };

// Attention variants of today's models, shared by every entry point; the defaults leave
// plain attention. Query i's position on the diagonal is d(i) = i + seq_k - seq_q aligned at
// the bottom right, d(i) = i at the top left (causal_alignment, also without causal).
struct Variants {
    // Sliding window (flash_attn's window_size = (left, right); Mistral, Gemma-2/3 local
    // layers, gpt-oss): query i sees keys j with d(i) - window_left <= j <= d(i) +
    // window_right; -1 leaves that side unbounded. Causal masking is window_right 0, so with
    // causal it must be -1 or 0. Blocks wholly outside the window are skipped: the cost
    // grows with the window, not the sequence.
    int window_left = -1;
    int window_right = -1;
    // Logit softcap (Gemma-2, Grok): scores become softcap * tanh(scores * softmax_scale /
    // softcap) before the softmax; 0 is off.
    float softcap = 0.0f;
    // Attention sinks (gpt-oss; FlashAttention-4's learnable_sink): device fp32, one logit
    // per query head, in the units of the scaled scores. It joins each row's softmax
    // denominator and contributes no value; the LSE includes it. A row that sees no key
    // then gets zeros and LSE sinks[head]. Null: none. Values are not checked (no host sync):
    // a NaN sink gives NaN rows.
    const float* sinks = nullptr;
    // ALiBi (BLOOM, MPT, Baichuan; flash_attn's alibi_slopes): device fp32 slopes, one per query
    // head, and with alibi_batch_stride heads_q one per (batch entry, query head), flash_attn's
    // (batch, heads) form (0: the batch shares them; varlen and KV-cache calls index entries by
    // sequence). Score (i, j) gets -slope * |d(i) - j| added in the units of the scaled scores,
    // after the softcap; the LSE includes it. (flash_attn's causal kernels add slope * j: the
    // same softmax, an LSE larger by slope * d(i).) Null: none. Values are not checked (no host
    // sync): a NaN slope gives NaN rows.
    const float* alibi_slopes = nullptr;
    std::int64_t alibi_batch_stride = 0;

    // Whether any variant is set: a config then runs its variant instantiation (decoding
    // shapes with sinks alone still take the split-KV kernels).
    bool any() const { return changes_scores() || sinks != nullptr; }
    // A sliding window, a softcap or ALiBi, which change the scores themselves: the split-KV
    // (decoding) kernels take none of them, only sinks.
    bool changes_scores() const {
        return window_left != -1 || window_right != -1 || softcap != 0.0f ||
               alibi_slopes != nullptr;
    }
};

// What every entry point takes besides its tensors: the scale, causal masking, the LSE
// output and the variants. One struct, so that a forward's options serve its backward too.
struct AttentionOptions {
    std::optional<float> softmax_scale;  // default 1/sqrt(d_head): see scale()
    // Query i sees keys j <= i + seq_k - seq_q (aligned at the bottom right, as
    // FlashAttention >= 2.1 does), or j <= i with causal_alignment top_left. A row that
    // sees no key gets zeros and LSE -inf. Varlen and KV-cache calls align each sequence.
    bool causal = false;
    CausalAlignment causal_alignment = CausalAlignment::bottom_right;
    // Optional output: log-sum-exp of each row's scaled scores, natural log, fp32,
    // contiguous; its layout is the entry point's (ForwardParams: (batch, heads_q, seq_q)).
    float* lse = nullptr;
    // Sliding window, softcap, sinks, ALiBi.
    Variants variants{};

    // The softmax scale the kernels use: softmax_scale, or 1/sqrt(d_head) when not given.
    float scale(std::int64_t d_head) const;
};

// FP8 (E4M3) inputs' dequantisation factors (real value = stored value x descale), flash_attn's
// q_descale, k_descale and v_descale: device fp32, (batch, heads_kv) contiguous, one per sequence
// and K/V head (a query head takes its K/V head's q factor). Each pointer is required, 4-byte
// aligned and may not overlap o or the LSE output. Values are not checked (no host sync): a zero
// factor works (an all-zero tensor's: its scores are all 0), as does any v factor; a q and k pair
// whose product is negative, and a NaN factor, give NaN rows (the kernels fold q's and k's into
// the softmax's scale).
struct Fp8Descales {
    const float* q = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
};

// q: (batch, seq_q, heads_q, d_head); k: (batch, seq_k, heads_kv, d_head); v: (batch, seq_k,
// heads_kv, d_v); o: (batch, seq_q, heads_q, d_v), with heads_q a multiple of heads_kv
// (grouped-query and multi-query attention: query head h reads K/V head h / (heads_q /
// heads_kv)). Any seq_q, seq_k >= 1; d_head 64, 96, 128, 192 or 256; d_v = d_head, or 128 with
// d_head 192 (DeepSeek's MLA). The softmax scale's default is 1/sqrt(d_head).
// FP8 attention (Hopper; forward() and forward_kvcache()): q, k and v E4M3 with o BF16 and
// `descales`, on the dequantised inputs. It takes d_head 64, 128 or 256 with d_v = d_head, no
// window, softcap, sinks or ALiBi yet; causal masking, GQA and the LSE as 16-bit inputs. Decoding
// shapes, and every shape at a head dim where the build has no sm90 FP8 kernel for it, run on
// forward_kvcache's split-KV kernel (below); the rest on the sm90 family's FP8 kernels.
struct ForwardParams {
    TensorView q;
    TensorView k;
    TensorView v;
    TensorView o;  // written; may not alias q, k or v
    AttentionOptions options{};
    // Required with E4M3 inputs, refused with FP16 or BF16 ones. Last, so that positional
    // initialisers written before it still compile.
    std::optional<Fp8Descales> descales{};
};

// Serving (inference engines, padding-free training): batches of sequences of different
// lengths, a paged KV cache, and split-KV decoding. Lengths and page ids live in device
// memory and are never read on the host, so a call does not synchronise and can be
// captured in a CUDA graph; what the host cannot check is documented per field. The
// query heads that share a K/V head are processed together (PackGQA), and the keys of a
// sequence may be split across CTAs whose partial results are merged by their log-sum-exp:
// how the keys are split depends only on the call's shape, never on another sequence's
// length, so a row's result does not depend on the rest of the batch; it can differ in
// the last bits between split counts (a different summation order). One exception, for
// speed: without num_splits, speculative-decoding shapes (17 to 64 query rows a K/V head,
// seq_q > 1, 1024 keys or more) run the sm90 family's packed-GQA tiles instead of the
// split-KV kernel on Hopper where those tiles, one a (sequence, K/V head), fill three
// quarters of the SMs, so the last bits of such a row can differ between batches on either
// side of that line. A num_splits of 1 or more keeps every shape on the split-KV kernel.

// The pages of a paged KV cache: k and v are then (num_pages, page_size, heads_kv, d_head)
// TensorViews and sequence b's key i lies in page block_table[b * row_stride + i /
// page_size], row i % page_size. page_size is k.shape[1] and must be a multiple of 16. A
// page id outside [0, num_pages) is never dereferenced: its keys read as zeros (scores 0,
// values 0), and KV append skips them. The strides are free; on Hopper the fast path
// (the sm90 kernels, for prefill-sized query counts) copies each run of a page's rows
// with all of a head's columns in one TMA box and needs the heads d_head elements apart
// (k.stride[2] == d_head, as in a packed cache): other caches run the split-KV kernel.
struct PageTable {
    const std::int32_t* block_table = nullptr;  // device memory, (batch, max_pages_per_seq)
    std::int64_t max_pages_per_seq = 0;
    std::int64_t row_stride = 0;  // elements between sequences' rows; 0: max_pages_per_seq
};

// flash_attn_varlen_func: sequences of different lengths packed along one token axis.
// q: (1, total_q, heads_q, d_head), o: (1, total_q, heads_q, d_v); k: (1, total_k, heads_kv,
// d_head) and v (..., d_v) packed the same way, or the pages of `pages` (d_v: V's head dim,
// d_head or 128 with 192, DeepSeek's MLA, which runs on the sm90 family only). Sequence b's queries
// are rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) and, without pages, its keys rows [cu_seqlens_k[b],
// cu_seqlens_k[b+1]). Offsets are device int32 arrays of batch + 1 non-decreasing values from 0; a
// sequence that reaches past its tensor is cut at the tensor's end (never read or written outside
// it), and a query row of no sequence is left unwritten.
struct VarlenParams {
    TensorView q;
    TensorView k;
    TensorView v;
    TensorView o;  // written; may not alias q, k or v
    const std::int32_t* cu_seqlens_q = nullptr;
    const std::int32_t* cu_seqlens_k = nullptr;  // required without pages; with pages optional
    // Keys sequence b uses: seqused_k[b] of its keys, the rest ignored. Required with pages
    // when cu_seqlens_k is not given.
    const std::int32_t* seqused_k = nullptr;
    std::int64_t batch = 0;  // sequences: the offsets hold batch + 1 values
    // At least every sequence's query length and at most the packed rows, q.shape[1] (it sizes
    // the grid).
    std::int64_t max_seqlen_q = 0;
    std::int64_t max_seqlen_k = 0;  // at least every sequence's key length (chooses splits)
    std::optional<PageTable> pages;
    // 0: the library's choice: queries that fill tiles (not a decoding shape) run on the
    // kernel forward() would choose for the longest sequence when it is an sm90 one
    // (Hopper; packed or paged K/V alike), anything else on the serving kernel with a key
    // split of its choosing. n >= 1: the serving kernel with n key ranges per sequence. A
    // sliding window, softcap or ALiBi runs on the sm90 kernel whatever n is (the serving kernel
    // takes none of them), as flash_attn honours them with any num_splits. The serving kernel
    // is built at d_head 64, 128 and 256: other head dims (96, 192, MLA) refuse n >= 1 and run
    // on the sm90 family only.
    int num_splits = 0;
    // Causal masking and the variants per sequence; the LSE output is (heads_q, total_q).
    AttentionOptions options{};
};

// flash_attn_with_kvcache: decoding and chunked prefill against a KV cache.
// q: (batch, seq_q, heads_q, d_head), o: (..., d_v). k_cache: (batch_cache, seq_cache,
// heads_kv, d_head) and v_cache (..., d_v) with batch_cache >= batch (sequence b uses entry b),
// or the pages of `pages` (d_v as in VarlenParams). Sequence b attends to its first
// cache_seqlens[b] keys plus k_new's seq_new (appended first; causal masking aligns the queries
// with the end of those keys).
struct KVCacheParams {
    TensorView q;
    TensorView k_cache;
    TensorView v_cache;
    TensorView o;  // written; may not alias q or the caches
    // Device int32, (batch): keys in the cache before this call. Null: every sequence
    // uses all seq_cache keys (contiguous cache, no k_new only). Lengths past the cache's
    // capacity are cut to it.
    const std::int32_t* cache_seqlens = nullptr;
    std::optional<PageTable> pages;
    // KV append: (batch, seq_new, heads_kv, d_head), v_new's d_v, written into the caches at rows
    // cache_seqlens[b] + [0, seq_new) before attention (rows past the capacity are
    // dropped). Both or neither; needs cache_seqlens.
    std::optional<TensorView> k_new;
    std::optional<TensorView> v_new;
    int num_splits = 0;  // as VarlenParams::num_splits
    // Causal masking and the variants per sequence; the LSE output is (batch, heads_q, seq_q).
    AttentionOptions options{};
    // An FP8 cache: q, k_cache and v_cache (k_new and v_new too) E4M3, o BF16, and their
    // dequantisation factors, (batch, heads_kv) each (ForwardParams' FP8 limits). It runs on the
    // split-KV kernel whatever the shape, which streams the e4m3 bytes and converts them exactly
    // to fp16 for its MMAs: decoding reads half a 16-bit cache's bytes; prefill through it runs
    // at mma.sync's speed, not at the sm90 FP8 kernels' (forward()).
    std::optional<Fp8Descales> descales{};
};

// The largest num_splits a call takes.
inline constexpr int k_max_splits = 256;

// Both throw flash_attention::Error on invalid input or a CUDA failure, before any launch
// for everything the host can check.
void forward_varlen(const VarlenParams& params, Stream stream = nullptr);
void forward_kvcache(const KVCacheParams& params, Stream stream = nullptr);

// The kernel a call runs: a KernelConfig's, or the split-KV serving kernel (decoding
// shapes, a requested split count, GPUs without the sm90 family) with its number of key
// ranges per sequence (1: unsplit). Without num_splits, the split count is the one `tune
// --kvcache` recorded in the tuning cache for this GPU, dtype, d_head, key-length bucket,
// query rows per K/V head and kind of cache (paged or not), else the library's heuristic;
// never the batch's.
struct KernelChoice {
    std::optional<KernelConfig> config;
    int splits = 0;  // the split-KV kernel's key ranges, when config is empty

    // The config's short form, or "split-KV (PackGQA), N splits".
    std::string to_string() const;
};

// What forward_varlen and forward_kvcache would run for these parameters on the current
// device: the same checks and choice, nothing launched. Throws as the call would.
KernelChoice chosen_kernel(const VarlenParams& params);
KernelChoice chosen_kernel(const KVCacheParams& params);

// A GPU as the library sees it: what decides which kernels run on it, and what the
// tuning cache is keyed by.
struct DeviceProperties {
    int index = -1;                // CUDA device ordinal; -1 for a model
    std::string name;              // as CUDA reports it, e.g. "NVIDIA H100 80GB HBM3"
    int major = 0, minor = 0;      // compute capability
    int sm_count = 0;              // streaming multiprocessors
    int smem_per_block_optin = 0;  // bytes of shared memory one CTA may opt into
    int l2_bytes = 0;              // of L2 cache: sizes the causal tile order's sections of heads

    // The current CUDA device, queried once per device and process. Throws
    // ErrorCode::no_device when there is none or it is older than compute capability 8.0.
    static const DeviceProperties& current();
    // A device model, no GPU needed: "a100" (A100-SXM4-80GB) or "h100" (H100 SXM5, 132
    // SMs). Throws ErrorCode::invalid_argument naming the known models otherwise.
    static DeviceProperties model(std::string_view name);

    // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)".
    std::string description() const;
};

// CUDA devices this process sees: 0 without a GPU or a driver (never throws).
int device_count();

// What the automatic choice depends on, without data: dense tensors of this shape.
struct ProblemShape {
    DType dtype = DType::BF16;  // E4M3: FP8 attention (forward(), forward_kvcache): BF16 output
    int d_head = 128;           // Q's and K's
    std::int64_t batch = 1;
    std::int64_t seq_q = 1;
    std::int64_t seq_k = 1;
    std::int64_t heads = 1;     // query heads
    std::int64_t heads_kv = 1;  // key/value heads, dividing the query heads
    bool causal = false;
    // A sliding window, a softcap or ALiBi (Variants::changes_scores): the configs' variant
    // kernels run, which the tuning cache keys apart, and never the split-KV kernels.
    bool window_or_softcap = false;
    // V's and O's head dim where it differs from d_head (DeepSeek's MLA: 192 and 128), else 0.
    int d_v = 0;
};

// Throws the Error forward() would for dense tensors of this shape with these options,
// without data or a GPU: dtype, head dim and sizes (as choose_config), the softmax scale,
// and the variants' bounds (the window with problem.causal, the softcap; sinks are device
// memory and not read); with dtype E4M3, FP8 attention's limits (its head dims, no variants;
// the descales are data, judged with the tensors). A command line judges its arguments with it
// before it looks for a GPU.
void validate(const ProblemShape& problem, std::optional<float> softmax_scale = std::nullopt,
              const Variants& variants = {});

// Runs the kernel the library chooses for this problem and device: the winner that
// `flash_attention tune` recorded for this GPU, dtype, d_head and sequence-length bucket
// in the tuning cache ($FLASH_ATTENTION_TUNING, else $XDG_CACHE_HOME/flash_attention/tuning.json,
// else ~/.cache/flash_attention/tuning.json),
// else a built-in table. The cache is read once per process; a missing, corrupt or stale
// cache only means the built-in table is used.
// Decoding shapes (at most 64 query rows per K/V head: seq_q x heads_q / heads_kv <= 64,
// and seq_k >= 1024) run on forward_kvcache's split-KV kernels instead, which have no
// KernelConfig (chosen_kernel() says which runs).
// Throws flash_attention::Error on invalid input or a CUDA failure.
void forward(const ForwardParams& params, Stream stream = nullptr);

// Runs exactly the named kernel; throws ErrorCode::not_built if it was not compiled.
void forward(const ForwardParams& params, const KernelConfig& config, Stream stream = nullptr);

// The kernel the automatic choice would run for these parameters on the current device.
// For decoding shapes, which forward() sends to the split-KV kernel, choose_config names
// the config it would run otherwise; chosen_kernel names the kernel that runs.
KernelConfig choose_config(const ForwardParams& params);
KernelChoice chosen_kernel(const ForwardParams& params);

// The kernel the automatic choice would run for dense tensors of this shape on `device`
// (a model or a real GPU), reading the tuning cache as forward() does. Throws Error for
// an invalid shape or when no built kernel runs it there.
KernelConfig choose_config(const ProblemShape& problem, const DeviceProperties& device);
// The kernel forward() runs for dense tensors of this shape on `device`: choose_config's, or
// for decoding shapes the split-KV kernel with the split count the call would use. A shape
// carries no sinks: with them a packgqa config's problems run on the split-KV kernel.
KernelChoice chosen_kernel(const ProblemShape& problem, const DeviceProperties& device);

// The gradients of forward(): given dO = ∂loss/∂O, writes dQ, dK and dV. P is recomputed from
// Q, K and the forward's log-sum-exp, so the forward must have written its LSE (options.lse).
// Shapes as ForwardParams': q, dq (batch, seq_q, heads_q, d_head); o, d_o (batch, seq_q,
// heads_q, d_v); k, dk (batch, seq_k, heads_kv, d_head); v, dv (batch, seq_k, heads_kv, d_v),
// d_v = d_head but for DeepSeek's MLA (192 with 128). With grouped-query attention a K/V head's dK
// and dV are summed over the query heads that share it, without expanding K and V. Any strides
// (unit d_head stride); the outputs may not overlap each other or the inputs.
struct BackwardParams {
    TensorView q;
    TensorView k;
    TensorView v;
    TensorView o;    // the forward's output
    TensorView d_o;  // ∂loss/∂O
    TensorView dq;   // written
    TensorView dk;   // written
    TensorView dv;   // written
    // The forward's options: the same scale, causal masking and variants. options.lse is the
    // forward's LSE, (batch, heads_q, seq_q) fp32, read; it is required (with sinks or ALiBi,
    // the one that includes them, as forward() writes it). ALiBi's slopes get no gradient.
    AttentionOptions options{};
    // Optional: ∂loss/∂LSE, (batch, heads_q, seq_q) fp32, where the forward's LSE output feeds
    // the loss too (its gradient joins dS = P ∘ (dP - D + dLSE)). Null: zero.
    const float* d_lse = nullptr;
    // Bitwise-identical gradients from run to run, and a row's independent of the rest of the
    // batch: the sm90 family then adds each query block's dQ in key-block order (ordered_dq);
    // sm80 kernels always are. false: the fastest kernel, whose fp32 dQ additions may land in
    // any order (last-bit differences from run to run).
    bool deterministic = false;
    // Optional (last, so that positional initialisers written before it still compile), with
    // options.variants.sinks: ∂loss/∂sinks, (heads_q,) fp32 device memory, written (not
    // accumulated): dsinks[h] = Σ over the batch's rows of head h of exp(sinks[h] - LSE) · (dLSE -
    // rowsum(dO ∘ O)), summed in one fixed order (the same bits from run to run, deterministic or
    // not); it overlaps no tensor, LSE, sink or ALiBi slope the call reads. Null: not computed.
    float* d_sinks = nullptr;
};

// The gradients of forward_varlen() over packed sequences (no pages): given dO, writes dQ, dK
// and dV. q, dq: (1, total_q, heads_q, d_head); o, d_o: (1, total_q, heads_q, d_v); k, dk: (1,
// total_k, heads_kv, d_head); v, dv: (1, total_k, heads_kv, d_v); sequence b's queries are rows
// [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and its keys rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]),
// of which it uses the first seqused_k[b] when given. options as the forward's (causal masking and
// the variants per sequence); options.lse is the forward's (heads_q, total_q) LSE, d_lse its
// gradient of that shape or null. Every row of dq, dk and dv that no sequence uses (past
// cu_seqlens[batch], keys past seqused_k) is written as zeros. Lengths are read on the device: no
// host synchronisation. max_seqlen_q and max_seqlen_k bound every sequence's lengths (they size the
// grid; max_seqlen_q at most the packed rows, q.shape[1]).
struct VarlenBackwardParams {
    TensorView q;
    TensorView k;
    TensorView v;
    TensorView o;
    TensorView d_o;
    TensorView dq;  // written
    TensorView dk;  // written
    TensorView dv;  // written
    const std::int32_t* cu_seqlens_q = nullptr;
    const std::int32_t* cu_seqlens_k = nullptr;
    const std::int32_t* seqused_k = nullptr;
    std::int64_t batch = 0;
    std::int64_t max_seqlen_q = 0;
    std::int64_t max_seqlen_k = 0;
    AttentionOptions options{};
    const float* d_lse = nullptr;
    bool deterministic = false;
    float* d_sinks = nullptr;  // (heads_q,), as BackwardParams'
};

// Runs the backward kernels the library chooses, on `stream`: the winner that `flash_attention
// tune --backward` recorded in the tuning cache for this GPU, dtype, d_head, sequence-length
// bucket and causal or not, else the built-in table's for this GPU, dtype and head dim; with
// params.deterministic a deterministic one (`tune --backward --deterministic` records those
// apart). Extra device memory: backward_workspace_bytes(), O(seq), from the library's
// stream-ordered pool; no host synchronisation (CUDA-graph capturable). Throws
// flash_attention::Error on invalid input or a CUDA failure, before any launch for everything the
// host can check.
void backward(const BackwardParams& params, Stream stream = nullptr);

// The gradients of forward_varlen() (VarlenBackwardParams), on the automatic choice's kernels or
// the named config's. Throws flash_attention::Error as backward() does.
void backward_varlen(const VarlenBackwardParams& params, Stream stream = nullptr);
void backward_varlen(const VarlenBackwardParams& params, const KernelConfig& config,
                     Stream stream = nullptr);

// Runs exactly the named backward kernel (a config with `bwd`; with params.deterministic, one
// that is: sm80, or sm90 with `ordered`); throws ErrorCode::not_built if it was not compiled.
void backward(const BackwardParams& params, const KernelConfig& config, Stream stream = nullptr);

// The backward kernel the automatic choice runs for dense tensors of this shape on `device`
// (deterministic: one whose gradients are bitwise identical from run to run), reading the tuning
// cache as backward() does.
KernelConfig choose_backward_config(const ProblemShape& problem, const DeviceProperties& device,
                                    bool deterministic = false);

// Whether a backward config's gradients are bitwise identical from run to run (sm80; sm90 with
// ordered_dq).
bool is_deterministic(const KernelConfig& config);

// Device memory a backward call of this shape takes besides its tensors with the automatic
// choice on the current device, or with `config`, in bytes: D = rowsum(dO ∘ O), one float per
// query row and head; the sm90 family adds the LSE in base 2 (one float a row) and dQ's fp32
// accumulator (d_head floats a row), its rows padded to whole blocks of 128 queries. O(seq).
// A stream-K config (streamk) on a non-causal shape that it splits adds, on the current device
// (none without a GPU), two slots a CTA of B_c x (d_head + d_v) floats and an int a split key
// block (at most 4/3 of the SMs): at most (2 x B_c x (d_head + d_v) + 2) x SMs x 4 bytes,
// whatever the length.
std::size_t backward_workspace_bytes(const ProblemShape& problem);
std::size_t backward_workspace_bytes(const ProblemShape& problem, const KernelConfig& config);

// Makes the next automatic choice read the tuning cache file again.
void reload_tuning_cache();

// The library's stream-ordered pool keeps the device memory its calls' scratch took (the
// backward's workspace, whose dQ accumulator is twice Q's bytes; split-KV partials; stream-K
// slots) mapped after they return, so that the next call's allocation is a lookup and not a
// driver mapping; memory other allocators (PyTorch's) cannot use. This hands back what no call
// still queued holds, on every device the library has run on; the next call maps its scratch
// again. Throws flash_attention::Error on a CUDA failure.
void release_cached_memory();

// The library's version, "MAJOR.MINOR.PATCH" (the CMake project's VERSION).
std::string_view version();

// Every config compiled into this build, in KernelConfig order.
const std::vector<KernelConfig>& configs();

// Whether this build holds a kernel for the config.
bool is_built(const KernelConfig& config);

// Whether the config is built and the current device can run it (sm90-family kernels
// need compute capability 9.0; the CTA's shared memory must fit the device). False when
// there is no device (or none of compute capability 8.0 or later).
bool is_supported(const KernelConfig& config);

// Why a forward config cannot run problems of this shape, with sinks or not, on any device, or
// an empty string: a packgqa config takes query heads a power-of-two multiple of the K/V heads
// (at most 64 times) and no window, softcap, ALiBi or sinks. forward() with the config throws
// Error(unsupported) with this reason.
std::string shape_problem(const KernelConfig& config, const ProblemShape& problem,
                          bool sinks = false);

// Dynamic shared memory one CTA of the config's kernel takes, in bytes (built or not).
std::size_t shared_memory_bytes(const KernelConfig& config);

}  // namespace flash_attention
