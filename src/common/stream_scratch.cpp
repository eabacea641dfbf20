#include "common/stream_scratch.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "common/cuda_check.hpp"
#include "common/relaxed_capture.hpp"

namespace flash_attention {

namespace {

// The library's pools, one per device, created on first use and kept for the process.
struct Pools {
    std::mutex mutex;
    std::unordered_map<int, cudaMemPool_t> of_device;
};

Pools& pools() {
    static Pools p;
    return p;
}

// The current device's pool. Its release threshold keeps what it holds mapped across
// synchronisations, so the per-launch allocation is a pool lookup, not a driver mapping
// (release_pool_memory() hands it back); the caller's default pool and its settings stay
// untouched.
cudaMemPool_t pool_of_current_device() {
    Pools& all = pools();
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    const std::lock_guard lock(all.mutex);
    auto& by_device = all.of_device;
    if (const auto it = by_device.find(device); it != by_device.end())
        return it->second;
    const RelaxedCapture relaxed;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    cuda_check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate (stream scratch)");
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
               "cudaMemPoolSetAttribute(ReleaseThreshold)");
    by_device.emplace(device, pool);
    return pool;
}

}  // namespace

void release_pool_memory() {
    Pools& all = pools();
    const std::lock_guard lock(all.mutex);
    for (const auto& entry : all.of_device)
        cuda_check(cudaMemPoolTrimTo(entry.second, 0), "cudaMemPoolTrimTo (stream scratch)");
}

StreamScratch::StreamScratch(std::size_t bytes, Stream stream, bool zeroed, Pool pool)
    : stream_(stream) {
    if (pool == Pool::library) {
        cuda_check(cudaMallocFromPoolAsync(&data_, bytes, pool_of_current_device(), stream_),
                   "cudaMallocFromPoolAsync (stream scratch)");
    } else {
        cuda_check(cudaMallocAsync(&data_, bytes, stream_), "cudaMallocAsync (stream scratch)");
    }
    if (!zeroed)
        return;
    const cudaError_t status = cudaMemsetAsync(data_, 0, bytes, stream_);
    if (status != cudaSuccess) {
        cudaFreeAsync(data_, stream_);
        cuda_check(status, "cudaMemsetAsync (stream scratch)");
    }
}

StreamScratch::~StreamScratch() {
    // A destructor does not throw: a failure here leaves the bytes in the pool, and the
    // stream's next call reports any sticky error.
    if (cudaFreeAsync(data_, stream_) != cudaSuccess)
        cudaGetLastError();
}

StreamCounters::StreamCounters(int count, Stream stream) {
    const std::size_t bytes = sizeof(int) * static_cast<std::size_t>(count);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) {
        captured_.emplace(bytes, stream, true);
        data_ = static_cast<int*>(captured_->get());
        return;
    }
    int device = 0;
    unsigned long long id = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(cudaStreamGetId(stream, &id), "cudaStreamGetId");
    static std::mutex mutex;
    static std::map<std::tuple<int, unsigned long long, int>, int*> counters;
    const std::lock_guard lock(mutex);
    int*& held = counters[{device, id, count}];
    if (held == nullptr) {
        // Stream-ordered, like the launches that use them. Never freed: they are a few
        // bytes, and a launch on the stream may still be queued when it is destroyed.
        void* fresh = nullptr;
        cuda_check(cudaMallocFromPoolAsync(&fresh, bytes, pool_of_current_device(), stream),
                   "cudaMallocFromPoolAsync (stream counters)");
        if (const cudaError_t status = cudaMemsetAsync(fresh, 0, bytes, stream);
            status != cudaSuccess) {
            cudaFreeAsync(fresh, stream);
            cuda_check(status, "cudaMemsetAsync (stream counters)");
        }
        held = static_cast<int*>(fresh);
    }
    data_ = held;
}

}  // namespace flash_attention
