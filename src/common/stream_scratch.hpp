#pragma once

// Scratch memory for one launch, in stream order: the dynamic tile schedule's counter, the
// partial results of split-KV attention. Memory per launch (not one buffer per device)
// keeps launches on different streams, and replays of one CUDA graph on several streams,
// from sharing it; allocating from the library's own stream-ordered pool keeps that cheap
// and needs no host synchronisation. Under stream capture the calls become graph nodes
// (allocation, memset, free), so a captured launch gets its own memory on every replay.

#include <cstddef>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention {

class StreamScratch {
  public:
    // Allocates `bytes` on `stream`, zeroed when asked; throws Error(ErrorCode::cuda).
    StreamScratch(std::size_t bytes, Stream stream, bool zeroed);
    // Frees it on the same stream, after the launches that used it.
    ~StreamScratch();
    StreamScratch(const StreamScratch&) = delete;
    StreamScratch& operator=(const StreamScratch&) = delete;

    void* get() const { return data_; }

  private:
    Stream stream_;
    void* data_ = nullptr;
};

}  // namespace flash_attention
