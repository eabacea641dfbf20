#pragma once

// Device memory for the command line and the GPU tests: RAII buffers, uploads of
// host tensors, NaN poisoning and downloads. Not part of the public API.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flash_attention/flash_attention.hpp"
#include "reference/reference.hpp"

namespace flash_attention {

class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return data_; }
    std::size_t bytes() const { return bytes_; }

    void upload(const std::vector<std::uint16_t>& host);
    void upload(const std::vector<std::int32_t>& host);  // lengths, offsets, page tables
    void upload(const std::vector<float>& host);         // attention sinks
    std::vector<std::uint16_t> download() const;
    std::vector<float> download_floats() const;  // a float buffer (the log-sum-exp)
    // Every byte 0xFF: NaN in both fp16 and bf16, so an element the kernel never
    // writes fails the check instead of passing as a stale value.
    void poison_with_nan();

  private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// A device copy of a contiguous host tensor, and a view of it.
struct DeviceTensor {
    DeviceBuffer buffer;
    TensorView view;

    static DeviceTensor upload(const reference::HostTensor& host);
    static DeviceTensor empty_like(const reference::HostTensor& host);
    reference::HostTensor download(const reference::HostTensor& shape_of) const;
};

// Times up to `capacity` launches queued back to back on one stream: events around each,
// one synchronisation at the end, so the GPU never idles between the timed kernels.
class LaunchTimes {
  public:
    explicit LaunchTimes(int capacity);
    ~LaunchTimes();
    LaunchTimes(const LaunchTimes&) = delete;
    LaunchTimes& operator=(const LaunchTimes&) = delete;
    void before(int i, Stream stream);
    void after(int i, Stream stream);
    // Waits for launch n-1 to finish; milliseconds of launches 0..n-1.
    std::vector<double> elapsed_ms(int n);

  private:
    std::vector<void*> start_, stop_;
};

}  // namespace flash_attention
