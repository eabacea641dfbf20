#include "problem.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "commands.hpp"

namespace flash_attention::cli {

namespace {

using reference::HostTensor;

std::int64_t pages_per_sequence(const Shape& shape) {
    return shape.page_size > 0 ? (shape.seq_k + shape.page_size - 1) / shape.page_size : 0;
}

// `t` (batch, seq, heads, d) cut into pages of page_size rows, placed where `table` says;
// rows past seq (the last page's tail) are zeros.
HostTensor to_pages(const HostTensor& t, int page_size, const std::vector<std::int32_t>& table) {
    const std::int64_t per_seq = (t.seq + page_size - 1) / page_size;
    const std::int64_t row = t.heads * t.d_head;
    std::vector<std::uint16_t> bits(table.size() * page_size * row, 0);
    for (std::int64_t b = 0; b < t.batch; ++b) {
        for (std::int64_t p = 0; p < per_seq; ++p) {
            const std::int64_t page = table[b * per_seq + p];
            for (std::int64_t r = 0; r < page_size && p * page_size + r < t.seq; ++r) {
                const auto from = t.bits.begin() + t.offset(b, p * page_size + r, 0);
                std::copy(from, from + row, bits.begin() + (page * page_size + r) * row);
            }
        }
    }
    return HostTensor::from_bits(t.dtype, static_cast<std::int64_t>(table.size()), page_size,
                                 t.heads, t.d_head, std::move(bits));
}

// Rows [first, first + n) of a (1, total, heads, d) tensor as a (1, n, heads, d) one.
HostTensor rows_of(const HostTensor& t, std::int64_t first, std::int64_t n) {
    const std::int64_t row = t.heads * t.d_head;
    std::vector<std::uint16_t> bits(t.bits.begin() + first * row,
                                    t.bits.begin() + (first + n) * row);
    return HostTensor::from_bits(t.dtype, 1, n, t.heads, t.d_head, std::move(bits));
}

// O's shape: Q's rows, V's head dim; BF16 for FP8 inputs.
HostTensor output_shape(const HostProblem& host) {
    const DType dtype = host.q.dtype == DType::E4M3 ? DType::BF16 : host.q.dtype;
    return HostTensor{dtype, host.q.batch, host.q.seq, host.q.heads, host.v.d_head, {}, {}};
}

DeviceBuffer upload_floats(const std::vector<float>& values) {
    DeviceBuffer buffer(values.size() * sizeof(float));
    buffer.upload(values);
    return buffer;
}

double softmax_scale_of(const Shape& shape) {
    return AttentionOptions{.softmax_scale = shape.scale}.scale(shape.d_head);
}

}  // namespace

HostProblem HostProblem::random(const Shape& shape, std::uint64_t seed) {
    HostProblem p;
    std::int64_t batch = shape.batch, seq_q = shape.seq_q, seq_k = shape.seq_k;
    if (shape.api == Api::varlen) {
        const std::vector<int> lengths = varlen_lengths(shape);
        p.seqlens.assign(1, 0);
        for (const int n : lengths)
            p.seqlens.push_back(p.seqlens.back() + n);
        batch = 1;
        seq_q = seq_k = p.seqlens.back();
    }
    p.q = HostTensor::random_normal(shape.dtype, batch, seq_q, shape.heads, shape.d_head, seed);
    p.k = HostTensor::random_normal(shape.dtype, batch, seq_k, shape.heads_kv, shape.d_head,
                                    seed + 1);
    p.v = HostTensor::random_normal(shape.dtype, batch, seq_k, shape.heads_kv, shape.v_head_dim(),
                                    seed + 2);
    if (shape.api == Api::kvcache) {
        p.seqlens.assign(static_cast<std::size_t>(shape.batch), shape.seq_k);
        if (shape.page_size > 0) {
            p.block_table.resize(static_cast<std::size_t>(shape.batch * pages_per_sequence(shape)));
            std::iota(p.block_table.begin(), p.block_table.end(), 0);
            std::shuffle(p.block_table.begin(), p.block_table.end(), std::mt19937_64(seed + 3));
            p.k_pages = to_pages(p.k, shape.page_size, p.block_table);
            p.v_pages = to_pages(p.v, shape.page_size, p.block_table);
        }
    }
    if (shape.backward) {
        p.d_o = HostTensor::random_normal(shape.dtype, batch, seq_q, shape.heads,
                                          shape.v_head_dim(), seed + 5);
    }
    if (shape.sinks) {
        std::mt19937_64 rng(seed + 4);
        std::normal_distribution<float> normal(0.0f, 3.0f);
        p.sinks.resize(static_cast<std::size_t>(shape.heads));
        for (float& x : p.sinks)
            x = normal(rng);
    }
    if (shape.dtype == DType::E4M3) {
        std::mt19937_64 rng(seed + 6);
        std::uniform_real_distribution<float> factor(0.5f, 2.0f);
        for (std::vector<float>* descale : {&p.q_descale, &p.k_descale, &p.v_descale}) {
            descale->resize(static_cast<std::size_t>(batch * shape.heads_kv));
            for (float& x : *descale)
                x = factor(rng);
        }
    }
    if (shape.alibi) {  // the ALiBi paper's slopes: 2^(-8 (h + 1) / heads)
        p.alibi_slopes.resize(static_cast<std::size_t>(shape.heads));
        for (std::size_t h = 0; h < p.alibi_slopes.size(); ++h)
            p.alibi_slopes[h] =
                std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(shape.heads));
    }
    return p;
}

DeviceProblem::DeviceProblem(const Shape& shape, const HostProblem& host)
    : shape_(shape),
      q_(DeviceTensor::upload(host.q)),
      k_(DeviceTensor::upload(host.k_pages ? *host.k_pages : host.k)),
      v_(DeviceTensor::upload(host.v_pages ? *host.v_pages : host.v)),
      o_(DeviceTensor::empty_like(output_shape(host))),
      pages_per_seq_(pages_per_sequence(shape)) {
    o_.buffer.poison_with_nan();
    if (!host.seqlens.empty()) {
        seqlens_ = DeviceBuffer(host.seqlens.size() * sizeof(std::int32_t));
        seqlens_.upload(host.seqlens);
    }
    if (shape.api == Api::varlen) {
        // max_seqlen_q may not exceed the packed tokens (a batch of short draws).
        for (std::size_t b = 0; b + 1 < host.seqlens.size(); ++b)
            longest_ = std::max(longest_, host.seqlens[b + 1] - host.seqlens[b]);
    }
    if (!host.block_table.empty()) {
        table_ = DeviceBuffer(host.block_table.size() * sizeof(std::int32_t));
        table_.upload(host.block_table);
    }
    if (!host.sinks.empty()) {
        sinks_ = DeviceBuffer(host.sinks.size() * sizeof(float));
        sinks_.upload(host.sinks);
    }
    if (!host.alibi_slopes.empty()) {
        alibi_ = DeviceBuffer(host.alibi_slopes.size() * sizeof(float));
        alibi_.upload(host.alibi_slopes);
    }
    if (!host.q_descale.empty()) {
        q_descale_ = upload_floats(host.q_descale);
        k_descale_ = upload_floats(host.k_descale);
        v_descale_ = upload_floats(host.v_descale);
    }
    if (shape.backward) {
        // The forward's output and LSE, which the backward reads, from the automatic choice.
        forward_lse_ = DeviceBuffer(static_cast<std::size_t>(host.q.batch * host.q.seq) *
                                    shape.heads * sizeof(float));
        d_o_ = DeviceTensor::upload(*host.d_o);
        dq_ = DeviceTensor::empty_like(host.q);
        dk_ = DeviceTensor::empty_like(host.k);
        dv_ = DeviceTensor::empty_like(host.v);
        for (DeviceTensor* g : {&*dq_, &*dk_, &*dv_})
            g->buffer.poison_with_nan();
        forward(dense_params(static_cast<float*>(forward_lse_.data())));
    }
}

AttentionOptions DeviceProblem::options(float* lse) const {
    return {.softmax_scale = shape_.scale,
            .causal = shape_.causal,
            .lse = lse,
            .variants = {.window_left = shape_.window_left,
                         .window_right = shape_.window_right,
                         .softcap = shape_.softcap,
                         .sinks = static_cast<const float*>(sinks_.data()),
                         .alibi_slopes = static_cast<const float*>(alibi_.data())}};
}

std::size_t DeviceProblem::bytes(const Shape& shape) {
    // Q and O, K and V at their elements' bytes, O at 2 (varlen: at most batch x seq_q tokens;
    // pages: at most one page of padding per sequence).
    const std::int64_t keys =
        std::int64_t{shape.batch} * (std::int64_t{shape.seq_k} + std::max(shape.page_size, 0));
    const std::size_t rows = std::size_t(shape.batch) * shape.seq_q * shape.heads;
    const std::size_t d = shape.d_head + shape.v_head_dim();
    const std::size_t in = element_bytes(shape.dtype);
    return rows * (in * shape.d_head + 2 * shape.v_head_dim()) +
           in * std::size_t(keys) * shape.heads_kv * d;
}

std::optional<Fp8Descales> DeviceProblem::descales() const {
    if (shape_.dtype != DType::E4M3)
        return std::nullopt;
    return Fp8Descales{static_cast<const float*>(q_descale_.data()),
                       static_cast<const float*>(k_descale_.data()),
                       static_cast<const float*>(v_descale_.data())};
}

ForwardParams DeviceProblem::dense_params(float* lse) const {
    return {q_.view, k_.view, v_.view, o_.view, options(lse), descales()};
}

BackwardParams DeviceProblem::backward_params() const {
    BackwardParams p{q_.view,   k_.view,    v_.view,
                     o_.view,   d_o_->view, dq_->view,
                     dk_->view, dv_->view,  options(static_cast<float*>(forward_lse_.data()))};
    return p;
}

KVCacheParams DeviceProblem::kvcache_params(int splits, float* lse) const {
    KVCacheParams p;
    p.q = q_.view;
    p.k_cache = k_.view;
    p.v_cache = v_.view;
    p.o = o_.view;
    p.cache_seqlens = static_cast<const std::int32_t*>(seqlens_.data());
    p.descales = descales();
    if (shape_.page_size > 0) {
        p.pages = PageTable{.block_table = static_cast<const std::int32_t*>(table_.data()),
                            .max_pages_per_seq = pages_per_seq_};
    }
    p.options = options(lse);
    p.num_splits = splits;
    return p;
}

VarlenParams DeviceProblem::varlen_params(int splits, float* lse) const {
    VarlenParams p;
    p.q = q_.view;
    p.k = k_.view;
    p.v = v_.view;
    p.o = o_.view;
    p.cu_seqlens_q = static_cast<const std::int32_t*>(seqlens_.data());
    p.cu_seqlens_k = p.cu_seqlens_q;
    p.batch = shape_.batch;
    p.max_seqlen_q = longest_;
    p.max_seqlen_k = longest_;
    p.options = options(lse);
    p.num_splits = splits;
    return p;
}

void DeviceProblem::launch(const Candidate& c, float* lse) const {
    if (shape_.backward) {
        if (c.config)
            backward(backward_params(), *c.config);
        else
            backward(backward_params());
        return;
    }
    switch (shape_.api) {
        case Api::dense:
            if (c.splits != 0)
                throw UsageError("--splits: expected with --kvcache or --varlen only");
            if (c.config)
                forward(dense_params(lse), *c.config);
            else
                forward(dense_params(lse));
            return;
        case Api::kvcache:
        case Api::varlen:
            if (c.config) {
                throw UsageError(
                    "--config: expected none with --kvcache or --varlen (their entry points "
                    "choose the kernel; --splits picks the split-KV kernel), got " +
                    c.config->to_string());
            }
            if (shape_.api == Api::kvcache)
                forward_kvcache(kvcache_params(c.splits, lse));
            else
                forward_varlen(varlen_params(c.splits, lse));
            return;
    }
}

KernelChoice DeviceProblem::kernel(const Candidate& c) const {
    if (shape_.backward) {
        return {c.config ? *c.config
                         : choose_backward_config(shape_.problem(), DeviceProperties::current()),
                0};
    }
    switch (shape_.api) {
        case Api::kvcache:
            return chosen_kernel(kvcache_params(c.splits, nullptr));
        case Api::varlen:
            return chosen_kernel(varlen_params(c.splits, nullptr));
        case Api::dense:
            break;
    }
    return c.config ? KernelChoice{c.config, 0} : chosen_kernel(dense_params(nullptr));
}

HostTensor DeviceProblem::download_output(const HostProblem& host) const {
    return o_.download(output_shape(host));
}

Gradients DeviceProblem::download_gradients(const HostProblem& host) const {
    return {dq_->download(host.q), dk_->download(host.k), dv_->download(host.v)};
}

reference::BackwardCheck check_gradients(const Shape& shape, const HostProblem& host,
                                         const Gradients& g, int rows_per_head,
                                         std::uint64_t seed) {
    return reference::check_attention_backward(
        {host.q, host.k, host.v, *host.d_o, g.dq, g.dk, g.dv, softmax_scale_of(shape),
         shape.causal},
        reference::sample_rows(shape.batch, shape.heads, shape.seq_q, rows_per_head, seed),
        reference::sample_rows(shape.batch, shape.heads_kv, shape.seq_k, rows_per_head, seed + 1));
}

reference::CheckResult check_output(const Shape& shape, const HostProblem& host,
                                    const HostTensor& out, const std::vector<float>* lse,
                                    int rows_per_head, std::uint64_t seed) {
    const double scale = softmax_scale_of(shape);
    const std::vector<float>* sinks = host.sinks.empty() ? nullptr : &host.sinks;
    const std::vector<float>* alibi = host.alibi_slopes.empty() ? nullptr : &host.alibi_slopes;
    const bool fp8 = !host.q_descale.empty();
    const auto problem = [&](const HostTensor& q, const HostTensor& k, const HostTensor& v,
                             const HostTensor& o, const std::vector<float>* l) {
        reference::Problem p{q,
                             k,
                             v,
                             o,
                             scale,
                             shape.causal,
                             l,
                             false,
                             shape.window_left,
                             shape.window_right,
                             shape.softcap,
                             sinks,
                             alibi};
        if (fp8) {
            p.q_descale = &host.q_descale;
            p.k_descale = &host.k_descale;
            p.v_descale = &host.v_descale;
        }
        return p;
    };
    if (shape.api != Api::varlen) {
        const auto rows =
            reference::sample_rows(shape.batch, shape.heads, shape.seq_q, rows_per_head, seed);
        return reference::check_attention(problem(host.q, host.k, host.v, out, lse), rows);
    }
    // One check per sequence; the result is the one closest to its tolerance, with the
    // rows and non-finite values of all of them.
    reference::CheckResult worst;
    worst.passed = true;
    std::int64_t rows_checked = 0, non_finite = 0;
    const std::int64_t total = host.seqlens.back();
    for (std::size_t b = 0; b + 1 < host.seqlens.size(); ++b) {
        const std::int64_t first = host.seqlens[b];
        const std::int64_t n = host.seqlens[b + 1] - first;
        const HostTensor q = rows_of(host.q, first, n), k = rows_of(host.k, first, n),
                         v = rows_of(host.v, first, n), o = rows_of(out, first, n);
        std::vector<float> seq_lse;  // (heads, total) -> (1, heads, n)
        if (lse != nullptr) {
            for (std::int64_t h = 0; h < shape.heads; ++h) {
                const auto from = lse->begin() + h * total + first;
                seq_lse.insert(seq_lse.end(), from, from + n);
            }
        }
        const reference::CheckResult r = reference::check_attention(
            problem(q, k, v, o, lse ? &seq_lse : nullptr),
            reference::sample_rows(1, shape.heads, n, rows_per_head, seed + b));
        rows_checked += r.rows_checked;
        non_finite += r.non_finite;
        const auto margin = [](const reference::CheckResult& c) {
            return c.tolerance > 0 ? c.max_error / c.tolerance : 0.0;
        };
        if (!r.passed || (worst.passed && margin(r) >= margin(worst)))
            worst = r;
    }
    worst.rows_checked = rows_checked;
    worst.non_finite = non_finite;
    return worst;
}

}  // namespace flash_attention::cli
