#include "kernels/fp8/v_transpose.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "kernels/launch_support.cuh"

namespace flash_attention::fp8 {

namespace {

// A CTA moves one (batch, head) tile of 4 k-steps by 64 columns: 8 KB through shared memory,
// reading 64-byte row pieces of V and writing 32-byte pieces of the copy's rows, whole sectors.
constexpr int tile_keys = 4 * fp8_k_step_keys;
constexpr int tile_cols = 64;
constexpr int chunks_per_row = tile_cols / 16;
constexpr int threads = 256;
constexpr int chunks_per_thread = tile_keys * chunks_per_row / threads;
constexpr int quads_per_thread = tile_keys / 4 * tile_cols / 4 / threads;

struct TransposeArgs {
    const std::uint8_t* v;
    std::uint8_t* out;
    std::int64_t batch_stride, seq_stride, head_stride;  // V's, in bytes
    std::int64_t seq_k, seq_pad;
    int heads, d_v, col_tiles;
};

// The word offset of 16-byte chunk c of tile row `row`. A 64-byte row covers half the banks, so
// rows swap with their neighbour where bit 2 is set and chunks XOR with bits 3-4: the 32 words
// one load of the second phase reads (rows 4 q + i of 8 consecutive q, the 4 words of a chunk)
// then lie in 32 distinct banks, and the first phase's 16-byte stores stay conflict-free too.
__device__ int tile_word(int row, int c) {
    return (row ^ (row >> 2 & 1)) * (tile_cols / 4) + (c ^ (row >> 3 & 3)) * 4;
}

template <bool Vector>
__device__ uint4 load_16(const std::uint8_t* p) {
    if constexpr (Vector) {
        return *reinterpret_cast<const uint4*>(p);
    } else {
        const auto word = [p](int i) {
            return std::uint32_t{p[i]} | std::uint32_t{p[i + 1]} << 8 |
                   std::uint32_t{p[i + 2]} << 16 | std::uint32_t{p[i + 3]} << 24;
        };
        return {word(0), word(4), word(8), word(12)};
    }
}

// Rows m[0..3] of a 4 x 4 byte matrix become its columns: byte i of m[j] is byte j of row i.
__device__ void transpose_4x4(std::uint32_t (&m)[4]) {
    const std::uint32_t lo01 = __byte_perm(m[0], m[1], 0x5140);
    const std::uint32_t hi01 = __byte_perm(m[0], m[1], 0x7362);
    const std::uint32_t lo23 = __byte_perm(m[2], m[3], 0x5140);
    const std::uint32_t hi23 = __byte_perm(m[2], m[3], 0x7362);
    m[0] = __byte_perm(lo01, lo23, 0x5410);
    m[1] = __byte_perm(lo01, lo23, 0x7632);
    m[2] = __byte_perm(hi01, hi23, 0x5410);
    m[3] = __byte_perm(hi01, hi23, 0x7632);
}

template <bool Vector>
__global__ void __launch_bounds__(threads)
    transpose_kernel(const __grid_constant__ TransposeArgs a) {
    __shared__ alignas(16) std::uint32_t tile[tile_keys * tile_cols / 4];
    const int col0 = static_cast<int>(blockIdx.x % a.col_tiles) * tile_cols;
    const std::int64_t key0 = std::int64_t{blockIdx.x / a.col_tiles} * tile_keys;
    const int head = blockIdx.y;
    const int b = blockIdx.z;
    const int tid = threadIdx.x;

    // Rows of V in, each key at its slot's row. Every load is issued before the first store;
    // keys past seq_k are zeros, the copy's padding.
    const std::uint8_t* v = a.v + b * a.batch_stride + head * a.head_stride + col0;
    uint4 chunks[chunks_per_thread];
    for (int i = 0; i < chunks_per_thread; ++i) {
        const int x = tid + i * threads;
        const std::int64_t key = key0 + x / chunks_per_row;
        const int c = x % chunks_per_row;
        chunks[i] = key < a.seq_k && col0 + 16 * c < a.d_v
                        ? load_16<Vector>(v + key * a.seq_stride + 16 * c)
                        : uint4{0, 0, 0, 0};
    }
    for (int i = 0; i < chunks_per_thread; ++i) {
        const int x = tid + i * threads;
        const int k = x / chunks_per_row;
        const int row =
            k / fp8_k_step_keys * fp8_k_step_keys + fp8_slot_of_key(k % fp8_k_step_keys);
        *reinterpret_cast<uint4*>(&tile[tile_word(row, x % chunks_per_row)]) = chunks[i];
    }
    __syncthreads();

    // Copy rows out: a thread transposes the 4 x 4 bytes of slots 4 q..4 q + 3 by columns
    // 4 u..4 u + 3 of chunk c. A warp takes 8 consecutive quads of one chunk, so each of its
    // stores writes 32 consecutive bytes of 4 of the copy's rows.
    for (int i = 0; i < quads_per_thread; ++i) {
        const int x = tid + i * threads;
        const int u = x % 4;
        const int q = x / 4 % 8 + x / 128 * 8;
        const int c = x / 32 % chunks_per_row;
        const int col = col0 + 16 * c + 4 * u;
        if (col >= a.d_v || key0 + 4 * q >= a.seq_pad)
            continue;
        std::uint32_t m[4];
        for (int r = 0; r < 4; ++r)
            m[r] = tile[tile_word(4 * q + r, c) + u];
        transpose_4x4(m);
        std::uint8_t* out =
            a.out + ((std::int64_t{b} * a.heads + head) * a.d_v + col) * a.seq_pad + key0 + 4 * q;
        for (int j = 0; j < 4; ++j)
            *reinterpret_cast<std::uint32_t*>(out + j * a.seq_pad) = m[j];
    }
}

}  // namespace

void transpose_v(const TensorView& v, void* out, Stream stream) {
    if (v.dtype != DType::E4M3) {
        throw Error(ErrorCode::dtype,
                    "v.dtype: expected E4M3, got " + std::string(to_string(v.dtype)));
    }
    if (v.shape[3] <= 0 || v.shape[3] % 16 != 0) {
        throw Error(ErrorCode::invalid_argument,
                    "v.shape[3] (d_v): expected a positive multiple of 16, got " +
                        std::to_string(v.shape[3]));
    }
    if (v.stride[3] != 1) {
        throw Error(
            ErrorCode::invalid_argument,
            "v.stride[3] (d_v): expected 1 (contiguous d_v), got " + std::to_string(v.stride[3]));
    }
    if (v.shape[0] == 0 || v.shape[1] == 0 || v.shape[2] == 0)
        return;
    const TransposeArgs args{
        .v = static_cast<const std::uint8_t*>(v.data),
        .out = static_cast<std::uint8_t*>(out),
        .batch_stride = v.stride[0],
        .seq_stride = v.stride[1],
        .head_stride = v.stride[2],
        .seq_k = v.shape[1],
        .seq_pad = padded_keys(v.shape[1]),
        .heads = static_cast<int>(v.shape[2]),
        .d_v = static_cast<int>(v.shape[3]),
        .col_tiles = static_cast<int>((v.shape[3] + tile_cols - 1) / tile_cols),
    };
    const dim3 grid(
        static_cast<unsigned>((args.seq_pad + tile_keys - 1) / tile_keys * args.col_tiles),
        static_cast<unsigned>(v.shape[2]), static_cast<unsigned>(v.shape[0]));
    const auto aligned = [&v](int i) { return v.shape[i] == 1 || v.stride[i] % 16 == 0; };
    if (reinterpret_cast<std::uintptr_t>(v.data) % 16 == 0 && aligned(0) && aligned(1) &&
        aligned(2)) {
        launch_kernel<&transpose_kernel<true>>(grid, threads, 0, stream, args,
                                               "FP8 V transpose kernel launch");
    } else {
        launch_kernel<&transpose_kernel<false>>(grid, threads, 0, stream, args,
                                                "FP8 V transpose kernel launch (byte loads)");
    }
}

}  // namespace flash_attention::fp8
