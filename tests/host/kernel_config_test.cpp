#include <gtest/gtest.h>

#include <chrono>

#include <set>
#include <unordered_set>

#include "config/config_code.hpp"
#include "config/config_space.hpp"
#include "config/resources.hpp"
#include "flash_attention/error.hpp"
#include "flash_attention/kernel_config.hpp"

namespace fa = flash_attention;
using fa::KernelConfig;

namespace {

const char* k_full =
    "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer+opt_softmax";

// The message of the Error that parsing `text` throws.
std::string parse_error(const std::string& text) {
    try {
        KernelConfig::parse(text);
    } catch (const fa::Error& e) {
        EXPECT_EQ(e.code(), fa::ErrorCode::invalid_argument);
        return e.what();
    }
    ADD_FAILURE() << "parsing \"" << text << "\" did not throw";
    return {};
}

}  // namespace

TEST(KernelConfig, ParsesEveryField) {
    const KernelConfig c = KernelConfig::parse(k_full);
    EXPECT_EQ(c.dtype, fa::DType::FP16);
    EXPECT_EQ(c.d_head, 128);
    EXPECT_EQ(c.B_r, 64);
    EXPECT_EQ(c.B_c, 64);
    EXPECT_EQ(c.n_warps, 4);
    EXPECT_TRUE(c.sm80.async_copy);
    EXPECT_TRUE(c.sm80.eager_load_blocks);
    EXPECT_TRUE(c.sm80.swizzled);
    EXPECT_EQ(c.sm80.Q_mma_load_K_tiles, 2);
    EXPECT_EQ(c.sm80.K_mma_load_K_tiles, 2);
    EXPECT_EQ(c.sm80.V_mma_load_K_tiles, 2);
    EXPECT_TRUE(c.sm80.mma_double_buffer_loads);
    EXPECT_TRUE(c.sm80.optimized_softmax);
}

TEST(KernelConfig, PrintsTheShortForm) {
    EXPECT_EQ(KernelConfig::parse(k_full).to_string(), k_full);
    KernelConfig plain{.dtype = fa::DType::BF16, .d_head = 64, .B_r = 128, .B_c = 32, .n_warps = 8};
    plain.sm80.K_mma_load_K_tiles = 1;
    plain.sm80.V_mma_load_K_tiles = 2;
    EXPECT_EQ(plain.to_string(), "(BF16, 64, 128, 32, 8): load_0_1_2_tiles");
}

TEST(KernelConfig, RoundTripsEveryConfigOfEverySet) {
    for (const auto name : fa::space::set_names()) {
        for (const KernelConfig& c : fa::space::named_set(name)) {
            const std::string s = c.to_string();
            EXPECT_EQ(KernelConfig::parse(s), c) << s;
            EXPECT_EQ(KernelConfig::parse(s).to_string(), s);
        }
    }
}

TEST(KernelConfig, ParsesAndPrintsHopperConfigs) {
    const char* text = "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong";
    const KernelConfig c = KernelConfig::parse(text);
    EXPECT_EQ(c.family, fa::Family::sm90);
    EXPECT_EQ(c.sm90.stages, 2);
    EXPECT_TRUE(c.sm90.intra_warpgroup_overlap);
    EXPECT_TRUE(c.sm90.pingpong);
    EXPECT_EQ(consumer_warpgroups(c), 2);
    EXPECT_FALSE(c.sm80.async_copy || c.sm80.swizzled || c.sm80.optimized_softmax);
    EXPECT_EQ(c.to_string(), text);
    EXPECT_EQ(KernelConfig::parse("(BF16, 64, 64, 64, 8): stages_1+sm90").to_string(),
              "(BF16, 64, 64, 64, 8): sm90+stages_1");
    // Q, 2 x 2 K/V stages of 128 x 128 16-bit, the alignment pad and 10 mbarriers.
    EXPECT_EQ(smem_bytes(c), (128u + 2 * 2 * 128) * 128 * 2 + 1024 + 8 * 10);
    // Persistent: a second Q buffer when it fits an H100 (d_head 128), else one (256).
    const KernelConfig persistent =
        KernelConfig::parse("(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent");
    EXPECT_EQ(q_buffers(persistent), 2);
    EXPECT_EQ(smem_bytes(persistent), (2 * 128u + 2 * 2 * 128) * 128 * 2 + 1024 + 8 * 12);
    const KernelConfig one_buffer =
        KernelConfig::parse("(BF16, 256, 128, 64, 12): sm90+stages_2+persistent");
    EXPECT_EQ(q_buffers(one_buffer), 1);
    // Its O gets a region of its own (64 rows and a barrier) where that fits an H100: at B_c 64,
    // not at B_c 80 (224 KB of Q, K and V), nor without persistence (no next tile's Q).
    EXPECT_TRUE(fa::o_staged_apart(one_buffer));
    // Its one buffer has a pair of Q barriers per consumer (12 mbarriers with the K/V ones).
    EXPECT_EQ(fa::q_barrier_pairs(one_buffer), 2);
    EXPECT_EQ(fa::q_barrier_pairs(persistent), 2);  // one per buffer
    EXPECT_EQ(fa::q_barrier_pairs(c), 1);           // one tile per CTA: one pair
    EXPECT_EQ(smem_bytes(one_buffer),
              (128u + 2 * 2 * 64) * 256 * 2 + 1024 + 8 * 12 + 64 * 256 * 2 + 8);
    EXPECT_FALSE(fa::o_staged_apart(
        KernelConfig::parse("(BF16, 256, 128, 80, 12): sm90+stages_2+persistent")));
    EXPECT_FALSE(
        fa::o_staged_apart(KernelConfig::parse("(BF16, 256, 128, 64, 12): sm90+stages_2")));
    EXPECT_FALSE(fa::o_staged_apart(persistent));
    // Nor with three consumers, whose turns one mbarrier's parity cannot order (this one has one
    // Q buffer and room for the region).
    const KernelConfig three =
        KernelConfig::parse("(FP16, 64, 192, 192, 16): sm90+stages_4+persistent");
    EXPECT_EQ(q_buffers(three), 1);
    EXPECT_LE(fa::detail::sm90_smem_bytes(three, 1, true),
              static_cast<std::size_t>(fa::DeviceLimits::h100().smem_per_block_optin));
    EXPECT_FALSE(fa::o_staged_apart(three));
    EXPECT_NE(parse_error("(BF16, 128, 128, 128, 12): sm90+stages_x").find("stages_x"),
              std::string::npos);
    EXPECT_NE(parse_error("(BF16, 128, 128, 128, 12): sm90+stages_-1").find("stages_-1"),
              std::string::npos);
    // Without sm90 a config is sm80 and needs its load flag.
    EXPECT_NE(parse_error("(BF16, 128, 128, 128, 12): stages_2").find("load_Q_K_V_tiles"),
              std::string::npos);
}

TEST(KernelConfig, FamiliesDifferInOrderAndHash) {
    KernelConfig a = KernelConfig::parse("(BF16, 128, 128, 128, 12): sm90+stages_2");
    KernelConfig b = a;
    b.sm90.stages = 3;
    EXPECT_LT(a, b);
    EXPECT_NE(std::hash<KernelConfig>{}(a), std::hash<KernelConfig>{}(b));
    EXPECT_LT(KernelConfig::parse(k_full), a);  // sm80 sorts first
}

TEST(KernelConfig, AcceptsWhitespaceCaseFlagOrderAndTheShortLoadToken) {
    const KernelConfig c = KernelConfig::parse(
        "  ( fp16 ,128,64 , 64,4 ) :opt_softmax + buffer+load_2_2_2+swizzled+eager+async ");
    EXPECT_EQ(c, KernelConfig::parse(k_full));
}

TEST(KernelConfig, RejectsMalformedStringsNamingTheToken) {
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): asyn+load_0_0_0_tiles").find("\"asyn\""),
              std::string::npos);
    EXPECT_NE(parse_error("(FP32, 128, 64, 64, 4): load_0_0_0_tiles").find("\"FP32\""),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 12x, 64, 64, 4): load_0_0_0_tiles").find("\"12x\""),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): load_0_a_0_tiles").find("\"a\""),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): async+async+load_0_0_0_tiles")
                  .find("\"async\" given twice"),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): async").find("load_Q_K_V_tiles"),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64): load_0_0_0_tiles").find("5 tuple fields"),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 0, 64, 4): load_0_0_0_tiles").find("B_r"),
              std::string::npos);
    EXPECT_NE(parse_error("FP16, 128, 64, 64, 4: load_0_0_0_tiles").find("\"(\""),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4) load_0_0_0_tiles").find("\":\""),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): async++load_0_0_0_tiles").find("empty flag"),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): load_1_1_tiles").find("three counts"),
              std::string::npos);
    parse_error("");
}

// Contradicting flags of one kind were accepted, the last one winning.
TEST(KernelConfig, RejectsTwoFlagsOfOneKind) {
    EXPECT_NE(parse_error("(BF16, 128, 128, 128, 12): sm90+stages_3+stages_2")
                  .find("more than one stages_N flag"),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): load_0_0_0_tiles+load_1_1_1_tiles")
                  .find("more than one load_Q_K_V_tiles flag"),
              std::string::npos);
}

// Knobs of both families in one form were accepted (the config then failed later, as
// "foreign_knobs"), as were a signed tile count, whitespace inside a token and text after
// a NUL.
TEST(KernelConfig, RejectsMixedFamiliesSignsInnerWhitespaceAndControlCharacters) {
    EXPECT_NE(parse_error("(BF16, 128, 128, 128, 12): sm90+stages_2+swizzled")
                  .find("\"swizzled\" is an sm80 knob"),
              std::string::npos);
    EXPECT_NE(parse_error("(BF16, 128, 128, 128, 12): sm90+stages_2+load_0_0_0_tiles")
                  .find("\"load_0_0_0_tiles\" is an sm80 knob"),
              std::string::npos);
    EXPECT_NE(parse_error("(BF16, 64, 128, 64, 4): async+load_1_1_1_tiles+pingpong")
                  .find("\"pingpong\" is an sm90 knob"),
              std::string::npos);
    EXPECT_NE(parse_error("(BF16, 64, 128, 64, 4): load_1_1_1_tiles+stages_0")
                  .find("\"stages_0\" is an sm90 knob"),
              std::string::npos);
    EXPECT_NE(parse_error("(BF16, 64, 128, 64, 4): load_-0_1_1_tiles").find("got \"-0\""),
              std::string::npos);
    EXPECT_NE(parse_error("(BF16, 128, 128, 128, 12): sm90+stages_-0").find("got \"-0\""),
              std::string::npos);
    EXPECT_NE(parse_error("(BF16, -0128, 128, 64, 4): load_1_1_1_tiles").find("got \"-0128\""),
              std::string::npos);
    for (const char* spaced :
         {"(BF16, 64, 128, 64, 4): load_1_ 1_1_tiles", "(BF16, 64, 128, 64, 4): load_1_1_1 _tiles",
          "(BF16, 6 4, 128, 64, 4): load_1_1_1_tiles",
          "(BF16, 64, 128, 64, 4): load_1_1_1_tiles+opt_\tsoftmax"}) {
        EXPECT_NE(parse_error(spaced).find("whitespace inside"), std::string::npos) << spaced;
    }
    const std::string with_nul("(BF16, 64, 128, 64, 4): load_1_1_1_tiles\0+pingpong", 50);
    EXPECT_NE(parse_error(with_nul).find("control character"), std::string::npos);
    EXPECT_NE(parse_error(with_nul.substr(0, 41)).find("control character"), std::string::npos);
    // Whitespace around tokens is still fine (AcceptsWhitespaceCaseFlagOrder...).
    EXPECT_NO_THROW(KernelConfig::parse("(BF16, 64, 128, 64, 4):\tload_1_1_1_tiles + async\n"));
}

// A message quoted the input's first 100 bytes, which could end inside a UTF-8 character
// (Python then raised UnicodeDecodeError, not ValueError), and echoed control characters
// raw: a newline split the message in two, a NUL ended Python's copy of it.
TEST(KernelConfig, MessagesQuoteTheInputAsOneLineOfValidUtf8) {
    const std::string cut = parse_error("(" + std::string(98, 'a') + "\xC3\xA9");  // é
    EXPECT_NE(cut.find("(" + std::string(98, 'a') + "...\""), std::string::npos) << cut;
    const std::string whole = parse_error("(" + std::string(97, 'a') + "\xC3\xA9");
    EXPECT_NE(whole.find(std::string(97, 'a') + "\xC3\xA9\""), std::string::npos) << whole;
    const std::string newline = parse_error("(BF16, 64, 128, 64, 4): asy\nnc+load_1_1_1_tiles");
    EXPECT_EQ(newline.find('\n'), std::string::npos) << newline;
    EXPECT_NE(newline.find("\"asy\\nnc\""), std::string::npos) << newline;
    const std::string nul =
        parse_error(std::string("(BF16, 64, 128, 64, 4): asy\0nc+load_1_1_1_tiles", 47));
    EXPECT_EQ(nul.find('\0'), std::string::npos) << nul;
    EXPECT_NE(nul.find("asy\\x00nc"), std::string::npos) << nul;
    const std::string invalid = parse_error("(BF16, 64, 128, 64, 4): \xFF+load_1_1_1_tiles");
    EXPECT_NE(invalid.find("\"\\xff\""), std::string::npos) << invalid;
}

// Values past what a kernel code holds overflowed smem_bytes() and n_threads().
TEST(KernelConfig, BoundsEveryNumber) {
    EXPECT_NE(parse_error("(FP16, 128, 2000000000, 64, 4): load_0_0_0_tiles")
                  .find("expected an integer from 1 to 255 for B_r"),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 99999): load_0_0_0_tiles").find("n_warps"),
              std::string::npos);
    EXPECT_NE(parse_error("(FP16, 4096, 64, 64, 4): load_0_0_0_tiles").find("d_head"),
              std::string::npos);
    EXPECT_NE(
        parse_error("(BF16, 128, 128, 128, 12): sm90+stages_9").find("the count of \"stages_9\""),
        std::string::npos);
    EXPECT_NE(parse_error("(FP16, 128, 64, 64, 4): load_0_99_0_tiles").find("tile count"),
              std::string::npos);
}

// A 200,000-token string took 72 s (a quadratic duplicate check) inside the automatic
// choice, with the tuning cache's mutex held; its message echoed the whole string.
TEST(KernelConfig, HostileLengthsAreRejectedAtOnce) {
    std::string huge = "(FP16, 128, 64, 64, 4): load_0_0_0_tiles";
    for (int i = 0; i < 200'000; ++i)
        huge += "+async";
    const auto start = std::chrono::steady_clock::now();
    const std::string message = parse_error(huge);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
    EXPECT_NE(message.find("at most 256 characters"), std::string::npos) << message.substr(0, 300);
    EXPECT_LT(message.size(), 400u);
}

TEST(KernelConfig, OrderEqualityAndHashAgree) {
    const auto all = fa::space::named_set("all");
    std::set<KernelConfig> ordered(all.begin(), all.end());
    std::unordered_set<KernelConfig> hashed(all.begin(), all.end());
    EXPECT_EQ(ordered.size(), all.size());
    EXPECT_EQ(hashed.size(), all.size());
    for (std::size_t i = 1; i < all.size(); ++i) {
        EXPECT_LT(all[i - 1], all[i]);
        EXPECT_NE(all[i - 1], all[i]);
    }
    KernelConfig a = KernelConfig::parse(k_full);
    KernelConfig b = a;
    EXPECT_EQ(a, b);
    EXPECT_EQ(std::hash<KernelConfig>{}(a), std::hash<KernelConfig>{}(b));
    b.sm80.optimized_softmax = false;
    EXPECT_NE(a, b);
    EXPECT_TRUE(b < a || a < b);
}

TEST(KernelConfig, SharedMemoryAndOccupancy) {
    const KernelConfig c = KernelConfig::parse(k_full);
    EXPECT_EQ(smem_bytes(c), (64u + 2 * 64) * 128 * 2);  // Q + K + V tiles of 16-bit
    // 48 KB + 1 KB reserved per CTA: 3 CTAs in an A100's 164 KB, 4 in an H100's 228 KB.
    EXPECT_EQ(fa::ctas_per_sm(c, fa::DeviceLimits::a100()), 3);
    EXPECT_EQ(fa::ctas_per_sm(c, fa::DeviceLimits::h100()), 4);
    KernelConfig huge = c;
    huge.B_r = 1024;
    EXPECT_EQ(fa::ctas_per_sm(huge, fa::DeviceLimits::a100()), 0);
}

TEST(KernelConfig, EveryConfigSurvivesTheKernelParameterPacking) {
    for (const KernelConfig& c : fa::space::named_set("all"))
        EXPECT_EQ(fa::unpack(fa::pack(c)), c) << c.to_string();
}

// Each field alone at its largest value, then all of them: a field that overlapped another's
// bits, or lost bits across the code's two words, would come back changed.
TEST(KernelConfig, EveryFieldAtItsLargestSurvivesThePacking) {
    KernelConfig all;
    for (int i = 0; i < fa::k_config_field_count; ++i) {
        const int largest = fa::field_max(fa::k_config_fields[i].bits);
        KernelConfig one;
        fa::set_field_value(one, i, largest);
        fa::set_field_value(all, i, largest);
        EXPECT_EQ(fa::unpack(fa::pack(one)), one) << fa::k_config_fields[i].name;
    }
    EXPECT_EQ(fa::unpack(fa::pack(all)), all);
    const fa::ConfigCode code = fa::pack(all);
    const int bits = fa::code_bits();
    EXPECT_EQ(code.lo, bits >= 64 ? ~0ull : (1ull << bits) - 1);
    EXPECT_EQ(code.hi, bits <= 64 ? 0ull : ~0ull >> (128 - bits));
}
