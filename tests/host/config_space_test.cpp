#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "config/builtin_choice.hpp"
#include "config/config_space.hpp"
#include "config/resources.hpp"
#include "flash_attention/error.hpp"

namespace fa = flash_attention;
using fa::KernelConfig;

namespace {

KernelConfig good() {
    return KernelConfig::parse(
        "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax");
}

std::string rejected_by(const KernelConfig& c) {
    const fa::space::Rule* rule = fa::space::rejecting_rule(c);
    return rule ? std::string(rule->name) : "";
}

}  // namespace

TEST(ConfigSpace, EveryRuleRejectsWhatItSays) {
    EXPECT_EQ(rejected_by(good()), "");
    auto with = [](auto change) {
        KernelConfig c = good();
        change(c);
        return rejected_by(c);
    };
    EXPECT_EQ(with([](KernelConfig& c) { c.dtype = static_cast<fa::DType>(3); }), "dtype");
    // Out of the code's range: caught before any rule computes a size from it.
    EXPECT_EQ(with([](KernelConfig& c) { c.dtype = static_cast<fa::DType>(7); }), "fields");
    EXPECT_EQ(with([](KernelConfig& c) { c.B_r = 2'000'000'000; }), "fields");
    EXPECT_EQ(with([](KernelConfig& c) { c.n_warps = 2'000'000'000; }), "fields");
    EXPECT_EQ(with([](KernelConfig& c) { c.d_head = -64; }), "fields");
    EXPECT_EQ(with([](KernelConfig& c) { c.d_head = 80; }), "d_head");
    // d_head 96's rows are 12 chunks: not swizzled (the sm90 family pads its tiles instead).
    EXPECT_EQ(with([](KernelConfig& c) { c.d_head = 96; }), "swizzled_rows");
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.d_head = 96;
                  c.sm80.swizzled = false;
              }),
              "");
    EXPECT_EQ(with([](KernelConfig& c) { c.n_warps = 2; }), "n_warps");
    EXPECT_EQ(with([](KernelConfig& c) { c.B_r = 256; }), "fields");  // 8 bits
    EXPECT_EQ(with([](KernelConfig& c) { c.B_r = 192; }), "rows_per_warp");
    EXPECT_EQ(with([](KernelConfig& c) { c.B_c = 48; }), "B_c");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm80.async_copy = false; }), "eager_needs_async");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm80.Q_mma_load_K_tiles = 2; }), "q_tiles");
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.sm80.Q_mma_load_K_tiles = 3;
                  c.sm80.K_mma_load_K_tiles = 3;
              }),
              "k_tiles");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm80.V_mma_load_K_tiles = 3; }), "v_tiles");
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.sm80.K_mma_load_K_tiles = 0;
                  c.sm80.Q_mma_load_K_tiles = 0;
                  c.sm80.V_mma_load_K_tiles = 0;
              }),
              "buffer_needs_steps");
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.B_c = 128;
                  c.B_r = 128;
                  c.n_warps = 4;
                  c.sm80.mma_double_buffer_loads = false;
              }),
              "register_budget");
}

TEST(ConfigSpace, EveryBackwardRuleRejectsWhatItSays) {
    const KernelConfig backward = KernelConfig::parse("(BF16, 128, 64, 64, 8): bwd+async+swizzled");
    EXPECT_EQ(rejected_by(backward), "");
    EXPECT_EQ(backward.to_string(), "(BF16, 128, 64, 64, 8): bwd+async+swizzled");
    auto with = [&](auto change) {
        KernelConfig c = backward;
        change(c);
        return rejected_by(c);
    };
    // The sm90 family's: two consumers of 64 keys, 64 queries a step.
    const KernelConfig hopper = KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2");
    EXPECT_EQ(rejected_by(hopper), "");
    const auto with_hopper = [&](auto change) {
        KernelConfig c = hopper;
        change(c);
        return rejected_by(c);
    };
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.sm90.pingpong = true; }), "backward_knobs");
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.B_c = 64; }), "backward_warpgroups");
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.B_r = 80; }), "backward_warpgroups");
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.d_head = 256; }), "backward_warpgroups");
    // One consumer cannot hold a 128-query step's two 64-row groups of dQ.
    EXPECT_EQ(with_hopper([](KernelConfig& c) {
                  c.B_r = 128;
                  c.B_c = 64;
                  c.n_warps = 8;
              }),
              "backward_warpgroups");
    // d_head 96 on 64-byte tiles: dQ's 96 columns split 64 + 32 over two consumers of one 64-row
    // group; one consumer's 96, or 48 each of two row groups, are not whole 64-column shares.
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.d_head = 96; }), "");
    EXPECT_EQ(with_hopper([](KernelConfig& c) {
                  c.d_head = 96;
                  c.B_r = 128;
              }),
              "backward_warpgroups");
    EXPECT_EQ(with_hopper([](KernelConfig& c) {
                  c.d_head = 96;
                  c.B_c = 64;
                  c.n_warps = 8;
              }),
              "backward_warpgroups");
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.sm90.stages = 4; }), "sm90_smem");
    // dQ a step behind: the consumers of 64 keys each, unordered.
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.sm90.lag_dq = true; }), "");
    EXPECT_EQ(KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+lagdq").sm90.lag_dq,
              true);
    EXPECT_EQ(with_hopper([](KernelConfig& c) {
                  c.sm90.lag_dq = true;
                  c.sm90.ordered_dq = true;
              }),
              "lagdq_is_backward");
    EXPECT_EQ(rejected_by(KernelConfig::parse("(BF16, 256, 64, 64, 12): sm90+bwd+stages_1+lagdq")),
              "lagdq_is_backward");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 128, 192, 80, 16): sm90+stages_3+overlap+lazy+trim+lagdq")),
              "lagdq_is_backward");
    // Persistent CTAs: consumers of 64 keys each, unordered dQ.
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.sm90.persistent = true; }), "");
    EXPECT_EQ(
        KernelConfig::parse("(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+lagdq").sm90,
        (fa::Sm90Knobs{.stages = 2, .persistent = true, .lag_dq = true}));
    EXPECT_EQ(with_hopper([](KernelConfig& c) {
                  c.sm90.persistent = true;
                  c.sm90.ordered_dq = true;
              }),
              "persistent_backward");
    EXPECT_EQ(
        rejected_by(KernelConfig::parse("(BF16, 256, 64, 64, 12): sm90+bwd+stages_1+persistent")),
        "persistent_backward");
    // The dynamic schedule: persistent CTAs take their next key block from a counter.
    EXPECT_EQ(with_hopper([](KernelConfig& c) {
                  c.sm90.persistent = true;
                  c.sm90.dynamic_schedule = true;
              }),
              "");
    EXPECT_EQ(
        KernelConfig::parse("(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq")
            .sm90,
        (fa::Sm90Knobs{.stages = 2, .persistent = true, .dynamic_schedule = true, .lag_dq = true}));
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.sm90.dynamic_schedule = true; }),
              "dynamic_needs_persistent");
    // Stream-K's last round: on the dynamic schedule with lagdq, not at d_head 96.
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq")),
              "");
    EXPECT_EQ(
        KernelConfig::parse("(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq+"
                            "streamk")
            .to_string(),
        "(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk")),
              "streamk_backward");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+streamk+lagdq")),
              "streamk_backward");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 96, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq")),
              "streamk_backward");
    EXPECT_EQ(with_hopper([](KernelConfig& c) { c.sm90.pingpong = true; }), "backward_knobs");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm80.optimized_softmax = true; }), "backward_knobs");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm80.K_mma_load_K_tiles = 2; }), "backward_knobs");
    EXPECT_EQ(with([](KernelConfig& c) { c.B_r = 32; }), "backward_tiles");
    // 8 key-row groups of 16 rows for 4 warps.
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.B_c = 128;
                  c.n_warps = 4;
              }),
              "backward_tiles");
    // dK and dV of 16 rows x 256 columns a warp: 256 fp32 registers alone.
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.d_head = 256;
                  c.n_warps = 4;
              }),
              "register_budget");
    // Backward configs need no fragment-loading token; forward sm80 configs do.
    EXPECT_THROW(KernelConfig::parse("(BF16, 128, 64, 64, 8): async+swizzled"), fa::Error);
    // Every set's backward configs pass their rules, and tune covers the release's.
    for (const KernelConfig& c : fa::space::named_set("tune-backward"))
        EXPECT_TRUE(c.backward && rejected_by(c).empty()) << c.to_string();
}

TEST(ConfigSpace, EverySm90RuleRejectsWhatItSays) {
    const KernelConfig hopper =
        KernelConfig::parse("(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong");
    EXPECT_EQ(rejected_by(hopper), "");
    auto with = [&](auto change) {
        KernelConfig c = hopper;
        change(c);
        return rejected_by(c);
    };
    // The family field has one bit: any other value is out of the code's range.
    EXPECT_EQ(with([](KernelConfig& c) { c.family = static_cast<fa::Family>(5); }), "fields");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm80.swizzled = true; }), "foreign_knobs");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm80.optimized_softmax = true; }), "foreign_knobs");
    EXPECT_EQ(with([](KernelConfig& c) { c.n_warps = 4; }), "warpgroups");
    EXPECT_EQ(with([](KernelConfig& c) { c.B_r = 192; }), "warpgroup_rows");
    EXPECT_EQ(with([](KernelConfig& c) { c.B_c = 96; }), "wgmma_n");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm90.stages = 0; }), "stages");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm90.stages = 5; }), "stages");
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.n_warps = 8;
                  c.B_r = 64;
              }),
              "pingpong_needs_two");
    EXPECT_EQ(with([](KernelConfig& c) { c.sm90.stages = 4; }), "sm90_smem");
    EXPECT_EQ(with([](KernelConfig& c) {
                  c.d_head = 256;  // O, S and P of 128 columns: 272 registers
                  c.sm90.stages = 1;
              }),
              "register_budget");
    // sm90 knobs on an sm80 config.
    KernelConfig sm80 = good();
    sm80.sm90.pingpong = true;
    EXPECT_EQ(rejected_by(sm80), "foreign_knobs");
}

TEST(ConfigSpace, FamilyTuneSetsSplitTheTuneSet) {
    const auto tune = fa::space::named_set("tune");
    const auto sm80 = fa::space::named_set("tune-sm80");
    const auto sm90 = fa::space::named_set("tune-sm90");
    ASSERT_FALSE(sm80.empty());
    ASSERT_FALSE(sm90.empty());
    const auto backward = fa::space::named_set("tune-backward");
    ASSERT_FALSE(backward.empty());
    for (const KernelConfig& c : sm80)
        EXPECT_TRUE(c.family == fa::Family::sm80 && !c.backward) << c.to_string();
    for (const KernelConfig& c : sm90)
        EXPECT_TRUE(c.family == fa::Family::sm90 && !c.backward) << c.to_string();
    for (const KernelConfig& c : backward)
        EXPECT_TRUE(c.backward) << c.to_string();
    EXPECT_EQ(fa::space::named_set("tune-sm80,tune-sm90,tune-backward"), tune);
}

// "@FILE": the short forms of a file, one per line with comments and blank lines, unioned
// like a set name; a bad line is named by its number, and what is not a regular file is
// refused before it is read (a FIFO would block, /dev/zero never end).
TEST(ConfigSpace, KernelSetFromAFile) {
    const auto dir =
        std::filesystem::temp_directory_path() / ("flash_set_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto write = [&](const char* name, const std::string& text) {
        std::ofstream(dir / name) << text;
        return "@" + (dir / name).string();
    };
    const std::string a = "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+lazy";
    const std::string b = "(FP16, 64, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer";
    const std::string list = write("winners.txt", "# tuned\n" + a + "  # d128\n\n  " + b + "\r\n");
    const auto set = fa::space::named_set(list);
    ASSERT_EQ(set.size(), 2u);
    EXPECT_NE(std::find(set.begin(), set.end(), KernelConfig::parse(a)), set.end());
    EXPECT_NE(std::find(set.begin(), set.end(), KernelConfig::parse(b)), set.end());
    const auto with_release = fa::space::named_set("release," + list);
    EXPECT_EQ(with_release.size(), fa::space::named_set("release").size() + 1);  // a is in it

    const auto message = [](const std::string& name) {
        try {
            fa::space::named_set(name);
        } catch (const fa::Error& e) {
            EXPECT_EQ(e.code(), fa::ErrorCode::invalid_argument);
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message(write("bad.txt", a + "\n(BF16, 128): sm90\n")).find("line 2"),
              std::string::npos);
    EXPECT_NE(message("@" + (dir / "missing.txt").string()).find("regular file"),
              std::string::npos);
    EXPECT_NE(message("@/dev/zero").find("regular file"), std::string::npos);
    EXPECT_NE(message("@" + dir.string()).find("regular file"), std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST(ConfigSpace, HopperTuneSetHasWiderKeyBlocksAtHeadDim256) {
    int b_c80 = 0;
    int b_c128 = 0;
    for (const KernelConfig& c : fa::space::named_set("tune-sm90")) {
        if (c.d_head != 256 || c.B_c == 64 || c.dtype == fa::DType::E4M3)  // FP8: rule dtype
            continue;
        b_c80 += c.B_c == 80;
        b_c128 += c.B_c == 128;
        EXPECT_EQ(rejected_by(c), "") << c.to_string();
        EXPECT_LE(smem_bytes(c), 227u * 1024) << c.to_string();
        if (c.B_c == 128) {
            EXPECT_EQ(c.sm90.stages, 1) << c.to_string();
            EXPECT_FALSE(c.sm90.intra_warpgroup_overlap) << c.to_string();
        }
    }
    // fp16/bf16 x ping-pong x (not persistent, persistent, persistent + dynamic schedule,
    // persistent + stream-K) x lazy rescaling x trimmed consumer blocks
    EXPECT_EQ(b_c80, 64);
    EXPECT_EQ(b_c128, 16);  // fp16/bf16 x the four schedules, with ping-pong, x lazy
}

// trim_blocks comes as a copy of every tune config whose consumers can end in different
// K/V blocks (B_c != B_r), and only there.
TEST(ConfigSpace, HopperTuneSetTrimsWhereConsumersEndApart) {
    const auto sm90 = fa::space::named_set("tune-sm90");
    int trimmed = 0;
    for (const KernelConfig& c : sm90) {
        if (!c.sm90.trim_blocks)
            continue;
        ++trimmed;
        EXPECT_NE(c.B_c, c.B_r) << c.to_string();
        KernelConfig plain = c;
        plain.sm90.trim_blocks = false;
        plain.sm90.half_blocks = false;  // half blocks need trim
        EXPECT_NE(std::find(sm90.begin(), sm90.end(), plain), sm90.end()) << c.to_string();
    }
    EXPECT_GT(trimmed, 0);
    for (const KernelConfig& c : sm90) {
        KernelConfig trim = c;
        trim.sm90.trim_blocks = true;
        EXPECT_EQ(std::find(sm90.begin(), sm90.end(), trim) != sm90.end(), c.B_c != c.B_r)
            << c.to_string();
    }
}

// half_blocks comes as a copy of every trimmed, overlapped B_c 128 tune config, and only there.
TEST(ConfigSpace, HopperTuneSetHalvesTrimmedB_c128) {
    const auto sm90 = fa::space::named_set("tune-sm90");
    int halved = 0;
    for (const KernelConfig& c : sm90) {
        KernelConfig half = c;
        half.sm90.half_blocks = true;
        const bool eligible = !c.sm90.half_blocks && c.sm90.trim_blocks &&
                              c.sm90.intra_warpgroup_overlap && c.B_c == 128;
        if (!c.sm90.half_blocks) {
            EXPECT_EQ(std::find(sm90.begin(), sm90.end(), half) != sm90.end(), eligible)
                << c.to_string();
        }
        halved += c.sm90.half_blocks ? 1 : 0;
    }
    EXPECT_GT(halved, 0);
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+half")),
              "half_needs_trim");
}

// stream_k comes as a copy of every persistent tune config on the static schedule, and only
// there; the rule names what it needs.
TEST(ConfigSpace, HopperTuneSetSplitsStaticPersistentRounds) {
    const auto sm90 = fa::space::named_set("tune-sm90");
    int streamed = 0;
    for (const KernelConfig& c : sm90) {
        if (c.sm90.stream_k) {
            ++streamed;
            continue;
        }
        if (c.dtype == fa::DType::E4M3)  // FP8 splits no rounds (rule dtype)
            continue;
        KernelConfig split = c;
        split.sm90.stream_k = true;
        EXPECT_EQ(std::find(sm90.begin(), sm90.end(), split) != sm90.end(),
                  c.sm90.persistent && !c.sm90.dynamic_schedule)
            << c.to_string();
    }
    EXPECT_GT(streamed, 0);
    EXPECT_EQ(rejected_by(KernelConfig::parse("(BF16, 256, 128, 64, 12): sm90+stages_2+streamk")),
              "streamk_needs_static_persistent");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 256, 128, 64, 12): sm90+stages_2+persistent+dynamic+streamk")),
              "streamk_needs_static_persistent");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+persistent+streamk")),
              "");
}

// packgqa: forward tiles of the per-sequence body, in the tune set at B_r 64 of every head dim;
// the rule names what it excludes.
TEST(ConfigSpace, PackedGqaTilesAreForwardOnly) {
    const auto sm90 = fa::space::named_set("tune-sm90");
    for (const int d : {64, 128, 256}) {
        EXPECT_TRUE(std::any_of(sm90.begin(), sm90.end(), [d](const KernelConfig& c) {
            return c.sm90.pack_gqa && c.d_head == d && c.B_r == 64;
        })) << d;
    }
    const auto packed =
        KernelConfig::parse("(BF16, 128, 64, 128, 8): sm90+stages_3+overlap+qreg+lazy+packgqa");
    EXPECT_TRUE(packed.sm90.pack_gqa);
    EXPECT_EQ(KernelConfig::parse(packed.to_string()), packed);
    EXPECT_EQ(rejected_by(packed), "");
    EXPECT_EQ(
        rejected_by(KernelConfig::parse(
            "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+lazy+streamk+packgqa")),
        "packgqa_forward");
    EXPECT_NE(
        rejected_by(KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+packgqa")),
        "");
}

// P through shared memory: forward tiles of whole 64-key sub-tiles whose P·V N the shared-memory
// wgmma wraps; the tune set's d_head 96 192-row tiles take it with overlap.
TEST(ConfigSpace, PInSharedMemoryIsForwardOnWhole64KeyBlocks) {
    const auto psmem = KernelConfig::parse(
        "(BF16, 96, 192, 128, 16): sm90+stages_2+overlap+persistent+dynamic+lazy+psmem");
    EXPECT_TRUE(psmem.sm90.p_in_smem);
    EXPECT_EQ(KernelConfig::parse(psmem.to_string()), psmem);
    EXPECT_EQ(rejected_by(psmem), "");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 128, 192, 80, 16): sm90+stages_3+overlap+lazy+psmem")),
              "psmem_forward");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+lazy+psmem")),
              "psmem_forward");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 128, 64, 128, 8): sm90+stages_3+overlap+qreg+lazy+packgqa+psmem")),
              "psmem_forward");
    EXPECT_NE(rejected_by(KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+psmem")),
              "");
    // A persistent tile with one Q buffer: valid since its three consumers no longer stage O
    // apart (which gave wrong results and a hang; correct on a GPU since, H100, 2026-12-06).
    const auto one_q_buffer = KernelConfig::parse(
        "(BF16, 192, 192, 64, 16): sm90+dv_128+stages_2+overlap+persistent+dynamic+lazy+psmem");
    EXPECT_EQ(fa::q_buffers(one_q_buffer), 1);
    EXPECT_FALSE(fa::o_staged_apart(one_q_buffer));
    EXPECT_EQ(rejected_by(one_q_buffer), "");
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(BF16, 192, 192, 64, 16): sm90+dv_128+stages_2+overlap+lazy+psmem")),
              "");
    const auto sm90 = fa::space::named_set("tune-sm90");
    EXPECT_TRUE(std::any_of(sm90.begin(), sm90.end(), [](const KernelConfig& c) {
        return c.sm90.p_in_smem && c.d_head == 96 && c.B_r == 192 && c.sm90.intra_warpgroup_overlap;
    }));
}

TEST(ConfigSpace, HopperSetsCoverEveryHeadDimAndDtype) {
    const auto tune = fa::space::named_set("tune");
    for (const fa::DType dtype : {fa::DType::FP16, fa::DType::BF16}) {
        for (const int d : {64, 128, 256}) {
            EXPECT_TRUE(std::any_of(tune.begin(), tune.end(), [&](const KernelConfig& c) {
                return c.family == fa::Family::sm90 && c.dtype == dtype && c.d_head == d;
            })) << d;
        }
    }
    const auto ladder = fa::space::named_set("progression-sm90");
    ASSERT_EQ(ladder.size(), 7u);
    for (const KernelConfig& c : ladder) {
        EXPECT_EQ(c.family, fa::Family::sm90);
        EXPECT_EQ(rejected_by(c), "") << c.to_string();
    }
    // Each step adds one technique: more consumers, more stages, overlap, ping-pong,
    // persistence, Q in registers.
    EXPECT_LT(consumer_warpgroups(ladder[0]), consumer_warpgroups(ladder[1]));
    EXPECT_LT(ladder[1].sm90.stages, ladder[2].sm90.stages);
    EXPECT_TRUE(!ladder[2].sm90.intra_warpgroup_overlap && ladder[3].sm90.intra_warpgroup_overlap);
    EXPECT_TRUE(!ladder[3].sm90.pingpong && ladder[4].sm90.pingpong);
    EXPECT_TRUE(!ladder[4].sm90.persistent && ladder[5].sm90.persistent);
    EXPECT_TRUE(!ladder[5].sm90.q_in_registers && ladder[6].sm90.q_in_registers);
}

TEST(ConfigSpace, CopySplitRule) {
    // 8 warps copying a 16-row tile of 64-wide rows: 128 chunks for 256 threads.
    const KernelConfig c = KernelConfig::parse("(FP16, 64, 128, 16, 8): async+load_1_1_1_tiles");
    EXPECT_EQ(rejected_by(c), "copy_split");
}

TEST(ConfigSpace, ValidityOnlySkipsPruning) {
    KernelConfig c = good();
    c.B_c = 128;
    c.sm80.mma_double_buffer_loads = false;
    ASSERT_EQ(rejected_by(c), "register_budget");
    EXPECT_EQ(fa::space::rejecting_rule(c, /*validity_only=*/true), nullptr);
}

TEST(ConfigSpace, NamedSetsAreValidSortedAndUnique) {
    for (const auto name : fa::space::set_names()) {
        const auto set = fa::space::named_set(name);
        EXPECT_FALSE(set.empty()) << name;
        for (const KernelConfig& c : set) {
            EXPECT_EQ(fa::space::rejecting_rule(c, /*validity_only=*/true), nullptr)
                << name << ": " << c.to_string();
        }
        if (name != "progression") {
            EXPECT_TRUE(std::is_sorted(set.begin(), set.end())) << name;
            EXPECT_TRUE(std::adjacent_find(set.begin(), set.end()) == set.end()) << name;
        }
    }
}

TEST(ConfigSpace, ProgressionIsTheSevenStepLadder) {
    const auto ladder = fa::space::named_set("progression");
    ASSERT_EQ(ladder.size(), 7u);
    const char* expected[] = {
        "(FP16, 128, 64, 64, 4): async+load_0_0_0_tiles",
        "(FP16, 128, 64, 64, 4): async+swizzled+load_0_0_0_tiles",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_0_0_0_tiles",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer+opt_softmax",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_0_2_2_tiles+opt_softmax",
    };
    for (int i = 0; i < 7; ++i)
        EXPECT_EQ(ladder[i].to_string(), expected[i]);
}

TEST(ConfigSpace, TuneSetCoversTheRequiredAxes) {
    const auto tune = fa::space::named_set("tune");
    const auto has = [&](auto pred) { return std::any_of(tune.begin(), tune.end(), pred); };
    for (const auto dtype : {fa::DType::FP16, fa::DType::BF16}) {
        for (const int d : {64, 128}) {
            for (const int br : {64, 128}) {
                for (const int bc : {32, 64, 128}) {
                    EXPECT_TRUE(has([&](const KernelConfig& c) {
                        return c.dtype == dtype && c.d_head == d && c.B_r == br && c.B_c == bc;
                    })) << "dtype "
                        << int(dtype) << " d " << d << " B_r " << br << " B_c " << bc;
                }
            }
        }
    }
    for (const int nw : {4, 8}) {
        EXPECT_TRUE(has([&](const KernelConfig& c) { return c.n_warps == nw; }));
    }
    EXPECT_TRUE(has([](const KernelConfig& c) { return c.sm80.mma_double_buffer_loads; }));
    EXPECT_TRUE(has([](const KernelConfig& c) { return !c.sm80.mma_double_buffer_loads; }));
    EXPECT_TRUE(has([](const KernelConfig& c) { return c.sm80.Q_mma_load_K_tiles == 0; }));
    EXPECT_TRUE(has([](const KernelConfig& c) { return c.sm80.Q_mma_load_K_tiles != 0; }));
    for (const KernelConfig& c : tune) {
        EXPECT_EQ(fa::space::rejecting_rule(c), nullptr) << c.to_string();
    }
}

// `tune` explores every knob of the field table: each field takes two values or more among its
// configs, so a new row of the table that the tune sets leave at its default fails here.
TEST(ConfigSpace, TuneSetVariesEveryField) {
    const auto tune = fa::space::named_set("tune");
    for (int i = 0; i < fa::k_config_field_count; ++i) {
        std::set<int> values;
        for (const KernelConfig& c : tune)
            values.insert(fa::field_value(c, i));
        EXPECT_GE(values.size(), 2u) << fa::k_config_fields[i].name;
    }
}

TEST(ConfigSpace, ExpandAppliesEveryRule) {
    fa::space::ValueSets values;
    values.d_head = {128};
    values.async_copy = {false, true};
    values.eager_load_blocks = {false, true};
    values.swizzled = {true};
    values.load_tiles = {{0, 2, 2}};
    values.optimized_softmax = {true};
    const auto configs = values.expand();
    // eager without async is dropped: 3 of the 4 copy combinations remain.
    EXPECT_EQ(configs.size(), 3u);
    for (const KernelConfig& c : configs)
        EXPECT_FALSE(c.sm80.eager_load_blocks && !c.sm80.async_copy);
}

// The field table drives the value sets: every field has a list (the load_Q_K_V_tiles
// fields one together), defaulting to the field's default, so a new table row is a new
// knob the space enumerates with no other change.
TEST(ConfigSpace, ValueSetsFollowTheFieldTable) {
    const fa::space::ValueSets defaults;
    const auto configs = defaults.expand();
    // The default value of every field is the one config, which the rules reject (an sm80
    // config with load_0_0_0 and nothing else is valid).
    ASSERT_LE(configs.size(), 1u);
    if (!configs.empty()) {
        EXPECT_EQ(configs[0], KernelConfig{});
    }
    for (int i = 0; i < fa::k_config_field_count; ++i)
        EXPECT_EQ(fa::field_value(KernelConfig{}, i), fa::k_config_fields[i].default_value);
}

TEST(ConfigSpace, UnknownSetNamesTheKnownOnes) {
    try {
        fa::space::named_set("fast");
        FAIL() << "no exception";
    } catch (const fa::Error& e) {
        EXPECT_EQ(e.code(), fa::ErrorCode::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("\"fast\""), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("tune"), std::string::npos);
    }
}

// The default build's set is the built-in table's configs, nothing more and nothing less:
// the table can never name a kernel the default build lacks (the table once named an sm90
// config that the default set did not hold, and the choice fell back to sm80).
TEST(ConfigSpace, ReleaseSetIsTheBuiltInTable) {
    std::vector<KernelConfig> table;
    for (const auto& row : fa::space::builtin_choices())
        table.push_back(row.config);
    std::sort(table.begin(), table.end());
    table.erase(std::unique(table.begin(), table.end()), table.end());
    const auto release = fa::space::named_set("release");
    EXPECT_EQ(release, table);
    for (const auto& c : release)
        EXPECT_EQ(rejected_by(c), "") << c.to_string();
    // Each family covers every dtype and head dim.
    for (const auto family : {fa::Family::sm80, fa::Family::sm90}) {
        for (const auto dtype : {fa::DType::FP16, fa::DType::BF16}) {
            for (const int d : fa::space::k_head_dims) {
                EXPECT_TRUE(std::any_of(release.begin(), release.end(),
                                        [&](const KernelConfig& c) {
                                            return c.family == family && c.dtype == dtype &&
                                                   c.d_head == d;
                                        }))
                    << fa::to_string(family) << " " << fa::to_string(dtype) << " " << d;
            }
        }
    }
    // The ci and tune sets hold it too, so their builds choose the same kernels.
    for (const char* name : {"ci", "tune", "all"}) {
        const auto set = fa::space::named_set(name);
        for (const auto& c : release)
            EXPECT_TRUE(std::binary_search(set.begin(), set.end(), c))
                << name << ": " << c.to_string();
    }
}

// V's own head dim (dv_N): printed only where set, 128 with d_head 192 only, forward only; its
// configs lay out V's and O's tiles at 128 columns.
TEST(ConfigSpace, ValueHeadDim) {
    const auto mla = fa::KernelConfig::parse(
        "(BF16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+lazy");
    EXPECT_EQ(mla.d_v, 128);
    EXPECT_EQ(mla.v_head_dim(), 128);
    EXPECT_EQ(mla.to_string(),
              "(BF16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+lazy");
    EXPECT_EQ(rejected_by(mla), "");
    KernelConfig same = mla;
    same.d_v = 0;
    EXPECT_EQ(same.v_head_dim(), 192);
    EXPECT_EQ(same.to_string().find("dv_"), std::string::npos);
    // Two stages of 128-row K (192 columns) and V (128) tiles beside one Q buffer of 128 rows,
    // the barriers (a Q pair per consumer), and O's own region of 64 rows at V's 128 columns.
    EXPECT_EQ(fa::smem_bytes(mla), 128 * 192 * 2 + 2 * 128 * (192 + 128) * 2 + 1024 +
                                       8 * (2 * 2 + 4 * 2) + 64 * 128 * 2 + 8);
    for (const int d_v : {192, 64, 256}) {
        KernelConfig c = mla;
        c.d_v = d_v;
        EXPECT_EQ(rejected_by(c), "d_v") << d_v;
    }
    KernelConfig d256 = fa::KernelConfig::parse(
        "(BF16, 256, 128, 80, 12): sm90+stages_2+overlap+pingpong+lazy+trim");
    d256.d_v = 128;
    EXPECT_EQ(rejected_by(d256), "d_v");
    // The backward, both families: sm90's on two consumers sharing 64 keys (one holding dK, the
    // other dV), not on consumers of 64 keys each.
    KernelConfig backward = fa::KernelConfig::parse("(BF16, 192, 64, 64, 8): bwd+async+swizzled");
    backward.d_v = 128;
    EXPECT_EQ(rejected_by(backward), "");
    EXPECT_EQ(
        rejected_by(fa::KernelConfig::parse("(BF16, 192, 64, 64, 12): sm90+dv_128+bwd+stages_2")),
        "");
    KernelConfig sm90_backward =
        fa::KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2");
    sm90_backward.d_head = 192;
    sm90_backward.d_v = 128;
    EXPECT_EQ(rejected_by(sm90_backward), "backward_warpgroups");
}

// E4M3 (FP8) parses and prints; the rule `dtype` takes the sm90 forward's FP8 knobs (stages,
// overlap, pingpong, persistent, dynamic, lazy, vtrans) at d_head 128 and 256 with B_c 128, and
// refuses the rest; `register_budget` refuses d_head 256 with overlap; vtrans is FP8's alone and
// adds a staging tile a stage and its barriers.
TEST(ConfigSpace, E4m3ParsesAndTheRuleTakesItsKnobs) {
    const auto fp8 = KernelConfig::parse(
        "(E4M3, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+persistent+dynamic+lazy");
    EXPECT_EQ(fp8.dtype, fa::DType::E4M3);
    EXPECT_EQ(KernelConfig::parse(fp8.to_string()), fp8);
    EXPECT_EQ(rejected_by(fp8), "");
    for (const char* refused : {
             "(E4M3, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg",
             "(E4M3, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+lazy+trim",
             "(E4M3, 128, 64, 128, 8): sm90+stages_2+packgqa",
             "(E4M3, 128, 128, 64, 12): sm90+stages_2",
             "(E4M3, 128, 192, 128, 16): sm90+stages_2+overlap+pingpong+persistent+lazy",
             "(E4M3, 96, 128, 128, 12): sm90+stages_2",
             "(E4M3, 192, 128, 128, 12): sm90+dv_128+stages_2",
             "(E4M3, 128, 64, 128, 12): sm90+bwd+stages_2",
             "(E4M3, 128, 64, 64, 4): async+swizzled+load_1_1_1_tiles",
         }) {
        EXPECT_EQ(rejected_by(KernelConfig::parse(refused)), "dtype") << refused;
    }
    for (const KernelConfig& c : fa::space::named_set("fp8"))
        EXPECT_EQ(rejected_by(c), "") << c.to_string();
    // d_head 256's block accumulators (Traits::pv_parts) leave no registers for overlap: with it
    // a consumer would hold S beside O and them (2604 bytes spilled with a whole block's, ptxas
    // 13.0); without it the estimate is 240, the consumers' budget.
    const auto d256 = KernelConfig::parse("(E4M3, 256, 128, 128, 12): sm90+stages_2+persistent");
    EXPECT_EQ(rejected_by(d256), "");
    EXPECT_EQ(fa::space::estimated_registers(d256), 240);
    EXPECT_EQ(rejected_by(KernelConfig::parse(
                  "(E4M3, 256, 128, 128, 12): sm90+stages_2+overlap+persistent+dynamic+lazy")),
              "register_budget");
    const auto vtrans = KernelConfig::parse(
        "(E4M3, 128, 128, 128, 12): sm90+stages_3+overlap+persistent+dynamic+lazy+vtrans");
    EXPECT_TRUE(vtrans.sm90.transpose_v);
    EXPECT_EQ(KernelConfig::parse(vtrans.to_string()), vtrans);
    EXPECT_EQ(rejected_by(vtrans), "");
    KernelConfig plain = vtrans;
    plain.sm90.transpose_v = false;
    // A staging tile, two mbarriers and an end word a stage.
    EXPECT_EQ(fa::smem_bytes(vtrans), fa::smem_bytes(plain) + 3 * (128 * 128 + 16 + 8));
    EXPECT_EQ(rejected_by(KernelConfig::parse("(BF16, 128, 128, 128, 12): sm90+stages_2+vtrans")),
              "vtrans_fp8");
    EXPECT_EQ(fa::element_bytes(fa::DType::E4M3), 1u);
    EXPECT_THROW(KernelConfig::parse("(E5M2, 128, 128, 128, 12): sm90+stages_2"), fa::Error);
}
