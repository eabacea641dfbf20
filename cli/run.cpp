#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>

#include "commands.hpp"

#include "flash_attention/flash_attention.hpp"
#include "options.hpp"
#include "reference/reference.hpp"
#include "sweep.hpp"
#include "testing/device_buffer.hpp"

namespace flash_attention::cli {

namespace {

struct RunOptions {
    std::string config;
    int batch = 4;
    int heads = 16;
    int seq = 4096;
    std::optional<int> seq_k;
    std::optional<int> heads_kv;
    bool causal = false;
    std::optional<int> d_head;
    std::optional<std::string> dtype;
    std::optional<float> scale;
    int repeat = 1;
    bool check = false;
    int check_rows = 256;
};

DType parse_dtype(const std::string& s) {
    return s == "fp16" ? DType::FP16 : DType::BF16;
}

int run(const RunOptions& opt) {
    std::optional<KernelConfig> config;
    if (!opt.config.empty())
        config = built_config(opt.config, "--config");
    DType dtype = config ? config->dtype : DType::BF16;
    int d_head = config ? config->d_head : 128;
    if (opt.dtype) {
        if (config && parse_dtype(*opt.dtype) != config->dtype) {
            throw UsageError("--dtype: expected " + std::string(to_string(config->dtype)) +
                             " (the config's dtype), got " + *opt.dtype);
        }
        dtype = parse_dtype(*opt.dtype);
    }
    if (opt.d_head) {
        if (config && *opt.d_head != config->d_head) {
            throw UsageError("--d-head: expected " + std::to_string(config->d_head) +
                             " (the config's d_head), got " + std::to_string(*opt.d_head));
        }
        d_head = *opt.d_head;
    }
    const int heads_kv = opt.heads_kv.value_or(opt.heads);
    if (opt.heads % heads_kv != 0) {
        throw UsageError("--heads-kv: expected a divisor of --heads (" + std::to_string(opt.heads) +
                         "), got " + std::to_string(heads_kv));
    }
    if (!gpu_available())
        return exit_failure;

    const int seq_k = opt.seq_k.value_or(opt.seq);
    const std::uint64_t seed = std::random_device{}();
    using reference::HostTensor;
    const HostTensor q =
        HostTensor::random_normal(dtype, opt.batch, opt.seq, opt.heads, d_head, seed);
    const HostTensor k =
        HostTensor::random_normal(dtype, opt.batch, seq_k, heads_kv, d_head, seed + 1);
    const HostTensor v =
        HostTensor::random_normal(dtype, opt.batch, seq_k, heads_kv, d_head, seed + 2);
    const DeviceTensor dq = DeviceTensor::upload(q);
    const DeviceTensor dk = DeviceTensor::upload(k);
    const DeviceTensor dv = DeviceTensor::upload(v);
    DeviceTensor dout = DeviceTensor::empty_like(q);
    dout.buffer.poison_with_nan();
    DeviceBuffer lse(static_cast<std::size_t>(opt.batch) * opt.heads * opt.seq * sizeof(float));
    lse.poison_with_nan();

    ForwardParams params{dq.view, dk.view, dv.view, dout.view, opt.scale};
    params.causal = opt.causal;
    if (opt.check)
        params.lse = static_cast<float*>(lse.data());
    const bool automatic = !config;
    if (automatic)
        config = choose_config(params);
    const auto launch = [&] { forward(params, *config, nullptr); };

    std::printf("config   %s%s\n", config->to_string().c_str(),
                automatic ? "  [automatic choice]" : "");
    std::printf("problem  batch %d, heads %d (k/v %d), seq_q %d, seq_k %d, d_head %d, %s%s\n",
                opt.batch, opt.heads, heads_kv, opt.seq, seq_k, d_head,
                std::string(to_string(dtype)).c_str(), opt.causal ? ", causal" : "");
    std::printf("device   %s\n", DeviceProperties::current().description().c_str());

    // The first run is both the warm-up and the one whose output is checked.
    launch();
    const HostTensor out = dout.download(q);
    LaunchTimes timer(opt.repeat);
    for (int r = 0; r < opt.repeat; ++r) {
        timer.before(r, nullptr);
        launch();
        timer.after(r, nullptr);
    }
    const Shape shape{dtype, d_head,   opt.batch,  opt.heads, opt.seq,
                      seq_k, heads_kv, opt.causal, opt.scale};
    const Measurement m =
        Measurement::of(config->to_string(), *config, shape, timer.elapsed_ms(opt.repeat));
    std::printf("time     %.4f ms (median of %d; min %.4f, max %.4f)\n", m.median_ms, m.runs,
                m.min_ms, m.max_ms);
    std::printf("rate     %.1f TFLOP/s\n", m.tflops());

    if (opt.check) {
        const auto rows =
            reference::sample_rows(opt.batch, opt.heads, opt.seq, opt.check_rows, seed);
        const std::vector<float> lse_host = lse.download_floats();
        const auto result = reference::check_attention(
            {q, k, v, out, opt.scale.value_or(1.0 / std::sqrt(double(d_head))), opt.causal,
             &lse_host},
            rows);
        std::printf("check    %s\n", result.summary().c_str());
        if (!result.passed)
            return exit_failure;
    }
    return exit_ok;
}

}  // namespace

void add_run_command(CLI::App& app, Action& action) {
    auto o = std::make_shared<RunOptions>();
    CLI::App* cmd =
        app.add_subcommand("run", "Run one kernel on random data, time it, optionally check it");
    cmd->add_option("--config", o->config,
                    "kernel config short form, e.g. \"(BF16, 128, 128, 64, 4): "
                    "async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax\"; default: the "
                    "library's automatic choice");
    cmd->add_option("--batch", o->batch, "batch size")->check(batch_size())->capture_default_str();
    cmd->add_option("--heads", o->heads, "attention heads")
        ->check(head_count())
        ->capture_default_str();
    cmd->add_option("--seq", o->seq, "query sequence length (and key length unless --seq-k)")
        ->check(seq_length())
        ->capture_default_str();
    cmd->add_option("--seq-k", o->seq_k, "key/value sequence length")->check(seq_length());
    cmd->add_option("--heads-kv", o->heads_kv, "key/value heads, dividing --heads (grouped-query)")
        ->check(head_count());
    cmd->add_flag("--causal", o->causal, "causal masking, aligned at the bottom right");
    cmd->add_option("--d-head", o->d_head, "head dimension (default: the config's, else 128)")
        ->check(integer_in(1, 1024));
    cmd->add_option("--dtype", o->dtype, "fp16 or bf16 (default: the config's, else bf16)")
        ->check(CLI::IsMember({"fp16", "bf16"}, CLI::ignore_case));
    cmd->add_option("--scale", o->scale, "softmax scale (default 1/sqrt(d_head))");
    cmd->add_option("--repeat", o->repeat, "timed runs after the warm-up")
        ->check(integer_in(1, 10000))
        ->capture_default_str();
    cmd->add_flag("--check", o->check, "compare with the double-precision CPU reference");
    cmd->add_option("--check-rows", o->check_rows,
                    "query rows per (batch, head) that --check samples")
        ->check(integer_in(1, 1 << 20))
        ->capture_default_str();
    cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace flash_attention::cli
