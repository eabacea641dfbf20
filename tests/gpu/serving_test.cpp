// The serving entry points (forward_varlen, forward_kvcache) against the double-precision
// reference, one sequence at a time: packed varlen batches with empty sequences, paged
// caches of several page sizes, split-KV decoding, KV append, GQA 1/4/8, causal both ways,
// and what must hold beyond the numbers (a row's result does not depend on the batch, bad
// page ids read nothing, a captured decode step replays on new cache contents).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "kernels/serving/launch.hpp"
#include "support/built_configs.hpp"

namespace fa = flash_attention;
using fa::reference::HostTensor;

namespace {

// Filler of memory no call should read: NaN as fp16, as bf16 and (each byte) as e4m3, as the
// tools' poison is, so that a stray read shows in any dtype (0x7E00 was NaN in fp16 only:
// 2^125 in bf16, 448 in e4m3).
constexpr std::uint16_t k_nan_bits = 0xFFFF;

// Fresh each run; FLASH_TEST_SEED replays the seed a failure printed.
std::uint64_t fresh_seed() {
    if (const char* s = std::getenv("FLASH_TEST_SEED"); s != nullptr && *s != '\0')
        return std::strtoull(s, nullptr, 10);
    return (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();
}

// Rows [row0, row0 + len) of entry `entry` of a host tensor, as a (1, len, heads, d) tensor.
HostTensor rows_of(const HostTensor& t, std::int64_t entry, std::int64_t row0, std::int64_t len) {
    const std::int64_t row = t.heads * t.d_head;
    const auto first = t.bits.begin() + t.offset(entry, row0, 0);
    return HostTensor::from_bits(t.dtype, 1, len, t.heads, t.d_head,
                                 std::vector<std::uint16_t>(first, first + len * row));
}

// Tensors of (1, len_i, heads, d) packed along seq into one (1, total, heads, d).
HostTensor pack(const std::vector<HostTensor>& parts, fa::DType dtype, std::int64_t heads,
                std::int64_t d) {
    std::vector<std::uint16_t> bits;
    std::int64_t total = 0;
    for (const HostTensor& p : parts) {
        bits.insert(bits.end(), p.bits.begin(), p.bits.end());
        total += p.seq;
    }
    return HostTensor::from_bits(dtype, 1, total, heads, d, std::move(bits));
}

fa::tools::DeviceBuffer upload_ints(const std::vector<std::int32_t>& host) {
    fa::tools::DeviceBuffer buffer(std::max<std::size_t>(host.size(), 1) * sizeof(std::int32_t));
    fa::cuda_check(cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(std::int32_t),
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy (ints)");
    return buffer;
}

std::vector<std::uint16_t> download_bits(const fa::tools::DeviceTensor& t) {
    return t.buffer.download();
}

// One sequence's problem and the kernel's answer to it.
struct SequenceCheck {
    HostTensor q, k, v;  // (1, len, heads, d)
    HostTensor out;
    std::vector<float> lse;  // (1, heads, len_q)
};

// The attention variants of a check (issue 15): none by default.
struct VariantSpec {
    int window_left = -1, window_right = -1;
    float softcap = 0;
    std::vector<float> sinks;  // per query head; empty: none
    // FP8 inputs' descales, q's, k's and v's, one a K/V head of the sequence; empty: 16-bit.
    std::vector<float> descales[3];
};

// Checks one sequence against the reference; a sequence with no keys must give zeros
// and LSE -inf (its head's sink with sinks).
void expect_matches(const SequenceCheck& s, bool causal, bool top_left, double scale,
                    std::uint64_t seed, const std::string& label, const VariantSpec& var = {}) {
    if (s.q.seq == 0)
        return;
    if (s.k.seq == 0) {
        for (const float x : s.out.values)
            ASSERT_EQ(x, 0.0f) << label << ": a sequence without keys gives zeros";
        for (std::size_t i = 0; i < s.lse.size(); ++i) {
            if (var.sinks.empty()) {
                ASSERT_EQ(s.lse[i], -INFINITY) << label << ": a sequence without keys has LSE -inf";
                continue;
            }
            // Its sink, through the softmax's base-2 units (a rounding or two).
            const float sink = var.sinks[i / static_cast<std::size_t>(s.q.seq)];
            ASSERT_NEAR(s.lse[i], sink, fa::reference::k_lse_tolerance)
                << label << ": a sequence without keys has its sink as LSE";
        }
        return;
    }
    const auto rows = fa::reference::sample_rows(1, s.q.heads, s.q.seq, 64, seed);
    fa::reference::Problem problem{s.q,
                                   s.k,
                                   s.v,
                                   s.out,
                                   scale,
                                   causal,
                                   &s.lse,
                                   top_left,
                                   var.window_left,
                                   var.window_right,
                                   var.softcap,
                                   var.sinks.empty() ? nullptr : &var.sinks};
    if (!var.descales[0].empty()) {
        problem.q_descale = &var.descales[0];
        problem.k_descale = &var.descales[1];
        problem.v_descale = &var.descales[2];
    }
    const auto result = fa::reference::check_attention(problem, rows);
    EXPECT_TRUE(result.passed) << label << ": " << result.summary() << "; seed " << seed;
}

// A paged copy of per-sequence keys: pages in a random order, the table's unused entries
// -1 (never read: they lie past every sequence's end).
struct PagedCache {
    fa::tools::DeviceTensor k, v;
    fa::tools::DeviceBuffer table;
    std::int64_t max_pages = 0;
    std::vector<std::int32_t> table_host;

    PagedCache(const std::vector<HostTensor>& ks, const std::vector<HostTensor>& vs,
               std::int64_t page_size, std::int64_t capacity, std::uint64_t seed) {
        const fa::DType dtype = ks[0].dtype;
        const std::int64_t heads = ks[0].heads, d = ks[0].d_head, d_v = vs[0].d_head;
        max_pages = (capacity + page_size - 1) / page_size;
        const std::int64_t batch = static_cast<std::int64_t>(ks.size());
        const std::int64_t num_pages = batch * max_pages + 3;  // a few never used
        std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
        table_host.assign(static_cast<std::size_t>(batch * max_pages), -1);
        const std::int64_t row = heads * d, v_row = heads * d_v;
        std::vector<std::uint16_t> k_bits(static_cast<std::size_t>(num_pages * page_size * row),
                                          k_nan_bits);  // a stray read shows
        std::vector<std::uint16_t> v_bits(static_cast<std::size_t>(num_pages * page_size * v_row),
                                          k_nan_bits);
        std::size_t next = 0;
        for (std::int64_t b = 0; b < batch; ++b) {
            for (std::int64_t pg = 0; pg * page_size < ks[b].seq; ++pg) {
                const std::int32_t page = order[next++];
                table_host[b * max_pages + pg] = page;
                const std::int64_t rows = std::min(page_size, ks[b].seq - pg * page_size);
                std::copy_n(ks[b].bits.begin() + pg * page_size * row, rows * row,
                            k_bits.begin() + page * page_size * row);
                std::copy_n(vs[b].bits.begin() + pg * page_size * v_row, rows * v_row,
                            v_bits.begin() + page * page_size * v_row);
            }
        }
        k = fa::tools::DeviceTensor::upload(
            HostTensor::from_bits(dtype, num_pages, page_size, heads, d, std::move(k_bits)));
        v = fa::tools::DeviceTensor::upload(
            HostTensor::from_bits(dtype, num_pages, page_size, heads, d_v, std::move(v_bits)));
        table = upload_ints(table_host);
    }

    fa::PageTable pages() const {
        return {static_cast<const std::int32_t*>(table.data()), max_pages, 0};
    }
};

// ---------------------------------------------------------------------------------------
// forward_varlen

struct VarlenCase {
    fa::DType dtype;
    int d;
    int group;  // query heads per K/V head
    bool causal;
    int page_size;          // 0: packed K/V
    int splits;             // 0: the library's choice
    bool top_left = false;  // the causal diagonal's alignment
    int window_left = -1, window_right = -1;
    float softcap = 0;
    bool sinks = false;
    int most_queries = 700;  // a sequence's queries at most (64: pack_gqa tiles on Hopper)
    int d_v = 0;             // V's head dim, 0: d (DeepSeek's MLA: d 192, V's 128)

    int v_dim() const { return d_v != 0 ? d_v : d; }
};

void PrintTo(const VarlenCase& c, std::ostream* os) {
    *os << fa::to_string(c.dtype) << " d" << c.d << " group " << c.group
        << (c.causal ? " causal" : "") << (c.top_left ? " top left" : "") << " page " << c.page_size
        << " splits " << c.splits << " window (" << c.window_left << ", " << c.window_right
        << ") softcap " << c.softcap << (c.sinks ? " sinks" : "")
        << " queries <= " << c.most_queries << " d_v " << c.v_dim();
}

// Sinks for `heads` query heads, normal with a spread of 3, and their device copy.
std::pair<std::vector<float>, fa::tools::DeviceBuffer> draw_sinks(int heads, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> sinks(static_cast<std::size_t>(heads));
    for (float& x : sinks)
        x = normal(rng);
    fa::tools::DeviceBuffer dev(sinks.size() * sizeof(float));
    dev.upload(sinks);
    return {std::move(sinks), std::move(dev)};
}

class Varlen : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(Varlen, MatchesReferencePerSequence) {
    const VarlenCase c = GetParam();
    const bool hopper = fa::DeviceProperties::current().major == 9;
    const bool window_or_softcap = c.window_left != -1 || c.window_right != -1 || c.softcap != 0;
    const bool no_split_kv = !fa::serving::has_split_kv(c.d) || c.d_v != 0;
    if (window_or_softcap && !hopper)
        GTEST_SKIP() << "a sliding window or softcap per sequence runs on the sm90 family only";
    if (no_split_kv && !hopper) {
        GTEST_SKIP() << "d_head " << c.d << " d_v " << c.v_dim()
                     << " per sequence runs on the sm90 family only";
    }
    if ((window_or_softcap || no_split_kv) &&
        !fa::testing::has_sm90_forward(c.dtype, c.d, c.v_dim()))
        GTEST_SKIP() << "this build has no sm90 kernel of " << fa::to_string(c.dtype) << " d_head "
                     << c.d << " d_v " << c.v_dim();
    const std::uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    const int heads_kv = 2, heads = heads_kv * c.group;
    // Empty sequences (no queries; no keys), one-token ones, lengths off every tile, a
    // query longer than its keys (causal rows that see none), and random ones.
    std::vector<std::pair<int, int>> lengths = {{0, 5},    {3, 0},     {1, 1},    {17, 300},
                                                {200, 33}, {129, 129}, {64, 1000}};
    std::uniform_int_distribution<int> any(1, 700);
    for (int i = 0; i < 13; ++i)
        lengths.push_back({any(rng), any(rng)});
    for (auto& [lq, lk] : lengths)
        lq = std::min(lq, c.most_queries);

    std::vector<HostTensor> qs, ks, vs;
    std::vector<std::int32_t> cu_q = {0}, cu_k = {0}, used_k;
    int max_q = 1, max_k = 1;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
        const auto [lq, lk] = lengths[i];
        qs.push_back(HostTensor::random_normal(c.dtype, 1, lq, heads, c.d, seed + 3 * i));
        ks.push_back(HostTensor::random_normal(c.dtype, 1, lk, heads_kv, c.d, seed + 3 * i + 1));
        vs.push_back(
            HostTensor::random_normal(c.dtype, 1, lk, heads_kv, c.v_dim(), seed + 3 * i + 2));
        cu_q.push_back(cu_q.back() + lq);
        cu_k.push_back(cu_k.back() + lk);
        used_k.push_back(lk);
        max_q = std::max(max_q, lq);
        max_k = std::max(max_k, lk);
    }
    // Rows of no sequence after the last one hold NaN: a kernel that reads a sequence's
    // neighbours must not let them into its result, and must not write those rows.
    constexpr int tail = 9;
    const auto with_tail = [&](std::vector<HostTensor> parts, int h, int d) {
        parts.push_back(HostTensor::from_bits(
            c.dtype, 1, tail, h, d,
            std::vector<std::uint16_t>(static_cast<std::size_t>(tail) * h * d, 0xFFFF)));
        return pack(parts, c.dtype, h, d);
    };
    const HostTensor q = with_tail(qs, heads, c.d);
    const fa::tools::DeviceTensor dq = fa::tools::DeviceTensor::upload(q);
    // O has V's head dim: a tensor of q's rows and heads, d_v columns.
    const HostTensor o_shape{c.dtype, 1, q.seq, heads, c.v_dim(), {}, {}};
    fa::tools::DeviceTensor dout = fa::tools::DeviceTensor::empty_like(o_shape);
    dout.buffer.poison_with_nan();
    fa::tools::DeviceBuffer lse(static_cast<std::size_t>(q.seq) * heads * sizeof(float));
    lse.poison_with_nan();
    const fa::tools::DeviceBuffer d_cu_q = upload_ints(cu_q), d_cu_k = upload_ints(cu_k),
                                  d_used = upload_ints(used_k);

    fa::VarlenParams p;
    p.q = dq.view;
    p.o = dout.view;
    p.cu_seqlens_q = static_cast<const std::int32_t*>(d_cu_q.data());
    p.batch = static_cast<std::int64_t>(lengths.size());
    p.max_seqlen_q = max_q;
    p.max_seqlen_k = max_k;
    p.options.causal = c.causal;
    if (c.top_left)
        p.options.causal_alignment = fa::CausalAlignment::top_left;
    p.options.lse = static_cast<float*>(lse.data());
    p.num_splits = c.splits;
    VariantSpec var{c.window_left, c.window_right, c.softcap, {}, {}};
    fa::tools::DeviceBuffer sinks_dev;
    if (c.sinks) {
        std::tie(var.sinks, sinks_dev) = draw_sinks(heads, seed + 7);
        p.options.variants.sinks = static_cast<const float*>(sinks_dev.data());
    }
    p.options.variants.window_left = c.window_left;
    p.options.variants.window_right = c.window_right;
    p.options.variants.softcap = c.softcap;
    std::optional<fa::tools::DeviceTensor> dk, dv;
    std::optional<PagedCache> paged;
    if (c.page_size == 0) {
        dk = fa::tools::DeviceTensor::upload(with_tail(ks, heads_kv, c.d));
        dv = fa::tools::DeviceTensor::upload(with_tail(vs, heads_kv, c.v_dim()));
        p.k = dk->view;
        p.v = dv->view;
        p.cu_seqlens_k = static_cast<const std::int32_t*>(d_cu_k.data());
    } else {
        paged.emplace(ks, vs, c.page_size, max_k, seed);
        p.k = paged->k.view;
        p.v = paged->v.view;
        p.pages = paged->pages();
        p.seqused_k = static_cast<const std::int32_t*>(d_used.data());
    }
    fa::forward_varlen(p);
    fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");

    const HostTensor out = dout.download(o_shape);
    const std::vector<float> lse_host = lse.download_floats();  // (heads, total_q)
    const std::int64_t row = std::int64_t{heads} * c.v_dim();
    for (std::int64_t i = cu_q.back() * row; i < q.seq * row; ++i)
        ASSERT_EQ(out.bits[i], 0xFFFF) << "o's row " << i / row << " (no sequence's) was written";
    for (std::size_t i = 0; i < lengths.size(); ++i) {
        const int lq = lengths[i].first;
        SequenceCheck s{qs[i], ks[i], vs[i], rows_of(out, 0, cu_q[i], lq), {}};
        for (int h = 0; h < heads; ++h) {
            for (int r = 0; r < lq; ++r)
                s.lse.push_back(lse_host[static_cast<std::size_t>(h) * q.seq + cu_q[i] + r]);
        }
        expect_matches(s, c.causal, c.top_left, 1.0 / std::sqrt(double(c.d)), seed,
                       "sequence " + std::to_string(i) + " (" + std::to_string(lq) + " x " +
                           std::to_string(lengths[i].second) + ")",
                       var);
    }
}

std::vector<VarlenCase> varlen_cases() {
    std::vector<VarlenCase> cases;
    for (const fa::DType dtype : {fa::DType::BF16, fa::DType::FP16}) {
        for (const int d : {64, 128, 256}) {
            for (const bool causal : {false, true})
                cases.push_back({dtype, d, dtype == fa::DType::BF16 ? 4 : 1, causal, 0, 0});
        }
    }
    for (const int page : {16, 64, 256}) {
        for (const bool causal : {false, true})
            cases.push_back({fa::DType::BF16, 128, 8, causal, page, 0});
    }
    cases.push_back({fa::DType::FP16, 256, 8, true, 64, 3});
    cases.push_back({fa::DType::BF16, 64, 1, true, 0, 5});
    // One range a sequence: the serving kernel without a split, where the library's
    // choice would take the sm90 kernels on Hopper.
    for (const bool causal : {false, true}) {
        cases.push_back({fa::DType::BF16, 128, 4, causal, 0, 1});
        cases.push_back({fa::DType::BF16, 128, 8, causal, 16, 1});
    }
    // Causal aligned at the top left (queries longer and shorter than their keys): the sm90
    // kernels on Hopper packed and paged, the serving kernel unsplit and split.
    cases.push_back({fa::DType::BF16, 128, 4, true, 0, 0, true});
    cases.push_back({fa::DType::FP16, 64, 2, true, 16, 0, true});
    cases.push_back({fa::DType::BF16, 256, 1, true, 0, 1, true});
    cases.push_back({fa::DType::FP16, 128, 8, true, 64, 3, true});
    // The attention variants: a window (causal and not, packed and paged), a softcap and
    // sinks on the sm90 kernels (Hopper); sinks on the serving kernel unsplit and split.
    cases.push_back({fa::DType::BF16, 128, 4, true, 0, 0, false, 100, 0, 0, false});
    cases.push_back({fa::DType::FP16, 64, 2, false, 16, 0, false, 64, 17, 10, true});
    cases.push_back({fa::DType::BF16, 256, 1, true, 64, 0, true, 33, 0, 30, false});
    cases.push_back({fa::DType::BF16, 128, 8, true, 0, 1, false, -1, -1, 0, true});
    cases.push_back({fa::DType::FP16, 128, 4, true, 16, 3, false, -1, -1, 0, true});
    // Grouped sequences of at most 64 queries: packed GQA tiles on Hopper (their numbering of
    // packed sequences, the LSE's rows and O's stores past a sequence's end), contiguous and
    // paged, causal at both alignments.
    for (const bool causal : {false, true}) {
        cases.push_back({fa::DType::BF16, 128, 4, causal, 0, 0, false, -1, -1, 0, false, 64});
        cases.push_back({fa::DType::FP16, 128, 8, causal, 16, 0, false, -1, -1, 0, false, 40});
    }
    cases.push_back({fa::DType::BF16, 128, 2, true, 0, 0, true, -1, -1, 0, false, 33});
    // d_head 96 and 192, and DeepSeek's MLA (192 with V's 128): the sm90 kernels on Hopper,
    // packed and paged.
    for (const bool causal : {false, true}) {
        cases.push_back({fa::DType::BF16, 96, 4, causal, 0, 0});
        cases.push_back({fa::DType::FP16, 192, 2, causal, 0, 0});
        cases.push_back({fa::DType::BF16, 192, 4, causal, 0, 0, false, -1, -1, 0, false, 700, 128});
    }
    cases.push_back({fa::DType::BF16, 192, 4, true, 16, 0});
    cases.push_back({fa::DType::BF16, 96, 4, true, 16, 0});
    cases.push_back({fa::DType::FP16, 96, 2, false, 64, 0});
    cases.push_back({fa::DType::FP16, 192, 8, true, 64, 0, true, -1, -1, 0, false, 700, 128});
    cases.push_back({fa::DType::BF16, 192, 2, false, 16, 0, false, -1, -1, 0, false, 40, 128});
    // Their variant kernels over packed sequences: a window on pages, a two-sided window with a
    // softcap and sinks, and MLA's window, softcap and sinks at the top left.
    cases.push_back({fa::DType::BF16, 96, 4, true, 16, 0, false, 100, 0, 0, false});
    cases.push_back({fa::DType::FP16, 192, 2, false, 0, 0, false, 64, 17, 10, true});
    cases.push_back({fa::DType::BF16, 192, 4, true, 0, 0, true, 33, 0, 30, true, 700, 128});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Serving, Varlen, ::testing::ValuesIn(varlen_cases()));

// ---------------------------------------------------------------------------------------
// forward_kvcache

struct CacheCase {
    int seq_q;      // 1: decoding; more: speculative decoding / chunked prefill
    int group;      // query heads per K/V head
    int seq_new;    // tokens appended by the call (0: none)
    int page_size;  // 0: contiguous cache
    bool causal;
    int splits;  // 0: the library's choice
    fa::DType dtype = fa::DType::BF16;
    int d = 128;
    bool top_left = false;  // the causal diagonal's alignment
    int d_v = 0;            // V's head dim, 0: d

    int v_dim() const { return d_v != 0 ? d_v : d; }
};

void PrintTo(const CacheCase& c, std::ostream* os) {
    *os << "seq_q " << c.seq_q << " group " << c.group << " new " << c.seq_new << " page "
        << c.page_size << (c.causal ? " causal" : "") << " splits " << c.splits << " "
        << fa::to_string(c.dtype) << " d" << c.d << (c.top_left ? " top left" : "") << " d_v "
        << c.v_dim();
}

// A decode problem: a cache of `capacity` rows per sequence with random lengths, q, and
// optionally new tokens; the expected K/V per sequence (cache prefix + new tokens).
struct CacheProblem {
    CacheCase c;
    std::uint64_t seed;
    int batch, heads, heads_kv, capacity;
    std::vector<int> lengths;
    HostTensor q, k_cache, v_cache, k_new, v_new;
    std::vector<HostTensor> k_seq, v_seq;  // expected keys per sequence
    // E4M3: q's, k's and v's descales, (batch, heads_kv) each, in [0.25, 2).
    std::vector<float> descales[3];

    CacheProblem(const CacheCase& c_, int batch_, int capacity_, std::uint64_t seed_,
                 std::vector<int> fixed_lengths = {})
        : c(c_), seed(seed_), batch(batch_), heads_kv(2), capacity(capacity_) {
        heads = heads_kv * c.group;
        std::mt19937_64 rng(seed);
        std::uniform_int_distribution<int> len(0, capacity - c.seq_new);
        lengths = fixed_lengths;
        while (static_cast<int>(lengths.size()) < batch)
            lengths.push_back(len(rng));
        q = HostTensor::random_normal(c.dtype, batch, c.seq_q, heads, c.d, seed + 1);
        k_cache = HostTensor::random_normal(c.dtype, batch, capacity, heads_kv, c.d, seed + 2);
        v_cache =
            HostTensor::random_normal(c.dtype, batch, capacity, heads_kv, c.v_dim(), seed + 3);
        k_new = HostTensor::random_normal(c.dtype, batch, std::max(c.seq_new, 1), heads_kv, c.d,
                                          seed + 4);
        v_new = HostTensor::random_normal(c.dtype, batch, std::max(c.seq_new, 1), heads_kv,
                                          c.v_dim(), seed + 5);
        // The rows past each length are stale memory in a real cache; NaN here, so a kernel
        // that lets them into a result fails.
        for (HostTensor* cache : {&k_cache, &v_cache}) {
            for (int b = 0; b < batch; ++b) {
                std::fill(cache->bits.begin() + cache->offset(b, lengths[b], 0),
                          cache->bits.begin() + cache->offset(b, capacity - 1, 0) +
                              std::int64_t{heads_kv} * cache->d_head,
                          std::uint16_t{0xFFFF});
            }
        }
        if (c.dtype == fa::DType::E4M3) {
            std::uniform_real_distribution<float> factor(0.25f, 2.0f);
            for (auto& ds : descales) {
                for (int i = 0; i < batch * heads_kv; ++i)
                    ds.push_back(factor(rng));
            }
        }
        for (int b = 0; b < batch; ++b) {
            HostTensor k = rows_of(k_cache, b, 0, lengths[b]);
            HostTensor v = rows_of(v_cache, b, 0, lengths[b]);
            if (c.seq_new > 0) {
                k = pack({k, rows_of(k_new, b, 0, c.seq_new)}, c.dtype, heads_kv, c.d);
                v = pack({v, rows_of(v_new, b, 0, c.seq_new)}, c.dtype, heads_kv, c.v_dim());
            }
            k_seq.push_back(std::move(k));
            v_seq.push_back(std::move(v));
        }
    }

    // O's shape: q's, with V's head dim (BF16 for FP8 inputs).
    HostTensor o_shape() const {
        const fa::DType out = c.dtype == fa::DType::E4M3 ? fa::DType::BF16 : c.dtype;
        return {out, batch, c.seq_q, heads, c.v_dim(), {}, {}};
    }

    // Sequence b's FP8 descales (none for 16-bit inputs), for its reference check.
    VariantSpec fp8_of(int b) const {
        VariantSpec var;
        for (int i = 0; i < 3 && !descales[i].empty(); ++i) {
            var.descales[i].assign(descales[i].begin() + b * heads_kv,
                                   descales[i].begin() + (b + 1) * heads_kv);
        }
        return var;
    }

    // The whole cache rows per sequence (for the paged copy): every row, so pages hold the
    // stale rows past each length too, as a real cache does.
    std::vector<HostTensor> cache_rows(const HostTensor& cache) const {
        std::vector<HostTensor> rows;
        for (int b = 0; b < batch; ++b)
            rows.push_back(rows_of(cache, b, 0, capacity));
        return rows;
    }
};

// Device state of a CacheProblem and the call that runs it.
struct CacheRun {
    const CacheProblem& pr;
    fa::tools::DeviceTensor dq, dk, dv, dk_new, dv_new, dout;
    std::optional<PagedCache> paged;
    fa::tools::DeviceBuffer seqlens, lse;
    std::vector<fa::tools::DeviceBuffer> descales;  // FP8's q, k and v factors

    explicit CacheRun(const CacheProblem& p)
        : pr(p),
          dq(fa::tools::DeviceTensor::upload(p.q)),
          dk(fa::tools::DeviceTensor::upload(p.k_cache)),
          dv(fa::tools::DeviceTensor::upload(p.v_cache)),
          dk_new(fa::tools::DeviceTensor::upload(p.k_new)),
          dv_new(fa::tools::DeviceTensor::upload(p.v_new)),
          dout(fa::tools::DeviceTensor::empty_like(p.o_shape())),
          seqlens(upload_ints(std::vector<std::int32_t>(p.lengths.begin(), p.lengths.end()))),
          lse(static_cast<std::size_t>(p.batch) * p.heads * p.c.seq_q * sizeof(float)) {
        if (p.c.page_size > 0) {
            paged.emplace(p.cache_rows(p.k_cache), p.cache_rows(p.v_cache), p.c.page_size,
                          p.capacity, p.seed);
        }
        descales.reserve(3);
        for (int i = 0; i < 3 && !p.descales[i].empty(); ++i) {
            descales.emplace_back(p.descales[i].size() * sizeof(float));
            descales.back().upload(p.descales[i]);
        }
    }

    fa::KVCacheParams params() const {
        fa::KVCacheParams k;
        k.q = dq.view;
        k.o = dout.view;
        k.k_cache = paged ? paged->k.view : dk.view;
        k.v_cache = paged ? paged->v.view : dv.view;
        if (paged)
            k.pages = paged->pages();
        k.cache_seqlens = static_cast<const std::int32_t*>(seqlens.data());
        if (pr.c.seq_new > 0) {
            k.k_new = dk_new.view;
            k.v_new = dv_new.view;
        }
        k.options.causal = pr.c.causal;
        if (pr.c.top_left)
            k.options.causal_alignment = fa::CausalAlignment::top_left;
        k.options.lse = static_cast<float*>(lse.data());
        k.num_splits = pr.c.splits;
        if (!descales.empty()) {
            k.descales = fa::Fp8Descales{static_cast<const float*>(descales[0].data()),
                                         static_cast<const float*>(descales[1].data()),
                                         static_cast<const float*>(descales[2].data())};
        }
        return k;
    }

    void expect_matches_reference(const std::string& label) const;
};

// Checks an output (and its LSE) of a call on `pr` against the reference.
void expect_cache_result(const CacheProblem& pr, const fa::tools::DeviceTensor& dout,
                         const fa::tools::DeviceBuffer& lse, const std::string& label) {
    const HostTensor out = dout.download(pr.o_shape());
    const std::vector<float> lse_host = lse.download_floats();  // (batch, heads, seq_q)
    const std::int64_t per_batch = std::int64_t{pr.heads} * pr.c.seq_q;
    for (int b = 0; b < pr.batch; ++b) {
        SequenceCheck s{rows_of(pr.q, b, 0, pr.c.seq_q), pr.k_seq[b], pr.v_seq[b],
                        rows_of(out, b, 0, pr.c.seq_q),
                        std::vector<float>(lse_host.begin() + b * per_batch,
                                           lse_host.begin() + (b + 1) * per_batch)};
        expect_matches(s, pr.c.causal, pr.c.top_left, 1.0 / std::sqrt(double(pr.c.d)), pr.seed,
                       label + ", sequence " + std::to_string(b) + " (" +
                           std::to_string(pr.lengths[b]) + " cached keys)",
                       pr.fp8_of(b));
    }
}

void CacheRun::expect_matches_reference(const std::string& label) const {
    expect_cache_result(pr, dout, lse, label);
}

class KVCache : public ::testing::TestWithParam<CacheCase> {};

TEST_P(KVCache, MatchesReferenceAndAppends) {
    const CacheCase c = GetParam();
    const bool no_split_kv = !fa::serving::has_split_kv(c.d) || c.d_v != 0;
    if (no_split_kv && fa::DeviceProperties::current().major != 9)
        GTEST_SKIP() << "d_head " << c.d << " d_v " << c.v_dim() << " runs on the sm90 family only";
    if (no_split_kv && !fa::testing::has_sm90_forward(c.dtype, c.d, c.v_dim()))
        GTEST_SKIP() << "this build has no sm90 kernel of " << fa::to_string(c.dtype) << " d_head "
                     << c.d << " d_v " << c.v_dim();
    if (c.dtype == fa::DType::E4M3 && fa::DeviceProperties::current().major < 9)
        GTEST_SKIP() << "FP8 attention runs on Hopper";
    const CacheProblem pr(c, 5, 1500, fresh_seed(), {0, 1500 - c.seq_new});
    CacheRun run(pr);
    run.dout.buffer.poison_with_nan();
    run.lse.poison_with_nan();
    fa::forward_kvcache(run.params());
    fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
    run.expect_matches_reference("kvcache");

    // (download_bits reads 16-bit elements: an FP8 cache's appended rows are not compared here;
    // the reference takes each sequence's expected keys, whatever the cache holds.)
    if (c.seq_new > 0 && c.page_size == 0 && c.dtype != fa::DType::E4M3) {
        // The new tokens are in both caches at each sequence's length, every column of every
        // head (V's may be fewer than K's), nothing else moved.
        for (const auto& [device, host, added, name] :
             {std::tuple{&run.dk, &pr.k_cache, &pr.k_new, "k_cache"},
              {&run.dv, &pr.v_cache, &pr.v_new, "v_cache"}}) {
            const std::vector<std::uint16_t> cache = download_bits(*device);
            const std::int64_t row_size = std::int64_t{pr.heads_kv} * host->d_head;
            for (int b = 0; b < pr.batch; ++b) {
                for (int r = 0; r < pr.capacity; ++r) {
                    const bool appended = r >= pr.lengths[b] && r < pr.lengths[b] + c.seq_new;
                    const std::int64_t row = host->offset(b, r, 0);
                    const std::uint16_t* expected =
                        appended ? &added->bits[added->offset(b, r - pr.lengths[b], 0)]
                                 : &host->bits[row];
                    for (std::int64_t i = 0; i < row_size; ++i) {
                        ASSERT_EQ(cache[row + i], expected[i])
                            << name << " batch " << b << " row " << r << " element " << i;
                    }
                }
            }
        }
    }
    if (c.seq_new > 0 && c.page_size > 0 && c.dtype != fa::DType::E4M3) {
        // Paged: each appended row on the page the table gives its position, every column.
        const PagedCache& paged = *run.paged;
        for (const auto& [device, added, name] :
             {std::tuple{&paged.k, &pr.k_new, "k_cache"}, {&paged.v, &pr.v_new, "v_cache"}}) {
            const std::vector<std::uint16_t> cache = download_bits(*device);
            const std::int64_t row_size = std::int64_t{pr.heads_kv} * added->d_head;
            for (int b = 0; b < pr.batch; ++b) {
                for (int r = pr.lengths[b]; r < pr.lengths[b] + c.seq_new; ++r) {
                    const std::int32_t page =
                        paged.table_host[b * paged.max_pages + r / c.page_size];
                    ASSERT_GE(page, 0) << name << " batch " << b << " row " << r;
                    const std::int64_t row =
                        (std::int64_t{page} * c.page_size + r % c.page_size) * row_size;
                    const std::uint16_t* expected =
                        &added->bits[added->offset(b, r - pr.lengths[b], 0)];
                    for (std::int64_t i = 0; i < row_size; ++i) {
                        ASSERT_EQ(cache[row + i], expected[i])
                            << name << " batch " << b << " row " << r << " element " << i;
                    }
                }
            }
        }
    }
}

std::vector<CacheCase> cache_cases() {
    std::vector<CacheCase> cases;
    for (const int page : {0, 16, 64, 256}) {
        cases.push_back({1, 8, 0, page, false, 0});
        cases.push_back({1, 4, 1, page, true, 0});
        cases.push_back({16, 4, 3, page, true, 0});
    }
    cases.push_back({1, 1, 0, 0, false, 1});
    cases.push_back({1, 8, 0, 0, false, 7});
    cases.push_back({5, 8, 2, 16, true, 17});
    cases.push_back({1, 4, 0, 0, false, 0, fa::DType::FP16, 64});
    cases.push_back({1, 4, 1, 64, true, 0, fa::DType::FP16, 256});
    cases.push_back({40, 4, 0, 0, true, 0, fa::DType::BF16, 256});
    // Chunked prefill: query tiles fill the GPU (the sm90 kernels on Hopper), contiguous
    // and paged (pages smaller than, equal to and larger than a K/V block, at every d_head).
    for (const bool causal : {false, true}) {
        cases.push_back({200, 4, 0, 0, causal, 0});
        cases.push_back({333, 1, 5, 0, causal, 0, fa::DType::FP16, 64});
        cases.push_back({200, 4, 3, 16, causal, 0});
        cases.push_back({150, 2, 0, 64, causal, 0, fa::DType::FP16, 256});
        cases.push_back({129, 8, 1, 256, causal, 0, fa::DType::BF16, 64});
        cases.push_back({177, 2, 2, 32, causal, 0, fa::DType::FP16, 64});
        cases.push_back({150, 4, 0, 16, causal, 0, fa::DType::BF16, 256});
    }
    // Causal aligned at the top left: speculative decoding (packed sm90 tiles on Hopper, and
    // split on the serving kernel) and appends on the serving kernel, chunked prefill
    // contiguous and paged (the sm90 kernels on Hopper).
    cases.push_back({16, 4, 0, 0, true, 0, fa::DType::BF16, 128, true});
    cases.push_back({16, 4, 0, 16, true, 3, fa::DType::BF16, 128, true});
    cases.push_back({5, 8, 2, 16, true, 0, fa::DType::FP16, 64, true});
    cases.push_back({200, 4, 0, 0, true, 0, fa::DType::BF16, 128, true});
    cases.push_back({150, 2, 3, 64, true, 0, fa::DType::FP16, 256, true});
    // d_head 96 and 192, and DeepSeek's MLA (192 with V's 128): the sm90 kernels on Hopper
    // (no split-KV kernel at these head dims), decoding, speculative decoding and chunked
    // prefill, with appends (V's narrower rows), contiguous and paged.
    cases.push_back({150, 2, 2, 0, true, 0, fa::DType::BF16, 96});
    cases.push_back({1, 4, 1, 0, true, 0, fa::DType::BF16, 96});
    cases.push_back({150, 2, 2, 16, true, 0, fa::DType::BF16, 96});
    cases.push_back({16, 4, 1, 64, true, 0, fa::DType::FP16, 96});
    cases.push_back({1, 4, 1, 0, true, 0, fa::DType::FP16, 192});
    cases.push_back({177, 2, 0, 16, false, 0, fa::DType::BF16, 192});
    cases.push_back({1, 8, 2, 0, false, 0, fa::DType::BF16, 192, false, 128});
    cases.push_back({16, 4, 0, 64, true, 0, fa::DType::BF16, 192, true, 128});
    cases.push_back({200, 4, 3, 0, true, 0, fa::DType::FP16, 192, false, 128});
    cases.push_back({200, 4, 0, 16, true, 0, fa::DType::FP16, 192, false, 128});
    cases.push_back({5, 8, 2, 16, true, 0, fa::DType::BF16, 192, false, 128});  // paged V appended
    // FP8 caches (E4M3 q, caches and new rows, descales a K/V head, BF16 O) on the split-KV
    // kernel's e4m3 instances: decoding (one-warp tiles), speculative decoding and chunked
    // prefill (four-warp tiles), contiguous and paged, appended, split, causal both ways.
    constexpr fa::DType e4m3 = fa::DType::E4M3;
    cases.push_back({1, 8, 0, 0, false, 0, e4m3, 128});
    cases.push_back({1, 4, 1, 16, true, 0, e4m3, 128});
    cases.push_back({1, 4, 2, 0, true, 5, e4m3, 128});
    cases.push_back({16, 4, 3, 64, true, 0, e4m3, 128});
    cases.push_back({16, 4, 0, 0, true, 3, e4m3, 128, true});
    cases.push_back({200, 4, 0, 0, true, 0, e4m3, 128});
    cases.push_back({177, 2, 2, 16, false, 0, e4m3, 128});
    cases.push_back({1, 4, 1, 64, true, 7, e4m3, 256});
    cases.push_back({5, 8, 2, 16, true, 0, e4m3, 256, true});
    cases.push_back({150, 2, 2, 16, false, 0, e4m3, 256});
    cases.push_back({129, 1, 0, 0, true, 0, e4m3, 256});
    // d_head 64's rows of 64 bytes (SmemTile's 64-byte swizzle): decoding on key warps and
    // split, speculative decoding paged with appends (top left too), chunked prefill.
    cases.push_back({1, 8, 0, 0, false, 0, e4m3, 64});
    cases.push_back({1, 4, 1, 16, true, 5, e4m3, 64});
    cases.push_back({16, 4, 3, 64, true, 0, e4m3, 64});
    cases.push_back({16, 4, 0, 16, true, 3, e4m3, 64, true});
    cases.push_back({177, 2, 2, 0, false, 0, e4m3, 64});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Serving, KVCache, ::testing::ValuesIn(cache_cases()));

// A sequence's result is the same, bit for bit, alone and in a batch (the split of its keys
// may not depend on the other rows), whichever way the launch spreads the batch's ranges:
// - decoding, batch 16, and batch 160, whose CTAs outnumber what the GPU holds;
// - decoding with 4096 rows (batch 256 x 16 heads), where the merge takes a warp a row and
//   batch 1's takes two;
// - speculative decoding, batch 160: each CTA streams and folds all its ranges, no merge
//   kernel, where batch 1 merges eight ranges in the combine; batch 20: CTAs of two ranges,
//   the first folded in the split kernel and the rest in the combine (on an H100);
// - decoding with key warps (batch 64's 128 rows on an H100 or H200: a CTA a row, its warps
//   each folding a group of ranges, no merge kernel) where batch 1 merges the groups in the
//   combine: groups of one range (4 ranges), of two (8, and d_head 64 fp16 causal; 16 over
//   eight warps on 16-row pages at d_head 64 fp16) and of four (16 on 16-row pages, d_head 128);
//   batch 160 (320 rows) a CTA a range, its merge kernel folding groups of one range;
// - speculative decoding on 16-row pages with 4 key ranges (num_splits: the library's own choice
//   runs a full batch on packed GQA tiles and one sequence on the split-KV kernel, whose bits
//   differ; flash_attention.hpp, Serving).
TEST(KVCacheBatch, ResultDoesNotDependOnTheBatch) {
    struct Shape {
        CacheCase c;
        int batch, capacity;
    };
    for (const auto& [c, batch, capacity] :
         {Shape{{1, 4, 0, 0, false, 0}, 16, 4096}, Shape{{1, 4, 0, 0, false, 0}, 160, 2048},
          Shape{{1, 8, 0, 0, false, 16}, 256, 512}, Shape{{16, 4, 0, 0, true, 8}, 160, 1024},
          Shape{{16, 4, 0, 0, true, 8}, 20, 1024}, Shape{{1, 4, 0, 0, false, 0}, 64, 2048},
          Shape{{1, 4, 0, 0, false, 0}, 64, 4096}, Shape{{1, 8, 0, 16, false, 16}, 64, 4096},
          Shape{{16, 4, 0, 16, true, 4}, 160, 1024},
          Shape{{1, 4, 0, 0, true, 8, fa::DType::FP16, 64}, 64, 4096},
          Shape{{1, 8, 0, 16, false, 16, fa::DType::FP16, 64}, 64, 4096}}) {
        const std::uint64_t seed = fresh_seed();
        const CacheProblem big(c, batch, capacity, seed);
        CacheRun run_big(big);
        run_big.dout.buffer.poison_with_nan();
        fa::forward_kvcache(run_big.params());
        // The same first sequence (same seed: same data) alone.
        const CacheProblem one(c, 1, capacity, seed, {big.lengths[0]});
        CacheRun run_one(one);
        run_one.dout.buffer.poison_with_nan();
        run_one.lse.poison_with_nan();
        fa::forward_kvcache(run_one.params());
        fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
        const auto all = download_bits(run_big.dout);
        const auto alone = download_bits(run_one.dout);
        const std::size_t sequence = static_cast<std::size_t>(c.seq_q) * big.heads * c.d;
        // Same seed, same generator: batch 1's inputs are the first sequence of the batch's.
        ASSERT_TRUE(std::equal(alone.begin(), alone.begin() + sequence, all.begin()))
            << testing::PrintToString(c) << ", batch " << batch << ", seed " << seed;
        // Equal bits of two calls that wrote nothing would be the poison's: the answer too.
        run_one.expect_matches_reference("batch 1 of " + std::to_string(batch));
    }
}

// Key warps (decoding batches whose rows fill the GPU: a CTA a row, four warps each folding
// a group of its ranges, eight on 16-row pages at d_head 64 and in e4m3) against the reference,
// every sequence of the batch: odd cache lengths with sequences of 0, 1 and all keys, groups of
// two ranges (3000 keys: 6 ranges over four warps; 16-row pages, 16 ranges over eight) and of
// one (e4m3 d_head 128 on 16-row pages, 8 ranges over eight), new tokens appended, LSE.
TEST(KVCacheBatch, KeyWarpsMatchTheReference) {
    for (const auto& [c, capacity] :
         {std::pair{CacheCase{1, 4, 0, 0, false, 0}, 3000},
          std::pair{CacheCase{1, 8, 1, 16, true, 16, fa::DType::FP16, 64}, 2500},
          std::pair{CacheCase{1, 4, 1, 16, true, 8, fa::DType::E4M3, 128}, 2500},
          std::pair{CacheCase{1, 8, 1, 0, true, 0, fa::DType::E4M3, 64}, 3000}}) {
        if (c.dtype == fa::DType::E4M3 && fa::DeviceProperties::current().major < 9)
            continue;  // FP8 attention runs on Hopper
        const CacheProblem pr(c, 64, capacity, fresh_seed(), {0, 1, capacity - c.seq_new});
        CacheRun run(pr);
        run.dout.buffer.poison_with_nan();
        run.lse.poison_with_nan();
        fa::forward_kvcache(run.params());
        fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
        run.expect_matches_reference("key warps, " + testing::PrintToString(c));
    }
}

// Page ids outside the cache are never dereferenced (compute-sanitizer runs this) and do
// not disturb the other sequences.
TEST(KVCachePages, OutOfRangePageIdsReadNothing) {
    // Decoding (serving kernel) and a chunked prefill (the sm90 kernels on Hopper).
    for (const int seq_q : {1, 200}) {
        const CacheCase c{seq_q, 4, 0, 16, false, 0};
        const CacheProblem pr(c, 3, 256, fresh_seed(), {200, 200, 200});
        CacheRun run(pr);
        std::vector<std::int32_t> table = run.paged->table_host;
        const std::int64_t num_pages = run.paged->k.view.shape[0];
        table[1 * run.paged->max_pages + 2] = -7;
        table[1 * run.paged->max_pages + 5] = static_cast<std::int32_t>(num_pages + 1000);
        run.paged->table = upload_ints(table);
        run.dout.buffer.poison_with_nan();
        fa::forward_kvcache(run.params());
        fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
        const HostTensor out = run.dout.download(pr.o_shape());
        for (const float x : out.values)
            ASSERT_TRUE(std::isfinite(x)) << "a bad page id gives a finite (meaningless) result";
        for (const int b : {0, 2}) {
            SequenceCheck s{rows_of(pr.q, b, 0, seq_q),
                            pr.k_seq[b],
                            pr.v_seq[b],
                            rows_of(out, b, 0, seq_q),
                            {}};
            const auto result = fa::reference::check_attention(
                {s.q, s.k, s.v, s.out, 1.0 / std::sqrt(128.0), false, nullptr},
                fa::reference::sample_rows(1, pr.heads, seq_q, 8, pr.seed));
            EXPECT_TRUE(result.passed)
                << "seq_q " << seq_q << ", sequence " << b << ": " << result.summary();
        }
    }
}

// The paged cache `t` (pages, page_size, heads, d) copied into memory laid out wider than
// it is viewed: each page pad_rows rows longer and the heads head_stride elements apart,
// the gaps NaN.
fa::tools::DeviceTensor widened(const fa::tools::DeviceTensor& t, std::int64_t pad_rows,
                                std::int64_t head_stride) {
    const auto [pages, page_size, heads, d] = t.view.shape;
    const std::int64_t row = heads * head_stride, page = (page_size + pad_rows) * row;
    const std::vector<std::uint16_t> bits = t.buffer.download();
    std::vector<std::uint16_t> wide(static_cast<std::size_t>(pages * page), k_nan_bits);
    for (std::int64_t p = 0; p < pages; ++p) {
        for (std::int64_t r = 0; r < page_size; ++r) {
            for (std::int64_t h = 0; h < heads; ++h) {
                std::copy_n(bits.begin() + ((p * page_size + r) * heads + h) * d, d,
                            wide.begin() + p * page + r * row + h * head_stride);
            }
        }
    }
    fa::tools::DeviceTensor out{fa::tools::DeviceBuffer(wide.size() * sizeof(std::uint16_t)),
                                t.view};
    out.buffer.upload(wide);
    out.view.data = out.buffer.data();
    out.view.stride = {page, row, head_stride, 1};
    return out;
}

// Paged caches whose memory is not packed: pages further apart than their rows (the sm90
// kernels' copies take any page stride), and heads further apart than d_head (the sm90
// kernels' copies cannot: such calls take the split-KV kernel). Decoding and a chunked
// prefill, 16-row pages, against the reference.
TEST(KVCachePages, StridedCachesMatchTheReference) {
    for (const auto& [pad_rows, head_gap] : {std::pair{16, 0}, std::pair{0, 64}}) {
        for (const int seq_q : {1, 200}) {
            const CacheCase c{seq_q, 4, 0, 16, true, 0};
            const CacheProblem pr(c, 3, 700, fresh_seed(), {0, 333});
            CacheRun run(pr);
            const std::int64_t head_stride = c.d + head_gap;
            run.paged->k = widened(run.paged->k, pad_rows, head_stride);
            run.paged->v = widened(run.paged->v, pad_rows, head_stride);
            run.dout.buffer.poison_with_nan();
            run.lse.poison_with_nan();
            fa::forward_kvcache(run.params());
            fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
            run.expect_matches_reference("pages " + std::to_string(pad_rows) +
                                         " rows apart, heads " + std::to_string(head_stride) +
                                         " apart, seq_q " + std::to_string(seq_q));
        }
    }
}

// A decode step captured in a CUDA graph replays correctly on new cache contents and
// lengths (what serving engines do every step).
TEST(KVCacheGraph, CapturedDecodeStepReplaysOnNewContents) {
    const CacheCase c{1, 8, 1, 16, true, 0};
    cudaStream_t stream = nullptr;
    fa::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const CacheProblem first(c, 4, 2048, fresh_seed());
    CacheRun run(first);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    fa::cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    fa::forward_kvcache(run.params(), stream);
    fa::cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
    fa::cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int step = 0; step < 3; ++step) {
        // New problem data in the same buffers (same shapes; new lengths, keys, queries).
        const CacheProblem next(c, 4, 2048, fresh_seed());
        CacheRun fresh(next);
        const auto copy = [&](const fa::tools::DeviceBuffer& to,
                              const fa::tools::DeviceBuffer& from) {
            fa::cuda_check(cudaMemcpy(to.data(), from.data(), from.bytes(), cudaMemcpyDefault),
                           "cudaMemcpy");
        };
        copy(run.dq.buffer, fresh.dq.buffer);
        copy(run.paged->k.buffer, fresh.paged->k.buffer);
        copy(run.paged->v.buffer, fresh.paged->v.buffer);
        copy(run.paged->table, fresh.paged->table);
        copy(run.dk_new.buffer, fresh.dk_new.buffer);
        copy(run.dv_new.buffer, fresh.dv_new.buffer);
        copy(run.seqlens, fresh.seqlens);
        run.dout.buffer.poison_with_nan();
        run.lse.poison_with_nan();
        fa::cuda_check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
        fa::cuda_check(cudaStreamSynchronize(stream), "graph replay");
        expect_cache_result(next, run.dout, run.lse, "replay " + std::to_string(step));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
}

}  // namespace

namespace {

// forward() without a config sends decoding shapes to the split-KV kernels: the answer
// matches the reference and is forward_kvcache's, bit for bit.
TEST(ForwardDecode, RunsTheSplitPathAndMatchesReference) {
    for (const bool causal : {false, true}) {
        const CacheCase c{2, 8, 0, 0, causal, 0};  // 2 positions x 8 heads = 16 rows a K/V head
        const CacheProblem pr(c, 3, 3000, fresh_seed(), {3000, 3000, 3000});
        CacheRun run(pr);
        fa::ForwardParams p{run.dq.view, run.dk.view, run.dv.view, run.dout.view};
        p.options.causal = causal;
        p.options.lse = static_cast<float*>(run.lse.data());
        // The split-KV kernel (no config), not an sm90 tile.
        EXPECT_FALSE(fa::chosen_kernel(p).config.has_value());
        run.dout.buffer.poison_with_nan();
        run.lse.poison_with_nan();
        fa::forward(p);
        fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
        expect_cache_result(pr, run.dout, run.lse, causal ? "forward, causal" : "forward");
        const auto via_forward = download_bits(run.dout);
        fa::KVCacheParams kv = run.params();
        kv.cache_seqlens = nullptr;         // all 3000 keys, as forward() sees them
        run.dout.buffer.poison_with_nan();  // a call that writes nothing must not match
        fa::forward_kvcache(kv);
        fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
        EXPECT_EQ(via_forward, download_bits(run.dout));
    }
}

}  // namespace
