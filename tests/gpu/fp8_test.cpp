// FP8 (e4m3) prefill's V transpose pass (kernels/fp8/v_transpose.hpp): every byte of V's
// transposed copy, the zero padding included, against a host loop, on random bytes with the
// output poisoned with 0xFF (e4m3's NaN) before each run.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "kernels/fp8/v_transpose.hpp"
#include "kernels/fp8_key_order.hpp"

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
