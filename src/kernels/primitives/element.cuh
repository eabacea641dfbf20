#pragma once

// The CUDA element type of each DType.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention {

template <DType dtype>
struct Element;
template <>
struct Element<DType::FP16> {
    using type = __half;
};
template <>
struct Element<DType::BF16> {
    using type = __nv_bfloat16;
};
template <>
struct Element<DType::E4M3> {
    using type = __nv_fp8_e4m3;
};

}  // namespace flash_attention
