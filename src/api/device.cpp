// Device discovery: the current GPU's properties, queried once per device, and the
// device models that let the automatic choice be asked without a GPU.

#include <cuda_runtime_api.h>

#include <array>
#include <mutex>
#include <string>
#include <utility>

#include "api/validate.hpp"
#include "common/cuda_check.hpp"
#include "common/text.hpp"
#include "config/resources.hpp"
#include "flash_attention/flash_attention.hpp"

namespace flash_attention {

namespace {

DeviceProperties query(int index) {
    cudaDeviceProp p{};
    cuda_check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
    return {index,
            p.name,
            p.major,
            p.minor,
            p.multiProcessorCount,
            static_cast<int>(p.sharedMemPerBlockOptin),
            p.l2CacheSize};
}

}  // namespace

const DeviceProperties& DeviceProperties::current() {
    int index = 0;
    const cudaError_t status = cudaGetDevice(&index);
    if (status != cudaSuccess) {
        // Clears the error, which is ours: the caller's next cudaGetLastError() must not
        // report it.
        cudaGetLastError();
        throw Error(ErrorCode::no_device,
                    std::string("no usable CUDA device: cudaGetDevice failed: ") +
                        cudaGetErrorString(status));
    }
    // Properties do not change while the process runs: each device is queried once
    // (cudaGetDeviceProperties takes microseconds, too long for every forward()).
    constexpr int max_devices = 64;
    static std::array<DeviceProperties, max_devices> cache{};
    static std::array<std::once_flag, max_devices> cached;
    thread_local DeviceProperties beyond_cache;
    const DeviceProperties* device = &beyond_cache;
    if (index < max_devices) {
        std::call_once(cached[index], [&] { cache[index] = query(index); });
        device = &cache[index];
    } else {
        beyond_cache = query(index);
    }
    if (device->major < 8) {
        throw Error(ErrorCode::no_device, "device " + std::to_string(index) +
                                              ": expected compute capability 8.0 or newer, got " +
                                              std::to_string(device->major) + "." +
                                              std::to_string(device->minor));
    }
    return *device;
}

void check_on_device(const ForwardParams& p, const DeviceProperties& device, Stream stream) {
    check_on_device({{p.q.data, "q.data"},
                     {p.k.data, "k.data"},
                     {p.v.data, "v.data"},
                     {p.o.data, "o.data"},
                     {p.options.lse, "lse"},
                     {p.options.variants.sinks, "variants.sinks"},
                     {p.options.variants.alibi_slopes, "variants.alibi_slopes"}},
                    device, stream);
}

void check_on_device(std::initializer_list<std::pair<const void*, const char*>> pointers,
                     const DeviceProperties& device, Stream stream) {
    for (const auto& [pointer, name] : pointers) {
        if (pointer == nullptr)
            continue;
        cudaPointerAttributes a{};
        const cudaError_t status = cudaPointerGetAttributes(&a, pointer);
        if (status != cudaSuccess) {
            cudaGetLastError();  // ours, reported by the exception
            throw Error(ErrorCode::invalid_argument,
                        std::string(name) +
                            ": expected a CUDA device pointer, got one CUDA "
                            "rejects (" +
                            cudaGetErrorString(status) + ")");
        }
        // Managed memory is reachable from every device; device memory only from its own.
        const bool reachable = a.type == cudaMemoryTypeManaged ||
                               (a.type == cudaMemoryTypeDevice && a.device == device.index) ||
                               (a.type == cudaMemoryTypeHost && a.devicePointer == pointer);
        if (!reachable) {
            const std::string given =
                a.type == cudaMemoryTypeDevice ? "memory of device " + std::to_string(a.device)
                : a.type == cudaMemoryTypeHost ? "pinned host memory not mapped at this address"
                                               : "host memory";
            throw Error(ErrorCode::invalid_argument,
                        std::string(name) + ": expected memory of the current device " +
                            std::to_string(device.index) + ", got " + given);
        }
    }
    // A stream being captured into a CUDA graph rejects cudaStreamGetDevice, and the
    // rejection invalidates the capture: only streams not capturing are asked.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (const cudaError_t status = cudaStreamIsCapturing(stream, &capture); status != cudaSuccess) {
        cudaGetLastError();
        throw Error(ErrorCode::invalid_argument,
                    std::string("stream: expected a valid CUDA stream, got one CUDA rejects (") +
                        cudaGetErrorString(status) + ")");
    }
    if (capture != cudaStreamCaptureStatusNone)
        return;
    int stream_device = device.index;
    if (const cudaError_t status = cudaStreamGetDevice(stream, &stream_device);
        status != cudaSuccess) {
        cudaGetLastError();
        throw Error(ErrorCode::invalid_argument,
                    std::string("stream: expected a valid CUDA stream, got one CUDA rejects (") +
                        cudaGetErrorString(status) + ")");
    }
    if (stream_device != device.index) {
        throw Error(ErrorCode::invalid_argument,
                    "stream: expected a stream of the current device " +
                        std::to_string(device.index) + ", got one of device " +
                        std::to_string(stream_device));
    }
}

std::string DeviceProperties::description() const {
    return name + " (sm_" + std::to_string(major) + std::to_string(minor) + ", " +
           std::to_string(sm_count) + " SMs)";
}

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // ours: "no device" is an answer, not the caller's error
        return 0;
    }
    return n;
}

DeviceProperties DeviceProperties::model(std::string_view name) {
    // The figures CUDA reports on these GPUs; shared memory and L2 from DeviceLimits, the one
    // place that states them.
    if (name == "a100") {
        constexpr DeviceLimits l = DeviceLimits::a100();
        return {-1, "NVIDIA A100-SXM4-80GB", 8, 0, 108, l.smem_per_block_optin, l.l2_bytes};
    }
    if (name == "h100") {
        constexpr DeviceLimits l = DeviceLimits::h100();
        return {-1, "NVIDIA H100 80GB HBM3", 9, 0, 132, l.smem_per_block_optin, l.l2_bytes};
    }
    throw Error(ErrorCode::invalid_argument,
                "device: expected a100 or h100, got \"" + printable(name) + "\"");
}

}  // namespace flash_attention
