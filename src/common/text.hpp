#pragma once

// Text a user gave (a config short form, an option's value, a file name), echoed in an
// error message.

#include <cstddef>
#include <string>
#include <string_view>

namespace flash_attention {

// `text` fit to quote in a one-line message: control characters written as escapes
// (\n, \t, \r, \x00, \x7f; C1 controls as \u0085) and bytes that are not UTF-8 as \xNN, so
// the message stays one line of valid UTF-8 (Python decodes it strictly, and a NUL would
// end its copy); cut after at most max_bytes of the result, at a character boundary, with
// "..." appended when cut.
std::string printable(std::string_view text, std::size_t max_bytes = 100);

}  // namespace flash_attention
