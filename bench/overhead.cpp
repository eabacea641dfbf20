// Host cost of one call of the C++ API (flash_attention::forward), on a problem so small
// that the GPU finishes each kernel long before the host issues the next: microseconds per
// call, best of 20 batches of 200 calls with a synchronisation between batches (a full
// launch queue would time the GPU instead). Prints one line per path.
//
//   flash_attention_overhead

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "flash_attention/flash_attention.hpp"

namespace fa = flash_attention;

namespace {

template <class Call>
double microseconds_per_call(Call call) {
    constexpr int batch = 200;
    call();
    cudaDeviceSynchronize();
    double best = std::numeric_limits<double>::infinity();
    for (int round = 0; round < 20; ++round) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < batch; ++i)
            call();
        const std::chrono::duration<double, std::micro> took =
            std::chrono::steady_clock::now() - start;
        best = std::min(best, took.count() / batch);
        cudaDeviceSynchronize();
    }
    return best;
}

}  // namespace

int main() {
    if (fa::device_count() == 0) {
        std::fprintf(stderr, "flash_attention_overhead: no CUDA device found\n");
        return 1;
    }
    const fa::KernelConfig config = fa::configs().front();
    const int seq = std::max(config.B_r, config.B_c);
    void* buffers[4] = {};
    for (void*& b : buffers) {
        if (cudaMalloc(&b, std::size_t{2} * seq * config.d_head) != cudaSuccess) {
            std::fprintf(stderr, "flash_attention_overhead: cudaMalloc failed\n");
            return 1;
        }
        cudaMemset(b, 0, std::size_t{2} * seq * config.d_head);
    }
    const auto view = [&](void* data) {
        return fa::TensorView::contiguous(data, config.dtype, 1, seq, 1, config.d_head);
    };
    const fa::ForwardParams p{view(buffers[0]), view(buffers[1]), view(buffers[2]),
                              view(buffers[3]), std::nullopt};
    std::printf("shape (1, %d, 1, %d) %s\n", seq, config.d_head,
                std::string(fa::to_string(config.dtype)).c_str());
    std::printf("fa::forward(params, stream) (automatic choice): %.2f us\n",
                microseconds_per_call([&] { fa::forward(p); }));
    std::printf("fa::forward(params, config, stream): %.2f us\n",
                microseconds_per_call([&] { fa::forward(p, config); }));
    for (void* b : buffers)
        cudaFree(b);
    return 0;
}
