#pragma once

// Relaxes this thread's stream-capture mode while it lives. One-time setup calls that are no
// stream work (creating a memory pool, opting a kernel into more shared memory) are refused
// while any capture in the default (global) mode runs, and a library's first launch may
// come inside its caller's capture: these calls run under this guard.

#include <cuda_runtime_api.h>

namespace flash_attention {

class RelaxedCapture {
  public:
    RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
    ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
    RelaxedCapture(const RelaxedCapture&) = delete;
    RelaxedCapture& operator=(const RelaxedCapture&) = delete;

  private:
    cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace flash_attention
