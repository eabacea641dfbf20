#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>

#include "commands.hpp"

#include "flash_attention/flash_attention.hpp"
#include "options.hpp"
#include "problem.hpp"
#include "sweep.hpp"

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
    std::optional<int> d_v;
    std::optional<std::string> dtype;
    std::optional<float> scale;
    int repeat = 1;
    bool check = false;
    int check_rows = 256;
    std::optional<std::uint64_t> seed;
    bool kvcache = false;
    int page_size = 0;
    bool varlen = false;
    int splits = 0;
    VariantOptions variants;
    bool backward = false;
};

DType parse_dtype(const std::string& s) {
    return s == "fp16" ? DType::FP16 : s == "e4m3" ? DType::E4M3 : DType::BF16;
}

int run(const RunOptions& opt) {
    std::optional<KernelConfig> config;
    if (!opt.config.empty())
        config = built_config(opt.config, "--config", opt.backward);
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
    // V's head dim: the config's, else d_head's unless --d-v names another.
    int d_v = config ? config->v_head_dim() : d_head;
    if (opt.d_v) {
        if (config && *opt.d_v != config->v_head_dim()) {
            throw UsageError("--d-v: expected " + std::to_string(config->v_head_dim()) +
                             " (the config's V head dim), got " + std::to_string(*opt.d_v));
        }
        d_v = *opt.d_v;
    }
    const int heads_kv = opt.heads_kv.value_or(opt.heads);
    if (opt.heads % heads_kv != 0) {
        throw UsageError("--heads-kv: expected a divisor of --heads (" + std::to_string(opt.heads) +
                         "), got " + std::to_string(heads_kv));
    }
    const Api api = serving_api(opt.kvcache, opt.page_size, opt.varlen, opt.seq_k.has_value());
    Candidate candidate;
    if (config)
        candidate = *config;
    if (opt.splits > 0)
        candidate = Candidate::with_splits(opt.splits);
    if (config && api != Api::dense) {
        throw UsageError(
            "--config: expected none with --kvcache or --varlen (their entry points choose the "
            "kernel; --splits picks the split-KV kernel's key ranges), got " +
            config->to_string());
    }
    if (opt.splits > 0 && api == Api::dense)
        throw UsageError("--splits: expected with --kvcache or --varlen only");

    Shape shape{.dtype = dtype,
                .d_head = d_head,
                .batch = opt.batch,
                .heads = opt.heads,
                .seq_q = opt.seq,
                .seq_k = opt.seq_k.value_or(opt.seq),
                .heads_kv = heads_kv,
                .causal = opt.causal,
                .scale = opt.scale,
                .api = api,
                .page_size = opt.page_size};
    shape.d_v = d_v == d_head ? 0 : d_v;
    opt.variants.apply(shape);
    shape.backward = opt.backward;
    validate_shape(shape);
    if (!gpu_available())
        return exit_failure;
    // Fresh inputs each run unless --seed names them (printed either way: a failing check can
    // be rerun, on this kernel or another, with the same data).
    const std::uint64_t seed = opt.seed.value_or(std::random_device{}());
    const HostProblem host = HostProblem::random(shape, seed);
    const DeviceProblem problem(shape, host);
    DeviceBuffer lse(static_cast<std::size_t>(host.q.batch * host.q.seq * opt.heads) *
                     sizeof(float));
    lse.poison_with_nan();
    float* lse_out = opt.check ? static_cast<float*>(lse.data()) : nullptr;
    const KernelChoice kernel = problem.kernel(candidate);

    std::printf("kernel   %s%s\n", kernel.to_string().c_str(),
                candidate.automatic() ? "  [automatic choice]" : "");
    std::printf(
        "problem  %s, batch %d, heads %d (k/v %d), seq_q %s%d, seq_k %d, d_head %d%s, %s%s\n",
        api_name(shape).c_str(), opt.batch, opt.heads, heads_kv, api == Api::varlen ? "1.." : "",
        shape.seq_q, api == Api::varlen ? shape.seq_q : shape.seq_k, d_head,
        shape.d_v != 0 ? (" (v " + std::to_string(shape.d_v) + ")").c_str() : "",
        std::string(to_string(dtype)).c_str(), opt.causal ? ", causal" : "");
    if (shape.window_left != -1 || shape.window_right != -1 || shape.softcap != 0 || shape.sinks ||
        shape.alibi) {
        std::printf("variants window (%d, %d), softcap %g%s%s\n", shape.window_left,
                    shape.window_right, static_cast<double>(shape.softcap),
                    shape.sinks ? ", sinks" : "", shape.alibi ? ", ALiBi" : "");
    }
    std::printf("inputs   random, seed %llu\n", static_cast<unsigned long long>(seed));
    if (opt.backward) {
        std::printf("backward dQ, dK, dV for a random dO; workspace %zu bytes\n",
                    backward_workspace_bytes(shape.problem()));
    }
    std::printf("device   %s\n", DeviceProperties::current().description().c_str());

    // The first run is both the warm-up and the one whose output is checked.
    problem.launch(candidate, lse_out);
    const reference::HostTensor out = problem.download_output(host);
    const std::optional<Gradients> gradients =
        opt.backward ? std::optional(problem.download_gradients(host)) : std::nullopt;
    LaunchTimes timer(opt.repeat);
    for (int r = 0; r < opt.repeat; ++r) {
        timer.before(r, nullptr);
        problem.launch(candidate, lse_out);
        timer.after(r, nullptr);
    }
    const Measurement m =
        Measurement::of(kernel.to_string(), kernel, shape, timer.elapsed_ms(opt.repeat));
    std::printf("time     %.4f ms (median of %d; min %.4f, max %.4f)\n", m.median_ms, m.runs,
                m.min_ms, m.max_ms);
    std::printf("rate     %.1f TFLOP/s", m.tflops());
    if (api != Api::dense)
        std::printf(", K/V read at %.2f TB/s", m.kv_tbps());
    std::printf("\n");

    if (opt.check && gradients) {
        const auto result = check_gradients(shape, host, *gradients, opt.check_rows, seed);
        std::printf("check    %s\n", result.summary().c_str());
        if (!result.passed)
            return exit_failure;
    } else if (opt.check) {
        const std::vector<float> lse_host = lse.download_floats();
        const auto result = check_output(shape, host, out, &lse_host, opt.check_rows, seed);
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
                    "library's automatic choice")
        ->check(non_empty("a config short form"));
    cmd->add_option("--batch", o->batch, "batch size")
        ->transform(batch_size())
        ->capture_default_str();
    cmd->add_option("--heads", o->heads, "attention heads")
        ->transform(head_count())
        ->capture_default_str();
    cmd->add_option("--seq", o->seq, "query sequence length (and key length unless --seq-k)")
        ->transform(seq_length())
        ->capture_default_str();
    cmd->add_option("--seq-k", o->seq_k, "key/value sequence length")->transform(seq_length());
    cmd->add_option("--heads-kv", o->heads_kv, "key/value heads, dividing --heads (grouped-query)")
        ->transform(head_count());
    cmd->add_flag("--causal", o->causal, "causal masking, aligned at the bottom right");
    cmd->add_option("--d-head", o->d_head, "head dimension (default: the config's, else 128)")
        ->transform(integer_in(1, k_most_d_head));
    cmd->add_option("--d-v", o->d_v,
                    "V's head dimension where it differs from Q's and K's: 128 with --d-head 192 "
                    "(default: the config's, else --d-head)")
        ->transform(integer_in(1, k_most_d_head));
    cmd->add_option(
           "--dtype", o->dtype,
           "fp16, bf16 or e4m3 (FP8: random descales, bf16 output, dense forward and --kvcache; "
           "default: the config's, else bf16)")
        ->check(non_empty("fp16, bf16 or e4m3"))
        ->check(CLI::IsMember({"fp16", "bf16", "e4m3"}, CLI::ignore_case));
    cmd->add_option("--scale", o->scale, "softmax scale, positive (default 1/sqrt(d_head))")
        ->check(softmax_scale_bounds());
    o->variants.add_to(*cmd);
    cmd->add_option("--repeat", o->repeat, "timed runs after the warm-up")
        ->transform(integer_in(1, 10000))
        ->capture_default_str();
    add_serving_options(*cmd, o->kvcache, o->page_size, o->varlen);
    cmd->add_option("--splits", o->splits,
                    "with --kvcache or --varlen: the split-KV kernel with this many key ranges "
                    "per sequence (default: the library's choice)")
        ->transform(integer_in(1, k_max_splits));
    add_backward_option(*cmd, o->backward);
    CLI::Option* check =
        cmd->add_flag("--check", o->check, "compare with the double-precision CPU reference");
    cmd->add_option("--check-rows", o->check_rows,
                    "query rows per (batch, head) that --check samples")
        ->transform(integer_in(1, 1 << 20))
        ->capture_default_str()
        ->needs(check);
    cmd->add_option("--seed", o->seed,
                    "seed of the random inputs, as `run` prints it (default: a fresh one each run)")
        ->transform(integer_in(0, std::numeric_limits<long long>::max()));
    cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace flash_attention::cli
