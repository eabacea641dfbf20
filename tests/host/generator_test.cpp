#include <gtest/gtest.h>

#include "config/config_space.hpp"
#include "flash_attention/error.hpp"
#include "generator/generator.hpp"

namespace fa = flash_attention;

TEST(Generator, IsDeterministic) {
    EXPECT_EQ(fa::generator::generate("tune", 16), fa::generator::generate("tune", 16));
}

TEST(Generator, EmitsEveryConfigOnceAcrossShardsAndInTheTable) {
    const auto files = fa::generator::generate("ci", 4);
    ASSERT_EQ(files.size(), 5u);  // 4 shards + the registry table
    ASSERT_TRUE(files.count("registry_table.cpp"));
    const std::string& table = files.at("registry_table.cpp");
    for (const auto& c : fa::space::named_set("ci")) {
        const std::string marker = "// " + c.to_string() + "\n";
        int in_shards = 0;
        for (const auto& [name, text] : files) {
            if (name == "registry_table.cpp")
                continue;
            for (auto pos = text.find(marker); pos != std::string::npos;
                 pos = text.find(marker, pos + 1)) {
                ++in_shards;
            }
        }
        EXPECT_EQ(in_shards, 1) << c.to_string();
        EXPECT_NE(table.find(marker), std::string::npos) << c.to_string();
    }
    EXPECT_NE(table.find("built_kernel_set() { return \"ci\"; }"), std::string::npos);
}

TEST(Generator, SpreadsConfigsEvenly) {
    const auto files = fa::generator::generate("tune", 16);
    const std::size_t n = fa::space::named_set("tune").size();
    for (const auto& [name, text] : files) {
        if (name == "registry_table.cpp")
            continue;
        std::size_t count = 0;
        for (auto pos = text.find("make_ops<"); pos != std::string::npos;
             pos = text.find("make_ops<", pos + 1)) {
            ++count;
        }
        EXPECT_GE(count, n / 16) << name;
        EXPECT_LE(count, n / 16 + 1) << name;
    }
}

TEST(Generator, RejectsBadArguments) {
    EXPECT_THROW(fa::generator::generate("nope", 4), fa::Error);
    EXPECT_THROW(fa::generator::generate("ci", 0), fa::Error);
}
