#pragma once

// Files a user names that the library reads whole (the tuning cache, kernel lists): read
// without ever blocking and within a bound. POSIX; host code only.

#include <cstddef>
#include <filesystem>
#include <string>

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

}  // namespace flash_attention
