// The backward entry point: checks, the automatic choice of a backward kernel, and its launch
// with D's workspace from the stream-ordered pool.

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "api/choice.hpp"
#include "api/kernel_args.hpp"
#include "api/validate.hpp"
#include "common/stream_scratch.hpp"
#include "config/builtin_choice.hpp"
#include "config/config_space.hpp"
#include "config/resources.hpp"
#include "kernels/key_block_scheduler.hpp"
#include "registry/registry.hpp"
#include "tuning/tuning_cache.hpp"

namespace flash_attention {

namespace {

void check_same_shape(const TensorView& t, const char* name, const TensorView& as,
                      const char* as_name) {
    for (int i = 0; i < 4; ++i) {
        if (t.shape[i] != as.shape[i]) {
            fail(ErrorCode::invalid_argument, shape_name(name, i),
                 std::to_string(as.shape[i]) + " (" + as_name + "'s)", std::to_string(t.shape[i]));
        }
    }
}

// d_sinks ((heads,) floats) overlaps none of the `count` floats at `other` (null: none).
void check_d_sinks_apart(const BackwardParams& p, const float* other, std::int64_t count,
                         const char* name) {
    check_words_apart(p.d_sinks, p.q.shape[2], "d_sinks", other, count, name);
}

// d_sinks, written before the main kernels run, overlaps none of the ALiBi slopes they read:
// (heads,) floats, or (batch, heads) with a batch stride (batch: the call's sequences).
void check_d_sinks_apart_from_slopes(const BackwardParams& p, std::int64_t batch) {
    const Variants& v = p.options.variants;
    const std::int64_t heads = p.q.shape[2];
    check_d_sinks_apart(p, v.alibi_slopes, v.alibi_batch_stride != 0 ? batch * heads : heads,
                        "options.variants.alibi_slopes");
}

// Shapes, dtypes, strides, alignment, aliasing and options; needs no GPU.
void validate_backward(const BackwardParams& p) {
    const std::array<std::pair<const TensorView*, const char*>, 8> tensors = {{{&p.q, "q"},
                                                                               {&p.k, "k"},
                                                                               {&p.v, "v"},
                                                                               {&p.o, "o"},
                                                                               {&p.d_o, "d_o"},
                                                                               {&p.dq, "dq"},
                                                                               {&p.dk, "dk"},
                                                                               {&p.dv, "dv"}}};
    for (const auto& [t, name] : tensors) {
        check_dtype(*t, name, p.q.dtype);
        check_layout(*t, name);
    }
    // The forward's shapes (validate_tensors), then the gradients' and dO's.
    validate_tensors(ForwardParams{p.q, p.k, p.v, p.o, {.softmax_scale = p.options.softmax_scale}});
    // dO has O's shape, dV V's (V's head dim may differ from Q's: DeepSeek's MLA).
    check_same_shape(p.d_o, "d_o", p.o, "o");
    check_same_shape(p.dq, "dq", p.q, "q");
    check_same_shape(p.dk, "dk", p.k, "k");
    check_same_shape(p.dv, "dv", p.v, "v");

    const std::initializer_list<std::pair<const TensorView*, const char*>> inputs = {
        {&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.o, "o"}, {&p.d_o, "d_o"}};
    check_output(p.dq, "dq", inputs);
    check_output(p.dk, "dk", inputs);
    check_output(p.dk, "dk", {{&p.dq, "dq"}});
    check_output(p.dv, "dv", inputs);
    check_output(p.dv, "dv", {{&p.dq, "dq"}, {&p.dk, "dk"}});

    const std::int64_t rows = p.q.shape[0] * p.q.shape[2] * p.q.shape[1];
    if (p.options.lse == nullptr) {
        fail(ErrorCode::invalid_argument, "options.lse",
             "the forward's log-sum-exp ((batch, heads, seq_q) fp32, which forward() writes "
             "where options.lse points)",
             "a null pointer");
    }
    const std::initializer_list<std::pair<const TensorView*, const char*>> outputs = {
        {&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}};
    check_float_rows(p.options.lse, "options.lse", rows, "(batch, heads, seq_q)", outputs);
    check_float_rows(p.d_lse, "d_lse", rows, "(batch, heads, seq_q)", outputs);
    check_options(p.options, p.q.shape[3], p.q.shape[2]);
    if (p.d_sinks != nullptr && p.options.variants.sinks == nullptr) {
        fail(ErrorCode::invalid_argument, "d_sinks",
             "null without options.variants.sinks (there is no sink to differentiate)",
             "a pointer");
    }
    // Written before the main kernels read their inputs and write dq, dk and dv: it overlaps
    // none of them, nor the LSE, dLSE and sinks it reads.
    const std::int64_t heads = p.q.shape[2];
    for (const auto& tensor : tensors)
        check_float_rows(p.d_sinks, "d_sinks", heads, "(heads,)", {tensor});
    check_d_sinks_apart(p, p.options.lse, rows, "options.lse");
    check_d_sinks_apart(p, p.d_lse, rows, "d_lse");
    check_d_sinks_apart(p, p.options.variants.sinks, heads, "options.variants.sinks");
    check_d_sinks_apart_from_slopes(p, p.q.shape[0]);
    // The sinks and slopes, read by every CTA, apart from the gradients other CTAs write.
    check_variant_arrays_apart(p.options, "options.variants.", heads, p.q.shape[0], outputs,
                               nullptr, 0);
}

// The forward's shape (with its window or softcap: the tuning cache keys those apart).
ProblemShape backward_shape(const BackwardParams& p) {
    return shape_of(ForwardParams{p.q, p.k, p.v, p.o, p.options});
}

// The tensors the sm90 backward copies with TMA (its tensor maps): Q, K, V and dO in, dK and dV
// out.
std::string backward_tma_problem(const BackwardParams& p) {
    return tma_problem(
        {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"d_o", &p.d_o}, {"dk", &p.dk}, {"dv", &p.dv}});
}

void validate_backward_config(const BackwardParams& p, const KernelConfig& c,
                              const DeviceProperties& device) {
    const auto wrong = [&](ErrorCode code, const std::string& expected) {
        throw Error(code, "config: expected " + expected + ", got " + c.to_string());
    };
    if (!c.backward)
        wrong(ErrorCode::invalid_argument, "a backward config (with bwd)");
    if (c.dtype != p.q.dtype)
        wrong(ErrorCode::invalid_argument, "dtype " + std::string(to_string(p.q.dtype)));
    if (c.d_head != p.q.shape[3])
        wrong(ErrorCode::invalid_argument, "d_head " + std::to_string(p.q.shape[3]));
    if (c.v_head_dim() != p.v.shape[3])
        wrong(ErrorCode::invalid_argument, "V's head dim " + std::to_string(p.v.shape[3]));
    if (const std::string problem = device_problem(c, device); !problem.empty())
        wrong(find_kernel(c) == nullptr ? ErrorCode::not_built : ErrorCode::unsupported, problem);
    if (p.deterministic && !is_deterministic(c)) {
        wrong(ErrorCode::invalid_argument,
              "a deterministic config for deterministic = true (sm80, or sm90 with ordered)");
    }
    if (c.family == Family::sm90) {
        if (const std::string problem = backward_tma_problem(p); !problem.empty())
            throw Error(ErrorCode::unsupported, problem + " with config " + c.to_string());
    }
}

BackwardArgs backward_args(const BackwardParams& p, const DeviceProperties& device) {
    const SoftmaxScale scale = softmax_scale(p.options, p.q.shape[3]);
    const auto seq_q = static_cast<int>(p.q.shape[1]);
    const auto seq_k = static_cast<int>(p.k.shape[1]);
    // A window that only states causal masking ((-1, 0), flash_attn's reading) runs the plain
    // causal kernels.
    const KeyBand band = key_band(p.options);
    const bool causal = p.options.causal || (band.left == k_unbounded_window && band.right == 0);
    // ALiBi runs on the band kernels too (their steps take its bias).
    const bool banded = band.left != k_unbounded_window ||
                        band.right != (causal ? 0 : k_unbounded_window) ||
                        p.options.variants.alibi_slopes != nullptr;
    return {.q = p.q.data,
            .k = p.k.data,
            .v = p.v.data,
            .o = p.o.data,
            .d_o = p.d_o.data,
            .dq = p.dq.data,
            .dk = p.dk.data,
            .dv = p.dv.data,
            .lse = p.options.lse,
            .d_lse = p.d_lse,
            .d = nullptr,
            .lse2 = nullptr,
            .dq_accum = nullptr,
            .dq_semaphores = nullptr,
            .tile_counter = nullptr,
            .q_rows = seq_q,
            .q_stride = strides(p.q),
            .k_stride = strides(p.k),
            .v_stride = strides(p.v),
            .o_stride = strides(p.o),
            .d_o_stride = strides(p.d_o),
            .dq_stride = strides(p.dq),
            .dk_stride = strides(p.dk),
            .dv_stride = strides(p.dv),
            .batch = static_cast<int>(p.q.shape[0]),
            .heads = static_cast<int>(p.q.shape[2]),
            .heads_kv = static_cast<int>(p.k.shape[2]),
            .seq_q = seq_q,
            .seq_k = seq_k,
            .causal = causal,
            .top_left = p.options.causal_alignment == CausalAlignment::top_left,
            .diagonal_seq_q = diagonal_queries(
                seq_q, seq_k, p.options.causal_alignment == CausalAlignment::top_left),
            .banded = banded,
            .band = band,
            .softmax_scale = p.options.scale(p.q.shape[3]),
            .scale_log2 = scale.scale_log2,
            .softcap_prescale = scale.softcap_prescale,
            .sm_count = device.sm_count,
            .sinks = p.options.variants.sinks,
            .d_sinks = p.d_sinks,
            .cu_seqlens_q = nullptr,
            .cu_seqlens_k = nullptr,
            .seqused_k = nullptr,
            .total_q = seq_q,
            .total_k = seq_k,
            .lse_rows = seq_q,
            .q_block = 1,  // launch_backward's, with the config's workspace
            .semaphore_rows = 0,
            .alibi_slopes = p.options.variants.alibi_slopes,
            .alibi_batch_stride = p.options.variants.alibi_batch_stride,
            .streamk_partials = nullptr,
            .streamk_counters = nullptr,
            .streamk_blocks = 0};
}

// The workspace from the stream-ordered pool, then the config's kernels.
void launch_backward(BackwardArgs args, const KernelConfig& config, Stream stream) {
    const bool packed = args.cu_seqlens_q != nullptr;
    const BackwardWorkspace w =
        packed ? backward_workspace_varlen(config, args.batch, args.heads, args.total_q, args.seq_q)
               : backward_workspace(config, args.batch, args.heads, args.seq_q);
    if (w.q_rows > std::numeric_limits<int>::max()) {
        fail(ErrorCode::invalid_argument, "q.shape[1] (seq)",
             "a length whose 128-row blocks stay below 2^31 rows", std::to_string(args.seq_q));
    }
    const StreamScratch workspace(w.bytes(), stream, false);
    float* const floats = static_cast<float*>(workspace.get());
    args.d = floats;
    args.lse2 = w.lse2_floats > 0 ? floats + w.lse2_offset() : nullptr;
    args.dq_accum = w.dq_floats > 0 ? floats + w.dq_offset() : nullptr;
    args.dq_semaphores =
        w.semaphores > 0 ? reinterpret_cast<int*>(floats + w.semaphore_offset()) : nullptr;
    args.tile_counter =
        w.counters > 0 ? reinterpret_cast<int*>(floats + w.counter_offset()) : nullptr;
    args.q_rows = static_cast<int>(w.q_rows);
    args.q_block = static_cast<int>(backward_q_block(config));
    args.semaphore_rows =
        packed ? static_cast<int>(backward_semaphore_rows(args.seq_q)) : args.q_rows;
    find_kernel(config)->launch_backward(args, stream);
}

void check_backward_on_device(
    const BackwardParams& p, const DeviceProperties& device, Stream stream,
    std::initializer_list<std::pair<const void*, const char*>> more = {}) {
    check_on_device({{p.q.data, "q.data"},
                     {p.k.data, "k.data"},
                     {p.v.data, "v.data"},
                     {p.o.data, "o.data"},
                     {p.d_o.data, "d_o.data"},
                     {p.dq.data, "dq.data"},
                     {p.dk.data, "dk.data"},
                     {p.dv.data, "dv.data"},
                     {p.options.lse, "options.lse"},
                     {p.d_lse, "d_lse"},
                     {p.options.variants.sinks, "options.variants.sinks"},
                     {p.options.variants.alibi_slopes, "options.variants.alibi_slopes"},
                     {p.d_sinks, "d_sinks"}},
                    device, stream);
    if (more.size() > 0)
        check_on_device(more, device, stream);
}

void launch_backward(const BackwardParams& p, const KernelConfig& config,
                     const DeviceProperties& device, Stream stream) {
    validate_backward_config(p, config, device);
    check_backward_on_device(p, device, stream);
    launch_backward(backward_args(p, device), config, stream);
}

// A packed call as dense tensors of one entry (total rows): what the dense checks and
// arguments read.
BackwardParams dense_view(const VarlenBackwardParams& p) {
    BackwardParams d{p.q,  p.k,  p.v,       p.o,     p.d_o,          p.dq,
                     p.dk, p.dv, p.options, p.d_lse, p.deterministic};
    d.d_sinks = p.d_sinks;
    return d;
}

// A packed call's arguments: the dense view's (one entry of total rows), then its sequences.
BackwardArgs varlen_args(const VarlenBackwardParams& p, const DeviceProperties& device) {
    BackwardArgs a = backward_args(dense_view(p), device);
    a.batch = static_cast<int>(p.batch);
    a.seq_q = static_cast<int>(p.max_seqlen_q);
    a.seq_k = static_cast<int>(p.max_seqlen_k);
    a.diagonal_seq_q = diagonal_queries(a.seq_q, a.seq_k, a.top_left);
    a.cu_seqlens_q = p.cu_seqlens_q;
    a.cu_seqlens_k = p.cu_seqlens_k;
    a.seqused_k = p.seqused_k;
    // The sm90 band kernels take packed sequences (their mask is each sequence's, causal
    // included), its plain ones dense tensors only; so do its schedules (one pair a section,
    // key-block order).
    a.banded = true;
    return a;
}

// The dense checks on the one-entry view, then the sequences'.
void validate_backward_varlen(const VarlenBackwardParams& p) {
    check_dim(p.q, "q", 0, "batch", 1, "packed tokens: (1, total_q, heads, d_head)");
    check_dim(p.k, "k", 0, "batch", 1, "packed tokens: (1, total_k, heads_kv, d_head)");
    validate_backward(dense_view(p));
    // As forward_varlen's: the grid's z extent holds the batch.
    check_range("batch", p.batch, 1, k_max_batch);
    check_d_sinks_apart_from_slopes(dense_view(p), p.batch);
    check_variant_arrays_apart(p.options, "options.variants.", p.q.shape[2], p.batch,
                               {{&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}}, nullptr, 0);
    check_range("max_seqlen_q", p.max_seqlen_q, 1, p.q.shape[1]);
    check_range("max_seqlen_k", p.max_seqlen_k, 1, k_max_seq);
    check_int_array(p.cu_seqlens_q, "cu_seqlens_q", true, "of batch + 1 offsets");
    check_int_array(p.cu_seqlens_k, "cu_seqlens_k", true, "of batch + 1 offsets");
    check_int_array(p.seqused_k, "seqused_k", false, "");
    // The lengths, read while other CTAs write the gradients.
    for (const auto& [array, name, count] :
         {std::tuple{p.cu_seqlens_q, "cu_seqlens_q", p.batch + 1},
          {p.cu_seqlens_k, "cu_seqlens_k", p.batch + 1},
          {p.seqused_k, "seqused_k", p.batch}}) {
        check_float_rows(array, name, count, "int32",
                         {{&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}});
        // d_sinks is written while other CTAs still read the lengths.
        check_words_apart(p.d_sinks, p.q.shape[2], "d_sinks", array, count, name);
    }
}

// The shape the automatic choice reads: the longest sequences, batch sequences.
ProblemShape varlen_backward_shape(const VarlenBackwardParams& p) {
    ProblemShape s = backward_shape(dense_view(p));
    s.batch = p.batch;
    s.seq_q = p.max_seqlen_q;
    s.seq_k = p.max_seqlen_k;
    return s;
}

void launch_backward_varlen(const VarlenBackwardParams& p, const KernelConfig& config,
                            const DeviceProperties& device, Stream stream) {
    validate_backward_config(dense_view(p), config, device);
    check_backward_on_device(dense_view(p), device, stream,
                             {{p.cu_seqlens_q, "cu_seqlens_q"},
                              {p.cu_seqlens_k, "cu_seqlens_k"},
                              {p.seqused_k, "seqused_k"}});
    launch_backward(varlen_args(p, device), config, stream);
}

}  // namespace

bool is_deterministic(const KernelConfig& config) {
    return config.family == Family::sm80 || config.sm90.ordered_dq;
}

namespace {

// tma_addressable false: tensors the sm90 family cannot copy (backward_tma_problem), which the
// sm80 kernels run.
KernelConfig choose_backward(const ProblemShape& problem, const DeviceProperties& device,
                             bool deterministic, bool tma_addressable) {
    validate_shape(problem);
    const auto fits = [&](const KernelConfig& c) {
        return c.backward && c.dtype == problem.dtype && c.d_head == problem.d_head &&
               c.d_v == problem.d_v && (!deterministic || is_deterministic(c)) &&
               device_problem(c, device).empty() && (c.family != Family::sm90 || tma_addressable);
    };
    // As the forward's choice: a cached config this build lacks, or one that cannot run here,
    // is skipped, so a stale cache costs speed, never a failure.
    if (const auto tuned = tuning::lookup(tuning::Key::of_backward(device, problem, deterministic));
        tuned && fits(*tuned))
        return *tuned;
    const std::int64_t seq = std::max(problem.seq_q, problem.seq_k);
    for (const space::BuiltinChoice& row : space::builtin_choices()) {
        if (fits(row.config) && row.admits(seq, problem.causal))
            return row.config;
    }
    // A build without the table's backward kernels: any built one that runs here.
    for (const KernelConfig& c : configs()) {
        if (fits(c))
            return c;
    }
    throw Error(
        ErrorCode::unsupported,
        "q: expected a dtype and d_head that a built backward kernel runs on " + device.name +
            " (kernel set \"" + std::string(built_kernel_set()) + "\"; see flash_attention list" +
            (tma_addressable ? "" : "; these tensors need an sm80-family one") + "), got " +
            std::string(to_string(problem.dtype)) + " d_head " + std::to_string(problem.d_head) +
            (problem.d_v != 0 ? " d_v " + std::to_string(problem.d_v) : ""));
}

}  // namespace

KernelConfig choose_backward_config(const ProblemShape& problem, const DeviceProperties& device,
                                    bool deterministic) {
    return choose_backward(problem, device, deterministic, true);
}

std::size_t backward_workspace_bytes(const ProblemShape& problem, const KernelConfig& config) {
    validate_shape(problem);
    // The config's own sizes (B_c, d_head, d_v) make the number: another problem's config would
    // give a plausible but wrong one.
    const auto wrong = [&](const std::string& expected) {
        throw Error(ErrorCode::invalid_argument,
                    "config: expected " + expected + ", got " + config.to_string());
    };
    if (!config.backward)
        wrong("a backward config (with bwd)");
    if (config.dtype != problem.dtype)
        wrong("dtype " + std::string(to_string(problem.dtype)));
    if (config.d_head != problem.d_head)
        wrong("d_head " + std::to_string(problem.d_head));
    if (config.d_v != problem.d_v)
        wrong("d_v " + std::to_string(problem.d_v != 0 ? problem.d_v : problem.d_head));
    std::size_t bytes =
        backward_workspace(config, problem.batch, problem.heads, problem.seq_q).bytes();
    // Stream-K's slots and counters where its kernel splits this shape on the current device
    // (dense, no window: the shape cannot tell, so at most these); none without a GPU.
    if (config.family == Family::sm90 && config.sm90.stream_k && !problem.causal &&
        device_count() > 0) {
        BackwardArgs a{};
        a.batch = static_cast<int>(problem.batch);
        a.heads = static_cast<int>(problem.heads);
        a.heads_kv = static_cast<int>(problem.heads_kv);
        a.seq_q = static_cast<int>(problem.seq_q);
        a.seq_k = static_cast<int>(problem.seq_k);
        // A CTA an SM: where the key blocks do not outnumber the SMs (the launch's fewer CTAs),
        // of() splits nothing either way.
        bytes +=
            sm90::BackwardStreamK::of(a, config.B_r, config.B_c,
                                      DeviceProperties::current().sm_count)
                .bytes(config.B_c, tile_columns(config.d_head) + tile_columns(config.v_head_dim()));
    }
    return bytes;
}

std::size_t backward_workspace_bytes(const ProblemShape& problem) {
    return backward_workspace_bytes(problem,
                                    choose_backward_config(problem, DeviceProperties::current()));
}

void backward(const BackwardParams& params, Stream stream) {
    validate_backward(params);
    const DeviceProperties& device = DeviceProperties::current();
    launch_backward(params,
                    choose_backward(backward_shape(params), device, params.deterministic,
                                    backward_tma_problem(params).empty()),
                    device, stream);
}

void backward(const BackwardParams& params, const KernelConfig& config, Stream stream) {
    validate_backward(params);
    launch_backward(params, config, DeviceProperties::current(), stream);
}

void backward_varlen(const VarlenBackwardParams& params, Stream stream) {
    validate_backward_varlen(params);
    const DeviceProperties& device = DeviceProperties::current();
    launch_backward_varlen(
        params,
        choose_backward(varlen_backward_shape(params), device, params.deterministic,
                        backward_tma_problem(dense_view(params)).empty()),
        device, stream);
}

void backward_varlen(const VarlenBackwardParams& params, const KernelConfig& config,
                     Stream stream) {
    validate_backward_varlen(params);
    launch_backward_varlen(params, config, DeviceProperties::current(), stream);
}

}  // namespace flash_attention
