// The serving entry points: forward_varlen (packed sequences) and forward_kvcache
// (decoding against a KV cache, with append). Everything the host can see is checked
// before any launch; the kernels (kernels/serving) cut device-side lengths and page ids
// to the tensors they were given.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <tuple>
#include <utility>

#include "api/choice.hpp"
#include "api/kernel_args.hpp"
#include "api/validate.hpp"
#include "config/config_space.hpp"
#include "kernels/serving/launch.hpp"
#include "kernels/sm90/tensor_maps.hpp"
#include "registry/registry.hpp"
#include "tuning/tuning_cache.hpp"

namespace flash_attention {

namespace {

using serving::AppendArgs;
using serving::KeySource;
using serving::SplitKvArgs;

// q (its heads and d_head) against k and v: the same d_head, a supported one, and query
// heads a multiple of the K/V heads.
void check_heads(const TensorView& q, const TensorView& k, const char* k_name) {
    if (!space::is_head_dim(q.shape[3])) {
        fail(ErrorCode::unsupported, "q.shape[3] (d_head)", space::head_dims_text(),
             std::to_string(q.shape[3]));
    }
    check_dim(k, k_name, 3, "d_head", q.shape[3], "q's");
    if (q.shape[2] % k.shape[2] != 0) {
        fail(ErrorCode::invalid_argument, "q.shape[2] (heads)",
             "a multiple of " + std::string(k_name) + "'s heads " + std::to_string(k.shape[2]) +
                 " (grouped-query attention)",
             std::to_string(q.shape[2]));
    }
}

// V (or its new rows) against K: the same entries, rows and heads; a head dim of q's d_head, or
// one the config space pairs with it (DeepSeek's MLA: 192 with V's 128).
void check_values(const TensorView& v, const char* v_name, const TensorView& k, const char* k_name,
                  std::int64_t d_head) {
    for (const auto& [i, dim_name] : {std::pair{0, "batch"}, {1, "seq"}, {2, "heads"}})
        check_dim(v, v_name, i, dim_name, k.shape[i], std::string(k_name) + "'s");
    if (!space::is_value_dim(d_head, v.shape[3])) {
        fail(ErrorCode::unsupported, std::string(v_name) + ".shape[3] (d_v)",
             space::value_dims_text(static_cast<int>(d_head)), std::to_string(v.shape[3]));
    }
}

// O: q's shape with V's head dim.
void check_output_shape(const TensorView& o, const TensorView& q, const TensorView& v,
                        const char* v_name) {
    for (const auto& [i, dim_name] : {std::pair{0, "batch"}, {1, "seq"}, {2, "heads"}})
        check_dim(o, "o", i, dim_name, q.shape[i], "q's");
    check_dim(o, "o", 3, "d_v", v.shape[3], std::string(v_name) + "'s");
}

// The pages: k and v are (num_pages, page_size, heads_kv, d_head); the table, batch rows of
// max_pages_per_seq entries row_stride apart, inside the address space (the kernels index it
// in 64 bits). Returns its span in entries.
std::int64_t check_pages(const PageTable& pages, const TensorView& k, std::int64_t batch) {
    if (k.shape[1] % 16 != 0) {
        fail(ErrorCode::invalid_argument, "k.shape[1] (page_size)",
             "a multiple of 16 (paged cache)", std::to_string(k.shape[1]));
    }
    check_int_array(pages.block_table, "pages.block_table", true, "(batch, max_pages_per_seq)");
    check_range("pages.max_pages_per_seq", pages.max_pages_per_seq, 1,
                std::numeric_limits<std::int32_t>::max() / k.shape[1]);
    if (pages.row_stride != 0 && pages.row_stride < pages.max_pages_per_seq) {
        fail(ErrorCode::invalid_argument, "pages.row_stride",
             "0 or at least max_pages_per_seq " + std::to_string(pages.max_pages_per_seq),
             std::to_string(pages.row_stride));
    }
    const std::int64_t stride = pages.row_stride != 0 ? pages.row_stride : pages.max_pages_per_seq;
    std::int64_t span = 0;
    if (__builtin_mul_overflow(batch - 1, stride, &span) ||
        __builtin_add_overflow(span, pages.max_pages_per_seq, &span) ||
        span > std::numeric_limits<std::int64_t>::max() / 4) {
        fail(ErrorCode::invalid_argument, "pages.row_stride",
             "a stride whose table of " + std::to_string(batch) + " rows fits the address space",
             std::to_string(pages.row_stride));
    }
    check_float_rows(pages.block_table, "pages.block_table", span, "(batch, max_pages_per_seq)",
                     {});
    return span;
}

// The K/V source shared by both entry points.
KeySource key_source(const TensorView& k, const TensorView& v,
                     const std::optional<PageTable>& pages) {
    KeySource ks{};
    ks.k = k.data;
    ks.v = v.data;
    ks.k_stride = strides(k);
    ks.v_stride = strides(v);
    ks.seq = static_cast<int>(k.shape[1]);
    ks.view_batch = static_cast<int>(k.shape[0]);
    if (pages) {
        ks.block_table = pages->block_table;
        ks.block_table_stride =
            pages->row_stride != 0 ? pages->row_stride : pages->max_pages_per_seq;
        ks.max_pages = static_cast<int>(pages->max_pages_per_seq);
    }
    return ks;
}

// The split-KV kernel's arguments of a call: its tensors and options (sinks, no window or
// softcap or ALiBi: the route refused those).
SplitKvArgs attention_args(const TensorView& q, const TensorView& o, const TensorView& k,
                           const AttentionOptions& options,
                           const std::optional<Fp8Descales>& descales = std::nullopt) {
    const SoftmaxScale scale = softmax_scale(options, q.shape[3]);
    SplitKvArgs a{};
    a.q = q.data;
    a.o = o.data;
    a.q_stride = strides(q);
    a.o_stride = strides(o);
    a.heads = static_cast<int>(q.shape[2]);
    a.heads_kv = static_cast<int>(k.shape[2]);
    a.view_seq_q = static_cast<int>(q.shape[1]);
    a.causal = options.causal;
    a.top_left = options.causal_alignment == CausalAlignment::top_left;
    a.sinks = options.variants.sinks;
    a.softmax_scale = scale.scale;
    a.scale_log2 = scale.scale_log2;
    a.lse = options.lse;
    if (descales) {
        a.q_descale = descales->q;
        a.k_descale = descales->k;
        a.v_descale = descales->v;
    }
    a.partial_rows = q.shape[0] * q.shape[1] * q.shape[2];
    return a;
}

// Packed rows (query position x query heads of a K/V head) are ints in the split-KV kernel and
// the sm90 pack_gqa tiles (pack_gqa_problem()'s bound).
void check_packed_rows(std::int64_t seq_q, const TensorView& q, const TensorView& k) {
    const std::int64_t group = q.shape[2] / k.shape[2];
    if (seq_q * group > std::numeric_limits<std::int32_t>::max() - 256) {
        fail(ErrorCode::invalid_argument, "q.shape",
             "query length x (query heads / K/V heads) below 2^31 - 256",
             std::to_string(seq_q) + " x " + std::to_string(group));
    }
}

// Where a serving call runs. Sequences whose queries fill tiles (not a decoding shape) run
// on the sm90 family, at forward()'s speed: the config forward() would choose for the
// longest sequence, when it is an sm90 one and TMA can address the tensors (pages
// included). A requested split count, decoding shapes and other GPUs take the split-KV
// kernel, with the requested splits, else the tuning cache's, else plan_splits' own.
struct Route {
    std::optional<KernelConfig> sm90;
    int requested_splits = 0;
};

// The split count to ask the split-KV kernel for: the call's, else the tuning cache's for
// this kind of cache (paged or not).
int requested_splits(const ProblemShape& shape, const DeviceProperties& device, int num_splits,
                     bool paged) {
    if (num_splits != 0)
        return num_splits;
    return tuning::lookup_splits(tuning::Key::of_splits(device, shape, paged)).value_or(0);
}

// The split-KV kernel has no V head dim of its own: every d_head that has one is refused there by
// its d_head (DeepSeek's 192) before V's could be.
static_assert(std::ranges::none_of(space::k_value_dims,
                                   [](const auto& dims) { return serving::has_split_kv(dims[0]); }),
              "a d_head with a V head dim of its own and a split-KV kernel: refuse d_v in route()");

// A sliding window, a softcap or ALiBi runs on the sm90 family whatever the shape (runs_split_kv
// says no to them) and whatever num_splits asks (a hint of the split-KV kernel's, which takes
// neither; sinks it does): flash_attn honours them with any num_splits, and its own tests pass
// explicit ones.
// page_size: rows per page of a paged cache, 0 for contiguous keys.
Route route(const ProblemShape& shape, const ForwardParams& views, int num_splits,
            std::int64_t page_size) {
    const DeviceProperties& device = DeviceProperties::current();
    const bool paged = page_size != 0;
    // An FP8 cache: the split-KV kernel's e4m3 instances, on Hopper (FP8 attention's GPUs).
    if (shape.dtype == DType::E4M3) {
        check_fp8_device(device, "q.dtype");
        return {std::nullopt, requested_splits(shape, device, num_splits, paged)};
    }
    // A paged cache's K and V need their heads d_head apart too (sm90::paged_maps_problem).
    const auto paged_maps_fit = [&](const TensorView& cache, const char* name) {
        return sm90::paged_maps_problem(name, cache.shape[2], cache.shape[3], cache.stride[2])
            .empty();
    };
    const bool tma_fits =
        tma_problem(views).empty() &&
        (!paged || (paged_maps_fit(views.k, "k") && paged_maps_fit(views.v, "v")));
    const ChoiceProblem problem{shape, true, page_size, views.options.variants.any()};
    if ((num_splits == 0 || shape.window_or_softcap) && tma_fits &&
        !runs_split_kv(problem, device)) {
        const std::optional<KernelConfig> config = find_kernel_for(problem, device);
        if (config && config->family == Family::sm90)
            return {config, 0};
    }
    if (shape.window_or_softcap) {
        const Variants& v = views.options.variants;
        fail(ErrorCode::unsupported, "variants",
             "no sliding window, softcap or ALiBi here: forward_varlen and forward_kvcache run "
             "them on the sm90 family only (a Hopper GPU with its kernels built, "
             "TMA-addressable K/V)",
             "window (" + std::to_string(v.window_left) + ", " + std::to_string(v.window_right) +
                 "), softcap " + std::to_string(v.softcap) +
                 (v.alibi_slopes != nullptr ? ", ALiBi" : ""));
    }
    if (!serving::has_split_kv(shape.d_head)) {
        fail(ErrorCode::unsupported, "q.shape[3] (d_head)",
             "64, 128 or 256 for the split-KV kernel (d_head " + std::to_string(shape.d_head) +
                 " runs on the sm90 family only: a Hopper GPU with its kernels built, "
                 "TMA-addressable K/V and num_splits 0)",
             std::to_string(shape.d_head));
    }
    return {std::nullopt, requested_splits(shape, device, num_splits, paged)};
}

// Rows per page of the keys' cache, 0 without pages (k is then the keys themselves).
std::int64_t rows_per_page(const TensorView& k, const std::optional<PageTable>& pages) {
    return pages ? k.shape[1] : 0;
}

// paged: the keys are a paged cache's (the split plan differs).
KernelChoice choice_of(const Route& r, const ProblemShape& shape, bool paged) {
    if (r.sm90)
        return {r.sm90, 0};
    const std::int64_t rows = shape.seq_q * (shape.heads / shape.heads_kv);
    return {std::nullopt, serving::plan_for(shape.d_head, shape.dtype, rows, shape.seq_k, paged,
                                            r.requested_splits)
                              .splits};
}

void launch_sm90(const KernelConfig& config, const ProblemShape& shape, const ForwardParams& views,
                 SequenceArgs seqs, Stream stream) {
    const DeviceProperties& device = DeviceProperties::current();
    validate_config(views, config, device);
    KernelArgs args = kernel_args(views, device);
    args.batch = static_cast<int>(shape.batch);
    args.seq_q = static_cast<int>(shape.seq_q);
    args.seq_k = static_cast<int>(shape.seq_k);
    args.seqs = seqs;
    find_kernel(config)->launch(args, stream);
}

// The sm90 kernels' view of a call's sequences: its offsets and lengths, the K/V source's
// pages, and the tensors' own shapes (page_copy_rows is the launch's to set).
SequenceArgs sequence_args(const TensorView& q, const TensorView& k, const KeySource& keys,
                           const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k,
                           const std::int32_t* seqused_k, int seqused_k_add) {
    return {.cu_seqlens_q = cu_seqlens_q,
            .cu_seqlens_k = cu_seqlens_k,
            .seqused_k = seqused_k,
            .seqused_k_add = seqused_k_add,
            .block_table = keys.block_table,
            .block_table_stride = keys.block_table_stride,
            .max_pages = keys.max_pages,
            .page_copy_rows = 0,
            .q_view_batch = static_cast<int>(q.shape[0]),
            .q_view_seq = static_cast<int>(q.shape[1]),
            .k_view_batch = static_cast<int>(k.shape[0]),
            .k_view_seq = static_cast<int>(k.shape[1])};
}

ProblemShape shape(const TensorView& q, const TensorView& k, const TensorView& v,
                   std::int64_t batch, std::int64_t seq_q, std::int64_t seq_k,
                   const AttentionOptions& options) {
    return {.dtype = q.dtype,
            .d_head = static_cast<int>(q.shape[3]),
            .batch = batch,
            .seq_q = seq_q,
            .seq_k = seq_k,
            .heads = q.shape[2],
            .heads_kv = k.shape[2],
            .causal = options.causal,
            .window_or_softcap = options.variants.changes_scores(),
            .d_v = value_dim_of(q, v)};
}

// Everything forward_varlen checks before a launch.
void check_varlen(const VarlenParams& p, Stream stream) {
    for (const auto& [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.o, "o"}}) {
        check_dtype(*t, name, p.q.dtype);
        check_layout(*t, name);
    }
    check_dim(p.q, "q", 0, "batch", 1, "packed tokens: (1, total_q, heads, d_head)");
    check_heads(p.q, p.k, "k");
    check_values(p.v, "v", p.k, "k", p.q.shape[3]);
    check_output_shape(p.o, p.q, p.v, "v");
    check_range("batch", p.batch, 1, k_max_batch);
    check_range("max_seqlen_q", p.max_seqlen_q, 1, p.q.shape[1]);
    check_range("max_seqlen_k", p.max_seqlen_k, 1, k_max_seq);
    check_range("num_splits", p.num_splits, 0, k_max_splits);
    check_int_array(p.cu_seqlens_q, "cu_seqlens_q", true, "of batch + 1 offsets");
    check_int_array(p.seqused_k, "seqused_k", false, "");
    std::int64_t table_span = 0;
    if (p.pages) {
        table_span = check_pages(*p.pages, p.k, p.batch);
        check_int_array(p.cu_seqlens_k, "cu_seqlens_k", false, "");
        if (p.cu_seqlens_k == nullptr && p.seqused_k == nullptr) {
            fail(ErrorCode::invalid_argument, "seqused_k",
                 "the key lengths (seqused_k or cu_seqlens_k) with a paged cache", "neither");
        }
    } else {
        check_dim(p.k, "k", 0, "batch", 1, "packed tokens: (1, total_k, heads_kv, d_head)");
        check_int_array(p.cu_seqlens_k, "cu_seqlens_k", true, "of batch + 1 offsets");
    }
    check_packed_rows(p.q.shape[1], p.q, p.k);
    const std::int64_t rows = p.q.shape[1] * p.q.shape[2];
    check_outputs_and_options(p.o, {{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}}, p.options, rows,
                              "(heads, total_q)", p.q.shape[3]);
    check_variant_arrays_apart(p.options, "variants.", p.q.shape[2], p.batch, {{&p.o, "o"}},
                               p.options.lse, rows);
    // The lengths and page table, read while other CTAs write O and the LSE.
    for (const auto& [array, name, count] :
         {std::tuple{static_cast<const void*>(p.cu_seqlens_q), "cu_seqlens_q", p.batch + 1},
          {p.cu_seqlens_k, "cu_seqlens_k", p.batch + 1},
          {p.seqused_k, "seqused_k", p.batch},
          {p.pages ? p.pages->block_table : nullptr, "pages.block_table", table_span}}) {
        check_float_rows(array, name, count, "int32", {{&p.o, "o"}});
        check_words_apart(array, count, name, p.options.lse, rows, "lse");
    }

    const DeviceProperties& device = DeviceProperties::current();
    check_on_device({{p.q.data, "q.data"},
                     {p.options.variants.sinks, "variants.sinks"},
                     {p.options.variants.alibi_slopes, "variants.alibi_slopes"},
                     {p.k.data, "k.data"},
                     {p.v.data, "v.data"},
                     {p.o.data, "o.data"},
                     {p.options.lse, "lse"},
                     {p.cu_seqlens_q, "cu_seqlens_q"},
                     {p.cu_seqlens_k, "cu_seqlens_k"},
                     {p.seqused_k, "seqused_k"},
                     {p.pages ? p.pages->block_table : nullptr, "pages.block_table"}},
                    device, stream);
}

ProblemShape varlen_shape(const VarlenParams& p) {
    return shape(p.q, p.k, p.v, p.batch, p.max_seqlen_q, p.max_seqlen_k, p.options);
}

ForwardParams varlen_views(const VarlenParams& p) {
    return {p.q, p.k, p.v, p.o, p.options};
}

// forward_kvcache's tensors as forward()'s (k and v the caches).
ForwardParams kvcache_views(const KVCacheParams& p) {
    return {p.q, p.k_cache, p.v_cache, p.o, p.options, p.descales};
}

// Everything forward_kvcache checks before a launch; returns k_new's length (0 without).
std::int64_t check_kvcache(const KVCacheParams& p, Stream stream) {
    const ForwardParams views = kvcache_views(p);
    check_attention_dtypes(views, "k_cache", "v_cache");
    for (const auto& [t, name] :
         {std::pair{&p.q, "q"}, {&p.k_cache, "k_cache"}, {&p.v_cache, "v_cache"}, {&p.o, "o"}})
        check_layout(*t, name);
    check_heads(p.q, p.k_cache, "k_cache");
    check_values(p.v_cache, "v_cache", p.k_cache, "k_cache", p.q.shape[3]);
    check_output_shape(p.o, p.q, p.v_cache, "v_cache");
    check_range("num_splits", p.num_splits, 0, k_max_splits);
    const std::int64_t batch = p.q.shape[0];
    const std::int64_t table_span = p.pages ? check_pages(*p.pages, p.k_cache, batch) : 0;
    if (!p.pages && p.k_cache.shape[0] < batch) {
        fail(ErrorCode::invalid_argument, "k_cache.shape[0] (batch)",
             "at least q's batch " + std::to_string(batch), std::to_string(p.k_cache.shape[0]));
    }
    check_int_array(p.cache_seqlens, "cache_seqlens", p.pages.has_value() || p.k_new.has_value(),
                    "of batch lengths (needed with pages and with k_new)");
    if (p.k_new.has_value() != p.v_new.has_value()) {
        fail(ErrorCode::invalid_argument, p.k_new ? "v_new" : "k_new",
             "a tensor when the other of k_new and v_new is given", "none");
    }
    std::int64_t seq_new = 0;
    if (p.k_new) {
        for (const auto& [t, name, cache, cache_name, dim_name] :
             {std::tuple{&*p.k_new, "k_new", &p.k_cache, "k_cache's", "d_head"},
              {&*p.v_new, "v_new", &p.v_cache, "v_cache's", "d_v"}}) {
            if (p.q.dtype != DType::E4M3) {
                check_dtype(*t, name, p.q.dtype);
            } else if (t->dtype != DType::E4M3) {
                fail(ErrorCode::dtype, std::string(name) + ".dtype", "E4M3 (the cache's)",
                     std::string(to_string(t->dtype)));
            }
            check_layout(*t, name);
            check_dim(*t, name, 0, "batch", batch, "q's");
            check_dim(*t, name, 2, "heads", cache->shape[2], cache_name);
            check_dim(*t, name, 3, dim_name, cache->shape[3], cache_name);
            for (const auto& [c, c_name] :
                 {std::pair{&p.k_cache, "k_cache"}, {&p.v_cache, "v_cache"}}) {
                if (overlap(*t, *c)) {
                    fail(ErrorCode::invalid_argument, name,
                         std::string("memory that does not overlap ") + c_name,
                         "an overlapping range");
                }
            }
        }
        check_dim(*p.v_new, "v_new", 1, "seq", p.k_new->shape[1], "k_new's");
        seq_new = p.k_new->shape[1];
    }
    check_packed_rows(p.q.shape[1], p.q, p.k_cache);
    if (p.q.dtype == DType::E4M3) {
        check_fp8_tensors(views);
    }
    const std::int64_t rows = batch * p.q.shape[2] * p.q.shape[1];
    check_outputs_and_options(p.o,
                              {{&p.q, "q"},
                               {&p.k_cache, "k_cache"},
                               {&p.v_cache, "v_cache"},
                               {p.k_new ? &*p.k_new : nullptr, "k_new"},
                               {p.v_new ? &*p.v_new : nullptr, "v_new"}},
                              p.options, rows, "(batch, heads, seq_q)", p.q.shape[3]);
    // With k_new the call writes the caches too: each a distinct row an element (a batch stride
    // of 0 would append two sequences to one row), apart from each other and from q; the
    // lengths, page table, variants' arrays and descales it reads apart from them.
    const TensorView* k_written = p.k_new ? &p.k_cache : nullptr;
    const TensorView* v_written = p.k_new ? &p.v_cache : nullptr;
    if (p.k_new) {
        check_output(p.k_cache, "k_cache", {{&p.q, "q"}, {&p.v_cache, "v_cache"}});
        check_output(p.v_cache, "v_cache", {{&p.q, "q"}});
        const std::initializer_list<std::pair<const TensorView*, const char*>> caches = {
            {&p.k_cache, "k_cache"}, {&p.v_cache, "v_cache"}};
        if (p.descales) {
            const std::int64_t factors = batch * p.k_cache.shape[2];
            for (const auto& [factor, name] : {std::pair{p.descales->q, "descales.q"},
                                               {p.descales->k, "descales.k"},
                                               {p.descales->v, "descales.v"}})
                check_float_rows(factor, name, factors, "(batch, heads_kv)", caches);
        }
    }
    check_variant_arrays_apart(p.options, "variants.", p.q.shape[2], batch,
                               {{&p.o, "o"}, {k_written, "k_cache"}, {v_written, "v_cache"}},
                               p.options.lse, rows);
    for (const auto& [array, name, count] :
         {std::tuple{static_cast<const void*>(p.cache_seqlens), "cache_seqlens", batch},
          {p.pages ? p.pages->block_table : nullptr, "pages.block_table", table_span}}) {
        check_float_rows(array, name, count, "int32",
                         {{&p.o, "o"}, {k_written, "k_cache"}, {v_written, "v_cache"}});
        check_words_apart(array, count, name, p.options.lse, rows, "lse");
    }

    const DeviceProperties& device = DeviceProperties::current();
    check_on_device({{p.q.data, "q.data"},
                     {p.options.variants.sinks, "variants.sinks"},
                     {p.options.variants.alibi_slopes, "variants.alibi_slopes"},
                     {p.k_cache.data, "k_cache.data"},
                     {p.v_cache.data, "v_cache.data"},
                     {p.o.data, "o.data"},
                     {p.options.lse, "lse"},
                     {p.cache_seqlens, "cache_seqlens"},
                     {p.k_new ? p.k_new->data : nullptr, "k_new.data"},
                     {p.v_new ? p.v_new->data : nullptr, "v_new.data"},
                     {p.pages ? p.pages->block_table : nullptr, "pages.block_table"},
                     {p.descales ? p.descales->q : nullptr, "descales.q"},
                     {p.descales ? p.descales->k : nullptr, "descales.k"},
                     {p.descales ? p.descales->v : nullptr, "descales.v"}},
                    device, stream);
    return seq_new;
}

// The keys a kvcache call's sequences may use: the cache's capacity.
std::int64_t cache_capacity(const KVCacheParams& p) {
    return p.pages ? p.pages->max_pages_per_seq * p.k_cache.shape[1] : p.k_cache.shape[1];
}

ProblemShape kvcache_shape(const KVCacheParams& p) {
    return shape(p.q, p.k_cache, p.v_cache, p.q.shape[0], p.q.shape[1], cache_capacity(p),
                 p.options);
}

}  // namespace

KernelChoice split_kv_choice(const ProblemShape& shape, const DeviceProperties& device,
                             int num_splits) {
    return choice_of({std::nullopt, requested_splits(shape, device, num_splits, false)}, shape,
                     false);
}

std::string KernelChoice::to_string() const {
    if (config)
        return config->to_string();
    return "split-KV (PackGQA), " + std::to_string(splits) + (splits == 1 ? " split" : " splits");
}

KernelChoice chosen_kernel(const VarlenParams& p) {
    check_varlen(p, nullptr);
    const ProblemShape s = varlen_shape(p);
    return choice_of(route(s, varlen_views(p), p.num_splits, rows_per_page(p.k, p.pages)), s,
                     p.pages.has_value());
}

KernelChoice chosen_kernel(const KVCacheParams& p) {
    check_kvcache(p, nullptr);
    const ProblemShape s = kvcache_shape(p);
    return choice_of(route(s, kvcache_views(p), p.num_splits, rows_per_page(p.k_cache, p.pages)), s,
                     p.pages.has_value());
}

void forward_varlen(const VarlenParams& p, Stream stream) {
    check_varlen(p, stream);
    const KeySource keys = key_source(p.k, p.v, p.pages);
    const ProblemShape s = varlen_shape(p);
    const Route r = route(s, varlen_views(p), p.num_splits, rows_per_page(p.k, p.pages));
    if (r.sm90) {
        launch_sm90(*r.sm90, s, varlen_views(p),
                    sequence_args(p.q, p.k, keys, p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, 0),
                    stream);
        return;
    }
    SplitKvArgs a = attention_args(p.q, p.o, p.k, p.options);
    a.cu_seqlens_q = p.cu_seqlens_q;
    a.max_seq_q = static_cast<int>(p.max_seqlen_q);
    a.batch = static_cast<int>(p.batch);
    a.keys = keys;
    a.keys.cu_seqlens = p.cu_seqlens_k;
    a.keys.seqlens = p.seqused_k;
    serving::launch_attention(a, p.q.dtype, static_cast<int>(p.q.shape[3]), p.max_seqlen_k,
                              r.requested_splits, stream);
}

void forward_kvcache(const KVCacheParams& p, Stream stream) {
    const std::int64_t seq_new = check_kvcache(p, stream);
    const std::int64_t batch = p.q.shape[0];
    const KeySource keys = key_source(p.k_cache, p.v_cache, p.pages);
    // Routed before the append, so a call refused here leaves the cache as it was.
    const ProblemShape s = kvcache_shape(p);
    const Route r = route(s, kvcache_views(p), p.num_splits, rows_per_page(p.k_cache, p.pages));
    if (p.k_new && seq_new > 0) {
        AppendArgs a{};
        a.k_new = p.k_new->data;
        a.v_new = p.v_new->data;
        a.k_new_stride = strides(*p.k_new);
        a.v_new_stride = strides(*p.v_new);
        a.k_cache = p.k_cache.data;
        a.v_cache = p.v_cache.data;
        a.k_stride = keys.k_stride;
        a.v_stride = keys.v_stride;
        a.cache_seqlens = p.cache_seqlens;
        a.seq_new = static_cast<int>(seq_new);
        a.d_head = static_cast<int>(p.q.shape[3]);
        a.d_v = static_cast<int>(p.v_cache.shape[3]);
        a.element_bytes = static_cast<int>(element_bytes(p.q.dtype));
        a.seq = keys.seq;
        a.view_batch = keys.view_batch;
        a.block_table = keys.block_table;
        a.block_table_stride = keys.block_table_stride;
        a.max_pages = keys.max_pages;
        serving::launch_append(a, static_cast<int>(batch), static_cast<int>(p.k_cache.shape[2]),
                               stream);
    }

    if (r.sm90) {
        launch_sm90(*r.sm90, s, kvcache_views(p),
                    sequence_args(p.q, p.k_cache, keys, nullptr, nullptr, p.cache_seqlens,
                                  static_cast<int>(seq_new)),
                    stream);
        return;
    }
    SplitKvArgs a = attention_args(p.q, p.o, p.k_cache, p.options, p.descales);
    a.max_seq_q = static_cast<int>(p.q.shape[1]);
    a.batch = static_cast<int>(batch);
    a.keys = keys;
    a.keys.seqlens = p.cache_seqlens;
    a.keys.seqlens_add = static_cast<int>(seq_new);
    serving::launch_attention(a, p.q.dtype, static_cast<int>(p.q.shape[3]), s.seq_k,
                              r.requested_splits, stream);
}

}  // namespace flash_attention
