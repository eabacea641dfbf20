#pragma once

// The tuning cache: which config `flash_attention tune` measured fastest for a
// (GPU, dtype, d_head, sequence-length bucket) key, and for decoding shapes on the split-KV
// kernel (`tune --kvcache`) which number of key ranges per sequence. A JSON file shared by
// the command line, which writes it, and the library's automatic choice, which reads it.
//
// Location: $FLASH_ATTENTION_TUNING, else $XDG_CACHE_HOME/flash_attention/tuning.json
// (an absolute XDG_CACHE_HOME: the XDG spec ignores a relative one), else
// $HOME/.cache/flash_attention/tuning.json, else none (the built-in table alone).

#include <chrono>
#include <compare>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention::tuning {

struct Key {
    std::string gpu;  // device name as CUDA reports it
    int sm_count = 0;
    DType dtype = DType::FP16;
    int d_head = 0;
    int seq_bucket = 0;  // see seq_bucket()
    bool causal = false;
    // 0: a kernel config for forward()'s problems. Else a split count for the split-KV
    // kernel, and this the bucket of its query rows per K/V head (seq_q x heads / heads_kv,
    // the smallest power of two at least that): one key never depends on the batch.
    int rows_bucket = 0;
    // ProblemShape::window_or_softcap: a winner among the configs' variant kernels, kept
    // apart from the plain kernels' (read as a fallback).
    bool window_or_softcap = false;
    // A split count for a paged cache's keys (rows_bucket > 0): its plan differs from a
    // contiguous cache's (serving::plan_for), so their counts are kept apart.
    bool paged = false;

    friend auto operator<=>(const Key&, const Key&) = default;
    std::string to_string() const;
    // The key of a problem on a device: the one place that says what a key is made of.
    static Key of(const DeviceProperties& device, const ProblemShape& problem);
    // The key of a problem's split count on the split-KV kernel, its keys in a paged cache
    // or not.
    static Key of_splits(const DeviceProperties& device, const ProblemShape& problem, bool paged);
};

// The bucket of a problem: the smallest power of two >= max(seq_q, seq_k), at least 64.
int seq_bucket(long long seq_q, long long seq_k);

// A key's winner: `config` when key.rows_bucket is 0, else `splits` (and the runner-up
// likewise).
struct Entry {
    Key key;
    KernelConfig config;
    double tflops = 0;
    std::optional<KernelConfig> runner_up;
    double runner_up_tflops = 0;
    std::string measured;  // ISO 8601 UTC time of the measurement
    int splits = 0;
    int runner_up_splits = 0;  // 0: none
};

struct LoadResult {
    std::vector<Entry> entries;
    // One line per problem: unreadable or corrupt file, malformed entries skipped.
    std::vector<std::string> warnings;
    bool corrupt = false;  // the file exists but is not a tuning cache: nothing was read
};

// $FLASH_ATTENTION_TUNING, else under $XDG_CACHE_HOME (if absolute), else under $HOME;
// none when none of them is set (never a file of the working directory, which may be
// anyone's).
std::optional<std::filesystem::path> default_path();

// The largest cache file read: a real one holds a few hundred entries of ~300 bytes.
inline constexpr std::size_t k_max_file_bytes = 4 << 20;

// A missing file is an empty cache without warnings. Anything but a regular file (a FIFO,
// a device, a folder) and files over k_max_file_bytes are corrupt, read without blocking;
// so is text whose arrays and objects nest more than 32 levels deep (a cache has three).
LoadResult load(const std::filesystem::path& path);
LoadResult parse(const std::string& json_text, const std::string& source_name);
std::string to_json(const std::vector<Entry>& entries);

// `existing` with every entry whose key `updates` holds replaced; other keys kept.
std::vector<Entry> merge(std::vector<Entry> existing, const std::vector<Entry>& updates);

// Creates the folders it goes in, then writes through write_file_atomically
// (common/small_file.hpp): readers and a crash mid-write see either the old file or the
// new one. Throws Error on failure.
void save_atomically(const std::filesystem::path& path, const std::vector<Entry>& entries);

// How update() waits while another process (another tune run) holds the lock.
struct LockWait {
    std::chrono::milliseconds timeout = std::chrono::seconds(60);
    // Called once, with the lock file's path, when the lock is found taken.
    std::function<void(const std::string& lock_path)> waiting;
    // Polled while waiting (every 50 ms): true gives up at once (Ctrl-C).
    std::function<bool()> interrupted;
};

// update() gave up waiting for the lock: `timeout` passed, or `interrupted` said so.
// Nothing was written.
class LockNotTaken : public std::runtime_error {
  public:
    LockNotTaken(const std::string& message, bool interrupted)
        : std::runtime_error(message), interrupted(interrupted) {}
    bool interrupted;
};

// Merges `entries` into the file as it is now: under an exclusive lock on `path`.lock
// (creating the folders and the lock file if missing), reads the file, merges, saves
// atomically. Concurrent writers (two tune runs) keep each other's entries. A corrupt file
// is first moved to `path`.corrupt. Returns the warnings of reading the file. Throws
// LockNotTaken as `wait` says, Error if the lock or the write fails.
std::vector<std::string> update(const std::filesystem::path& path,
                                const std::vector<Entry>& entries, const LockWait& wait = {});

// Throws the Error update() would for what can be told without creating anything (a run
// that fails before it measures leaves no folder or lock file behind): the path is no
// folder or device, the nearest existing folder above it can be written, and its lock file
// is not a link or anything but a regular file.
void check_path(const std::filesystem::path& path);

// check_path, then what only trying tells, before a long tune rather than after it:
// creates the folders and a temporary file in them, which it removes. Takes no lock and
// creates no lock file.
void check_writable(const std::filesystem::path& path);

// The process-wide cache behind forward(params, stream): read from default_path() on
// first use (a warning on stderr if it is corrupt), then kept in memory.
std::optional<KernelConfig> lookup(const Key& key);
// The same for a split-count key (Key::of_splits).
std::optional<int> lookup_splits(const Key& key);
// Drops the in-memory copy; the next lookup reads the file again.
void reload();

}  // namespace flash_attention::tuning
