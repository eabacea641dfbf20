#include "kernels/sm90/tensor_maps.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

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

CUtensorMap encode(const char* name, const void* data, DType dtype, int d_head, int seq, int heads,
                   int batch, const TensorStrides& stride, int box_rows) {
    constexpr std::uint64_t element = 2;
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(seq),
                                static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
    // A dimension of size 1 is never stepped along, so its stride is free; TMA wants every
    // stride a non-zero multiple of 16 bytes, which the largest stride of the others is.
    std::uint64_t strides[3] = {static_cast<std::uint64_t>(stride.seq) * element,
                                static_cast<std::uint64_t>(stride.head) * element,
                                static_cast<std::uint64_t>(stride.batch) * element};
    std::uint64_t widest = static_cast<std::uint64_t>(d_head) * element;
    for (int i = 0; i < 3; ++i) {
        if (dims[i + 1] > 1)
            widest = std::max(widest, strides[i]);
    }
    for (int i = 0; i < 3; ++i) {
        if (dims[i + 1] == 1)
            strides[i] = widest;
    }
    const cuuint64_t global_strides[3] = {strides[0], strides[1], strides[2]};
    const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    CUtensorMap map{};
    const CUresult result = encode_function()(
        &map,
        dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        4, const_cast<void*>(data), dims, global_strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
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

}  // namespace

TensorMaps make_tensor_maps(const KernelArgs& a, DType dtype, int d_head, int kv_rows) {
    const SequenceArgs& s = a.seqs;
    return {
        encode("q", a.q, dtype, d_head, s.q_view_seq, a.heads, s.q_view_batch, a.q_stride, 64),
        encode("k", a.k, dtype, d_head, s.k_view_seq, a.heads_kv, s.k_view_batch, a.k_stride,
               kv_rows),
        encode("v", a.v, dtype, d_head, s.k_view_seq, a.heads_kv, s.k_view_batch, a.v_stride,
               kv_rows),
        encode("o", a.o, dtype, d_head, s.q_view_seq, a.heads, s.q_view_batch, a.o_stride, 64),
    };
}

}  // namespace flash_attention::sm90
