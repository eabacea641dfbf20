#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "api/choice.hpp"
#include "config/config_space.hpp"
#include "flash_attention/error.hpp"
#include "flash_attention/flash_attention.hpp"
#include "support/built_configs.hpp"
#include "tuning/tuning_cache.hpp"

namespace fa = flash_attention;
namespace tuning = fa::tuning;

namespace {

const fa::KernelConfig k_a = fa::KernelConfig::parse(
    "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax");
const fa::KernelConfig k_b = fa::KernelConfig::parse(
    "(BF16, 128, 64, 64, 4): async+eager+swizzled+load_0_2_2_tiles+opt_softmax");

tuning::Entry entry(const std::string& gpu, int bucket, const fa::KernelConfig& c, double tflops) {
    tuning::Entry e{{gpu, 132, c.dtype, c.d_head, bucket, false},
                    c,
                    tflops,
                    k_b,
                    tflops / 2,
                    "2026-11-23T00:00:00Z"};
    e.key.d_v = c.d_v;
    return e;
}

// Dense (1, seq, 2, d) views of a config's tensors at made-up addresses `gib` GiB: q, k, v, o
// (v and o with V's head dim).
fa::ForwardParams views_for(const fa::KernelConfig& c, std::int64_t seq) {
    const auto view = [&](std::uintptr_t gib, int d) {
        return fa::TensorView::contiguous(reinterpret_cast<void*>(gib << 30), c.dtype, 1, seq, 2,
                                          d);
    };
    return {view(1, c.d_head), view(2, c.d_head), view(3, c.v_head_dim()), view(4, c.v_head_dim())};
}

// Backward configs of the built-in table's rows: any pass, deterministic, deterministic.
const fa::KernelConfig k_sm90_backward =
    fa::KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic");
const fa::KernelConfig k_sm80_backward =
    fa::KernelConfig::parse("(BF16, 128, 64, 64, 8): bwd+async+swizzled");
const fa::KernelConfig k_sm90_ordered =
    fa::KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+ordered");

// The entry of `key` with winner `c` (and a runner-up, if given).
tuning::Entry entry_of(const tuning::Key& key, const fa::KernelConfig& c,
                       std::optional<fa::KernelConfig> runner_up = std::nullopt) {
    tuning::Entry e;
    e.key = key;
    e.config = c;
    e.tflops = 2;
    e.runner_up = runner_up;
    e.runner_up_tflops = runner_up ? 1 : 0;
    e.measured = "2026-12-02T00:00:00Z";
    return e;
}

// A training-sized backward problem: BF16, d_head 128, 4096 tokens, 16 heads.
fa::ProblemShape backward_problem() {
    return {.dtype = fa::DType::BF16,
            .d_head = 128,
            .batch = 2,
            .seq_q = 4096,
            .seq_k = 4096,
            .heads = 16,
            .heads_kv = 16};
}

// A decode step: batch 16, one query, 8192 keys, 32 query heads over 8 K/V heads.
fa::ProblemShape decode_b16() {
    return {.dtype = fa::DType::BF16,
            .d_head = 128,
            .batch = 16,
            .seq_q = 1,
            .seq_k = 8192,
            .heads = 32,
            .heads_kv = 8};
}

// A fresh temporary folder per test, removed afterwards.
class TempDir {
  public:
    TempDir()
        : path_(std::filesystem::temp_directory_path() /
                ("fa_test_" + std::to_string(getpid()) + "_" + std::to_string(counter_++))) {
        std::filesystem::create_directories(path_);
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    const std::filesystem::path& path() const { return path_; }

  private:
    static inline int counter_ = 0;
    std::filesystem::path path_;
};

// Points the process-wide cache at `file` for the scope of the object.
class CacheEnvironment {
  public:
    explicit CacheEnvironment(const std::filesystem::path& file) {
        setenv("FLASH_ATTENTION_TUNING", file.c_str(), 1);
        fa::reload_tuning_cache();
    }
    ~CacheEnvironment() {
        unsetenv("FLASH_ATTENTION_TUNING");
        fa::reload_tuning_cache();
    }
};

}  // namespace

TEST(TuningCache, SeqBuckets) {
    EXPECT_EQ(tuning::seq_bucket(1, 1), 64);
    EXPECT_EQ(tuning::seq_bucket(512, 512), 512);
    EXPECT_EQ(tuning::seq_bucket(513, 100), 1024);
    EXPECT_EQ(tuning::seq_bucket(100, 4095), 4096);
    EXPECT_EQ(tuning::seq_bucket(16384, 16384), 16384);
    EXPECT_EQ(tuning::seq_bucket(16385, 1), 32768);
}

TEST(TuningCache, RoundTrip) {
    const std::vector<tuning::Entry> entries = {entry("GPU A", 4096, k_a, 369.2),
                                                entry("GPU B", 512, k_b, 200)};
    const auto back = tuning::parse(tuning::to_json(entries), "test");
    EXPECT_FALSE(back.corrupt);
    EXPECT_TRUE(back.warnings.empty());
    ASSERT_EQ(back.entries.size(), 2u);
    for (std::size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(back.entries[i].key, entries[i].key);
        EXPECT_EQ(back.entries[i].config, entries[i].config);
        EXPECT_DOUBLE_EQ(back.entries[i].tflops, entries[i].tflops);
        EXPECT_EQ(back.entries[i].runner_up, entries[i].runner_up);
        EXPECT_EQ(back.entries[i].measured, entries[i].measured);
    }
}

// Split counts of the split-KV kernel (`tune --kvcache`) live beside the configs: their
// own keys (rows_bucket > 0), written and read back, looked up by lookup_splits only.
TEST(TuningCache, SplitCountEntries) {
    fa::ProblemShape decode = decode_b16();
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const tuning::Key key = tuning::Key::of_splits(h100, decode, false);
    EXPECT_EQ(key.rows_bucket, 4);  // 1 position x 4 query heads a K/V head
    EXPECT_EQ(key.seq_bucket, 8192);
    decode.batch = 1;
    EXPECT_EQ(tuning::Key::of_splits(h100, decode, false), key) << "the batch is not in the key";
    decode.seq_q = 5;
    EXPECT_EQ(tuning::Key::of_splits(h100, decode, false).rows_bucket, 32);
    EXPECT_EQ(tuning::Key::of(h100, decode).rows_bucket, 0);

    tuning::Entry split;
    split.key = key;
    split.splits = 16;
    split.runner_up_splits = 32;
    split.tflops = 12.5;
    split.runner_up_tflops = 12;
    split.measured = "2026-11-24T00:00:00Z";
    const auto back = tuning::parse(tuning::to_json({entry("GPU A", 4096, k_a, 1), split}), "t");
    ASSERT_EQ(back.entries.size(), 2u);
    EXPECT_TRUE(back.warnings.empty());
    EXPECT_EQ(back.entries[1].key, key);
    EXPECT_EQ(back.entries[1].splits, 16);
    EXPECT_EQ(back.entries[1].runner_up_splits, 32);

    auto doc = nlohmann::json::parse(tuning::to_json({split}));
    for (const nlohmann::json& bad :
         {nlohmann::json(0), nlohmann::json(257), nlohmann::json("8"), nlohmann::json(1e40)}) {
        doc["entries"][0]["splits"] = bad;
        const auto r = tuning::parse(doc.dump(), "cache.json");
        EXPECT_TRUE(r.entries.empty()) << bad.dump();
        EXPECT_EQ(r.warnings.size(), 1u) << bad.dump();
    }

    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    tuning::save_atomically(file, {entry(h100.name, 8192, k_a, 1), split});
    const CacheEnvironment env(file);
    EXPECT_EQ(tuning::lookup_splits(key), 16);
    EXPECT_FALSE(tuning::lookup(key).has_value()) << "a split key names no config";
    tuning::Key config_key = key;
    config_key.rows_bucket = 0;
    EXPECT_FALSE(tuning::lookup_splits(config_key).has_value());
}

// A paged cache's split counts are kept apart from a contiguous cache's: their plans differ.
TEST(TuningCache, PagedSplitCountsHaveTheirOwnKeys) {
    const fa::ProblemShape decode = decode_b16();
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const tuning::Key contiguous = tuning::Key::of_splits(h100, decode, false);
    const tuning::Key paged = tuning::Key::of_splits(h100, decode, true);
    EXPECT_NE(contiguous, paged);
    EXPECT_NE(paged.to_string().find("paged"), std::string::npos);
    tuning::Entry e;
    e.key = paged;
    e.splits = 32;
    e.tflops = 1;
    const auto back = tuning::parse(tuning::to_json({e}), "t");
    ASSERT_EQ(back.entries.size(), 1u);
    EXPECT_EQ(back.entries[0].key, paged);
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    tuning::save_atomically(file, {e});
    const CacheEnvironment env(file);
    EXPECT_EQ(tuning::lookup_splits(paged), 32);
    EXPECT_FALSE(tuning::lookup_splits(contiguous).has_value());
}

TEST(TuningCache, MergeKeepsOtherKeysAndReplacesItsOwn) {
    const auto merged = tuning::merge({entry("GPU A", 4096, k_a, 1), entry("GPU B", 4096, k_a, 2)},
                                      {entry("GPU A", 4096, k_b, 3), entry("GPU A", 512, k_a, 4)});
    ASSERT_EQ(merged.size(), 3u);
    const auto find = [&](const std::string& gpu, int bucket) {
        return *std::find_if(merged.begin(), merged.end(), [&](const tuning::Entry& e) {
            return e.key.gpu == gpu && e.key.seq_bucket == bucket;
        });
    };
    EXPECT_EQ(find("GPU A", 4096).config, k_b);
    EXPECT_DOUBLE_EQ(find("GPU B", 4096).tflops, 2);
    EXPECT_DOUBLE_EQ(find("GPU A", 512).tflops, 4);
}

TEST(TuningCache, CorruptFilesAreReportedNotFatal) {
    for (const char* text : {"not json", "{}", "[1, 2]", R"({"version": 7, "entries": []})"}) {
        const auto r = tuning::parse(text, "cache.json");
        EXPECT_TRUE(r.corrupt) << text;
        EXPECT_TRUE(r.entries.empty()) << text;
        ASSERT_EQ(r.warnings.size(), 1u) << text;
        EXPECT_NE(r.warnings[0].find("cache.json"), std::string::npos);
    }
}

TEST(TuningCache, MalformedEntriesAreSkipped) {
    auto doc = nlohmann::json::parse(tuning::to_json(
        {entry("GPU A", 4096, k_a, 1), entry("GPU A", 512, k_a, 2), entry("GPU A", 1024, k_a, 3)}));
    doc["entries"][0].erase("d_head");                              // missing key
    doc["entries"][1]["config"] = "(BF16, 128, 64, 64, 4): bogus";  // unknown config
    const auto r = tuning::parse(doc.dump(), "cache.json");
    EXPECT_FALSE(r.corrupt);
    ASSERT_EQ(r.entries.size(), 1u);
    EXPECT_EQ(r.entries[0].key.seq_bucket, 1024);
    ASSERT_EQ(r.warnings.size(), 1u);
    EXPECT_NE(r.warnings[0].find("skipped 2"), std::string::npos) << r.warnings[0];
}

// A warning quotes the file's text and its path: control characters escaped, one line (a
// dtype holding a newline and an ESC reached the terminal as they were).
TEST(TuningCache, WarningsQuoteTheFileEscaped) {
    auto doc = nlohmann::json::parse(tuning::to_json({entry("GPU A", 4096, k_a, 1)}));
    doc["entries"][0]["dtype"] = "BF\n\x1b[31m16";
    const std::vector<std::pair<std::string, std::string>> files = {
        {doc.dump(), "cache.json"}, {"{\"entries\": [1,", "cache\n\x1b.json"}};
    for (const auto& [text, source] : files) {
        const auto r = tuning::parse(text, source);
        ASSERT_EQ(r.warnings.size(), 1u) << text;
        for (const char c : r.warnings[0])
            EXPECT_FALSE(c == '\n' || c == '\x1b') << r.warnings[0];
    }
}

// Hostile files: each is a warning and the built-in table, within a second, never an
// exception of another type, a hang or undefined behaviour.
TEST(TuningCache, WronglyTypedOrHugeValuesAreMalformedNotFatal) {
    // A string version threw nlohmann::type_error out of the first forward().
    for (const char* text :
         {R"({"version": "1", "entries": []})", R"({"version": 1.5, "entries": []})",
          R"({"version": null, "entries": []})", R"({"entries": []})"}) {
        const auto r = tuning::parse(text, "cache.json");
        EXPECT_TRUE(r.corrupt) << text;
        ASSERT_EQ(r.warnings.size(), 1u) << text;
        EXPECT_NE(r.warnings[0].find("format version"), std::string::npos) << r.warnings[0];
    }
    auto doc = nlohmann::json::parse(tuning::to_json({entry("GPU A", 4096, k_a, 1)}));
    const nlohmann::json base = doc["entries"][0];
    const std::vector<std::pair<const char*, nlohmann::json>> bad = {
        {"sm_count", 1e67},  // converted to int: undefined behaviour
        {"sm_count", -3},
        {"sm_count", "132"},
        {"d_head", 128.5},
        {"seq_bucket", nlohmann::json::array()},
        {"causal", "yes"},
        {"gpu", 7},
        {"gpu", std::string(100'000, 'x')},
        {"config", std::string(300'000, '+')},
        {"tflops", "fast"},
    };
    for (const auto& [field, value] : bad) {
        nlohmann::json e = base;
        e[field] = value;
        doc["entries"] = nlohmann::json::array({e, base});
        const auto r = tuning::parse(doc.dump(), "cache.json");
        EXPECT_FALSE(r.corrupt) << field;
        EXPECT_EQ(r.entries.size(), 1u) << field << " = " << value.dump().substr(0, 40);
        ASSERT_EQ(r.warnings.size(), 1u) << field;
        EXPECT_LT(r.warnings[0].size(), 400u) << field;
    }
    doc["entries"] = nlohmann::json::array({1, "x", nullptr, base});
    EXPECT_EQ(tuning::parse(doc.dump(), "cache.json").entries.size(), 1u);
}

// A cache nested 100,000 levels deep under "version" crashed `choose`: dump() recursed
// once per level (as copies and comparisons do). Any file nested deeper than a cache ever
// is, wherever the nesting is, is one warning and the built-in table.
TEST(TuningCache, DeeplyNestedFilesAreCorruptNotFatal) {
    constexpr int depth = 100'000;
    const std::string arrays = std::string(depth, '[') + std::string(depth, ']');
    std::string objects;
    for (int i = 0; i < depth; ++i)
        objects += R"({"a":)";
    objects += "1" + std::string(depth, '}');
    const std::string entry_text = tuning::to_json({entry("GPU A", 4096, k_a, 1)});
    for (const std::string& deep : {arrays, objects}) {
        std::string in_entry = entry_text;
        in_entry.replace(in_entry.find("\"GPU A\""), 7, deep);
        for (const std::string& text : {deep, R"({"version": 1, "entries": )" + deep + "}",
                                        R"({"entries": [], "version": )" + deep + "}", in_entry}) {
            const auto r = tuning::parse(text, "cache.json");
            EXPECT_TRUE(r.corrupt);
            ASSERT_EQ(r.warnings.size(), 1u) << text.substr(0, 80);
            EXPECT_NE(r.warnings[0].find("nested"), std::string::npos) << r.warnings[0];
            EXPECT_LT(r.warnings[0].size(), 200u);
        }
    }
    // Brackets inside strings are text, not nesting.
    const std::string in_string =
        R"({"version": 1, "entries": [], "x": "\\\")" + std::string(depth, '[') + R"("})";
    EXPECT_TRUE(tuning::parse(in_string, "cache.json").warnings.empty());
    // Through the automatic choice: one warning, then the built-in table.
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    std::ofstream(file) << R"({"entries": [], "version": )" + arrays + "}";
    const CacheEnvironment env(file);
    testing::internal::CaptureStderr();
    EXPECT_FALSE(tuning::lookup({"GPU", 132, fa::DType::BF16, 128, 4096, false}).has_value());
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find("warning"), std::string::npos) << err;
}

TEST(TuningCache, OnlyRegularFilesAreRead) {
    const TempDir dir;
    // A FIFO with no writer: opening it for reading blocked forever, with the mutex held.
    const auto fifo = dir.path() / "fifo.json";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    const auto start = std::chrono::steady_clock::now();
    const auto r = tuning::load(fifo);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
    EXPECT_TRUE(r.corrupt);
    ASSERT_EQ(r.warnings.size(), 1u);
    EXPECT_NE(r.warnings[0].find("not a regular file"), std::string::npos) << r.warnings[0];
    // An endless device: read until bad_alloc.
    EXPECT_TRUE(tuning::load("/dev/zero").corrupt);
    EXPECT_TRUE(tuning::load(dir.path()).corrupt);  // a folder
    // Past the size limit: not read.
    const auto big = dir.path() / "big.json";
    std::ofstream(big) << std::string(tuning::k_max_file_bytes + 1, ' ');
    const auto rb = tuning::load(big);
    EXPECT_TRUE(rb.corrupt);
    EXPECT_NE(rb.warnings.at(0).find("limit"), std::string::npos);
    // Through the automatic choice: a warning and the table, not a hang.
    const CacheEnvironment env(fifo);
    testing::internal::CaptureStderr();
    EXPECT_FALSE(tuning::lookup({"GPU", 132, fa::DType::BF16, 128, 4096, false}).has_value());
    EXPECT_NE(testing::internal::GetCapturedStderr().find("warning"), std::string::npos);
}

// With no HOME or XDG_CACHE_HOME the cache was ./flash_attention_tuning.json: whatever file
// of that name the working directory held steered the kernel choice.
TEST(TuningCache, NoDefaultPathWithoutAHome) {
    const auto saved = [](const char* name) -> std::optional<std::string> {
        const char* v = std::getenv(name);
        return v ? std::optional<std::string>(v) : std::nullopt;
    };
    const auto home = saved("HOME");
    const auto xdg = saved("XDG_CACHE_HOME");
    const auto own = saved("FLASH_ATTENTION_TUNING");
    unsetenv("HOME");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("FLASH_ATTENTION_TUNING");
    EXPECT_FALSE(tuning::default_path().has_value());
    setenv("XDG_CACHE_HOME", "/x", 1);
    EXPECT_EQ(tuning::default_path(), std::filesystem::path("/x/flash_attention/tuning.json"));
    // A relative XDG_CACHE_HOME is ignored, as the XDG Base Directory spec says: it was
    // read relative to whatever the working directory was.
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    EXPECT_FALSE(tuning::default_path().has_value());
    setenv("HOME", "/h", 1);
    EXPECT_EQ(tuning::default_path(),
              std::filesystem::path("/h/.cache/flash_attention/tuning.json"));
    unsetenv("HOME");
    unsetenv("XDG_CACHE_HOME");
    for (const auto& [name, value] :
         {std::pair{"HOME", home}, {"XDG_CACHE_HOME", xdg}, {"FLASH_ATTENTION_TUNING", own}}) {
        if (value)
            setenv(name, value->c_str(), 1);
    }
}

// Two tune runs on one cache: each read the file at its start and wrote its merge an hour
// later, so the second writer dropped the first one's entries.
TEST(TuningCache, ConcurrentWritersKeepEachOthersEntries) {
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    constexpr int writers = 8;
    std::vector<std::thread> threads;
    for (int w = 0; w < writers; ++w) {
        threads.emplace_back([&, w] {
            for (int i = 0; i < 5; ++i)
                tuning::update(file, {entry("GPU " + std::to_string(w), 64 << i, k_a, w)});
        });
    }
    for (auto& t : threads)
        t.join();
    const auto r = tuning::load(file);
    EXPECT_FALSE(r.corrupt);
    EXPECT_EQ(r.entries.size(), static_cast<std::size_t>(writers * 5));
}

// While another process held the lock, update() waited forever and said nothing.
TEST(TuningCache, UpdateWaitsForAHeldLockBoundedlyAndSaysSo) {
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    const std::string lock_path = file.string() + ".lock";
    // A lock on another open file description conflicts as another process's would.
    const int held = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(held, 0);
    ASSERT_EQ(::flock(held, LOCK_EX), 0);
    std::vector<std::string> notices;
    tuning::LockWait wait;
    wait.timeout = std::chrono::milliseconds(300);
    wait.waiting = [&](const std::string& path) { notices.push_back(path); };
    const auto update_throws = [&](bool interrupted) {
        const auto start = std::chrono::steady_clock::now();
        try {
            tuning::update(file, {entry("GPU A", 4096, k_a, 1)}, wait);
            ADD_FAILURE() << "update() took a lock that was held";
        } catch (const tuning::LockNotTaken& e) {
            EXPECT_EQ(e.interrupted, interrupted);
            EXPECT_NE(std::string(e.what()).find(lock_path), std::string::npos) << e.what();
        }
        return std::chrono::steady_clock::now() - start;
    };
    const auto waited = update_throws(false);
    EXPECT_GE(waited, std::chrono::milliseconds(300));
    EXPECT_LT(waited, std::chrono::seconds(5));
    EXPECT_EQ(notices, std::vector<std::string>{lock_path});
    EXPECT_FALSE(std::filesystem::exists(file));
    // Ctrl-C (what `interrupted` reports) ends the wait at once.
    wait.timeout = std::chrono::minutes(10);
    wait.interrupted = [] { return true; };
    EXPECT_LT(update_throws(true), std::chrono::seconds(5));
    // Released: the update goes through, without a notice.
    notices.clear();
    wait.interrupted = [] { return false; };
    ASSERT_EQ(::flock(held, LOCK_UN), 0);
    EXPECT_TRUE(tuning::update(file, {entry("GPU A", 4096, k_a, 1)}, wait).empty());
    EXPECT_TRUE(notices.empty());
    EXPECT_EQ(tuning::load(file).entries.size(), 1u);
    ::close(held);
}

// tune's checks before a GPU is looked for create nothing: no folder, no lock file.
TEST(TuningCache, PathChecksCreateNothing) {
    const TempDir dir;
    const auto deep = dir.path() / "a" / "b" / "tuning.json";
    EXPECT_NO_THROW(tuning::check_path(deep));
    EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
    EXPECT_THROW(tuning::check_path(dir.path()), fa::Error);  // a folder
    std::ofstream(dir.path() / "file") << "x";
    EXPECT_THROW(tuning::check_path(dir.path() / "file" / "tuning.json"), fa::Error);
    EXPECT_THROW(tuning::check_path("/dev/null"), fa::Error);
    // The check after the GPU's creates the folders the cache goes in, and no lock file.
    tuning::check_writable(deep);
    EXPECT_TRUE(std::filesystem::is_directory(deep.parent_path()));
    EXPECT_TRUE(std::filesystem::is_empty(deep.parent_path()));
}

TEST(TuningCache, WritesNeitherThroughLinksNorToPredictableNames) {
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    // A planted link where the old code's temporary file went (path.tmp.<pid>): it was
    // opened with O_TRUNC and followed, clobbering the target.
    const auto victim = dir.path() / "victim.txt";
    std::ofstream(victim) << "precious";
    std::filesystem::create_symlink(victim, file.string() + ".tmp." + std::to_string(getpid()));
    tuning::save_atomically(file, {entry("GPU A", 4096, k_a, 1)});
    std::ifstream in(victim);
    std::string text;
    in >> text;
    EXPECT_EQ(text, "precious");
    EXPECT_EQ(tuning::load(file).entries.size(), 1u);
    // The old file's permissions survive the rewrite.
    std::filesystem::permissions(file, std::filesystem::perms::owner_read |
                                           std::filesystem::perms::owner_write |
                                           std::filesystem::perms::group_read);
    tuning::save_atomically(file, {entry("GPU A", 4096, k_b, 2)});
    EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::all,
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                  std::filesystem::perms::group_read);
    // A link as the lock file is refused, not followed.
    const auto other = dir.path() / "other.json";
    std::filesystem::create_symlink(victim, other.string() + ".lock");
    EXPECT_THROW(tuning::update(other, {}), fa::Error);
    EXPECT_THROW(tuning::check_writable(other), fa::Error);
}

TEST(TuningCache, MissingFileIsAnEmptyCache) {
    const TempDir dir;
    const auto r = tuning::load(dir.path() / "absent.json");
    EXPECT_FALSE(r.corrupt);
    EXPECT_TRUE(r.entries.empty());
    EXPECT_TRUE(r.warnings.empty());
}

TEST(TuningCache, SavesAtomically) {
    const TempDir dir;
    const auto file = dir.path() / "sub" / "tuning.json";
    tuning::save_atomically(file, {entry("GPU A", 4096, k_a, 1)});
    tuning::save_atomically(file, {entry("GPU A", 4096, k_b, 2)});
    const auto r = tuning::load(file);
    ASSERT_EQ(r.entries.size(), 1u);
    EXPECT_EQ(r.entries[0].config, k_b);
    int files = 0;
    for (const auto& f : std::filesystem::directory_iterator(file.parent_path())) {
        ++files;
        EXPECT_EQ(f.path().filename(), "tuning.json") << "left behind: " << f.path();
    }
    EXPECT_EQ(files, 1);
    // A folder where the file should be: the write fails with an Error, nothing else.
    std::filesystem::create_directories(dir.path() / "blocked.json");
    EXPECT_THROW(tuning::save_atomically(dir.path() / "blocked.json", {}), fa::Error);
}

// The automatic choice reads the cache: a built winner is used, an unbuilt one or a
// corrupt file falls back to the built-in table.
TEST(TuningCache, AutomaticChoiceFollowsTheCache) {
    const auto& built = fa::configs();
    ASSERT_GE(built.size(), 1u);
    const fa::DeviceProperties device{0, "Test GPU", 9, 0, 132, 232448};
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    for (const fa::KernelConfig& c : built) {
        const std::int64_t seq = 1024;
        // pack_gqa winners serve grouped problems of few queries only (GroupedFewQueries...).
        if (seq % c.B_r != 0 || seq % c.B_c != 0 || c.backward || c.sm90.pack_gqa)
            continue;
        const fa::ChoiceProblem p = fa::choice_problem(views_for(c, seq));
        const fa::KernelConfig table_choice = *fa::heuristic_config(p, device);

        tuning::save_atomically(file, {entry("Test GPU", 1024, c, 1)});
        {
            const CacheEnvironment env(file);
            EXPECT_EQ(fa::choose_kernel(p, device), c) << c.to_string();
        }
        fa::KernelConfig unbuilt = c;
        unbuilt.B_c = 16;  // valid, never built by any set
        unbuilt.sm80.mma_double_buffer_loads = false;
        tuning::save_atomically(file, {entry("Test GPU", 1024, unbuilt, 1)});
        {
            const CacheEnvironment env(file);
            EXPECT_EQ(fa::choose_kernel(p, device), table_choice);
        }
        std::ofstream(file) << "{ corrupt";
        {
            const CacheEnvironment env(file);
            testing::internal::CaptureStderr();
            EXPECT_EQ(fa::choose_kernel(p, device), table_choice);
            EXPECT_EQ(fa::choose_kernel(p, device), table_choice);
            const std::string err = testing::internal::GetCapturedStderr();
            EXPECT_NE(err.find("warning"), std::string::npos);
            EXPECT_EQ(err.find("warning"), err.rfind("warning"))
                << "warned more than once: " << err;
        }
    }
}

// Problems of the variant kernels (a sliding window or softcap) have keys of their own
// (`tune --window/--softcap`), written and read back; without one they take the plain
// problem's winner, and a variant winner is never read for plain problems.
TEST(TuningCache, VariantKernelEntries) {
    // Two built forward configs of one dtype and d_head that run the variant kernels (not
    // pack_gqa's): their keys differ in the variants alone.
    std::optional<fa::KernelConfig> plain_winner, variant_winner;
    const auto has_variants = [](const fa::KernelConfig& c) {
        return !c.backward && !c.sm90.pack_gqa;
    };
    for (const fa::KernelConfig& a : fa::configs()) {
        for (const fa::KernelConfig& b : fa::configs()) {
            if (!plain_winner && a != b && has_variants(a) && has_variants(b) &&
                a.dtype == b.dtype && a.d_head == b.d_head && a.d_v == b.d_v) {
                plain_winner = a;
                variant_winner = b;
            }
        }
    }
    if (!plain_winner)
        GTEST_SKIP() << "this build has no two forward configs of one dtype and d_head";
    const fa::DeviceProperties device{0, "Test GPU", 9, 0, 132, 232448};
    tuning::Entry variant = entry(device.name, 1024, *variant_winner, 1);
    variant.key.window_or_softcap = true;
    const auto back = tuning::parse(tuning::to_json({variant}), "t");
    ASSERT_EQ(back.entries.size(), 1u);
    EXPECT_EQ(back.entries[0].key, variant.key);
    EXPECT_NE(variant.key.to_string().find("window/softcap"), std::string::npos);
    auto doc = nlohmann::json::parse(tuning::to_json({variant}));
    doc["entries"][0]["window_or_softcap"] = "yes";
    EXPECT_TRUE(tuning::parse(doc.dump(), "cache.json").entries.empty());

    fa::ForwardParams params = views_for(*plain_winner, 1024);
    const fa::ChoiceProblem plain = fa::choice_problem(params);
    params.options.variants.window_left = 100;
    const fa::ChoiceProblem windowed = fa::choice_problem(params);
    ASSERT_TRUE(windowed.shape.window_or_softcap);
    EXPECT_TRUE(tuning::Key::of(device, windowed.shape).window_or_softcap);
    if (!fa::can_run(*plain_winner, plain, device) || !fa::can_run(*variant_winner, plain, device))
        GTEST_SKIP() << "the two configs do not run on the test GPU";
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    tuning::save_atomically(file, {entry(device.name, 1024, *plain_winner, 1), variant});
    {
        const CacheEnvironment env(file);
        EXPECT_EQ(fa::choose_kernel(windowed, device), *variant_winner);
        EXPECT_EQ(fa::choose_kernel(plain, device), *plain_winner);
    }
    tuning::save_atomically(file, {entry(device.name, 1024, *plain_winner, 1)});
    {
        const CacheEnvironment env(file);
        EXPECT_EQ(fa::choose_kernel(windowed, device), *plain_winner);
    }
}

// Backward winners (`tune --backward [--deterministic]`) have keys of their own, marked by
// the "pass" field: written and read back, never displacing the forward's entry of the same
// problem nor one another.
TEST(TuningCache, BackwardEntriesHaveKeysOfTheirOwn) {
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const fa::ProblemShape problem = backward_problem();
    const tuning::Key forward = tuning::Key::of(h100, problem);
    const tuning::Key backward = tuning::Key::of_backward(h100, problem, false);
    const tuning::Key deterministic = tuning::Key::of_backward(h100, problem, true);
    EXPECT_EQ(forward.pass, tuning::Pass::forward);
    EXPECT_EQ(backward.pass, tuning::Pass::backward);
    EXPECT_EQ(deterministic.pass, tuning::Pass::backward_deterministic);
    EXPECT_NE(forward, backward);
    EXPECT_NE(backward, deterministic);
    EXPECT_NE(backward.to_string().find(", backward"), std::string::npos) << backward.to_string();
    EXPECT_NE(deterministic.to_string().find("backward-deterministic"), std::string::npos);
    EXPECT_EQ(forward.to_string().find("backward"), std::string::npos);
    // A window's or softcap's backward reads the plain problem's entry (its kernels are
    // instances of the same configs; `tune --backward` writes plain entries only).
    fa::ProblemShape windowed = problem;
    windowed.window_or_softcap = true;
    EXPECT_EQ(tuning::Key::of_backward(h100, windowed, false), backward);
    EXPECT_EQ(tuning::Key::of_backward(h100, windowed, true), deterministic);

    const tuning::Entry f = entry_of(forward, k_a);
    const tuning::Entry b = entry_of(backward, k_sm90_backward, k_sm80_backward);
    const tuning::Entry d = entry_of(deterministic, k_sm80_backward, k_sm90_ordered);
    const std::string text = tuning::to_json({f, b, d});
    const auto doc = nlohmann::json::parse(text);
    EXPECT_FALSE(doc["entries"][0].contains("pass")) << "forward entries are as they were";
    EXPECT_EQ(doc["entries"][1]["pass"], "backward");
    EXPECT_EQ(doc["entries"][2]["pass"], "backward-deterministic");
    const auto back = tuning::parse(text, "t");
    EXPECT_TRUE(back.warnings.empty()) << back.warnings.at(0);
    const std::vector<tuning::Entry> written = {f, b, d};
    ASSERT_EQ(back.entries.size(), written.size());
    for (std::size_t i = 0; i < written.size(); ++i) {
        const tuning::Entry& e = written[i];
        EXPECT_EQ(back.entries[i].key, e.key) << i;
        EXPECT_EQ(back.entries[i].config, e.config) << i;
        EXPECT_EQ(back.entries[i].runner_up, e.runner_up) << i;
        EXPECT_DOUBLE_EQ(back.entries[i].runner_up_tflops, e.runner_up_tflops) << i;
    }
    // "pass": "forward" is the forward's key, as no "pass" is.
    auto forward_doc = nlohmann::json::parse(tuning::to_json({f}));
    forward_doc["entries"][0]["pass"] = "forward";
    const auto named = tuning::parse(forward_doc.dump(), "t");
    ASSERT_EQ(named.entries.size(), 1u);
    EXPECT_EQ(named.entries[0].key, forward);
    // An update of one pass's key keeps the others' entries.
    const auto merged = tuning::merge({f, b, d}, {entry_of(backward, k_sm90_ordered)});
    ASSERT_EQ(merged.size(), 3u);
    const auto config_of = [&](const tuning::Key& key) {
        return std::find_if(merged.begin(), merged.end(),
                            [&](const tuning::Entry& e) { return e.key == key; })
            ->config;
    };
    EXPECT_EQ(config_of(forward), k_a);
    EXPECT_EQ(config_of(backward), k_sm90_ordered);
    EXPECT_EQ(config_of(deterministic), k_sm80_backward);
}

// The built-in table's d_head 64 and 128 rows: persistent CTAs of the dynamic schedule, causal
// or not, with GQA or without; dQ a step behind (lagdq) except for short walks (d_head 64: up to
// 512 keys; d_head 128: up to 1k, causal up to 2k), where the lag's last dQ after each walk costs
// more than it gains; stream-K's last round (streamk) for non-causal walks from 4k keys (d_head
// 64) or 8k (128); the deterministic kernel only when asked for. A row's length and causal
// limits hold for the backward as for the forward.
TEST(TuningCache, BackwardTableTakesThePersistentKernelAndOrderedOnlyWhenAsked) {
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const TempDir dir;
    const CacheEnvironment env(dir.path() / "tuning.json");  // no file: the table alone
    const auto built = [](const fa::KernelConfig& c) {
        return std::find(fa::configs().begin(), fa::configs().end(), c) != fa::configs().end();
    };
    for (const auto& [dtype, name] : {std::pair{fa::DType::BF16, std::string("BF16")},
                                      std::pair{fa::DType::FP16, std::string("FP16")}})
        for (const int d_head : {64, 128}) {
            fa::ProblemShape problem = backward_problem();
            problem.dtype = dtype;
            problem.d_head = d_head;
            const std::string tile =
                "(" + name + (d_head == 64 ? ", 64, 128, 128, 12): " : ", 128, 64, 128, 12): ");
            const auto ordered = fa::KernelConfig::parse(tile + "sm90+bwd+stages_2+ordered");
            const auto in_step =
                fa::KernelConfig::parse(tile + "sm90+bwd+stages_2+persistent+dynamic");
            const auto lagged =
                fa::KernelConfig::parse(tile + "sm90+bwd+stages_2+persistent+dynamic+lagdq");
            const auto stream_k = fa::KernelConfig::parse(
                tile + "sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq");
            if (!built(ordered) || !built(in_step) || !built(lagged) || !built(stream_k))
                GTEST_SKIP() << "this build lacks the sm90 " << name << " d_head " << d_head
                             << " backward kernels";
            for (const std::int64_t seq : {512, 1024, 2048, 4096, 8192}) {
                problem.seq_q = problem.seq_k = seq;
                for (const bool causal : {false, true}) {
                    problem.causal = causal;
                    const bool short_walks =
                        d_head == 64 ? seq <= 512 : seq <= 1024 || (causal && seq <= 2048);
                    // Stream-K splits only non-causal grids, and pays from 4k keys (d_head 64) or
                    // 8k (128).
                    const bool long_walks = !causal && seq >= (d_head == 64 ? 4096 : 8192);
                    const auto expected = short_walks ? in_step : long_walks ? stream_k : lagged;
                    problem.heads_kv = problem.heads;
                    EXPECT_EQ(fa::choose_backward_config(problem, h100), expected)
                        << d_head << " " << seq << causal;
                    EXPECT_EQ(fa::choose_backward_config(problem, h100, true), ordered)
                        << seq << causal;
                    problem.heads_kv = problem.heads / 4;
                    EXPECT_EQ(fa::choose_backward_config(problem, h100), expected)
                        << d_head << " " << seq << causal;
                    EXPECT_EQ(fa::choose_backward_config(problem, h100, true), ordered)
                        << seq << causal;
                }
            }
        }
}

// choose_backward_config reads the cache: a winner of this device, problem and pass that is
// built and runs there beats the built-in table; the deterministic choice reads only its own
// key; a winner this device cannot run, or a corrupt file, leaves the table's choice.
TEST(TuningCache, BackwardChoiceFollowsTheCache) {
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const fa::DeviceProperties a100 = fa::DeviceProperties::model("a100");
    const fa::ProblemShape problem = backward_problem();
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    std::optional<fa::KernelConfig> table, deterministic_table;
    {
        const CacheEnvironment env(file);  // no file: the table alone
        try {
            table = fa::choose_backward_config(problem, h100);
            deterministic_table = fa::choose_backward_config(problem, h100, true);
        } catch (const fa::Error&) {
            GTEST_SKIP() << "this build has no BF16 d_head 128 backward kernel for an H100";
        }
    }
    // A built config of the problem that runs on an H100 (a deterministic one if asked) and
    // is not the table's choice.
    const auto other_than = [&](const fa::KernelConfig& choice, bool deterministic) {
        for (const fa::KernelConfig& c : fa::configs()) {
            if (c.backward && c != choice && c.dtype == problem.dtype &&
                c.d_head == problem.d_head && (!deterministic || fa::is_deterministic(c)) &&
                fa::device_problem(c, h100).empty())
                return std::optional(c);
        }
        return std::optional<fa::KernelConfig>();
    };
    const auto winner = other_than(*table, false);
    const auto deterministic_winner = other_than(*deterministic_table, true);
    if (!winner || !deterministic_winner)
        GTEST_SKIP() << "this build has no second BF16 d_head 128 backward kernel for an H100";

    tuning::save_atomically(file,
                            {entry_of(tuning::Key::of_backward(h100, problem, false), *winner)});
    {
        const CacheEnvironment env(file);
        EXPECT_EQ(fa::choose_backward_config(problem, h100), *winner);
        EXPECT_EQ(fa::choose_backward_config(problem, h100, true), *deterministic_table)
            << "the deterministic choice read the other pass's key";
        fa::ProblemShape shorter = problem;
        shorter.seq_q = shorter.seq_k = problem.seq_q / 2;  // another sequence bucket
        EXPECT_EQ(fa::choose_backward_config(shorter, h100), *table);
    }
    tuning::save_atomically(
        file, {entry_of(tuning::Key::of_backward(h100, problem, false), *winner),
               entry_of(tuning::Key::of_backward(h100, problem, true), *deterministic_winner)});
    {
        const CacheEnvironment env(file);
        EXPECT_EQ(fa::choose_backward_config(problem, h100), *winner);
        EXPECT_EQ(fa::choose_backward_config(problem, h100, true), *deterministic_winner);
    }
    // An sm90 winner recorded for an A100 (a stale or copied cache): the A100's table.
    const auto sm90 = std::find_if(fa::configs().begin(), fa::configs().end(), [&](auto& c) {
        return c.backward && c.family == fa::Family::sm90 && c.dtype == problem.dtype &&
               c.d_head == problem.d_head;
    });
    if (sm90 != fa::configs().end()) {
        std::optional<fa::KernelConfig> a100_table;
        {
            const CacheEnvironment env(dir.path() / "absent.json");
            a100_table = fa::choose_backward_config(problem, a100);
        }
        tuning::save_atomically(file,
                                {entry_of(tuning::Key::of_backward(a100, problem, false), *sm90)});
        const CacheEnvironment env(file);
        EXPECT_EQ(fa::choose_backward_config(problem, a100), *a100_table);
    }
    std::ofstream(file) << "{ corrupt";
    {
        const CacheEnvironment env(file);
        testing::internal::CaptureStderr();
        EXPECT_EQ(fa::choose_backward_config(problem, h100), *table);
        EXPECT_EQ(fa::choose_backward_config(problem, h100, true), *deterministic_table);
        const std::string err = testing::internal::GetCapturedStderr();
        EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    }
}

// Hostile or inconsistent backward entries are malformed: skipped with one warning, the other
// entries kept.
TEST(TuningCache, MalformedBackwardEntriesAreSkipped) {
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const tuning::Key key = tuning::Key::of_backward(h100, backward_problem(), false);
    tuning::Key deterministic = key;
    deterministic.pass = tuning::Pass::backward_deterministic;
    auto doc = nlohmann::json::parse(
        tuning::to_json({entry_of(key, k_sm90_backward, k_sm80_backward),
                         entry_of(deterministic, k_sm80_backward, k_sm90_ordered)}));
    const nlohmann::json base = doc["entries"][0];
    const nlohmann::json base_deterministic = doc["entries"][1];
    const std::vector<std::pair<const char*, nlohmann::json>> bad = {
        {"pass", "sideways"},
        {"pass", "Backward"},
        {"pass", ""},
        {"pass", 2},
        {"pass", true},
        {"pass", nlohmann::json::array({"backward"})},
        {"pass", std::string(100'000, 'b')},
        {"config", k_a.to_string()},     // a forward config in a backward entry
        {"runner_up", k_b.to_string()},  // likewise
        {"window_or_softcap", true},     // the backward pass takes no variants
        {"paged", true},                 // nor pages
        {"rows_bucket", 4},              // nor split counts
        {"config", "(BF16, 128, 64, 64, 8): bwd+bogus"},
    };
    const auto expect_one_skipped = [&](const nlohmann::json& malformed, const std::string& what) {
        doc["entries"] = nlohmann::json::array({malformed, base});
        const auto r = tuning::parse(doc.dump(), "cache.json");
        EXPECT_FALSE(r.corrupt) << what;
        ASSERT_EQ(r.entries.size(), 1u) << what;
        EXPECT_EQ(r.entries[0].key, key) << what;
        ASSERT_EQ(r.warnings.size(), 1u) << what;
        EXPECT_NE(r.warnings[0].find("skipped 1"), std::string::npos) << r.warnings[0];
        EXPECT_LT(r.warnings[0].size(), 400u) << what;
    };
    for (const auto& [field, value] : bad) {
        nlohmann::json e = base;
        e[field] = value;
        expect_one_skipped(e, std::string(field) + " = " + value.dump().substr(0, 40));
    }
    // A deterministic entry whose config or runner-up is not deterministic.
    for (const char* field : {"config", "runner_up"}) {
        nlohmann::json e = base_deterministic;
        e[field] = k_sm90_backward.to_string();
        expect_one_skipped(e, std::string("deterministic ") + field);
    }
    // A forward entry (no "pass") naming a backward config.
    nlohmann::json forward = base;
    forward.erase("pass");
    expect_one_skipped(forward, "forward entry with a backward config");
    doc["entries"] = nlohmann::json::array({base, base_deterministic});
    const auto valid = tuning::parse(doc.dump(), "cache.json");
    EXPECT_EQ(valid.entries.size(), 2u);
    EXPECT_TRUE(valid.warnings.empty());
}

// The built-in table's d_head 256 entries on Hopper depend on the length: one stage of
// B_c 128 up to 512 keys, trimmed B_c 64 with overlap and ping-pong beyond (docs/PERF.md,
// 2026-11-26: both stage O apart from Q); causal, trimmed B_c 64 up to 8192 keys, then
// trimmed B_c 80 one CTA a tile (2026-11-26).
TEST(TuningCache, BuiltInTableChoosesByLengthAtHeadDim256) {
    const auto short_tile = fa::KernelConfig::parse(
        "(BF16, 256, 128, 128, 12): sm90+stages_1+pingpong+persistent+lazy");
    const auto long_tile = fa::KernelConfig::parse(
        "(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+persistent+lazy+trim");
    const auto short_causal = fa::KernelConfig::parse(
        "(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+lazy+trim");
    const auto long_causal = fa::KernelConfig::parse(
        "(BF16, 256, 128, 80, 12): sm90+stages_2+overlap+pingpong+lazy+trim");
    // A build of the whole release set (the default, ci) holds the table's kernels: there a
    // missing one means the table changed under this test, which must fail, not skip.
    const auto release = fa::space::named_set("release");
    const bool release_built = std::all_of(release.begin(), release.end(), fa::is_built);
    for (const auto& c : {short_tile, long_tile, short_causal, long_causal}) {
        ASSERT_TRUE(fa::is_built(c) || !release_built)
            << "the table no longer names " << c.to_string();
        if (!fa::is_built(c))
            GTEST_SKIP() << "this build lacks " << c.to_string();
    }
    const fa::DeviceProperties hopper{0, "Test GPU", 9, 0, 132, 232448};
    const auto params = [](std::int64_t seq_q, std::int64_t seq_k, bool causal = false) {
        const auto view = [](std::uintptr_t gib, std::int64_t seq) {
            return fa::TensorView::contiguous(reinterpret_cast<void*>(gib << 30), fa::DType::BF16,
                                              1, seq, 2, 256);
        };
        fa::ForwardParams p{view(1, seq_q), view(2, seq_k), view(3, seq_k), view(4, seq_q)};
        p.options.causal = causal;
        return fa::choice_problem(p);
    };
    EXPECT_EQ(fa::heuristic_config(params(512, 512), hopper), short_tile);
    EXPECT_EQ(fa::heuristic_config(params(513, 513), hopper), long_tile);
    EXPECT_EQ(fa::heuristic_config(params(2048, 2048), hopper), long_tile);
    EXPECT_EQ(fa::heuristic_config(params(128, 8192), hopper), long_tile);  // the keys count
    EXPECT_EQ(fa::heuristic_config(params(8192, 8192, true), hopper), short_causal);
    EXPECT_EQ(fa::heuristic_config(params(8193, 8193, true), hopper), long_causal);
}

// d_head 64 past 1024 keys takes stream-K's tile, except under short keys (at most 256, long
// queries: cross-attention), where the dynamic tile of shorter problems runs (H100, 2026-12-05).
TEST(TuningCache, BuiltInTableTakesShortKeysApartAtHeadDim64) {
    const auto up_to_1k = fa::KernelConfig::parse(
        "(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim");
    const auto streamk = fa::KernelConfig::parse(
        "(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+lazy+streamk");
    const auto release = fa::space::named_set("release");
    const bool release_built = std::all_of(release.begin(), release.end(), fa::is_built);
    for (const auto& c : {up_to_1k, streamk}) {
        ASSERT_TRUE(fa::is_built(c) || !release_built)
            << "the table no longer names " << c.to_string();
        if (!fa::is_built(c))
            GTEST_SKIP() << "this build lacks " << c.to_string();
    }
    const fa::DeviceProperties hopper{0, "Test GPU", 9, 0, 132, 232448};
    const auto params = [](std::int64_t seq_q, std::int64_t seq_k) {
        const auto view = [](std::uintptr_t gib, std::int64_t seq) {
            return fa::TensorView::contiguous(reinterpret_cast<void*>(gib << 30), fa::DType::BF16,
                                              2, seq, 16, 64);
        };
        return fa::choice_problem(
            fa::ForwardParams{view(1, seq_q), view(2, seq_k), view(3, seq_k), view(4, seq_q)});
    };
    EXPECT_EQ(fa::heuristic_config(params(1024, 1024), hopper), up_to_1k);
    EXPECT_EQ(fa::heuristic_config(params(4096, 4096), hopper), streamk);
    EXPECT_EQ(fa::heuristic_config(params(4096, 77), hopper), up_to_1k);
    EXPECT_EQ(fa::heuristic_config(params(4096, 256), hopper), up_to_1k);
    EXPECT_EQ(fa::heuristic_config(params(4096, 257), hopper), streamk);
    EXPECT_EQ(fa::heuristic_config(params(77, 4096), hopper), streamk);  // short queries: the keys'

    // A winner tuned on the square problem of the 4096 bucket (stream-K's tile here) does not
    // serve the short keys of that bucket, nor theirs the square problem.
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    const auto tuned = [&](const fa::ChoiceProblem& p, const fa::KernelConfig& c) {
        return entry_of(tuning::Key::of(hopper, p.shape), c);
    };
    tuning::save_atomically(file, {tuned(params(4096, 4096), streamk)});
    {
        const CacheEnvironment env(file);
        EXPECT_EQ(fa::find_kernel_for(params(4096, 4096), hopper), streamk);
        EXPECT_EQ(fa::find_kernel_for(params(4096, 77), hopper), up_to_1k);
    }
    tuning::save_atomically(file, {tuned(params(4096, 77), streamk)});
    {
        const CacheEnvironment env(file);
        EXPECT_EQ(fa::find_kernel_for(params(4096, 128), hopper), streamk);
        EXPECT_EQ(fa::find_kernel_for(params(1024, 1024), hopper), up_to_1k);
        EXPECT_EQ(fa::find_kernel_for(params(4096, 4096), hopper), streamk);  // the table's
    }
}

// A key's lengths: few queries over more keys, short keys under more queries, or neither; in
// the file as "lengths" (absent: general), in the key's text, and never on a split count's
// entry, whose rows bucket tells them.
TEST(TuningCache, KeysTellProportionsApart) {
    EXPECT_EQ(tuning::lengths_of(16, 4096), tuning::Lengths::few_queries);
    EXPECT_EQ(tuning::lengths_of(64, 65), tuning::Lengths::few_queries);
    EXPECT_EQ(tuning::lengths_of(64, 64), tuning::Lengths::general);
    EXPECT_EQ(tuning::lengths_of(65, 4096), tuning::Lengths::general);
    EXPECT_EQ(tuning::lengths_of(4096, 77), tuning::Lengths::short_keys);
    EXPECT_EQ(tuning::lengths_of(257, 256), tuning::Lengths::short_keys);
    EXPECT_EQ(tuning::lengths_of(256, 256), tuning::Lengths::general);
    EXPECT_EQ(tuning::lengths_of(4096, 257), tuning::Lengths::general);
    EXPECT_EQ(tuning::lengths_of(32, 16), tuning::Lengths::short_keys);

    for (const auto lengths : {tuning::Lengths::few_queries, tuning::Lengths::short_keys}) {
        tuning::Entry e = entry("GPU A", 4096, k_a, 1);
        e.key.lengths = lengths;
        const auto back = tuning::parse(tuning::to_json({e}), "t");
        ASSERT_EQ(back.entries.size(), 1u) << tuning::to_string(lengths);
        EXPECT_EQ(back.entries[0].key, e.key);
        EXPECT_NE(e.key.to_string().find(std::string(tuning::to_string(lengths))),
                  std::string::npos)
            << e.key.to_string();
        EXPECT_NE(e.key, entry("GPU A", 4096, k_a, 1).key);
    }
    auto doc = nlohmann::json::parse(tuning::to_json({entry("GPU A", 4096, k_a, 1)}));
    EXPECT_FALSE(doc["entries"][0].contains("lengths"));
    doc["entries"][0]["lengths"] = "few-queries";
    EXPECT_EQ(tuning::parse(doc.dump(), "t").entries.size(), 1u);
    for (const nlohmann::json& bad : {nlohmann::json("square"), nlohmann::json(1)}) {
        doc["entries"][0]["lengths"] = bad;
        const auto r = tuning::parse(doc.dump(), "cache.json");
        EXPECT_TRUE(r.entries.empty()) << bad.dump();
        EXPECT_EQ(r.warnings.size(), 1u) << bad.dump();
    }

    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    fa::ProblemShape decode = decode_b16();
    EXPECT_EQ(tuning::Key::of(h100, decode).lengths, tuning::Lengths::few_queries);
    tuning::Entry splits;
    splits.key = tuning::Key::of_splits(h100, decode, false);
    splits.tflops = 1;
    splits.splits = 4;
    EXPECT_EQ(splits.key.lengths, tuning::Lengths::general);
    doc = nlohmann::json::parse(tuning::to_json({splits}));
    ASSERT_EQ(tuning::parse(doc.dump(), "t").entries.size(), 1u);
    doc["entries"][0]["lengths"] = "few-queries";
    EXPECT_TRUE(tuning::parse(doc.dump(), "t").entries.empty());
}

// On a paged cache the table prefers rows whose key blocks and pages divide one another:
// d_head 128's B_c 80 on 64- or 256-row pages would copy 16-row runs, so the 128 x 128 rows
// after it run; 16-row pages divide 80 and keep it; d_head 256's rows at 8192 keys are B_c 64,
// which 64-row pages divide (heuristic_config()).
TEST(TuningCache, BuiltInTableCopiesWholePages) {
    const auto wide = fa::KernelConfig::parse(
        "(BF16, 128, 192, 80, 16): sm90+stages_3+overlap+pingpong+persistent+lazy+streamk");
    const auto wide_causal =
        fa::KernelConfig::parse("(BF16, 128, 192, 80, 16): sm90+stages_3+overlap+lazy+trim");
    const auto square = fa::KernelConfig::parse(
        "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+lazy");
    const auto square_causal = fa::KernelConfig::parse(
        "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic+lazy");
    // As above: a release build that lacks one means the table changed under this test.
    const auto release = fa::space::named_set("release");
    const bool release_built = std::all_of(release.begin(), release.end(), fa::is_built);
    for (const auto& c : {wide, wide_causal, square, square_causal}) {
        ASSERT_TRUE(fa::is_built(c) || !release_built)
            << "the table no longer names " << c.to_string();
        if (!fa::is_built(c))
            GTEST_SKIP() << "this build lacks " << c.to_string();
    }
    const fa::DeviceProperties hopper{0, "Test GPU", 9, 0, 132, 232448};
    const auto problem = [](int d, bool causal, std::int64_t page_size) {
        const auto view = [d](std::uintptr_t gib) {
            return fa::TensorView::contiguous(reinterpret_cast<void*>(gib << 30), fa::DType::BF16,
                                              1, 8192, 2, d);
        };
        fa::ChoiceProblem p =
            fa::choice_problem(fa::ForwardParams{view(1), view(2), view(3), view(4)});
        p.shape.causal = causal;
        p.page_size = page_size;
        return p;
    };
    for (const bool causal : {false, true}) {
        const auto& keep = causal ? wide_causal : wide;
        const auto& whole = causal ? square_causal : square;
        EXPECT_EQ(fa::heuristic_config(problem(128, causal, 0), hopper), keep);
        EXPECT_EQ(fa::heuristic_config(problem(128, causal, 16), hopper), keep);
        EXPECT_EQ(fa::heuristic_config(problem(128, causal, 64), hopper), whole);
        EXPECT_EQ(fa::heuristic_config(problem(128, causal, 256), hopper), whole);
        const auto d256 = fa::heuristic_config(problem(256, causal, 64), hopper);
        ASSERT_TRUE(d256.has_value());
        EXPECT_EQ(d256->family, fa::Family::sm90) << d256->to_string();
        EXPECT_EQ(d256->B_c, 64) << d256->to_string();
    }
    // DeepSeek's MLA causal past 2k keys: the 128 x 112 tile contiguous, the persistent dynamic
    // 128 x 128 on pages 112 keys do not divide (not the non-causal row, which runs causal at
    // about 60% of it).
    const auto mla_causal = fa::KernelConfig::parse(
        "(BF16, 192, 128, 112, 12): sm90+dv_128+stages_2+overlap+pingpong+lazy+trim");
    const auto mla_paged = fa::KernelConfig::parse(
        "(BF16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+dynamic+lazy");
    if (fa::is_built(mla_causal) && fa::is_built(mla_paged)) {
        const auto mla = [](std::int64_t page_size) {
            const auto view = [](std::uintptr_t gib, std::int64_t d) {
                return fa::TensorView::contiguous(reinterpret_cast<void*>(gib << 30),
                                                  fa::DType::BF16, 1, 4096, 2, d);
            };
            fa::ChoiceProblem p = fa::choice_problem(
                fa::ForwardParams{view(1, 192), view(2, 192), view(3, 128), view(4, 128)});
            p.shape.causal = true;
            p.page_size = page_size;
            return p;
        };
        EXPECT_EQ(fa::heuristic_config(mla(0), hopper), mla_causal);
        EXPECT_EQ(fa::heuristic_config(mla(64), hopper), mla_paged);
        EXPECT_EQ(fa::heuristic_config(mla(256), hopper), mla_paged);
    } else {
        EXPECT_FALSE(release_built) << "the table no longer names MLA's causal tiles";
    }
}

// Grouped-query problems of at most 64 queries take the table's pack_gqa rows (a tile a K/V
// head, its rows every query head's positions), which forward() prefers to the split-KV kernel
// above decoding's 16 rows a K/V head where the tiles fill the SMs; not where they cannot run (3
// query heads a K/V head, a window, sinks), nor past 64 queries or without groups. A tuned pack_gqa
// winner serves only the problems those rows would.
TEST(TuningCache, GroupedFewQueriesTakePackedTiles) {
    const auto packed =
        fa::KernelConfig::parse("(BF16, 128, 64, 128, 8): sm90+stages_3+overlap+qreg+lazy+packgqa");
    const auto release = fa::space::named_set("release");
    const bool release_built = std::all_of(release.begin(), release.end(), fa::is_built);
    ASSERT_TRUE(fa::is_built(packed) || !release_built)
        << "the table no longer names " << packed.to_string();
    if (!fa::is_built(packed))
        GTEST_SKIP() << "this build lacks " << packed.to_string();
    const fa::DeviceProperties hopper{0, "Test GPU", 9, 0, 132, 232448};
    const auto problem = [](std::int64_t seq_q, std::int64_t heads, std::int64_t heads_kv,
                            std::int64_t seq_k = 4096, std::int64_t batch = 16) {
        const auto view = [batch](std::uintptr_t gib, std::int64_t seq, std::int64_t h) {
            return fa::TensorView::contiguous(reinterpret_cast<void*>(gib << 30), fa::DType::BF16,
                                              batch, seq, h, 128);
        };
        fa::ForwardParams p{view(1, seq_q, heads), view(2, seq_k, heads_kv),
                            view(3, seq_k, heads_kv), view(4, seq_q, heads)};
        p.options.causal = true;
        return fa::choice_problem(p);
    };
    const auto chosen = [&](const fa::ChoiceProblem& p) {
        const auto c = fa::heuristic_config(p, hopper);
        return c.has_value() && *c == packed;
    };
    const TempDir dir;
    std::optional<CacheEnvironment> cache;
    cache.emplace(dir.path() / "none.json");  // no tuned entries
    EXPECT_TRUE(chosen(problem(16, 32, 8)));  // speculative decoding
    EXPECT_FALSE(fa::runs_split_kv(problem(16, 32, 8), hopper));
    // Batch 4: 32 tiles a K/V head's keys each would leave most SMs idle; split-KV runs.
    EXPECT_TRUE(chosen(problem(16, 32, 8, 4096, 4)));
    EXPECT_TRUE(fa::runs_split_kv(problem(16, 32, 8, 4096, 4), hopper));
    EXPECT_TRUE(chosen(problem(64, 64, 1, 77)));                // short keys
    EXPECT_TRUE(chosen(problem(1, 32, 8)));                     // decoding: the table's row ...
    EXPECT_TRUE(fa::runs_split_kv(problem(1, 32, 8), hopper));  // ... but split-KV runs
    EXPECT_TRUE(fa::runs_split_kv(problem(2, 64, 8), hopper));  // 16 rows a K/V head
    EXPECT_TRUE(fa::runs_split_kv(problem(1, 32, 1, 4096, 128), hopper));  // one position
    EXPECT_FALSE(chosen(problem(65, 32, 8)));   // a head's queries fill tiles
    EXPECT_FALSE(chosen(problem(16, 32, 32)));  // nothing to pack
    EXPECT_FALSE(chosen(problem(16, 24, 8)));   // 3 heads a K/V head
    EXPECT_TRUE(fa::runs_split_kv(problem(16, 24, 8), hopper));
    fa::ChoiceProblem sinks = problem(16, 32, 8);
    sinks.variants = true;
    EXPECT_FALSE(chosen(sinks));
    EXPECT_TRUE(fa::runs_split_kv(sinks, hopper));
    fa::ChoiceProblem window = problem(16, 32, 8);
    window.shape.window_or_softcap = true;
    EXPECT_FALSE(chosen(window));
    // A tuned pack_gqa winner of the 4096-key bucket: taken by speculative decoding, not by a
    // square problem of that bucket.
    const auto file = dir.path() / "tuning.json";
    tuning::save_atomically(file,
                            {entry_of(tuning::Key::of(hopper, problem(16, 32, 8).shape), packed)});
    cache.reset();
    cache.emplace(file);
    EXPECT_EQ(fa::find_kernel_for(problem(16, 32, 8), hopper), packed);
    const auto square = fa::find_kernel_for(problem(4096, 32, 8), hopper);
    ASSERT_TRUE(square.has_value());
    EXPECT_FALSE(square->sm90.pack_gqa) << square->to_string();
    // A winner tuned on the square problem of that bucket neither serves speculative decoding
    // nor sends it to the split-KV kernel (the table's packed tile runs).
    tuning::save_atomically(
        file, {entry_of(tuning::Key::of(hopper, problem(4096, 32, 8).shape), *square)});
    cache.reset();
    cache.emplace(file);
    EXPECT_EQ(fa::find_kernel_for(problem(4096, 32, 8), hopper), square);
    EXPECT_EQ(fa::find_kernel_for(problem(16, 32, 8), hopper), packed);
    EXPECT_FALSE(fa::runs_split_kv(problem(16, 32, 8), hopper));
}

// Tensors TMA cannot address (a broadcast K/V, a stride of 2^40 bytes) run on the sm80
// family on Hopper instead of failing in cuTensorMapEncodeTiled.
TEST(TuningCache, TensorsBeyondTmaChooseTheSm80Family) {
    if (!fa::testing::holds_release_set())
        GTEST_SKIP()
            << "both families' kernels of every head dim (the release set); this build's set is "
            << fa::tools::built_kernel_set();
    const fa::DeviceProperties hopper = fa::DeviceProperties::model("h100");
    for (const auto dtype : {fa::DType::FP16, fa::DType::BF16}) {
        for (const int d : {64, 128, 256}) {
            const auto view = [&](std::uintptr_t gib) {
                return fa::TensorView::contiguous(reinterpret_cast<void*>(gib << 41), dtype, 2,
                                                  1024, 4, d);
            };
            fa::ForwardParams p{view(1), view(2), view(3), view(4)};
            const auto usual = fa::heuristic_config(fa::choice_problem(p), hopper);
            ASSERT_TRUE(usual.has_value());
            EXPECT_EQ(usual->family, fa::Family::sm90) << usual->to_string();
            p.k.stride[0] = std::int64_t{1} << 39;
            const auto fallback = fa::heuristic_config(fa::choice_problem(p), hopper);
            ASSERT_TRUE(fallback.has_value());
            EXPECT_EQ(fallback->family, fa::Family::sm80) << fallback->to_string();
        }
    }
}

// E4M3 tensors TMA cannot copy have no kernel (the sm80 family has no FP8 ones): the error says
// the layout is why, whatever head dims the build has.
TEST(TuningCache, Fp8TensorsBeyondTmaNameTheirLayout) {
    const fa::DeviceProperties hopper = fa::DeviceProperties::model("h100");
    for (const int d : {64, 128}) {
        fa::ChoiceProblem p{
            .shape = {.dtype = fa::DType::E4M3, .d_head = d, .seq_q = 1024, .seq_k = 1024},
            .tma_addressable = false};
        try {
            fa::choose_kernel(p, hopper);
            ADD_FAILURE() << "no error at d_head " << d;
        } catch (const fa::Error& e) {
            EXPECT_EQ(e.code(), fa::ErrorCode::unsupported);
            EXPECT_NE(std::string(e.what()).find("E4M3 tensors need strides TMA can copy"),
                      std::string::npos)
                << e.what();
        }
    }
}
