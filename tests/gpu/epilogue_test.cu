// The epilogue's register-path store (store_accumulator_rows: a quad transpose, then 16-byte
// pieces), which the sm90 forward's FP8 O and packed sequences' tail rows and the sm90 backward's
// packed dK/dV take: one warp's m16n8 accumulators, each element its own (row, column) value,
// stored to a strided 16-bit slice filled with NaN. Every stored element must sit at its row and
// column, scaled and rounded (fp16: exact values; bf16: rounded to nearest even, as the host
// rounds them); rows past the valid ones, columns past NT's and each row's padding keep the NaN.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "kernels/primitives/epilogue.cuh"

namespace fa = flash_attention;

namespace {

constexpr std::uint16_t poison = 0x7FFF;  // a NaN in fp16 and in bf16

// The value of row r, column c before scaling, distinct for every element of 16 rows and up to
// 256 columns: magnitudes 1 to 2048 (fp16's 11 bits), the upper 8 rows negative, so that they
// stay exact in fp16 after the test's scale of 0.5; bf16 (8 bits) rounds them.
__host__ __device__ constexpr float element_value(int r, int c) {
    return static_cast<float>((r < 8 ? 1 : -1) * ((r % 8) * 256 + c + 1));
}

// Accumulator element e of n8 tile nt of lane l: row l / 4 + 8 (e / 2), column 8 nt + 2 (l % 4)
// + e % 2 (the m16n8 layout).
template <fa::DType dtype, int NT, int N>
__global__ void store_rows_probe(std::uint16_t* out, std::int64_t stride, int valid_rows,
                                 float scale) {
    const int lane = static_cast<int>(threadIdx.x);
    float acc[N][4];
#pragma unroll
    for (int nt = 0; nt < N; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            acc[nt][e] = element_value(lane / 4 + 8 * (e / 2), 8 * nt + 2 * (lane % 4) + e % 2);
    }
    fa::store_accumulator_rows<dtype, NT>(acc, scale, [&](int h) {
        const int row = lane / 4 + 8 * h;
        return row < valid_rows ? out + row * stride : nullptr;
    });
}

// fp16 bits to float, for the finite values and NaN this test writes.
float half_to_float(std::uint16_t h) {
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const float sign = (h & 0x8000) != 0 ? -1.0f : 1.0f;
    if (exponent == 0x1f)
        return mantissa != 0 ? NAN : sign * INFINITY;
    if (exponent == 0)
        return sign * std::ldexp(static_cast<float>(mantissa), -24);
    return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent - 15);
}

// fp32 to bf16 bits, rounded to nearest even (finite values).
std::uint16_t bf16_bits(float x) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

template <fa::DType dtype, int NT, int N>
void check_store(std::int64_t stride, int valid_rows) {
    constexpr int rows = 16;
    const float scale = 0.5f;
    std::vector<std::uint16_t> host(rows * stride, poison);
    std::uint16_t* device = nullptr;
    fa::cuda_check(cudaMalloc(&device, host.size() * sizeof(std::uint16_t)), "cudaMalloc");
    fa::cuda_check(cudaMemcpy(device, host.data(), host.size() * sizeof(std::uint16_t),
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy");
    store_rows_probe<dtype, NT, N><<<1, 32>>>(device, stride, valid_rows, scale);
    fa::cuda_check(cudaGetLastError(), "store_rows_probe launch");
    fa::cuda_check(cudaDeviceSynchronize(), "store_rows_probe");
    fa::cuda_check(cudaMemcpy(host.data(), device, host.size() * sizeof(std::uint16_t),
                              cudaMemcpyDeviceToHost),
                   "cudaMemcpy");
    cudaFree(device);
    int wrong = 0;
    for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < stride; ++c) {
            const std::uint16_t bits = host[r * stride + c];
            const bool stored = r < valid_rows && c < 8 * NT;
            const float value = element_value(r, c) * scale;
            const bool ok = !stored                    ? bits == poison
                            : dtype == fa::DType::FP16 ? half_to_float(bits) == value
                                                       : bits == bf16_bits(value);
            if (!ok && ++wrong <= 5) {
                ADD_FAILURE() << "row " << r << ", column " << c << ": "
                              << (stored ? "expected " + std::to_string(value)
                                         : std::string("expected the NaN left unwritten"))
                              << ", got bits 0x" << std::hex << bits << std::dec;
            }
        }
    }
    EXPECT_EQ(wrong, 0) << (dtype == fa::DType::FP16 ? "fp16" : "bf16") << ", NT " << NT << " of "
                        << N << " tiles, stride " << stride << ", " << valid_rows << " valid rows";
}

TEST(Epilogue, AccumulatorRowsLandAtTheirRowsAndColumns) {
    using fa::DType;
    check_store<DType::FP16, 16, 16>(128, 16);  // every row, whole rows
    check_store<DType::FP16, 8, 12>(72, 11);    // the first 8 of 12 tiles, padded rows, some rows
    check_store<DType::FP16, 12, 12>(96, 16);   // d_head 96's 12 tiles
    check_store<DType::FP16, 32, 32>(264, 9);   // d_head 256's 32
    check_store<DType::FP16, 4, 4>(40, 1);      // one row
    check_store<DType::FP16, 8, 8>(64, 0);      // no row: nothing written
    check_store<DType::BF16, 16, 16>(136, 13);  // bf16 (FP8's O, bf16 gradients), rounded
    check_store<DType::BF16, 24, 24>(192, 16);  // d_head 192's 24
}

}  // namespace
