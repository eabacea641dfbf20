#pragma once

// Scratch memory for one launch, in stream order: the partial results of split-KV attention,
// and the dynamic tile schedule's counters under stream capture (StreamCounters below, each
// stream's own otherwise). Memory per launch (not one buffer per device)
// keeps launches on different streams, and replays of one CUDA graph on several streams,
// from sharing it; allocating from the library's own stream-ordered pool keeps that cheap
// and needs no host synchronisation. Under stream capture the calls become graph nodes
// (allocation, memset, free), so a captured launch gets its own memory on every replay.

#include <cstddef>
#include <optional>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention {

// Hands the memory the library's pools hold and no allocation uses back to the driver
// (release_cached_memory()); throws Error(ErrorCode::cuda).
void release_pool_memory();

class StreamScratch {
  public:
    // Where the bytes come from: the library's pool, which keeps what it holds mapped (small,
    // frequent scratch), or the device's current pool, whose release threshold hands large
    // scratch back (FP8's copy of V, the size of V: kept, one call would hold it for the process).
    enum class Pool { library, device };
    // Allocates `bytes` on `stream`, zeroed when asked; throws Error(ErrorCode::cuda).
    StreamScratch(std::size_t bytes, Stream stream, bool zeroed, Pool pool = Pool::library);
    // Frees it on the same stream, after the launches that used it.
    ~StreamScratch();
    StreamScratch(const StreamScratch&) = delete;
    StreamScratch& operator=(const StreamScratch&) = delete;

    void* get() const { return data_; }

  private:
    Stream stream_;
    void* data_ = nullptr;
};

// `count` ints that are zero when a launch on `stream` starts and that the launch leaves zero
// when it ends (the dynamic tile schedule's counters: its last CTA zeroes them). Outside
// stream capture they are the stream's own (keyed by its unique id, so a destroyed stream's
// handle reused by a new one gets new counters), allocated and zeroed on the stream's first
// launch and kept for the process: a StreamScratch per launch put an allocation, a memset and
// a free into every call's GPU time, about 2 us (H200, 2026-11-26, docs/PERF.md). Under
// capture a launch has its own zeroed StreamScratch, so every replay of the graph starts
// from zero, and graphs instantiated twice share nothing.
class StreamCounters {
  public:
    // Throws Error(ErrorCode::cuda).
    StreamCounters(int count, Stream stream);

    int* get() const { return data_; }

  private:
    std::optional<StreamScratch> captured_;
    int* data_ = nullptr;
};

}  // namespace flash_attention
