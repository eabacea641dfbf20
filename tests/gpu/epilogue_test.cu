// The epilogue's register-path store (store_accumulator_rows: a quad transpose, then 16-byte
// pieces), which the sm90 forward's FP8 O and packed sequences' tail rows and the sm90 backward's
// packed dK/dV take: one warp's m16n8 accumulators, each element its own (row, column) value,
// stored to a strided fp16 slice filled with NaN. Every stored element must sit at its row and
// column, scaled and rounded; rows past the valid ones, columns past NT's and each row's padding
// keep the NaN.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "kernels/primitives/epilogue.cuh"

namespace fa = flash_attention;

namespace {

constexpr std::uint16_t poison = 0x7E00;  // an fp16 NaN

// The value of row r, column c before scaling: exact in fp16 after the test's scale of 0.5.
__host__ __device__ constexpr float element_value(int r, int c) {
    return static_cast<float>(r * 100 + c);
}

// Accumulator element e of n8 tile nt of lane l: row l / 4 + 8 (e / 2), column 8 nt + 2 (l % 4)
// + e % 2 (the m16n8 layout).
template <int NT, int N>
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
    fa::store_accumulator_rows<fa::DType::FP16, NT>(acc, scale, [&](int h) {
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

template <int NT, int N>
void check_store(std::int64_t stride, int valid_rows) {
    constexpr int rows = 16;
    const float scale = 0.5f;
    std::vector<std::uint16_t> host(rows * stride, poison);
    std::uint16_t* device = nullptr;
    fa::cuda_check(cudaMalloc(&device, host.size() * sizeof(std::uint16_t)), "cudaMalloc");
    fa::cuda_check(cudaMemcpy(device, host.data(), host.size() * sizeof(std::uint16_t),
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy");
    store_rows_probe<NT, N><<<1, 32>>>(device, stride, valid_rows, scale);
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
            const bool ok =
                stored ? half_to_float(bits) == element_value(r, c) * scale : bits == poison;
            if (!ok && ++wrong <= 5) {
                ADD_FAILURE() << "row " << r << ", column " << c << ": "
                              << (stored ? "expected " + std::to_string(element_value(r, c) * scale)
                                         : std::string("expected the NaN left unwritten"))
                              << ", got bits 0x" << std::hex << bits << std::dec;
            }
        }
    }
    EXPECT_EQ(wrong, 0) << "NT " << NT << " of " << N << " tiles, stride " << stride << ", "
                        << valid_rows << " valid rows";
}

TEST(Epilogue, AccumulatorRowsLandAtTheirRowsAndColumns) {
    check_store<16, 16>(128, 16);  // every row, whole rows
    check_store<8, 12>(72, 11);    // the first 8 of 12 tiles, padded rows, a partial row set
    check_store<4, 4>(40, 1);      // one row
    check_store<8, 8>(64, 0);      // no row: nothing written
}

}  // namespace
