#include <gtest/gtest.h>

#include <algorithm>

#include "config/config_space.hpp"
#include "flash_attention/error.hpp"
#include "generator/generator.hpp"

namespace fa = flash_attention;

TEST(Generator, IsDeterministic) {
    EXPECT_EQ(fa::generator::generate("tune", 16), fa::generator::generate("tune", 16));
}

TEST(Generator, EmitsEveryConfigOnceAcrossShardsAndInTheTable) {
    const auto files = fa::generator::generate("ci", 4, 2);
    ASSERT_EQ(files.size(), 7u);  // 4 sm80 shards + 2 sm90 shards + the registry table
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

TEST(Generator, PutsEachFamilyInItsOwnShards) {
    const auto files = fa::generator::generate("ci", 2, 2);
    for (const auto& [name, text] : files) {
        if (name == "registry_table.cpp")
            continue;
        const bool sm90_shard = name.starts_with("kernels_sm90_");
        EXPECT_EQ(text.find("sm90::make_ops") != std::string::npos, sm90_shard) << name;
        EXPECT_EQ(text.find("sm80::make_ops") != std::string::npos, !sm90_shard) << name;
        EXPECT_NE(text.find(sm90_shard ? "kernels/sm90/launch.cuh" : "kernels/sm80/launch.cuh"),
                  std::string::npos)
            << name;
    }
}

TEST(Generator, LeavesTheSm90FamilyOutWithoutItsShards) {
    const auto files = fa::generator::generate("ci", 2);
    ASSERT_EQ(files.size(), 3u);
    EXPECT_EQ(files.at("registry_table.cpp").find("Family::sm90"), std::string::npos);
    // A set of Hopper kernels only has nothing to build then.
    EXPECT_THROW(fa::generator::generate("progression-sm90", 2), fa::Error);
    EXPECT_NO_THROW(fa::generator::generate("progression-sm90", 2, 1));
}

TEST(Generator, SpreadsConfigsEvenly) {
    const auto files = fa::generator::generate("tune", 16, 8);
    const auto tune = fa::space::named_set("tune");
    const auto n_sm90 = static_cast<std::size_t>(
        std::count_if(tune.begin(), tune.end(),
                      [](const fa::KernelConfig& c) { return c.family == fa::Family::sm90; }));
    const std::size_t n_sm80 = tune.size() - n_sm90;
    for (const auto& [name, text] : files) {
        if (name == "registry_table.cpp")
            continue;
        std::size_t count = 0;
        for (auto pos = text.find("make_ops<"); pos != std::string::npos;
             pos = text.find("make_ops<", pos + 1)) {
            ++count;
        }
        const bool sm90 = name.starts_with("kernels_sm90_");
        const std::size_t per_shard = sm90 ? n_sm90 / 8 : n_sm80 / 16;
        EXPECT_GE(count, per_shard) << name;
        EXPECT_LE(count, per_shard + 1) << name;
    }
}

TEST(Generator, RejectsBadArguments) {
    EXPECT_THROW(fa::generator::generate("nope", 4), fa::Error);
    EXPECT_THROW(fa::generator::generate("ci", 0), fa::Error);
    EXPECT_THROW(fa::generator::generate("ci", 1, -1), fa::Error);
}
