#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "app.hpp"
#include "commands.hpp"
#include "flash_attention/flash_attention.hpp"
#include "options.hpp"
#include "report.hpp"

namespace fa = flash_attention;
namespace cli = flash_attention::cli;

namespace {

// Runs the program in-process; returns the exit code and what it wrote to stderr.
std::pair<int, std::string> run(std::vector<std::string> args) {
    args.insert(args.begin(), "flash_attention");
    std::vector<char*> argv;
    for (auto& a : args)
        argv.push_back(a.data());
    testing::internal::CaptureStderr();
    testing::internal::CaptureStdout();
    const int code = cli::run_cli(static_cast<int>(argv.size()), argv.data());
    testing::internal::GetCapturedStdout();
    return {code, testing::internal::GetCapturedStderr()};
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

std::vector<cli::Measurement> sample() {
    const auto c = fa::KernelConfig::parse(
        "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+opt_softmax");
    std::vector<cli::Measurement> v;
    for (const int seq : {512, 1024, 2048}) {
        v.push_back({c.to_string(),
                     c,
                     {fa::DType::BF16, 128, 16384 / seq, 16, seq, seq, 16, false, std::nullopt},
                     0.1 * seq / 512,
                     0.09,
                     0.11,
                     20,
                     {}});
    }
    v.push_back({"automatic choice (BF16, d_head 128)",
                 c,
                 {fa::DType::BF16, 128, 8, 16, 2048, 2048, 16, false, std::nullopt},
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
}

TEST(Cli, ShapesNoBuiltKernelSupportsAreUsageErrors) {
    const auto& c = fa::configs().front();
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
              "config,kernel,dtype,d_head,batch,heads,heads_kv,seq_q,seq_k,causal,median_ms,min_ms,"
              "max_ms,runs,"
              "tflops");
    int rows = 0;
    while (std::getline(csv, line)) {
        ++rows;
        EXPECT_EQ(csv_fields(line), 15u) << line;
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
