#include "common/small_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace flash_attention {

Fd::Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

Fd::~Fd() {
    if (fd_ >= 0)
        ::close(fd_);
}

SmallFile read_small_file(const std::filesystem::path& path, std::size_t max_bytes) {
    SmallFile file;
    const Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (fd.get() < 0) {
        if (errno == ENOENT)
            file.missing = true;
        else
            file.problem = "cannot be opened (" + std::string(std::strerror(errno)) + ")";
        return file;
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        file.problem = "is not a regular file";
        return file;
    }
    if (static_cast<std::size_t>(st.st_size) > max_bytes) {
        file.problem = "has " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                       std::to_string(max_bytes);
        return file;
    }
    char buffer[65536];
    for (;;) {
        const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            file.problem = "cannot be read (" + std::string(std::strerror(errno)) + ")";
            file.text.clear();
            return file;
        }
        if (n == 0)
            return file;
        file.text.append(buffer, static_cast<std::size_t>(n));
        if (file.text.size() > max_bytes) {
            file.problem = "grew past the size limit of " + std::to_string(max_bytes) + " bytes";
            file.text.clear();
            return file;
        }
    }
}

}  // namespace flash_attention
