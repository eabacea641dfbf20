#pragma once

// The dynamic tile schedule's global counter: a fresh zeroed int per launch, in stream
// order. A counter per launch (not one per device) keeps launches on different streams,
// and replays of one CUDA graph on several streams, from sharing it; allocating from the
// library's own stream-ordered pool keeps that cheap and needs no host synchronisation.
// Under stream capture the three calls become graph nodes (allocation, memset, free), so
// a captured launch gets its own counter on every replay.

#include "flash_attention/flash_attention.hpp"

namespace flash_attention::sm90 {

class TileCounter {
  public:
    // Allocates and zeroes the counter on `stream`; throws Error(ErrorCode::cuda).
    explicit TileCounter(Stream stream);
    // Frees it on the same stream, after the launch that used it.
    ~TileCounter();
    TileCounter(const TileCounter&) = delete;
    TileCounter& operator=(const TileCounter&) = delete;

    int* get() const { return counter_; }

  private:
    Stream stream_;
    int* counter_ = nullptr;
};

}  // namespace flash_attention::sm90
