// `flash_attention tune` on a tiny set and one shape, then the automatic choice.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "app.hpp"
#include "common/cuda_check.hpp"
#include "flash_attention/flash_attention.hpp"
#include "testing/device_buffer.hpp"
#include "tuning/tuning_cache.hpp"

namespace fa = flash_attention;

TEST(Tune, AutomaticChoiceRunsTheWinner) {
    constexpr int seq = 1024;
    // Two built configs of one (dtype, d_head) that both divide the sequence length.
    std::map<std::pair<fa::DType, int>, std::vector<fa::KernelConfig>> groups;
    for (const auto& c : fa::configs()) {
        if (seq % c.B_r == 0 && seq % c.B_c == 0 && fa::is_supported(c))
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
    const auto dq = fa::DeviceTensor::upload(q);
    const auto dk = fa::DeviceTensor::upload(q);
    const auto dv = fa::DeviceTensor::upload(q);
    const auto dout = fa::DeviceTensor::empty_like(q);
    const fa::ForwardParams params{dq.view, dk.view, dv.view, dout.view, std::nullopt};
    EXPECT_EQ(fa::choose_config(params), winner);
    fa::forward(params);
    fa::cuda_check(cudaDeviceSynchronize(), "forward with the tuned choice");

    unsetenv("FLASH_ATTENTION_TUNING");
    fa::reload_tuning_cache();
    std::filesystem::remove(file);
}
