#include <gtest/gtest.h>

#include <string>

#include "common/text.hpp"

using flash_attention::printable;

TEST(Printable, EscapesControlCharactersAndBytesThatAreNotUtf8) {
    EXPECT_EQ(printable("plain text"), "plain text");
    EXPECT_EQ(printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
    EXPECT_EQ(printable(std::string("a\0b\x1b[31m\x7f", 9)), "a\\x00b\\x1b[31m\\x7f");
    EXPECT_EQ(printable("\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x99\x82"),
              "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x99\x82");
    EXPECT_EQ(printable("\xC2\x9B"), "\\u009b");  // a C1 control (CSI)
    // A lone continuation byte, a cut sequence, an overlong '/', a surrogate.
    EXPECT_EQ(printable("\x80|\xE2\x82|\xC0\xAF|\xED\xA0\x80"),
              "\\x80|\\xe2\\x82|\\xc0\\xaf|\\xed\\xa0\\x80");
}

TEST(Printable, CutsAtACharacterBoundary) {
    EXPECT_EQ(printable("abcdef", 6), "abcdef");
    EXPECT_EQ(printable("abcdefg", 6), "abcdef...");
    EXPECT_EQ(printable("abcde\xC3\xA9", 6), "abcde...");  // é would end past the bound
    EXPECT_EQ(printable("abcd\n", 5), "abcd...");          // so would "\n"
    EXPECT_EQ(printable(std::string(300, 'x')).size(), 103u);
}
