#pragma once

#include <stdexcept>
#include <string>

namespace flash_attention {

// What went wrong, coarse enough for a binding to map onto its own exception types
// (the Python package maps invalid_argument/unsupported/not_built to ValueError,
// dtype to TypeError, cuda/no_device to RuntimeError).
enum class ErrorCode {
    invalid_argument,  // a shape, stride, pointer or value that the call cannot accept
    dtype,             // a dtype the call does not take (e4m3 outside FP8), or dtypes that differ
    unsupported,       // valid input that no kernel family handles (e.g. d_head 80)
    not_built,         // a config that is valid but was not compiled into this build
    no_device,         // no CUDA device, or one older than compute capability 8.0
    cuda,              // a CUDA runtime call or kernel launch failed
};

// The one exception type the library throws. The message names the argument,
// what was expected and what was given.
class Error : public std::runtime_error {
  public:
    Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
    ErrorCode code() const noexcept { return code_; }

  private:
    ErrorCode code_;
};

}  // namespace flash_attention
