#include "common/small_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/text.hpp"

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

namespace {

std::string errno_text() {
    return std::strerror(errno);
}

}  // namespace

std::string write_file_atomically(const std::filesystem::path& path, std::string_view text) {
    // The new file gets the old one's permissions, else what a new file of this user gets.
    mode_t mode = 0;
    if (struct stat old{}; ::stat(path.c_str(), &old) == 0) {
        if (!S_ISREG(old.st_mode))
            return "a path that is not a regular file";
        mode = old.st_mode & 07777;
    } else {
        const mode_t mask = ::umask(0);
        ::umask(mask);
        mode = 0666 & ~mask;
    }
    std::string tmp = path.string() + std::string(k_temporary_suffix);
    const Fd fd(::mkstemp(tmp.data()));  // O_CREAT | O_EXCL, mode 0600, random name
    if (fd.get() < 0)
        return "no temporary file beside it (" + errno_text() + ")";
    const auto give_up = [&](const std::string& what) {
        ::unlink(tmp.c_str());
        return what;
    };
    for (std::size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return give_up("a write error on " + printable(tmp, 4096) + " (" + errno_text() + ")");
        done += static_cast<std::size_t>(n);
    }
    if (::fchmod(fd.get(), mode) != 0 || ::fsync(fd.get()) != 0) {
        return give_up("a failed fchmod/fsync of " + printable(tmp, 4096) + " (" + errno_text() +
                       ")");
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0)
        return give_up("a failed rename (" + errno_text() + ")");
    // The rename itself reaches the disk with the folder.
    const Fd folder(::open(path.has_parent_path() ? path.parent_path().c_str() : ".",
                           O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (folder.get() >= 0)
        ::fsync(folder.get());
    return {};
}

std::string write_problem(const std::filesystem::path& path, bool create_folders) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return "a path that is not a regular file";
    } else if (errno != ENOENT && errno != ENOTDIR) {  // ENOTDIR: the folders' loop names it
        return "a path that cannot be used (" + errno_text() + ")";
    }
    // The write goes through a temporary name beside it, longer by the suffix.
    if (const long most =
            ::pathconf(path.has_parent_path() ? path.parent_path().c_str() : ".", _PC_NAME_MAX);
        most > 0 && path.filename().string().size() + k_temporary_suffix.size() >
                        static_cast<std::size_t>(most)) {
        return "a file name longer than " + std::to_string(most - k_temporary_suffix.size()) +
               " bytes (its temporary file's name adds " +
               std::to_string(k_temporary_suffix.size()) + ")";
    }
    std::filesystem::path folder = path.parent_path();
    for (;;) {
        const std::filesystem::path shown = folder.empty() ? "." : folder;
        if (::stat(shown.c_str(), &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                return "a path under " + printable(shown.string(), 4096) +
                       ", which is not a folder";
            }
            if (::access(shown.c_str(), W_OK | X_OK) != 0) {
                return "a folder " + printable(shown.string(), 4096) + " that cannot be written (" +
                       errno_text() + ")";
            }
            return {};
        }
        if (errno == ENOTDIR)
            return "a path under a file that is not a folder";
        if (errno != ENOENT) {
            return "a folder " + printable(shown.string(), 4096) + " that cannot be used (" +
                   errno_text() + ")";
        }
        if (!create_folders || folder.empty() || folder == folder.parent_path())
            return "no folder " + printable(shown.string(), 4096);
        folder = folder.parent_path();
    }
}

}  // namespace flash_attention
