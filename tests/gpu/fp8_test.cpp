// FP8 (e4m3): the V transpose pass (kernels/fp8/v_transpose.hpp), every byte of V's transposed
// copy, the zero padding included, against a host loop, on random bytes with the output
// poisoned with 0xFF (e4m3's NaN) before each run; and the FP8 forward of every built FP8 config
// and of the automatic choice against the float64 reference of the dequantised inputs, by the
// FP8 rule (tools.hpp), on fresh random inputs with O poisoned with NaN.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "kernels/fp8.hpp"
#include "kernels/fp8/v_transpose.hpp"
#include "support/built_configs.hpp"

namespace fa = flash_attention;

namespace {

// A V view (batch, seq_k, heads_kv, d_v) at `offset` bytes into an allocation that holds it.
struct Layout {
    std::int64_t batch, seq_k, heads, d_v;
    std::array<std::int64_t, 3> stride;  // batch, seq, heads; elements are bytes
    std::int64_t offset = 0;

    static Layout contiguous(std::int64_t batch, std::int64_t seq_k, std::int64_t heads,
                             std::int64_t d_v) {
        return {batch, seq_k, heads, d_v, {seq_k * heads * d_v, heads * d_v, d_v}};
    }

    std::int64_t allocation_bytes() const {
        return offset + (batch - 1) * stride[0] + (seq_k - 1) * stride[1] +
               (heads - 1) * stride[2] + d_v;
    }

    std::string describe() const {
        return "V (batch " + std::to_string(batch) + ", seq_k " + std::to_string(seq_k) +
               ", heads_kv " + std::to_string(heads) + ", d_v " + std::to_string(d_v) +
               ") strides (" + std::to_string(stride[0]) + ", " + std::to_string(stride[1]) + ", " +
               std::to_string(stride[2]) + ", 1) at offset " + std::to_string(offset);
    }
};

std::string hex(std::uint8_t byte) {
    char text[8];
    std::snprintf(text, sizeof text, "0x%02X", byte);
    return text;
}

// Runs the pass once over fresh random bytes and compares the whole copy with the host's.
void check_transpose(const Layout& l, std::mt19937_64& rng) {
    std::vector<std::uint8_t> host(static_cast<std::size_t>(l.allocation_bytes()));
    for (std::uint8_t& byte : host)
        byte = static_cast<std::uint8_t>(rng());
    fa::tools::DeviceBuffer v_buffer(host.size());
    fa::cuda_check(cudaMemcpy(v_buffer.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
                   "cudaMemcpy (V)");
    const fa::TensorView v{static_cast<std::uint8_t*>(v_buffer.data()) + l.offset,
                           fa::DType::E4M3,
                           {l.batch, l.seq_k, l.heads, l.d_v},
                           {l.stride[0], l.stride[1], l.stride[2], 1}};
    const std::int64_t seq_pad = fa::fp8::padded_keys(l.seq_k);
    const std::size_t bytes = fa::fp8::transposed_v_bytes(v);
    ASSERT_EQ(bytes, static_cast<std::size_t>(l.batch * l.heads * l.d_v * seq_pad)) << l.describe();
    fa::tools::DeviceBuffer out(bytes);
    out.poison_with_nan();
    fa::fp8::transpose_v(v, out.data(), nullptr);
    fa::cuda_check(cudaDeviceSynchronize(), "FP8 V transpose");
    std::vector<std::uint8_t> got(bytes);
    fa::cuda_check(cudaMemcpy(got.data(), out.data(), bytes, cudaMemcpyDeviceToHost),
                   "cudaMemcpy (V's copy)");

    std::int64_t mismatches = 0;
    std::string first;
    std::size_t i = 0;
    for (std::int64_t b = 0; b < l.batch; ++b) {
        for (std::int64_t h = 0; h < l.heads; ++h) {
            for (std::int64_t c = 0; c < l.d_v; ++c) {
                for (std::int64_t s = 0; s < seq_pad; ++s, ++i) {
                    const std::int64_t key =
                        s / fa::fp8_k_step_keys * fa::fp8_k_step_keys +
                        fa::fp8_key_of_slot(static_cast<int>(s % fa::fp8_k_step_keys));
                    const std::uint8_t expected =
                        key < l.seq_k ? host[l.offset + b * l.stride[0] + key * l.stride[1] +
                                             h * l.stride[2] + c]
                                      : 0;
                    if (got[i] != expected && mismatches++ == 0) {
                        first = "[" + std::to_string(b) + "][" + std::to_string(h) + "][" +
                                std::to_string(c) + "][" + std::to_string(s) + "] (byte " +
                                std::to_string(i) + ", key " + std::to_string(key) +
                                (key < l.seq_k ? "" : ", padding") + "): expected " +
                                hex(expected) + ", got " + hex(got[i]);
                    }
                }
            }
        }
    }
    EXPECT_EQ(mismatches, 0) << l.describe() << ": first mismatch at " << first << " of " << bytes
                             << " bytes";
}

// Calls the pass on `v` and expects Error with `code` and a message starting with `argument`.
void expect_rejected(const fa::TensorView& v, fa::ErrorCode code, const std::string& argument) {
    fa::tools::DeviceBuffer out(fa::fp8::transposed_v_bytes(v));
    try {
        fa::fp8::transpose_v(v, out.data(), nullptr);
        ADD_FAILURE() << argument << ": accepted";
    } catch (const fa::Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        EXPECT_EQ(std::string(e.what()).rfind(argument + ": expected ", 0), 0u) << e.what();
    }
}

}  // namespace

TEST(Fp8, VTransposeMatchesHost) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    std::mt19937_64 rng(20261201);
    for (const std::int64_t seq_k : {1, 31, 32, 33, 1000, 4100}) {
        for (const std::int64_t heads : {1, 3}) {
            for (const std::int64_t d_v : {64, 128, 192, 256})
                check_transpose(Layout::contiguous(1, seq_k, heads, d_v), rng);
        }
    }
    // Heads 1..3 of an (8 heads, 160 columns) tensor: 16-byte strides, 16-byte loads.
    check_transpose({2, 1000, 3, 128, {1000 * 8 * 160, 8 * 160, 160}, 160 + 32}, rng);
    // Columns 8.. of rows of 136 bytes: the byte loads.
    check_transpose({2, 77, 3, 128, {77 * 3 * 136 + 8, 3 * 136, 136}, 8}, rng);
    // d_v a multiple of 16 but not of 64: the last column tile holds one chunk.
    check_transpose(Layout::contiguous(1, 33, 2, 80), rng);
}

TEST(Fp8, VTransposeRejectsBadInput) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    fa::tools::DeviceBuffer v_buffer(64 * 4 * 256);
    fa::TensorView v = fa::TensorView::contiguous(v_buffer.data(), fa::DType::E4M3, 1, 64, 4, 64);
    v.dtype = fa::DType::BF16;
    expect_rejected(v, fa::ErrorCode::dtype, "v.dtype");
    v = fa::TensorView::contiguous(v_buffer.data(), fa::DType::E4M3, 1, 64, 4, 72);
    expect_rejected(v, fa::ErrorCode::invalid_argument, "v.shape[3] (d_v)");
    v = fa::TensorView::contiguous(v_buffer.data(), fa::DType::E4M3, 1, 64, 2, 64);
    v.stride[3] = 2;
    expect_rejected(v, fa::ErrorCode::invalid_argument, "v.stride[3] (d_v)");
}

namespace {

// A device copy of fp32 values (the descales).
fa::tools::DeviceBuffer upload_floats(const std::vector<float>& values) {
    fa::tools::DeviceBuffer buffer(values.size() * sizeof(float));
    buffer.upload(values);
    return buffer;
}

struct Fp8Shape {
    int batch, seq_q, seq_k, heads, heads_kv;
    bool causal, top_left;
    bool non_negative_v = false;  // |V|: O's sum over the keys grows with them, one sign throughout
};

// One FP8 forward on fresh inputs: `config` or (nullopt) the automatic choice; with
// `first_q_descale`, the first (sequence, K/V head)'s q descale set to it.
void check_fp8_forward(const std::optional<fa::KernelConfig>& config, int d, const Fp8Shape& s,
                       std::uint64_t seed, std::optional<float> first_q_descale = {}) {
    using fa::reference::HostTensor;
    const HostTensor q =
        HostTensor::random_normal(fa::DType::E4M3, s.batch, s.seq_q, s.heads, d, seed);
    const HostTensor k =
        HostTensor::random_normal(fa::DType::E4M3, s.batch, s.seq_k, s.heads_kv, d, seed + 1);
    HostTensor v =
        HostTensor::random_normal(fa::DType::E4M3, s.batch, s.seq_k, s.heads_kv, d, seed + 2);
    if (s.non_negative_v) {
        std::vector<std::uint16_t> magnitudes = v.bits;
        for (std::uint16_t& b : magnitudes)
            b &= 0x7F;  // e4m3's sign bit
        v = HostTensor::from_bits(fa::DType::E4M3, s.batch, s.seq_k, s.heads_kv, d,
                                  std::move(magnitudes));
    }
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::uniform_real_distribution<float> factor(0.25f, 2.0f);
    std::vector<float> descales[3];
    for (auto& ds : descales) {
        ds.resize(static_cast<std::size_t>(s.batch) * s.heads_kv);
        for (float& x : ds)
            x = factor(rng);
    }
    if (first_q_descale)
        descales[0][0] = *first_q_descale;
    // E4M3 tensors at a byte an element (the tools' DeviceTensor), with their views.
    const auto q_d = fa::tools::DeviceTensor::upload(q), k_d = fa::tools::DeviceTensor::upload(k),
               v_d = fa::tools::DeviceTensor::upload(v);
    const auto qs = upload_floats(descales[0]), ks = upload_floats(descales[1]),
               vs = upload_floats(descales[2]);
    fa::tools::DeviceBuffer o_d(static_cast<std::size_t>(q.size()) * 2);
    fa::tools::DeviceBuffer lse_d(static_cast<std::size_t>(s.batch) * s.heads * s.seq_q *
                                  sizeof(float));
    o_d.poison_with_nan();
    lse_d.poison_with_nan();
    fa::ForwardParams p;
    p.q = q_d.view;
    p.k = k_d.view;
    p.v = v_d.view;
    p.o = fa::TensorView::contiguous(o_d.data(), fa::DType::BF16, s.batch, s.seq_q, s.heads, d);
    p.options.causal = s.causal;
    p.options.causal_alignment =
        s.top_left ? fa::CausalAlignment::top_left : fa::CausalAlignment::bottom_right;
    p.options.lse = static_cast<float*>(lse_d.data());
    p.descales =
        fa::Fp8Descales{static_cast<const float*>(qs.data()), static_cast<const float*>(ks.data()),
                        static_cast<const float*>(vs.data())};
    if (config)
        fa::forward(p, *config);
    else
        fa::forward(p);
    fa::cuda_check(cudaDeviceSynchronize(), "FP8 forward");
    const HostTensor out =
        HostTensor::from_bits(fa::DType::BF16, s.batch, s.seq_q, s.heads, d, o_d.download());
    const std::vector<float> lse = lse_d.download_floats();
    const double scale = 1.0 / std::sqrt(double(d));
    fa::reference::Problem problem{q, k, v, out, scale, s.causal, &lse, s.top_left};
    problem.q_descale = &descales[0];
    problem.k_descale = &descales[1];
    problem.v_descale = &descales[2];
    const auto result = fa::reference::check_attention(
        problem, fa::reference::sample_rows(s.batch, s.heads, s.seq_q, 64, seed));
    EXPECT_TRUE(result.passed) << (config ? config->to_string() : "automatic choice") << ", d " << d
                               << ", batch " << s.batch << " x " << s.seq_q << " x " << s.seq_k
                               << ", heads " << s.heads << "/" << s.heads_kv
                               << (s.causal ? (s.top_left ? ", causal top-left" : ", causal") : "")
                               << ": " << result.summary() << "; seed " << seed;
}

const Fp8Shape fp8_shapes[] = {
    {2, 1000, 1000, 4, 2, false, false},
    {2, 1000, 1000, 4, 2, true, false},
    {1, 129, 4096, 8, 1, true, false},
    {1, 300, 77, 2, 2, false, false},
    {1, 200, 700, 2, 1, true, true},
    {1, 700, 200, 2, 2, true, false},
    // Keys enough that O's sum over blocks would drift if the tensor cores' 14-bit additions
    // (k_fp8_accumulation) compounded: O accumulates across every block in them. With V's
    // magnitudes the sum only grows and the additions' rounding cannot cancel.
    {1, 64, 65536, 2, 1, false, false},
    {1, 64, 16384, 2, 1, false, false, true},
    {1, 64, 65536, 2, 1, false, false, true},
};

}  // namespace

TEST(Fp8, ForwardMatchesReference) {
    const fa::DeviceProperties& device = fa::DeviceProperties::current();
    if (fa::testing::fp8_configs().empty() || device.major != 9 || device.minor != 0)
        GTEST_SKIP() << "no FP8 config in this build, or not a Hopper GPU";
    std::uint64_t seed = std::random_device{}();
    for (const fa::KernelConfig& c : fa::testing::fp8_configs()) {
        for (const Fp8Shape& s : fp8_shapes)
            check_fp8_forward(c, c.d_head, s, seed += 3);
    }
    // A zero q descale (an all-zero Q's): its heads' scores are all 0, the softmax uniform over
    // the keys each row sees (the kernels fold it into the scale as the smallest normal float, so
    // a masked score stays -inf).
    for (const fa::KernelConfig& c : fa::testing::fp8_configs())
        check_fp8_forward(c, c.d_head, fp8_shapes[1], seed += 3, 0.0f);
    // The automatic choice, at each head dim the build has an FP8 kernel of.
    for (const int d : {64, 128, 256}) {
        const auto& built = fa::testing::fp8_configs();
        if (std::any_of(built.begin(), built.end(),
                        [d](const fa::KernelConfig& c) { return c.d_head == d; }))
            check_fp8_forward(std::nullopt, d, fp8_shapes[1], seed += 3);
    }
}

// Decoding shapes through forward() run on the split-KV kernel's e4m3 instances (its tiles of
// (position, query head) rows), which any build has: decoding, speculative decoding (causal
// both ways), and a batch of one over many keys (split into ranges and merged).
TEST(Fp8, DecodingShapesRunOnTheSplitKvKernel) {
    if (fa::DeviceProperties::current().major != 9)
        GTEST_SKIP() << "FP8 attention runs on Hopper";
    const Fp8Shape shapes[] = {
        {4, 1, 4096, 16, 2, false, false},
        {2, 16, 2048, 8, 2, true, false},
        {2, 16, 2048, 8, 2, true, true},
        {1, 1, 30000, 8, 8, false, false},
    };
    std::uint64_t seed = std::random_device{}();
    for (const int d : {64, 128, 256}) {
        for (const Fp8Shape& s : shapes) {
            const fa::ProblemShape shape{.dtype = fa::DType::E4M3,
                                         .d_head = d,
                                         .batch = s.batch,
                                         .seq_q = s.seq_q,
                                         .seq_k = s.seq_k,
                                         .heads = s.heads,
                                         .heads_kv = s.heads_kv,
                                         .causal = s.causal};
            EXPECT_FALSE(fa::chosen_kernel(shape, fa::DeviceProperties::current()).config)
                << "d " << d << ", seq_q " << s.seq_q << ": expected the split-KV kernel";
            check_fp8_forward(std::nullopt, d, s, seed += 3);
        }
    }
}
