// `flash_attention tune` on a tiny set and one shape, then the automatic choice.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "app.hpp"
#include "common/cuda_check.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "support/built_configs.hpp"
#include "tuning/tuning_cache.hpp"

namespace fa = flash_attention;

TEST(Tune, AutomaticChoiceRunsTheWinner) {
    constexpr int seq = 1024;
    // Two built configs of one (dtype, d_head) that both divide the sequence length.
    std::map<std::pair<fa::DType, int>, std::vector<fa::KernelConfig>> groups;
    for (const auto& c : fa::testing::forward_configs()) {
        if (seq % c.B_r == 0 && seq % c.B_c == 0 && fa::is_supported(c) && c.d_v == 0)
            groups[{c.dtype, c.d_head}].push_back(c);
    }
    const auto group = std::find_if(groups.begin(), groups.end(),
                                    [](const auto& g) { return g.second.size() >= 2; });
    if (group == groups.end())
        GTEST_SKIP() << "this build has no two configs of one dtype and d_head";
    const fa::KernelConfig a = group->second[0];
    const fa::KernelConfig b = group->second[1];

    const auto file = std::filesystem::temp_directory_path() /
                      ("fa_tune_test_" + std::to_string(getpid()) + ".json");
    std::vector<std::string> args = {
        "flash_attention", "tune",        "--config", a.to_string(),
        "--config",        b.to_string(), "--seq",    std::to_string(seq),
        "--batch",         "2",           "--heads",  "4",
        "--runs",          "5",           "--warmup", "1",
        "--cache",         file.string(), "--format", "none"};
    std::vector<char*> argv;
    for (auto& s : args)
        argv.push_back(s.data());
    ASSERT_EQ(fa::cli::run_cli(static_cast<int>(argv.size()), argv.data()), 0);

    const auto cache = fa::tuning::load(file);
    ASSERT_EQ(cache.entries.size(), 1u);
    const fa::KernelConfig winner = cache.entries[0].config;
    EXPECT_TRUE(winner == a || winner == b) << winner.to_string();
    ASSERT_TRUE(cache.entries[0].runner_up.has_value());

    setenv("FLASH_ATTENTION_TUNING", file.c_str(), 1);
    fa::reload_tuning_cache();
    const auto q = fa::reference::HostTensor::random_normal(a.dtype, 2, seq, 4, a.d_head, 1);
    const auto dq = fa::tools::DeviceTensor::upload(q);
    const auto dk = fa::tools::DeviceTensor::upload(q);
    const auto dv = fa::tools::DeviceTensor::upload(q);
    auto dout = fa::tools::DeviceTensor::empty_like(q);
    const fa::ForwardParams params{dq.view, dk.view, dv.view, dout.view};
    EXPECT_EQ(fa::choose_config(params), winner);
    dout.buffer.poison_with_nan();
    fa::forward(params);
    fa::cuda_check(cudaDeviceSynchronize(), "forward with the tuned choice");
    // The winner's answer, not only its launch.
    const auto result =
        fa::reference::check_attention(q, q, q, dout.download(q), 1.0 / std::sqrt(double(a.d_head)),
                                       fa::reference::sample_rows(2, 4, seq, 256, 1));
    EXPECT_TRUE(result.passed) << winner.to_string() << ": " << result.summary();

    unsetenv("FLASH_ATTENTION_TUNING");
    fa::reload_tuning_cache();
    std::filesystem::remove(file);
}

// `tune --backward [--deterministic]` records the winner of two backward configs under the
// pass's own key; choose_backward_config, which backward() runs, then picks it.
TEST(Tune, BackwardWinnersAreTheBackwardChoice) {
    constexpr int seq = 1024;
    const auto file = std::filesystem::temp_directory_path() /
                      ("fa_tune_backward_" + std::to_string(getpid()) + ".json");
    int tuned = 0;
    for (const bool deterministic : {false, true}) {
        // Two runnable backward configs of one (dtype, d_head) whose forward is built too (the
        // backward reads the forward's output and LSE).
        std::map<std::pair<fa::DType, int>, std::vector<fa::KernelConfig>> groups;
        for (const auto& c : fa::testing::backward_configs()) {
            if (fa::is_supported(c) && (!deterministic || fa::is_deterministic(c)))
                groups[{c.dtype, c.d_head}].push_back(c);
        }
        const auto group = std::find_if(groups.begin(), groups.end(), [](const auto& g) {
            return g.second.size() >= 2 &&
                   std::any_of(fa::testing::forward_configs().begin(),
                               fa::testing::forward_configs().end(), [&](const auto& f) {
                                   return f.dtype == g.first.first && f.d_head == g.first.second &&
                                          fa::is_supported(f);
                               });
        });
        if (group == groups.end())
            continue;
        const fa::KernelConfig a = group->second[0];
        const fa::KernelConfig b = group->second[1];
        std::vector<std::string> args = {"flash_attention",
                                         "tune",
                                         "--backward",
                                         "--config",
                                         a.to_string(),
                                         "--config",
                                         b.to_string(),
                                         "--seq",
                                         std::to_string(seq),
                                         "--batch",
                                         "2",
                                         "--heads",
                                         "4",
                                         "--runs",
                                         "5",
                                         "--warmup",
                                         "1",
                                         "--cache",
                                         file.string(),
                                         "--format",
                                         "none"};
        if (deterministic)
            args.push_back("--deterministic");
        std::vector<char*> argv;
        for (auto& s : args)
            argv.push_back(s.data());
        ASSERT_EQ(fa::cli::run_cli(static_cast<int>(argv.size()), argv.data()), 0);
        ++tuned;

        const fa::ProblemShape problem{.dtype = a.dtype,
                                       .d_head = a.d_head,
                                       .batch = 2,
                                       .seq_q = seq,
                                       .seq_k = seq,
                                       .heads = 4,
                                       .heads_kv = 4};
        const fa::tuning::Key key =
            fa::tuning::Key::of_backward(fa::DeviceProperties::current(), problem, deterministic);
        const auto cache = fa::tuning::load(file);
        ASSERT_EQ(cache.entries.size(), static_cast<std::size_t>(tuned));
        const auto entry = std::find_if(cache.entries.begin(), cache.entries.end(),
                                        [&](const fa::tuning::Entry& e) { return e.key == key; });
        ASSERT_NE(entry, cache.entries.end()) << key.to_string();
        EXPECT_TRUE(entry->config == a || entry->config == b) << entry->config.to_string();
        ASSERT_TRUE(entry->runner_up.has_value());

        setenv("FLASH_ATTENTION_TUNING", file.c_str(), 1);
        fa::reload_tuning_cache();
        EXPECT_EQ(
            fa::choose_backward_config(problem, fa::DeviceProperties::current(), deterministic),
            entry->config);
        unsetenv("FLASH_ATTENTION_TUNING");
        fa::reload_tuning_cache();
    }
    std::filesystem::remove(file);
    if (tuned == 0)
        GTEST_SKIP() << "this build has no two runnable backward configs of one dtype and d_head";
}

namespace {

int cli(std::vector<std::string> args) {
    args.insert(args.begin(), "flash_attention");
    std::vector<char*> argv;
    for (auto& s : args)
        argv.push_back(s.data());
    return fa::cli::run_cli(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

// `run --seed` draws the inputs it names: the same seed twice gives the same check (the kernel
// is deterministic), and the printed seed is the one given.
TEST(Cli, RunSeedRepeatsTheInputs) {
    if (!fa::testing::has_forward(fa::DType::BF16, 128, 128))
        GTEST_SKIP() << "this build has no forward kernel of BF16 d_head 128 that runs here "
                        "(`run`'s default problem)";
    // The seed line and the check line (its errors, which depend on the inputs) of one run.
    const auto run_with = [](const std::string& seed) -> std::pair<std::string, std::string> {
        testing::internal::CaptureStdout();
        const int code = cli({"run", "--seed", seed, "--check", "--batch", "2", "--heads", "4",
                              "--seq", "1000", "--causal"});
        const std::string out = testing::internal::GetCapturedStdout();
        EXPECT_EQ(code, 0) << out;
        std::pair<std::string, std::string> lines;
        std::istringstream in(out);
        for (std::string line; std::getline(in, line);) {
            if (line.rfind("inputs", 0) == 0)
                lines.first = line;
            if (line.rfind("check", 0) == 0)
                lines.second = line;
        }
        return lines;
    };
    const auto [seed_line, check_line] = run_with("20261128");
    EXPECT_NE(seed_line.find("seed 20261128"), std::string::npos) << seed_line;
    EXPECT_NE(check_line.find("passed"), std::string::npos) << check_line;
    EXPECT_EQ(run_with("20261128").second, check_line);
    EXPECT_NE(run_with("20261129").second, check_line);  // other inputs, other errors
}

// Issue 14, part 7: `run --check` through forward_kvcache (contiguous and paged) and
// forward_varlen, against the double-precision reference (odd lengths, GQA, causal).
TEST(ServingCli, RunCheckPassesOnEveryEntryPoint) {
    const std::vector<std::string> shape = {"--batch", "3",       "--heads",      "8", "--heads-kv",
                                            "2",       "--check", "--check-rows", "64"};
    const auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), "run");
        extra.insert(extra.end(), shape.begin(), shape.end());
        return extra;
    };
    EXPECT_EQ(cli(with({"--kvcache", "--seq", "1", "--seq-k", "3001"})), 0);
    EXPECT_EQ(cli(with({"--kvcache", "--seq", "1", "--seq-k", "3001", "--splits", "5"})), 0);
    EXPECT_EQ(cli(with({"--page-size", "16", "--seq", "7", "--seq-k", "999", "--causal"})), 0);
    EXPECT_EQ(cli(with({"--page-size", "64", "--seq", "130", "--seq-k", "1001", "--causal"})), 0);
    EXPECT_EQ(cli(with({"--varlen", "--seq", "777", "--causal"})), 0);
    EXPECT_EQ(cli(with({"--varlen", "--seq", "300", "--splits", "3"})), 0);
}

// `tune --kvcache` records a split count per key; forward_kvcache's automatic choice then
// runs it (chosen_kernel says so), whatever the batch.
TEST(ServingCli, TuneRecordsTheSplitCountTheChoiceUses) {
    const auto file = std::filesystem::temp_directory_path() /
                      ("fa_tune_splits_" + std::to_string(getpid()) + ".json");
    ASSERT_EQ(cli({"tune",     "--kvcache",   "--seq",    "1",   "--seq-k",    "4096",
                   "--batch",  "2",           "--heads",  "8",   "--heads-kv", "2",
                   "--splits", "3,7",         "--runs",   "5",   "--warmup",   "1",
                   "--cache",  file.string(), "--format", "none"}),
              0);
    const auto cache = fa::tuning::load(file);
    ASSERT_EQ(cache.entries.size(), 1u);
    const fa::tuning::Entry& e = cache.entries[0];
    EXPECT_EQ(e.key.rows_bucket, 4);
    EXPECT_TRUE(e.splits == 3 || e.splits == 7) << e.splits;
    EXPECT_EQ(e.runner_up_splits, e.splits == 3 ? 7 : 3);

    setenv("FLASH_ATTENTION_TUNING", file.c_str(), 1);
    fa::reload_tuning_cache();
    for (const int batch : {1, 5}) {
        const auto q =
            fa::reference::HostTensor::random_normal(fa::DType::BF16, batch, 1, 8, 128, 1);
        const auto k =
            fa::reference::HostTensor::random_normal(fa::DType::BF16, batch, 4096, 2, 128, 2);
        const auto dq = fa::tools::DeviceTensor::upload(q);
        const auto dk = fa::tools::DeviceTensor::upload(k);
        const auto dv = fa::tools::DeviceTensor::upload(k);
        const auto dout = fa::tools::DeviceTensor::empty_like(q);
        fa::KVCacheParams p;
        p.q = dq.view;
        p.k_cache = dk.view;
        p.v_cache = dv.view;
        p.o = dout.view;
        const fa::KernelChoice chosen = fa::chosen_kernel(p);
        EXPECT_FALSE(chosen.config.has_value());
        EXPECT_EQ(chosen.splits, e.splits) << chosen.to_string();
        const fa::ForwardParams dense{dq.view, dk.view, dv.view, dout.view};
        EXPECT_EQ(fa::chosen_kernel(dense).splits, e.splits) << "forward()'s decoding route";
    }
    unsetenv("FLASH_ATTENTION_TUNING");
    fa::reload_tuning_cache();
    std::filesystem::remove(file);
}
