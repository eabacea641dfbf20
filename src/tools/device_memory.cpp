#include "flash_attention/tools.hpp"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "common/cuda_check.hpp"

namespace flash_attention::tools {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    cuda_check(cudaMalloc(&data_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
    if (data_ != nullptr)
        cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        if (data_ != nullptr)
            cudaFree(data_);
        data_ = std::exchange(other.data_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
}

namespace {

// The copies and the poison run on the legacy default stream, which a non-blocking stream does
// not wait for: each completes on the whole device before it returns (a poison still queued when
// a kernel on a non-blocking stream wrote O overwrote it with NaN, and the GPU tests failed
// whenever other processes shared the GPU, H100, 2026-12-06), and a download first waits for
// every stream's work.
void settle(const char* what) {
    cuda_check(cudaDeviceSynchronize(), what);
}

void upload_bytes(void* device, std::size_t capacity, const void* host, std::size_t bytes) {
    if (bytes > capacity) {
        throw Error(ErrorCode::invalid_argument, "upload: expected at most " +
                                                     std::to_string(capacity) + " bytes, got " +
                                                     std::to_string(bytes));
    }
    cuda_check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice),
               "cudaMemcpy (host to device)");
    settle("cudaMemcpy (host to device)");
}

}  // namespace

void DeviceBuffer::upload(const std::vector<std::uint16_t>& host) {
    upload_bytes(data_, bytes_, host.data(), host.size() * sizeof(std::uint16_t));
}

void DeviceBuffer::upload(const std::vector<std::int32_t>& host) {
    upload_bytes(data_, bytes_, host.data(), host.size() * sizeof(std::int32_t));
}

void DeviceBuffer::upload(const std::vector<std::uint8_t>& host) {
    upload_bytes(data_, bytes_, host.data(), host.size());
}

void DeviceBuffer::upload(const std::vector<float>& host) {
    upload_bytes(data_, bytes_, host.data(), host.size() * sizeof(float));
}

std::vector<std::uint16_t> DeviceBuffer::download() const {
    std::vector<std::uint16_t> host(bytes_ / 2);
    settle("before a download");
    cuda_check(cudaMemcpy(host.data(), data_, host.size() * 2, cudaMemcpyDeviceToHost),
               "cudaMemcpy (device to host)");
    return host;
}

std::vector<float> DeviceBuffer::download_floats() const {
    std::vector<float> host(bytes_ / sizeof(float));
    settle("before a download");
    cuda_check(cudaMemcpy(host.data(), data_, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy (device to host)");
    return host;
}

void DeviceBuffer::poison_with_nan() {
    cuda_check(cudaMemset(data_, 0xFF, bytes_), "cudaMemset");
    settle("cudaMemset (poison)");
}

DeviceTensor DeviceTensor::upload(const reference::HostTensor& host) {
    DeviceTensor t = empty_like(host);
    if (element_bytes(host.dtype) == 1)  // E4M3: the encodings' low bytes
        t.buffer.upload(std::vector<std::uint8_t>(host.bits.begin(), host.bits.end()));
    else
        t.buffer.upload(host.bits);
    return t;
}

DeviceTensor DeviceTensor::empty_like(const reference::HostTensor& host) {
    DeviceTensor t;
    t.buffer = DeviceBuffer(static_cast<std::size_t>(host.size()) * element_bytes(host.dtype));
    t.view = TensorView::contiguous(t.buffer.data(), host.dtype, host.batch, host.seq, host.heads,
                                    host.d_head);
    return t;
}

reference::HostTensor DeviceTensor::download(const reference::HostTensor& shape_of) const {
    std::vector<std::uint16_t> bits;
    if (element_bytes(shape_of.dtype) == 1) {
        std::vector<std::uint8_t> bytes(buffer.bytes());
        settle("before a download");
        cuda_check(cudaMemcpy(bytes.data(), buffer.data(), bytes.size(), cudaMemcpyDeviceToHost),
                   "cudaMemcpy (device to host)");
        bits.assign(bytes.begin(), bytes.end());
    } else {
        bits = buffer.download();
    }
    return reference::HostTensor::from_bits(shape_of.dtype, shape_of.batch, shape_of.seq,
                                            shape_of.heads, shape_of.d_head, std::move(bits));
}

LaunchTimes::LaunchTimes(int capacity) : start_(capacity), stop_(capacity) {
    for (int i = 0; i < capacity; ++i) {
        cuda_check(cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&start_[i])), "cudaEventCreate");
        cuda_check(cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&stop_[i])), "cudaEventCreate");
    }
}

LaunchTimes::~LaunchTimes() {
    for (std::size_t i = 0; i < start_.size(); ++i) {
        cudaEventDestroy(static_cast<cudaEvent_t>(start_[i]));
        cudaEventDestroy(static_cast<cudaEvent_t>(stop_[i]));
    }
}

void LaunchTimes::before(int i, Stream stream) {
    cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(start_.at(i)), stream), "cudaEventRecord");
}

void LaunchTimes::after(int i, Stream stream) {
    cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(stop_.at(i)), stream), "cudaEventRecord");
}

std::vector<double> LaunchTimes::elapsed_ms(int n) {
    std::vector<double> ms;
    if (n == 0)
        return ms;
    cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_.at(n - 1))),
               "cudaEventSynchronize");
    for (int i = 0; i < n; ++i) {
        float t = 0;
        cuda_check(cudaEventElapsedTime(&t, static_cast<cudaEvent_t>(start_[i]),
                                        static_cast<cudaEvent_t>(stop_[i])),
                   "cudaEventElapsedTime");
        ms.push_back(t);
    }
    return ms;
}

void synchronize() {
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

std::size_t free_device_bytes() {
    std::size_t free_bytes = 0, total_bytes = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    return free_bytes;
}

}  // namespace flash_attention::tools
