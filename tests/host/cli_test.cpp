#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app.hpp"
#include "commands.hpp"
#include "flash_attention/flash_attention.hpp"
#include "options.hpp"
#include "report.hpp"
#include "support/built_configs.hpp"
#include "sweep.hpp"

namespace fa = flash_attention;
namespace cli = flash_attention::cli;

namespace {

struct Output {
    int code;
    std::string out, err;
};

// Runs the program in-process; returns the exit code and what it wrote.
Output run_program(std::vector<std::string> args) {
    args.insert(args.begin(), "flash_attention");
    std::vector<char*> argv;
    for (auto& a : args)
        argv.push_back(a.data());
    testing::internal::CaptureStderr();
    testing::internal::CaptureStdout();
    const int code = cli::run_cli(static_cast<int>(argv.size()), argv.data());
    std::string out = testing::internal::GetCapturedStdout();
    return {code, std::move(out), testing::internal::GetCapturedStderr()};
}

// A fresh temporary folder, removed afterwards.
class TempDir {
  public:
    TempDir()
        : path_(std::filesystem::temp_directory_path() /
                ("fa_cli_test_" + std::to_string(getpid()) + "_" + std::to_string(counter_++))) {
        std::filesystem::create_directories(path_);
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    const std::filesystem::path& path() const { return path_; }
    // The names in the folder, recursively.
    std::vector<std::string> contents() const {
        std::vector<std::string> names;
        for (const auto& e : std::filesystem::recursive_directory_iterator(path_))
            names.push_back(std::filesystem::relative(e.path(), path_).string());
        return names;
    }

  private:
    static inline int counter_ = 0;
    std::filesystem::path path_;
};

std::string file_text(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::pair<int, std::string> run(std::vector<std::string> args) {
    const Output o = run_program(std::move(args));
    return {o.code, o.err};
}

void expect_usage_error(const std::vector<std::string>& args, const std::string& names) {
    const auto [code, err] = run(args);
    EXPECT_EQ(code, 2) << err;
    EXPECT_NE(err.find(names), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "not one line: " << err;
}

// Fields of a CSV line whose quoted fields may hold commas.
std::size_t csv_fields(const std::string& line) {
    std::size_t fields = 1;
    bool quoted = false;
    for (const char c : line) {
        if (c == '"')
            quoted = !quoted;
        if (c == ',' && !quoted)
            ++fields;
    }
    return fields;
}

// A dense bf16 d_head 128 shape of 16 heads.
cli::Shape dense_shape(int batch, int seq) {
    return {.dtype = fa::DType::BF16,
            .d_head = 128,
            .batch = batch,
            .heads = 16,
            .seq_q = seq,
            .seq_k = seq,
            .heads_kv = 16,
            .causal = false,
            .scale = std::nullopt};
}

std::vector<cli::Measurement> sample() {
    const auto c = fa::KernelConfig::parse(
        "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+opt_softmax");
    std::vector<cli::Measurement> v;
    for (const int seq : {512, 1024, 2048}) {
        v.push_back({c.to_string(),
                     {c, 0},
                     dense_shape(16384 / seq, seq),
                     0.1 * seq / 512,
                     0.09,
                     0.11,
                     20,
                     {}});
    }
    v.push_back({"automatic choice (BF16, d_head 128)",
                 {c, 0},
                 dense_shape(8, 2048),
                 0.5,
                 0.5,
                 0.6,
                 20,
                 {}});
    return v;
}

}  // namespace

TEST(Cli, ListParsing) {
    EXPECT_EQ(cli::parse_int_list("512,1024", "--seq"), (std::vector<int>{512, 1024}));
    EXPECT_THROW(cli::parse_int_list("512,,1024", "--seq"), cli::UsageError);
    EXPECT_THROW(cli::parse_int_list("-4", "--seq"), cli::UsageError);
    EXPECT_THROW(cli::parse_int_list("4k", "--seq"), cli::UsageError);
    EXPECT_THROW(cli::parse_int_list("", "--seq"), cli::UsageError);
    EXPECT_EQ(cli::parse_dtype_list("bf16,fp16", "--dtype"),
              (std::vector<fa::DType>{fa::DType::BF16, fa::DType::FP16}));
    EXPECT_THROW(cli::parse_dtype_list("fp32", "--dtype"), cli::UsageError);
}

TEST(Cli, BadArgumentsExitWithTwoAndAOneLineMessage) {
    expect_usage_error({"bench", "--seq", "512,x"}, "--seq");
    expect_usage_error({"bench", "--set", "fastest"}, "\"fastest\"");
    expect_usage_error({"bench", "--config", "(FP16, 128, 64, 64, 4): asyn+load_0_0_0_tiles"},
                       "\"asyn\"");
    expect_usage_error({"bench", "--format", "xml"}, "--format");
    expect_usage_error({"bench", "--frobnicate"}, "--frobnicate");
    expect_usage_error({"tune", "--runs", "0"}, "--runs");
    expect_usage_error({"bench", "--rounds", "-1"}, "--rounds");
    expect_usage_error({"bench", "--warmup-ms", "-5"}, "--warmup-ms");
    expect_usage_error({"run", "--batch", "abc"}, "--batch");
    expect_usage_error({"run", "--config", "(FP16, 128, 64, 16, 4): async+load_0_1_1_tiles"},
                       "--config");
    expect_usage_error({"run", "--dtype", "fp32"}, "--dtype");
    expect_usage_error({"progression", "--family", "sm70"}, "--family");
    expect_usage_error({"nosuchcommand"}, "nosuchcommand");
    expect_usage_error({}, "A subcommand is required");
    expect_usage_error({"-x", "run"}, "\"-x\" before the command");
    expect_usage_error({"--seq", "512"}, "\"--seq\" before the command");
}

// The serving entry points' options (issue 14): contradictions are usage errors before
// any GPU work, naming the option.
TEST(Cli, ServingOptionsThatContradictAreUsageErrors) {
    expect_usage_error({"run", "--kvcache", "--varlen"}, "--kvcache");
    expect_usage_error({"bench", "--page-size", "24"}, "--page-size");
    expect_usage_error({"run", "--page-size", "8"}, "--page-size");
    expect_usage_error({"bench", "--varlen", "--page-size", "16"}, "--page-size");
    expect_usage_error({"run", "--varlen", "--seq-k", "5"}, "--seq-k");
    expect_usage_error({"bench", "--splits", "4"}, "--splits");
    expect_usage_error({"run", "--splits", "4"}, "--splits");
    expect_usage_error({"run", "--kvcache", "--splits", "0"}, "--splits");
    expect_usage_error({"bench", "--kvcache", "--splits", "1,x"}, "--splits");
    expect_usage_error({"tune", "--kvcache", "--set", "tune"}, "--set");
    expect_usage_error({"tune", "--splits", "2,4"}, "--splits");
    if (const fa::KernelConfig* c = fa::testing::any_forward_config()) {
        const std::string built = c->to_string();
        expect_usage_error({"run", "--kvcache", "--config", built}, "--config");
        expect_usage_error({"bench", "--varlen", "--config", built}, "--config");
        expect_usage_error({"tune", "--kvcache", "--config", built}, "--config");
    }
}

// FLOPs and K/V bytes of the serving shapes: the pairs each row sees, as
// bench/serving.py counts them.
TEST(Cli, ServingShapesCountWhatEachRowSees) {
    cli::Shape decode = dense_shape(16, 1);
    decode.seq_k = 8192;
    decode.heads = 32;
    decode.heads_kv = 8;
    decode.api = cli::Api::kvcache;
    EXPECT_DOUBLE_EQ(decode.flop(), 4.0 * 16 * 32 * 8192 * 128);
    EXPECT_DOUBLE_EQ(decode.kv_bytes(), 2.0 * 16 * 8192 * 8 * 128 * 2);
    cli::Shape spec = decode;
    spec.seq_q = 16;
    spec.seq_k = 20;
    spec.causal = true;  // row i sees 20 - 16 + i + 1 keys
    EXPECT_DOUBLE_EQ(spec.flop(), 4.0 * 16 * 32 * 128 * (5 + 20) * 16 / 2);
    cli::Shape varlen = dense_shape(64, 8192);
    varlen.api = cli::Api::varlen;
    const std::vector<int> lengths = cli::varlen_lengths(varlen);
    ASSERT_EQ(lengths.size(), 64u);
    EXPECT_EQ(lengths, cli::varlen_lengths(varlen));  // the same every time
    double pairs = 0, keys = 0;
    for (const int n : lengths) {
        EXPECT_GE(n, 1);
        EXPECT_LE(n, 8192);
        pairs += double(n) * n;
        keys += n;
    }
    EXPECT_DOUBLE_EQ(varlen.flop(), 4.0 * 16 * 128 * pairs);
    EXPECT_DOUBLE_EQ(varlen.kv_bytes(), 2.0 * keys * 16 * 128 * 2);
}

// --window, --softcap and --sinks (issue 15): malformed values exit 2 before anything runs,
// and TFLOP/s counts the pairs a window leaves.
TEST(Cli, VariantOptions) {
    expect_usage_error({"run", "--window", "5"}, "--window");
    expect_usage_error({"bench", "--window", "5,x"}, "--window");
    expect_usage_error({"bench", "--window", "1,2,3"}, "--window");
    expect_usage_error({"run", "--window", "-2,0"}, "--window");
    expect_usage_error({"bench", "--softcap", "-1"}, "--softcap");
    cli::Shape windowed = dense_shape(1, 100);
    windowed.causal = true;
    windowed.window_left = 9;  // row i sees keys max(0, i - 9) .. i: min(i + 1, 10) of them
    double pairs = 0;
    for (int i = 0; i < 100; ++i)
        pairs += std::min(i + 1, 10);
    EXPECT_DOUBLE_EQ(windowed.flop(), 4.0 * windowed.heads * windowed.d_head * pairs);
    EXPECT_TRUE(windowed.problem().window_or_softcap);
    EXPECT_FALSE(dense_shape(1, 100).problem().window_or_softcap);
}

// nan and 1e308 were accepted as --warmup-ms, 2^31 - 1 as --runs (an overflow), and range
// messages printed 309-digit numbers.
TEST(Cli, NumbersAreBoundedByReadableLimits) {
    expect_usage_error({"bench", "--warmup-ms", "nan"},
                       "--warmup-ms: expected a number from 0 to 60000, got \"nan\"");
    expect_usage_error({"bench", "--warmup-ms", "1e308"}, "got \"1e308\"");
    expect_usage_error({"bench", "--warmup-ms", "inf"}, "--warmup-ms");
    expect_usage_error({"bench", "--runs", "2147483647"},
                       "--runs: expected an integer from 1 to 10000");
    expect_usage_error({"bench", "--warmup", "99999999999999999999"}, "--warmup");
    expect_usage_error({"bench", "--seq", "2147483647"}, "--seq");
    expect_usage_error({"bench", "--batch", "70000"},
                       "--batch: expected an integer from 1 to 65535");
    expect_usage_error({"run", "--seq", "1073741825"},
                       "--seq: expected an integer from 1 to 1073741824");
    expect_usage_error({"run", "--repeat", "0"}, "--repeat");
    expect_usage_error({"run", "--seed", "abc"}, "--seed");
    expect_usage_error({"run", "--seed", "-1"}, "--seed");
    expect_usage_error({"run", "--seed", "9223372036854775808"}, "--seed");
    expect_usage_error({"choose", "--heads-kv", "0"}, "--heads-kv");
    // The library's refusal of the dtype (the backward takes 16-bit inputs) names the option.
    expect_usage_error({"choose", "--device", "h100", "--dtype", "e4m3", "--backward"},
                       ": --dtype:");
    // FP8 runs on Hopper only: a decoding shape on an A100 is refused too, as the library's
    // forward_kvcache refuses it (not named the split-KV kernel's).
    expect_usage_error(
        {"choose", "--device", "a100", "--dtype", "e4m3", "--seq", "1", "--seq-k", "8192"},
        ": --dtype: expected FP16 or BF16 on this GPU");
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"bench", "--warmup-ms", "1e308"}, {"bench", "--runs", "2147483647"}}) {
        const auto [code, err] = run(args);
        EXPECT_LT(err.size(), 200u) << err;
    }
    // Leading zeros are decimal, as in the lists: CLI11 alone read "0100" as octal 64, a built
    // head dim, and "09" not at all.
    expect_usage_error({"choose", "--device", "a100", "--d-head", "0100"}, "--d-head");
    for (const auto& [option, padded, plain] :
         {std::tuple{"--d-head", "0128", "128"}, {"--seq", "09", "9"}, {"--heads", "020", "20"}}) {
        const Output a = run_program({"choose", "--device", "h100", option, padded});
        const Output b = run_program({"choose", "--device", "h100", option, plain});
        EXPECT_EQ(a.code, b.code) << option << " " << padded << ": " << a.err;
        EXPECT_EQ(a.out, b.out) << option << " " << padded;
        EXPECT_EQ(a.err, b.err) << option << " " << padded;
    }
}

// forward() sends decoding shapes to the split-KV kernel: `choose` says so (it named the
// dense config that never ran), on a device model without a GPU.
TEST(Cli, ChooseNamesTheSplitKvKernelForDecodingShapes) {
    const Output o = run_program({"choose", "--device", "h100", "--seq", "1", "--seq-k", "8192",
                                  "--heads", "32", "--heads-kv", "8"});
    EXPECT_EQ(o.code, 0) << o.out;
    EXPECT_EQ(o.out.rfind("split-KV (PackGQA), ", 0), 0u) << o.out;
    const fa::KernelConfig* built = fa::testing::any_forward_config();
    if (built == nullptr || built->dtype == fa::DType::E4M3)
        return;  // the dense choice needs a 16-bit forward kernel: one of the build's
    const Output dense = run_program({"choose", "--device", "h100", "--seq", "4096", "--dtype",
                                      built->dtype == fa::DType::FP16 ? "fp16" : "bf16", "--d-head",
                                      std::to_string(built->d_head)});
    EXPECT_EQ(dense.code, 0) << dense.err;
    EXPECT_NO_THROW(fa::KernelConfig::parse(dense.out.substr(0, dense.out.find('\n'))));
}

// Speculative decoding (16 positions x 4 heads a K/V head, batch 16) runs on packed GQA tiles
// where they are built: `choose` names the packgqa config, and a sweep leaves it out of shapes it
// cannot run (3 query heads a K/V head), a usage error when nothing is left.
TEST(Cli, SpeculativeDecodingTakesPackedTiles) {
    const auto packed =
        fa::KernelConfig::parse("(BF16, 128, 64, 128, 8): sm90+stages_3+overlap+qreg+lazy+packgqa");
    if (!fa::is_built(packed))
        GTEST_SKIP() << "this build lacks " << packed.to_string();
    const Output o =
        run_program({"choose", "--device", "h100", "--dtype", "bf16", "--seq", "16", "--seq-k",
                     "4096", "--batch", "16", "--heads", "32", "--heads-kv", "8", "--causal"});
    EXPECT_EQ(o.code, 0) << o.err;
    EXPECT_EQ(o.out.substr(0, o.out.find('\n')), packed.to_string()) << o.out;
    expect_usage_error({"bench", "--config", packed.to_string(), "--seq", "16", "--seq-k", "4096",
                        "--heads", "6", "--heads-kv", "2"},
                       "--config/--set: expected a config that runs these shapes");
}

// The command line's checks come before its notes, so that a refused argument's message is the
// one line on stderr; a serving sweep names the set or config it refuses; variants are left to
// the set's 16-bit configs when it holds FP8 ones.
TEST(Cli, RefusalsAreOneLineAndNameTheirOption) {
    expect_usage_error({"tune", "--set", "tune", "--seq", "0"}, "--seq");
    expect_usage_error(
        {"bench", "--set", "tune", "--window", "16,0", "--svg", "/nonexistent/x.svg"}, "--svg");
    expect_usage_error({"bench", "--kvcache", "--set", "release"}, "--set: expected none");
    const auto fp8 = fa::KernelConfig::parse("(E4M3, 128, 128, 128, 12): sm90+stages_2");
    if (!fa::is_built(fp8))
        return;
    expect_usage_error({"bench", "--config", fp8.to_string(), "--sinks"},
                       "--config/--set: expected a config that runs");
    // An FP8 config and a 16-bit one with a softcap: the FP8 one left out, the other accepted
    // (without a GPU the command then exits 1 for want of one, not 2 for the arguments).
    if (fa::device_count() > 0)
        return;
    for (const fa::KernelConfig& c : fa::configs()) {
        if (!c.backward && c.dtype != fa::DType::E4M3 && !c.sm90.pack_gqa) {
            const Output o = run_program({"bench", "--config", fp8.to_string(), "--config",
                                          c.to_string(), "--softcap", "30"});
            EXPECT_EQ(o.code, 1) << o.err;
            break;
        }
    }
}

TEST(Cli, Version) {
    const Output o = run_program({"--version"});
    EXPECT_EQ(o.code, 0);
    EXPECT_EQ(o.out, "flash_attention " + std::string(fa::version()) + "\n");
}

// On an H100, causal problems of every (dtype, d_head) and length never take the static
// persistent stride (causal tiles differ in length, and the stride left one CTA up to
// 1.7x the mean work): they run the dynamic schedule or one CTA per tile. Non-causal ones
// are persistent, and take the counter only with trimmed blocks (a head's partial last tile
// is then cheaper than the others); equal-length tiles gain nothing from it.
TEST(Cli, ChooseKeepsCausalProblemsOffTheStaticStrideOnHopper) {
    if (!fa::testing::holds_release_set())
        GTEST_SKIP() << "the release set's choice; this build's set is "
                     << fa::tools::built_kernel_set();
    for (const char* dtype : {"fp16", "bf16"}) {
        for (const int d : {64, 128, 256}) {
            for (const char* seq : {"512", "4096", "16384"}) {
                for (const bool causal : {false, true}) {
                    std::vector<std::string> args{"choose",          "--device", "h100",
                                                  "--dtype",         dtype,      "--d-head",
                                                  std::to_string(d), "--seq",    seq};
                    if (causal)
                        args.push_back("--causal");
                    const Output o = run_program(args);
                    ASSERT_EQ(o.code, 0) << o.err;
                    const auto c = fa::KernelConfig::parse(o.out.substr(0, o.out.find('\n')));
                    const bool static_stride = c.sm90.persistent && !c.sm90.dynamic_schedule;
                    if (causal)
                        EXPECT_FALSE(static_stride) << o.out;
                    else
                        EXPECT_TRUE(static_stride || (c.sm90.persistent && c.sm90.trim_blocks))
                            << o.out;
                    EXPECT_TRUE(fa::is_built(c)) << c.to_string();
                }
            }
        }
    }
}

// The automatic choice for every (dtype, d_head) on a device model: an sm90 kernel of this
// build on an H100, an sm80 one on an A100 (the default build holds both).
TEST(Cli, ChooseNamesABuiltKernelOfTheDevicesFamily) {
    if (!fa::testing::holds_release_set())
        GTEST_SKIP() << "the release set's choice; this build's set is "
                     << fa::tools::built_kernel_set();
    for (const auto& [device, family] :
         {std::pair{"h100", fa::Family::sm90}, {"a100", fa::Family::sm80}}) {
        for (const char* dtype : {"fp16", "bf16"}) {
            for (const int d : {64, 128, 256}) {
                for (const int seq : {512, 4096, 16384}) {
                    const Output o =
                        run_program({"choose", "--device", device, "--dtype", dtype, "--d-head",
                                     std::to_string(d), "--seq", std::to_string(seq)});
                    ASSERT_EQ(o.code, 0) << o.err;
                    const auto c = fa::KernelConfig::parse(o.out.substr(0, o.out.find('\n')));
                    EXPECT_EQ(c.family, family) << device << " " << o.out;
                    EXPECT_TRUE(fa::is_built(c)) << c.to_string();
                    EXPECT_EQ(c.d_head, d);
                    EXPECT_EQ(std::string(fa::to_string(c.dtype)),
                              dtype == std::string("fp16") ? "FP16" : "BF16");
                }
            }
        }
    }
    expect_usage_error({"choose", "--device", "v100"}, "--device");
    expect_usage_error({"choose", "--device", "h100", "--d-head", "80"},
                       "--d-head: expected 64, 96, 128, 192 or 256, got 80");
    expect_usage_error({"choose", "--device", "h100", "--heads", "6", "--heads-kv", "4"}, "heads");
}

// A failed --svg write exited 0, after the whole run; now the path is checked first.
TEST(Cli, OutputFilesAreCheckedBeforeTheRun) {
    expect_usage_error({"bench", "--svg", "/nonexistent-folder/chart.svg"},
                       "--svg: expected a file that can be written");
    // Judged without creating anything: a path under a file. (A folder where nothing can be
    // created, such as /proc for root, only shows when trying, after the GPU check.)
    if (const fa::KernelConfig* c = fa::testing::any_forward_config())
        expect_usage_error({"tune", "--config", c->to_string(), "--cache", "/dev/null/tuning.json"},
                           "--cache");
}

TEST(Cli, CtrlCExitsWith130) {
    cli::SweepResult result;
    EXPECT_EQ(result.exit_code(), 0);
    result.interrupted = true;
    EXPECT_EQ(result.exit_code(), 130);
}

TEST(Cli, ShapesNoBuiltKernelSupportsAreUsageErrors) {
    if (fa::testing::any_forward_config() == nullptr)
        GTEST_SKIP() << "this build has no 16-bit forward config";
    const auto& c = *fa::testing::any_forward_config();
    expect_usage_error(
        {"bench", "--config", c.to_string(), "--d-head", std::to_string(c.d_head + 32)},
        "--d-head");
}

TEST(Cli, CsvHasOneLinePerMeasurement) {
    const auto results = sample();
    std::istringstream csv(cli::format_report(results, "csv", "Test GPU"));
    std::string line;
    std::getline(csv, line);
    EXPECT_EQ(line,
              "config,kernel,api,dtype,d_head,batch,heads,heads_kv,seq_q,seq_k,causal,median_ms,"
              "min_ms,max_ms,runs,tflops,kv_tbps");
    int rows = 0;
    while (std::getline(csv, line)) {
        ++rows;
        EXPECT_EQ(csv_fields(line), 17u) << line;
    }
    EXPECT_EQ(rows, 4);
}

TEST(Cli, JsonHoldsMeasurementsAndHarmonicMeans) {
    const auto results = sample();
    const auto j = nlohmann::json::parse(cli::format_report(results, "json", "Test GPU"));
    EXPECT_EQ(j["device"], "Test GPU");
    ASSERT_EQ(j["measurements"].size(), 4u);
    EXPECT_EQ(j["measurements"][0]["seq_q"], 512);
    EXPECT_NEAR(j["measurements"][0]["tflops"].get<double>(), results[0].tflops(), 1e-9);
    EXPECT_EQ(j["harmonic_mean_tflops"].size(), 2u);
    EXPECT_NEAR(j["harmonic_mean_tflops"]["automatic choice (BF16, d_head 128)"].get<double>(),
                results[3].tflops(), 1e-9);
}

TEST(Cli, HarmonicMean) {
    auto results = sample();
    results.pop_back();
    double inverse = 0;
    for (const auto& m : results)
        inverse += 1 / m.tflops();
    EXPECT_NEAR(cli::harmonic_mean_tflops(results), 3 / inverse, 1e-9);
}

TEST(Cli, TableAndChart) {
    const std::string table = cli::format_report(sample(), "table", "Test GPU");
    EXPECT_NE(table.find("# device: Test GPU"), std::string::npos);
    EXPECT_NE(table.find("harmonic mean"), std::string::npos);
    const std::string svg = cli::svg_chart(sample(), "chart");
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    int lines = 0;
    for (auto pos = svg.find("<polyline"); pos != std::string::npos;
         pos = svg.find("<polyline", pos + 1))
        ++lines;
    EXPECT_EQ(lines, 2);
}

// The polyline was cut at a 512-byte buffer (about 37 lengths): the chart lost its points.
TEST(Cli, ChartKeepsEveryPoint) {
    const auto c = fa::KernelConfig::parse(
        "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+opt_softmax");
    std::vector<cli::Measurement> many;
    for (int seq = 128; seq < 128 + 200 * 64; seq += 64) {
        many.push_back({c.to_string(), {c, 0}, dense_shape(1, seq), 0.1, 0.1, 0.1, 20, {}});
    }
    const std::string svg = cli::svg_chart(many, std::string(2000, 't'));
    const auto start = svg.find("points=\"");
    ASSERT_NE(start, std::string::npos);
    const std::string points = svg.substr(start + 8, svg.find('"', start + 8) - start - 8);
    EXPECT_EQ(std::count(points.begin(), points.end(), ','), 200);
    EXPECT_NE(svg.find(std::string(2000, 't')), std::string::npos);
    EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

// An empty value was taken for an option not given: `run --config ""` ran the automatic
// choice, `bench --svg ""` wrote no chart, `tune --cache ""` wrote the default cache.
TEST(Cli, EmptyValuesAreUsageErrors) {
    const std::vector<std::vector<std::string>> commands = {
        {"run", "--config"},         {"run", "--dtype"},          {"run", "--window"},
        {"bench", "--svg"},          {"bench", "--config"},       {"bench", "--set"},
        {"bench", "--splits"},       {"bench", "--seq"},          {"bench", "--d-head"},
        {"bench", "--dtype"},        {"bench", "--window"},       {"bench", "--format"},
        {"tune", "--cache"},         {"tune", "--config"},        {"tune", "--set"},
        {"tune", "--splits"},        {"tune", "--d-head"},        {"tune", "--dtype"},
        {"progression", "--d-head"}, {"progression", "--family"}, {"list", "--set"},
        {"choose", "--device"},      {"choose", "--dtype"}};
    for (std::vector<std::string> args : commands) {
        const std::string option = args[1];
        args.push_back("");
        const auto [code, err] = run(args);
        EXPECT_EQ(code, 2) << args[0] << " " << option << ": " << err;
        EXPECT_EQ(err.rfind("flash_attention: " + option + ": expected ", 0), 0u)
            << args[0] << " " << option << ": " << err;
        EXPECT_NE(err.find("got \"\""), std::string::npos)
            << args[0] << " " << option << ": " << err;
        EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    }
}

// Text the user gave was echoed raw: a newline in --config made a message of two lines.
TEST(Cli, MessagesEscapeControlCharacters) {
    expect_usage_error({"run", "--config", "(BF16, 64, 128, 64, 4): asy\nnc+load_1_1_1_tiles"},
                       "asy\\nnc");
    expect_usage_error({"bench", "--dtype", "bf16,fp\n32"}, "fp\\n32");
    expect_usage_error({"bench", "--seq", "512\r"}, "512\\r");
    expect_usage_error({"list", "--set", "tu\tne"}, "tu\\tne");
    expect_usage_error({"tune\n"}, "tune\\n");
}

// --svg emptied an existing file before the GPU check, so a run that failed destroyed it.
TEST(Cli, AFailedBenchLeavesAnExistingChartUntouched) {
    if (fa::device_count() > 0)
        GTEST_SKIP() << "a run that fails before measuring needs a machine without a GPU";
    const TempDir dir;
    const auto chart = dir.path() / "chart.svg";
    std::ofstream(chart) << "the last chart";
    const Output o = run_program({"bench", "--svg", chart.string()});
    EXPECT_EQ(o.code, 1) << o.err;
    EXPECT_EQ(file_text(chart), "the last chart");
    EXPECT_EQ(dir.contents(), std::vector<std::string>{"chart.svg"});
    // Nor is a new chart's file made before the run.
    const Output fresh = run_program({"bench", "--svg", (dir.path() / "new.svg").string()});
    EXPECT_EQ(fresh.code, 1) << fresh.err;
    EXPECT_EQ(dir.contents(), std::vector<std::string>{"chart.svg"});
    expect_usage_error({"bench", "--svg", dir.path().string()}, "--svg: expected");
}

// tune created the cache's missing folders and a lock file before finding no GPU, and left
// them behind.
TEST(Cli, TuneCreatesNothingBeforeTheGpuCheck) {
    if (fa::device_count() > 0)
        GTEST_SKIP() << "a run that fails before measuring needs a machine without a GPU";
    if (fa::testing::any_forward_config() == nullptr)
        GTEST_SKIP() << "this build has no 16-bit forward config";
    const TempDir dir;
    const std::string built = fa::testing::any_forward_config()->to_string();
    for (const auto& cache : {dir.path() / "tuning.json", dir.path() / "a" / "b" / "tuning.json"}) {
        const Output o = run_program({"tune", "--config", built, "--cache", cache.string()});
        EXPECT_EQ(o.code, 1) << o.err;
        EXPECT_TRUE(dir.contents().empty()) << dir.contents().front();
    }
    // What can be judged without creating anything still is, before the GPU.
    expect_usage_error({"tune", "--config", built, "--cache", dir.path().string()}, "--cache");
    expect_usage_error({"tune", "--lock-timeout", "-1"}, "--lock-timeout");
    EXPECT_NE(run_program({"tune", "--help"}).out.find("--lock-timeout"), std::string::npos);
}

// Values a GPU is not needed to judge were judged after the GPU check: exit 1, "no CUDA
// device", instead of 2 naming the argument.
TEST(Cli, ArgumentsAreCheckedBeforeTheGpu) {
    for (const char* scale : {"nan", "inf", "-inf", "0", "-1", "1e39", "x"}) {
        expect_usage_error({"run", "--scale", scale}, "--scale");
        expect_usage_error({"bench", "--scale", scale}, "--scale");
    }
    expect_usage_error({"run", "--d-head", "100"},
                       "--d-head: expected 64, 96, 128, 192 or 256, got 100");
    expect_usage_error({"bench", "--d-head", "100"},
                       "--d-head: expected 64, 96, 128, 192 or 256, got 100");
    expect_usage_error({"run", "--d-head", "192", "--d-v", "64"},
                       "--d-v: expected 0 (V's head dim is d_head) or 128 with d_head 192, got 64");
    expect_usage_error({"bench", "--d-head", "128", "--d-v", "64"},
                       "--d-v: expected 0 (V's head dim is d_head) or 128 with d_head 192, got 64");
    expect_usage_error({"bench", "--d-head", "64,100"}, "--d-head");
    expect_usage_error({"run", "--window", "5,5", "--causal"},
                       "--window: expected -1 or 0 with causal");
    expect_usage_error({"bench", "--window", "5,5", "--causal"}, "--window");
    // scale / softcap must be a normal float.
    expect_usage_error({"run", "--scale", "1e-33", "--softcap", "1e6"}, "softcap");
    for (const char* command : {"run", "bench", "tune", "progression"}) {
        const Output help = run_program({command, "--help"});
        const auto line = help.out.find("--scale");
        ASSERT_NE(line, std::string::npos) << command;
        const std::string text = help.out.substr(line, help.out.find("\n  -", line) - line);
        EXPECT_NE(text.find("positive"), std::string::npos) << text;
        EXPECT_NE(text.find("2.359e+38"), std::string::npos) << text;
    }
}

// Values that were taken and silently changed or dropped: a flag given a value (`--causal=no`
// set it), a list's stray comma (dropped), a softcap or scale that a float rounds to 0 (the
// softcap turned off), --d-v beside a config of another V head dim (ignored), and a varlen
// batch whose packed rows overflow. Each is refused, before the GPU, naming the option.
TEST(Cli, ValuesAreNeverSilentlyChanged) {
    expect_usage_error({"run", "--causal=no"}, "--causal: expected no value (a flag), got \"no\"");
    expect_usage_error({"bench", "--causal=7"}, "--causal: expected no value (a flag), got \"7\"");
    expect_usage_error({"bench", "--seq", "1,"}, "--seq");
    expect_usage_error({"bench", "--seq", ",1"}, "--seq");
    expect_usage_error({"bench", "--d-head", "64,"}, "--d-head");
    expect_usage_error({"bench", "--dtype", "bf16,"}, "--dtype");
    expect_usage_error({"tune", "--kvcache", "--splits", "1,"}, "--splits");
    expect_usage_error({"run", "--softcap", "1e-300"}, "--softcap: expected");
    expect_usage_error({"run", "--scale", "1e-300"}, "--scale: expected");
    expect_usage_error({"bench", "--scale", "1e-45"}, "--scale: expected");
    if (const fa::KernelConfig* c = fa::testing::any_forward_config()) {
        const std::string other_v = std::to_string(c->v_head_dim() == 128 ? 64 : 128);
        expect_usage_error({"bench", "--config", c->to_string(), "--d-v", other_v},
                           "--d-v " + other_v);
    }
    expect_usage_error({"run", "--varlen", "--batch", "631", "--seq", "1073741824"},
                       "--batch: expected at most 1 sequences of up to --seq 1073741824");
    // A message quotes at most a part of a huge value.
    const auto [code, err] = run({"choose", "--device", std::string(100000, 'A')});
    EXPECT_EQ(code, 2);
    EXPECT_LT(err.size(), 1100u);
    // Options that only another gives a meaning to.
    expect_usage_error({"run", "--check-rows", "5"}, "--check");
    // No kernel of the problem's dtype and head dim in the build (where one is missing): named
    // by the options.
    for (const auto& [dtype, name] :
         {std::pair{fa::DType::FP16, "fp16"}, {fa::DType::BF16, "bf16"}}) {
        for (const int d : {64, 96, 128, 192, 256}) {
            const auto configs = fa::configs();
            if (std::none_of(configs.begin(), configs.end(), [&](const fa::KernelConfig& c) {
                    return !c.backward && c.dtype == dtype && c.d_head == d && c.d_v == 0;
                })) {
                expect_usage_error(
                    {"choose", "--device", "h100", "--dtype", name, "--d-head", std::to_string(d)},
                    "--dtype/--d-head: expected");
            }
        }
    }
    expect_usage_error({"tune", "--splits", "1,2,4,8,16,32,64,128"}, "--splits");
    // The chart's name with its temporary file's suffix past the folder's name limit.
    expect_usage_error({"bench", "--svg",
                        (std::filesystem::temp_directory_path() / std::string(250, 'a')).string()},
                       "--svg: expected a file that can be written");
}

// The help names every place the default tuning cache is looked for.
TEST(Cli, TuneHelpNamesTheDefaultCachePaths) {
    const Output help = run_program({"tune", "--help"});
    for (const char* name : {"FLASH_ATTENTION_TUNING", "XDG_CACHE_HOME", ".cache"})
        EXPECT_NE(help.out.find(name), std::string::npos) << name;
}

// --backward takes the dense entry point without variants, and configs of its own pass (tune
// too); each refusal comes before the GPU check.
TEST(Cli, BackwardArgumentsAreCheckedBeforeTheGpu) {
    expect_usage_error({"run", "--backward", "--kvcache", "--seq", "1", "--seq-k", "1024"},
                       "--backward: expected a dense problem");
    expect_usage_error({"bench", "--backward", "--varlen"}, "--backward: expected a dense problem");
    expect_usage_error({"run", "--backward", "--window", "64,0"},
                       "--backward: expected no --window");
    for (const std::string command : {"run", "bench", "tune"}) {
        expect_usage_error({command, "--backward", "--config",
                            "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+"
                            "buffer+opt_softmax"},
                           "--config: expected a backward config");
        expect_usage_error({command, "--config", "(BF16, 128, 64, 64, 8): bwd+async+swizzled"},
                           "--config: expected a forward config");
    }
    const Output help = run_program({"bench", "--help"});
    EXPECT_NE(help.out.find("--backward"), std::string::npos);
}

// tune --backward takes backward configs, --deterministic only with --backward and then only
// deterministic ones; each refusal names the option and comes before the GPU check.
TEST(Cli, TuneBackwardArgumentsAreCheckedBeforeTheGpu) {
    expect_usage_error({"tune", "--deterministic"},
                       "--deterministic: expected with --backward (only backward kernels differ in "
                       "determinism), got it without --backward");
    expect_usage_error(
        {"tune", "--deterministic", "--config", "(BF16, 128, 64, 64, 8): bwd+async+swizzled"},
        "--deterministic: expected with --backward");
    expect_usage_error({"choose", "--device", "h100", "--deterministic"},
                       "--deterministic: expected with --backward");
    expect_usage_error({"tune", "--backward", "--kvcache", "--seq", "1", "--seq-k", "1024"},
                       "--backward: expected a dense problem");
    expect_usage_error(
        {"tune", "--backward", "--deterministic", "--kvcache", "--seq", "1", "--seq-k", "1024"},
        "--backward: expected a dense problem");
    const auto built = [](bool deterministic) {
        for (const fa::KernelConfig& c : fa::configs()) {
            if (c.backward && fa::is_deterministic(c) == deterministic)
                return std::optional(c.to_string());
        }
        return std::optional<std::string>();
    };
    if (const auto fastest = built(false)) {
        expect_usage_error({"tune", "--backward", "--deterministic", "--config", *fastest},
                           "--config: expected a deterministic backward config (sm80, or sm90 "
                           "with ordered) with --deterministic, got " +
                               *fastest);
        expect_usage_error({"tune", "--backward", "--config", *fastest, "--window", "64,0"},
                           "--backward: expected no --window");
    }
    const std::optional<std::string> deterministic = built(true);
    if (!deterministic)
        GTEST_SKIP() << "this build has no deterministic backward config";
    if (fa::device_count() > 0)
        GTEST_SKIP() << "a run that fails before measuring needs a machine without a GPU";
    const TempDir dir;
    const Output o =
        run_program({"tune", "--backward", "--deterministic", "--config", *deterministic, "--cache",
                     (dir.path() / "tuning.json").string()});
    EXPECT_EQ(o.code, 1) << o.err;
    EXPECT_NE(o.err.find("no CUDA device"), std::string::npos) << o.err;
    EXPECT_TRUE(dir.contents().empty());
}

// choose --backward prints what backward() runs: the library's choice (a cached winner of the
// backward key first), deterministic with --deterministic, on a device model.
TEST(Cli, ChooseBackwardPrintsTheBackwardChoice) {
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const fa::ProblemShape problem{.dtype = fa::DType::BF16,
                                   .d_head = 128,
                                   .batch = 1,
                                   .seq_q = 4096,
                                   .seq_k = 4096,
                                   .heads = 16,
                                   .heads_kv = 16};
    const TempDir dir;
    const auto file = dir.path() / "tuning.json";
    setenv("FLASH_ATTENTION_TUNING", file.c_str(), 1);
    fa::reload_tuning_cache();
    const auto first_line = [](const std::string& out) { return out.substr(0, out.find('\n')); };
    for (const bool deterministic : {false, true}) {
        std::vector<std::string> args = {"choose", "--device", "h100", "--backward"};
        if (deterministic)
            args.push_back("--deterministic");
        const Output o = run_program(args);
        try {
            const fa::KernelConfig expected =
                fa::choose_backward_config(problem, h100, deterministic);
            EXPECT_EQ(o.code, 0) << o.err;
            EXPECT_EQ(first_line(o.out), expected.to_string()) << o.out;
            EXPECT_NE(o.out.find(deterministic ? "# deterministic backward, " : "# backward, "),
                      std::string::npos)
                << o.out;
        } catch (const fa::Error& e) {
            EXPECT_EQ(o.code, 2) << e.what();  // no backward kernel of the problem in this build
        }
    }
    // A tuned winner that is not the table's: choose prints it.
    std::optional<fa::KernelConfig> table;
    try {
        table = fa::choose_backward_config(problem, h100);
    } catch (const fa::Error&) {
    }
    const auto winner = std::find_if(fa::configs().begin(), fa::configs().end(), [&](auto& c) {
        return table && c.backward && c != *table && c.dtype == problem.dtype &&
               c.d_head == problem.d_head && c.family == fa::Family::sm80;
    });
    if (winner != fa::configs().end()) {
        fa::tuning::Entry e;
        e.key = fa::tuning::Key::of_backward(h100, problem, false);
        e.config = *winner;
        e.tflops = 1;
        fa::tuning::save_atomically(file, {e});
        fa::reload_tuning_cache();
        const Output o = run_program({"choose", "--device", "h100", "--backward"});
        EXPECT_EQ(o.code, 0) << o.err;
        EXPECT_EQ(first_line(o.out), winner->to_string()) << o.out;
    }
    unsetenv("FLASH_ATTENTION_TUNING");
    fa::reload_tuning_cache();
    if (winner == fa::configs().end())
        GTEST_SKIP() << "this build has no second BF16 d_head 128 backward kernel";
}
