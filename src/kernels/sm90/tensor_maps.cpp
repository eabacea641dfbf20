#include "kernels/sm90/tensor_maps.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <string>

#include "config/resources.hpp"
#include "flash_attention/error.hpp"

namespace flash_attention::sm90 {

namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point: the library needs
// no link-time dependency on libcuda.
PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
    static const PFN_cuTensorMapEncodeTiled_v12000 function = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        const cudaError_t status = cudaGetDriverEntryPointByVersion(
            "cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
        if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
            throw Error(
                ErrorCode::cuda,
                std::string("cuTensorMapEncodeTiled: expected the driver to provide "
                            "it (CUDA 12.0 or newer), got ") +
                    (status != cudaSuccess ? cudaGetErrorString(status) : "no such entry point"));
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    return function;
}

// One map of `rank` dimensions (dims[0] the contiguous one, strides in bytes of the others),
// 16-bit elements in boxes of box[0] columns, one row of the swizzle: 64 (128-byte swizzle) or
// 32 (64-byte), as the kernels' tiles (SwizzledTile) lay them out.
CUtensorMap encode_map(const char* name, const void* data, DType dtype, int rank,
                       const cuuint64_t* dims, std::uint64_t* strides, const cuuint32_t* box) {
    // A dimension of size 1 is never stepped along, so its stride is free; TMA wants every
    // stride a non-zero multiple of 16 bytes, which the largest stride of the others is.
    std::uint64_t widest = dims[0] * 2;
    for (int i = 1; i < rank; ++i) {
        if (dims[i] > 1)
            widest = std::max(widest, strides[i - 1]);
    }
    for (int i = 1; i < rank; ++i) {
        if (dims[i] == 1)
            strides[i - 1] = widest;
    }
    const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
    CUtensorMap map{};
    const CUresult result = encode_function()(
        &map,
        dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        static_cast<cuuint32_t>(rank), const_cast<void*>(data), dims, strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE,
        box[0] == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
        throw Error(ErrorCode::cuda, std::string(name) +
                                         ": expected a tensor TMA can address (16-byte aligned "
                                         "address, strides non-zero multiples of 16 bytes), "
                                         "cuTensorMapEncodeTiled returned error " +
                                         std::to_string(static_cast<int>(result)));
    }
    return map;
}

// (d_head, seq, heads, batch), boxes of box_cols columns x box_rows (tma::load_tile).
CUtensorMap encode(const char* name, const void* data, DType dtype, int d_head, int seq, int heads,
                   int batch, const TensorStrides& stride, int box_rows, int box_cols) {
    constexpr std::uint64_t element = 2;
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(seq),
                                static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
    std::uint64_t strides[3] = {static_cast<std::uint64_t>(stride.seq) * element,
                                static_cast<std::uint64_t>(stride.head) * element,
                                static_cast<std::uint64_t>(stride.batch) * element};
    const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows),
                               1, 1};
    return encode_map(name, data, dtype, 4, dims, strides, box);
}

// pack_gqa's Q or O (tma::load_packed_tile): (d_head, group, seq, heads / group, batch),
// boxes of box_cols columns x the group's heads x 64 / group positions, which land as 64 rows,
// position-major. The group divides 64 (the launcher checks).
CUtensorMap encode_packed(const char* name, const void* data, DType dtype, int d_head, int seq,
                          int heads, int group, int batch, const TensorStrides& stride,
                          int box_cols) {
    constexpr std::uint64_t element = 2;
    const cuuint64_t dims[5] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(group),
                                static_cast<cuuint64_t>(seq),
                                static_cast<cuuint64_t>(heads / group),
                                static_cast<cuuint64_t>(batch)};
    std::uint64_t strides[4] = {static_cast<std::uint64_t>(stride.head) * element,
                                static_cast<std::uint64_t>(stride.seq) * element,
                                static_cast<std::uint64_t>(stride.head) * group * element,
                                static_cast<std::uint64_t>(stride.batch) * element};
    const cuuint32_t box[5] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(group),
                               static_cast<cuuint32_t>(64 / group), 1, 1};
    return encode_map(name, data, dtype, 5, dims, strides, box);
}

// A paged cache (pages, page_size, heads, d_head) for group-major tiles
// (tma::load_group_rows): (sub-tile columns, 8 rows, heads x sub-tiles, 8-row groups of a page,
// pages), boxes of one run of run_rows rows with all its columns. The third dimension steps a
// sub-tile's row (64 columns, or 32 where d_head is not whole 64-column sub-tiles) through a
// head's sub-tiles and on into the next head's, which start there only when the heads are
// d_head apart (paged_maps_problem()).
CUtensorMap encode_paged(const char* name, const void* data, DType dtype, int d_head, int page_size,
                         int heads, int pages, const TensorStrides& stride, int run_rows) {
    constexpr std::uint64_t element = 2;
    const int cols = tile_swizzle_bytes(d_head) / 2;
    const int sub_tiles = d_head / cols;
    const cuuint64_t dims[5] = {
        static_cast<cuuint64_t>(cols), 8, static_cast<cuuint64_t>(heads) * sub_tiles,
        static_cast<cuuint64_t>(page_size / 8), static_cast<cuuint64_t>(pages)};
    std::uint64_t strides[4] = {static_cast<std::uint64_t>(stride.seq) * element,
                                static_cast<std::uint64_t>(cols) * element,
                                8 * static_cast<std::uint64_t>(stride.seq) * element,
                                static_cast<std::uint64_t>(stride.batch) * element};
    const cuuint32_t box[5] = {static_cast<cuuint32_t>(cols), 8, static_cast<cuuint32_t>(sub_tiles),
                               static_cast<cuuint32_t>(run_rows / 8), 1};
    return encode_map(name, data, dtype, 5, dims, strides, box);
}

}  // namespace

std::string paged_maps_problem(const char* name, std::int64_t heads, std::int64_t d_head,
                               std::int64_t head_stride) {
    if (d_head % 32 != 0) {
        return std::string(name) + ".shape[3] (d_head): expected a multiple of 32 (the sm90 " +
               "family copies a paged cache's rows in whole 32- or 64-column sub-tiles), got " +
               std::to_string(d_head);
    }
    if (heads > 1 && head_stride != d_head) {
        return std::string(name) + ".stride[2] (heads): expected d_head " + std::to_string(d_head) +
               " (the sm90 family copies a run of a paged cache's rows with every column "
               "of a head in one box), got " +
               std::to_string(head_stride);
    }
    return {};
}

TensorMaps make_tensor_maps(const KernelArgs& a, DType dtype, int d_head, int d_v, int kv_rows,
                            bool packed) {
    const SequenceArgs& s = a.seqs;
    // Boxes of one row of the tiles' swizzle (tile_swizzle_bytes()).
    const auto query_map = [&](const char* name, const void* data, int d,
                               const TensorStrides& stride) {
        const int cols = tile_swizzle_bytes(d) / 2;
        if (packed) {
            return encode_packed(name, data, dtype, d, s.q_view_seq, a.heads, a.heads / a.heads_kv,
                                 s.q_view_batch, stride, cols);
        }
        return encode(name, data, dtype, d, s.q_view_seq, a.heads, s.q_view_batch, stride, 64,
                      cols);
    };
    const auto key_map = [&](const char* name, const void* data, int d,
                             const TensorStrides& stride) {
        if (s.block_table == nullptr) {
            return encode(name, data, dtype, d, s.k_view_seq, a.heads_kv, s.k_view_batch, stride,
                          kv_rows, tile_swizzle_bytes(d) / 2);
        }
        // The API routes such caches elsewhere; a map would read other heads' columns.
        if (const std::string problem = paged_maps_problem(name, a.heads_kv, d, stride.head);
            !problem.empty())
            throw Error(ErrorCode::unsupported, problem);
        return encode_paged(name, data, dtype, d, s.k_view_seq, a.heads_kv, s.k_view_batch, stride,
                            kv_rows);
    };
    return {
        query_map("q", a.q, d_head, a.q_stride),
        key_map("k", a.k, d_head, a.k_stride),
        key_map("v", a.v, d_v, a.v_stride),
        query_map("o", a.o, d_v, a.o_stride),
    };
}

TensorMaps make_fp8_tensor_maps(const KernelArgs& a, int d_head, int kv_rows, const void* vt,
                                std::int64_t seq_pad) {
    // Byte strides as 16-bit ones: exact only for even strides, and TMA takes multiples of 16
    // bytes (a dimension of one element is never stepped along).
    const auto in_pairs = [](const char* name, const TensorStrides& stride,
                             const std::array<std::int64_t, 3>& sizes) {
        const std::int64_t bytes[3] = {stride.seq, stride.head, stride.batch};
        for (int i = 0; i < 3; ++i) {
            if (sizes[i] > 1 && bytes[i] % 16 != 0) {
                throw Error(ErrorCode::invalid_argument,
                            std::string(name) + ".stride[" + std::to_string(i + 1) +
                                "]: expected a multiple of 16 bytes (FP8's TMA copies), got " +
                                std::to_string(bytes[i]));
            }
        }
        return TensorStrides{stride.batch / 2, stride.seq / 2, stride.head / 2};
    };
    const SequenceArgs& s = a.seqs;
    const TensorStrides q_pairs =
        in_pairs("q", a.q_stride, {s.q_view_seq, a.heads, s.q_view_batch});
    const TensorStrides k_pairs =
        in_pairs("k", a.k_stride, {s.k_view_seq, a.heads_kv, s.k_view_batch});
    const int cols = tile_swizzle_bytes(d_head / 2) / 2;
    const CUtensorMap k = encode("k", a.k, DType::FP16, d_head / 2, s.k_view_seq, a.heads_kv,
                                 s.k_view_batch, k_pairs, kv_rows, cols);
    const CUtensorMap q = encode("q", a.q, DType::FP16, d_head / 2, s.q_view_seq, a.heads,
                                 s.q_view_batch, q_pairs, 64, cols);
    if (vt == nullptr) {
        const TensorStrides v_pairs =
            in_pairs("v", a.v_stride, {s.k_view_seq, a.heads_kv, s.k_view_batch});
        return {q, k,
                encode("v", a.v, DType::FP16, d_head / 2, s.k_view_seq, a.heads_kv, s.k_view_batch,
                       v_pairs, kv_rows, cols),
                CUtensorMap{}};  // O: from registers
    }
    const std::int64_t row = seq_pad / 2;  // the copy's rows, in pairs of keys
    const TensorStrides vt_pairs{a.heads_kv * d_head * row, row, d_head * row};
    return {
        q, k,
        encode("v's transposed copy", vt, DType::FP16, static_cast<int>(row), d_head, a.heads_kv,
               a.batch, vt_pairs, d_head, 64),
        CUtensorMap{},  // O: from registers
    };
}

BackwardTensorMaps make_backward_tensor_maps(const BackwardArgs& a, DType dtype, int d_head,
                                             int d_v, int q_rows, int kv_rows) {
    // The views: packed sequences are one entry of total rows. Boxes of one row of the tiles'
    // swizzle (tile_swizzle_bytes(), BackwardTraits).
    const int entries = a.cu_seqlens_q != nullptr ? 1 : a.batch;
    const int cols = tile_swizzle_bytes(d_head) / 2, v_cols = tile_swizzle_bytes(d_v) / 2;
    return {
        encode("q", a.q, dtype, d_head, a.total_q, a.heads, entries, a.q_stride, q_rows, cols),
        encode("k", a.k, dtype, d_head, a.total_k, a.heads_kv, entries, a.k_stride, kv_rows, cols),
        encode("v", a.v, dtype, d_v, a.total_k, a.heads_kv, entries, a.v_stride, kv_rows, v_cols),
        encode("d_o", a.d_o, dtype, d_v, a.total_q, a.heads, entries, a.d_o_stride, q_rows, v_cols),
        encode("dk", a.dk, dtype, d_head, a.total_k, a.heads_kv, entries, a.dk_stride, kv_rows,
               cols),
        encode("dv", a.dv, dtype, d_v, a.total_k, a.heads_kv, entries, a.dv_stride, kv_rows,
               v_cols),
    };
}

}  // namespace flash_attention::sm90
