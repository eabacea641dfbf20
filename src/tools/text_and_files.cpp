// The tools API's text and file helpers: the library's own (common/), one implementation.

#include "common/small_file.hpp"
#include "common/text.hpp"
#include "flash_attention/tools.hpp"

namespace flash_attention::tools {

std::string printable(std::string_view text, std::size_t max_bytes) {
    return flash_attention::printable(text, max_bytes);
}

std::string write_file_atomically(const std::filesystem::path& path, std::string_view text) {
    return flash_attention::write_file_atomically(path, text);
}

std::string write_problem(const std::filesystem::path& path, bool create_folders) {
    return flash_attention::write_problem(path, create_folders);
}

}  // namespace flash_attention::tools
