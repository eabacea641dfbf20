// FP8 (e4m3) wgmma operands, as the FP8 forward will use them: S = Q·Kᵀ from shared memory,
// then P (S scaled, rounded to e4m3 straight from S's accumulator registers by pack_e4m3x4) as
// the A fragment of O = P·V, with V read from its transposed copy whose keys follow
// fp8_key_of_slot. One warpgroup, 64 queries, 128 keys, head dim 128 (128-byte swizzled rows) or
// 64 (64-byte swizzled rows, as the d_head 64 kernels' Q and K tiles), V's 64 columns. Checked
// against host products: a wrong fragment order, descriptor or key order fails by far more than
// fp32 rounding. sm_90a machine code (wgmma), built with the sm90 family.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "flash_attention/tools.hpp"
#include "kernels/fp8.hpp"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/swizzled_tile.cuh"
#include "kernels/primitives/sm90/tma.cuh"

namespace fa = flash_attention;

namespace {

constexpr int queries = 64, keys = 128, v_cols = 64;
// 8-bit tiles as swizzled rows of head_bytes: SwizzledTile counts 16-bit columns, so a row of 128
// e4m3 values is 64 of its columns, and a k-step of 32 bytes holds 32 values.
template <int HeadBytes>
struct ProbeTiles {
    using QTile = fa::SwizzledTile<queries, HeadBytes / 2, HeadBytes>;
    using KTile = fa::SwizzledTile<keys, HeadBytes / 2, HeadBytes>;
    using VtTile = fa::Swizzle128Tile<v_cols, keys / 2>;  // rows: V's columns; k: the key slots
    struct alignas(1024) Smem {
        unsigned char q[QTile::bytes];
        unsigned char k[KTile::bytes];
        unsigned char vt[VtTile::bytes];
    };
};

// Row-major bytes into a tile, 16-byte chunks at their swizzled places.
template <class Tile>
__device__ void fill(unsigned char* tile, const unsigned char* rows) {
    for (int c = threadIdx.x; c < Tile::rows * Tile::chunks; c += blockDim.x) {
        const int row = c / Tile::chunks, chunk = c % Tile::chunks;
        *reinterpret_cast<uint4*>(tile + Tile::chunk_offset(0, row, chunk)) =
            *reinterpret_cast<const uint4*>(rows + row * Tile::row_bytes + chunk * 16);
    }
}

template <int HeadBytes>
__global__ void __launch_bounds__(128)
    probe(const unsigned char* q, const unsigned char* k, const unsigned char* vt, float p_scale,
          float* s_out, float* o_out) {
    using QTile = typename ProbeTiles<HeadBytes>::QTile;
    using KTile = typename ProbeTiles<HeadBytes>::KTile;
    using VtTile = typename ProbeTiles<HeadBytes>::VtTile;
    extern __shared__ unsigned char raw[];
    auto& smem = *reinterpret_cast<typename ProbeTiles<HeadBytes>::Smem*>(
        (reinterpret_cast<std::uintptr_t>(raw) + 1023) & ~std::uintptr_t{1023});
    fill<QTile>(smem.q, q);
    fill<KTile>(smem.k, k);
    fill<VtTile>(smem.vt, vt);
    fa::tma::fence_shared_to_async_proxy();
    __syncthreads();

    const auto address = [](const void* p) {
        return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
    };
    float s[keys / 8][4];
    fa::ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HeadBytes / 32; ++kk) {
        fa::ptx::wgmma_ss<fa::DType::E4M3, keys, false>(
            s, QTile::k_major(address(smem.q), kk), KTile::k_major(address(smem.k), kk), kk > 0);
    }
    fa::ptx::wgmma_commit_group();
    fa::ptx::wgmma_wait<0>();
    fa::ptx::fence_operands(s);

    // A thread's accumulator element e of n8 tile nt: row 16 warp + lane / 4 + 8 (e / 2),
    // column 8 nt + 2 (lane % 4) + e % 2.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = 16 * warp + lane / 4;
    for (int nt = 0; nt < keys / 8; ++nt) {
        for (int e = 0; e < 4; ++e)
            s_out[(row0 + 8 * (e / 2)) * keys + 8 * nt + 2 * (lane % 4) + e % 2] = s[nt][e];
    }

    // P's A fragment of k-step kt: register i from n8 tiles 4 kt + 2 (i / 2) and the next, rows
    // of i % 2, in the accumulator's own order (the key order fp8_key_of_slot names). All made
    // before the first wgmma reads any (else ptxas serializes them: C7519).
    std::uint32_t a[keys / 32][4];
#pragma unroll
    for (int kt = 0; kt < keys / 32; ++kt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int t = 4 * kt + 2 * (i / 2), e = 2 * (i % 2);
            a[kt][i] = fa::ptx::pack_e4m3x4(s[t][e] * p_scale, s[t][e + 1] * p_scale,
                                            s[t + 1][e] * p_scale, s[t + 1][e + 1] * p_scale);
        }
    }
    float o[v_cols / 8][4];
    fa::ptx::wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < keys / 32; ++kt) {
        fa::ptx::wgmma_rs<fa::DType::E4M3, v_cols, false>(
            o, a[kt], VtTile::k_major(address(smem.vt), kt), kt > 0);
    }
    fa::ptx::wgmma_commit_group();
    fa::ptx::wgmma_wait<0>();
    fa::ptx::fence_operands(o);
    for (int nt = 0; nt < v_cols / 8; ++nt) {
        for (int e = 0; e < 4; ++e)
            o_out[(row0 + 8 * (e / 2)) * v_cols + 8 * nt + 2 * (lane % 4) + e % 2] = o[nt][e];
    }
}

float e4m3(std::uint8_t bits) {
    return fa::reference::to_float(fa::DType::E4M3, bits);
}

// Random e4m3 codes of magnitude at most 2 (no NaN), so that S stays within e4m3's range once
// scaled.
std::vector<std::uint8_t> random_codes(std::size_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal;
    std::vector<std::uint8_t> codes(n);
    for (auto& c : codes) {
        const float x = std::fmax(-2.0f, std::fmin(2.0f, normal(rng)));
        c = static_cast<std::uint8_t>(fa::reference::from_float(fa::DType::E4M3, x));
    }
    return codes;
}

template <class T>
T* to_device(const std::vector<T>& host) {
    T* device = nullptr;
    fa::cuda_check(cudaMalloc(&device, host.size() * sizeof(T)), "cudaMalloc");
    fa::cuda_check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
                   "cudaMemcpy");
    return device;
}

template <int head_bytes>
void check_fragments() {
    const fa::DeviceProperties& device = fa::DeviceProperties::current();
    if (device.major != 9 || device.minor != 0)
        GTEST_SKIP() << "sm_90a machine code needs compute capability 9.0";
    std::mt19937 rng(std::random_device{}());
    const auto q = random_codes(queries * head_bytes, rng);
    const auto k = random_codes(keys * head_bytes, rng);
    const auto v = random_codes(keys * v_cols, rng);  // keys x V's columns
    // V transposed, each 32-key k-step's keys at their slots.
    std::vector<std::uint8_t> vt(v_cols * keys);
    for (int c = 0; c < v_cols; ++c) {
        for (int slot = 0; slot < keys; ++slot) {
            const int key = slot / fa::fp8_k_step_keys * fa::fp8_k_step_keys +
                            fa::fp8_key_of_slot(slot % fa::fp8_k_step_keys);
            vt[c * keys + slot] = v[key * v_cols + c];
        }
    }
    const float p_scale = 0.125f;
    std::uint8_t *q_d = to_device(q), *k_d = to_device(k), *vt_d = to_device(vt);
    float *s_d = nullptr, *o_d = nullptr;
    fa::cuda_check(cudaMalloc(&s_d, sizeof(float) * queries * keys), "cudaMalloc");
    fa::cuda_check(cudaMalloc(&o_d, sizeof(float) * queries * v_cols), "cudaMalloc");
    constexpr int smem = sizeof(typename ProbeTiles<head_bytes>::Smem) + 1024;
    fa::cuda_check(
        cudaFuncSetAttribute(probe<head_bytes>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
        "cudaFuncSetAttribute");
    probe<head_bytes><<<1, 128, smem>>>(q_d, k_d, vt_d, p_scale, s_d, o_d);
    fa::cuda_check(cudaGetLastError(), "probe launch");
    fa::cuda_check(cudaDeviceSynchronize(), "probe");
    std::vector<float> s(queries * keys), o(queries * v_cols);
    fa::cuda_check(cudaMemcpy(s.data(), s_d, sizeof(float) * s.size(), cudaMemcpyDeviceToHost),
                   "cudaMemcpy");
    fa::cuda_check(cudaMemcpy(o.data(), o_d, sizeof(float) * o.size(), cudaMemcpyDeviceToHost),
                   "cudaMemcpy");
    for (void* p : {static_cast<void*>(q_d), static_cast<void*>(k_d), static_cast<void*>(vt_d),
                    static_cast<void*>(s_d), static_cast<void*>(o_d)})
        cudaFree(p);

    // S: sums of head_bytes products of 4-bit significands, exact in double; the tensor cores add
    // each k-step's products at about 14 bits (k_fp8_accumulation), 1.7e-4 off at 4.83 (H100,
    // 2026-12-06), far inside what a wrong layout or key order would give.
    for (int i = 0; i < queries; ++i) {
        for (int j = 0; j < keys; ++j) {
            double ref = 0, magnitude = 0;
            for (int c = 0; c < head_bytes; ++c) {
                const double x = double(e4m3(q[i * head_bytes + c])) * e4m3(k[j * head_bytes + c]);
                ref += x;
                magnitude += std::fabs(x);
            }
            ASSERT_NEAR(s[i * keys + j], ref,
                        head_bytes / 32 * fa::reference::k_fp8_accumulation * magnitude + 1e-6)
                << "S row " << i << ", key " << j;
        }
    }
    // O from the device's own S (P rounds the same fp32 values on both sides): P by key, V by
    // key, whatever order the fragments and V's slots hold them in; accumulated as S is.
    for (int i = 0; i < queries; ++i) {
        for (int c = 0; c < v_cols; ++c) {
            double ref = 0, magnitude = 0;
            for (int j = 0; j < keys; ++j) {
                const double p = e4m3(static_cast<std::uint8_t>(
                    fa::reference::from_float(fa::DType::E4M3, s[i * keys + j] * p_scale)));
                ref += p * e4m3(v[j * v_cols + c]);
                magnitude += std::fabs(p * e4m3(v[j * v_cols + c]));
            }
            ASSERT_NEAR(o[i * v_cols + c], ref,
                        keys / 32 * fa::reference::k_fp8_accumulation * magnitude + 1e-6)
                << "O row " << i << ", column " << c;
        }
    }
}

TEST(Fp8, WgmmaFragmentsMatchHostProducts) {
    check_fragments<128>();
}

// d_head 64: Q's and K's rows of 64 bytes on the 64-byte swizzle (Traits::qk_swizzle).
TEST(Fp8, WgmmaFragmentsMatchHostProductsOn64ByteRows) {
    check_fragments<64>();
}

}  // namespace
