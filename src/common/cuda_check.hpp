#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flash_attention/error.hpp"

namespace flash_attention {

// Throws Error(ErrorCode::cuda) naming the call that failed and CUDA's reason.
inline void cuda_check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
        throw Error(ErrorCode::cuda, std::string(what) + " failed: " + cudaGetErrorName(status) +
                                         " (" + cudaGetErrorString(status) + ")");
    }
}

}  // namespace flash_attention
