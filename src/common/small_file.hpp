#pragma once

// Files a user names that the library reads whole (the tuning cache, kernel lists): read
// without ever blocking and within a bound; and files written whole (the tuning cache, a
// chart), replaced in one step. POSIX; host code only.

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace flash_attention {

// A file descriptor closed on scope exit.
class Fd {
  public:
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& other) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd& operator=(Fd&&) = delete;
    ~Fd();
    int get() const { return fd_; }

  private:
    int fd_;
};

// The whole text of a regular file of at most max_bytes, or why not. Opened with
// O_NONBLOCK (a FIFO would wait for a writer forever), checked with fstat before any
// read (a FIFO, a device such as /dev/zero or a folder is refused), read within the bound
// (a file that grows while being read is refused).
struct SmallFile {
    bool missing = false;  // no file of that name: `problem` is empty too
    std::string problem;   // e.g. "is not a regular file"; empty when `text` holds the file
    std::string text;
};
SmallFile read_small_file(const std::filesystem::path& path, std::size_t max_bytes);

// Writes `text` to `path` through a fresh temporary file in the same folder (a random name,
// created exclusively: never an existing file or a link), flushed to disk, with the old
// file's permissions (else those a new file of this user gets), then renamed over `path`:
// readers and a crash mid-write see either the old file or the new one, and a failure
// leaves the old file as it was and no temporary file. The folder must exist. Returns why
// it failed ("a failed rename (...)"), or an empty string.
std::string write_file_atomically(const std::filesystem::path& path, std::string_view text);

// The temporary file's name: the file's, then this (mkstemp's template).
inline constexpr std::string_view k_temporary_suffix = ".tmp.XXXXXX";

// Why write_file_atomically(path) would fail, as far as can be told without creating
// anything (a long run checks this first, and a run that fails early leaves nothing
// behind): `path` exists but is not a regular file, cannot be looked up (a name too long),
// leaves no room for its temporary file's name, or the folder it goes in is missing, not a
// folder, or not one this user may write. With create_folders the nearest existing
// folder above it is checked instead of a missing one (the caller creates the rest).
// Empty if nothing is known to stand in the way.
std::string write_problem(const std::filesystem::path& path, bool create_folders);

}  // namespace flash_attention
