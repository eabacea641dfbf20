// flash_attention choose: which kernel the automatic choice runs for a problem, on the GPU
// present or on a device model (no GPU needed), through forward() or with --backward through
// backward(). The first line is the config's short form, or for a decoding shape's forward
// "split-KV (PackGQA), N splits".

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "commands.hpp"
#include "flash_attention/flash_attention.hpp"
#include "options.hpp"

namespace flash_attention::cli {

namespace {

struct ChooseOptions {
    std::string device;  // a model; empty: the GPU present
    std::string dtype = "bf16";
    int d_head = 128;
    std::optional<int> d_v;  // V's head dim; default d_head
    int seq = 4096;
    std::optional<int> seq_k;
    int batch = 1;
    int heads = 16;
    std::optional<int> heads_kv;
    bool causal = false;
    bool backward = false;
    bool deterministic = false;
};

// The second line: what chose the config, and where it runs.
void print_origin(const KernelConfig& config, const std::string& pass,
                  const DeviceProperties& device, bool model) {
    std::printf(
        "# %s%s family on %s%s (compute capability %d.%d, %d SMs); tuning cache, else the "
        "built-in table\n",
        pass.c_str(), std::string(to_string(config.family)).c_str(), device.name.c_str(),
        model ? " (model)" : "", device.major, device.minor, device.sm_count);
}

// The automatic choice for the problem on the device, printed with what chose it.
int print_choice(const ChooseOptions& o, const ProblemShape& problem,
                 const DeviceProperties& device, bool model) {
    if (o.backward) {
        const KernelConfig config = choose_backward_config(problem, device, o.deterministic);
        std::printf("%s\n", config.to_string().c_str());
        print_origin(config, o.deterministic ? "deterministic backward, " : "backward, ", device,
                     model);
        return exit_ok;
    }
    const KernelChoice kernel = chosen_kernel(problem, device);
    std::printf("%s\n", kernel.to_string().c_str());
    if (!kernel.config) {
        // A decoding shape: forward() runs the split-KV kernel, which has no config.
        std::printf(
            "# decoding shape on %s%s (%d SMs): the split-KV kernel; split count from the "
            "tuning cache (tune --kvcache), else the heuristic\n",
            device.name.c_str(), model ? " (model)" : "", device.sm_count);
        return exit_ok;
    }
    print_origin(*kernel.config, "", device, model);
    return exit_ok;
}

int choose(const ChooseOptions& o) {
    check_deterministic(o.deterministic, o.backward);
    DeviceProperties device;
    if (!o.device.empty()) {
        device = DeviceProperties::model(o.device);
    } else {
        if (device_count() == 0) {
            std::fprintf(stderr,
                         "flash_attention: no CUDA device found (pass --device a100 or h100 to "
                         "ask about a model)\n");
            return exit_failure;
        }
        device = DeviceProperties::current();
    }
    const ProblemShape problem{.dtype = o.dtype == "fp16"   ? DType::FP16
                                        : o.dtype == "e4m3" ? DType::E4M3
                                                            : DType::BF16,
                               .d_head = o.d_head,
                               .batch = o.batch,
                               .seq_q = o.seq,
                               .seq_k = o.seq_k.value_or(o.seq),
                               .heads = o.heads,
                               .heads_kv = o.heads_kv.value_or(o.heads),
                               .causal = o.causal,
                               .d_v = o.d_v.value_or(o.d_head) == o.d_head ? 0 : *o.d_v};
    const bool model = !o.device.empty();
    try {
        return print_choice(o, problem, device, model);
    } catch (const Error& e) {
        // The problem's own errors name its fields: here they are the options.
        if (is_bad_argument(e.code()))
            throw UsageError(in_option_names(e.what()));
        throw;
    }
}

}  // namespace

void add_choose_command(CLI::App& app, Action& action) {
    auto o = std::make_shared<ChooseOptions>();
    CLI::App* cmd = app.add_subcommand(
        "choose",
        "Print the kernel the automatic choice runs for a problem (first line: its short form)");
    cmd->add_option("--device", o->device,
                    "a device model instead of the GPU present: a100 or h100 (no GPU needed)")
        ->check(non_empty("a100 or h100"))
        ->check(CLI::IsMember({"a100", "h100"}));
    cmd->add_option("--dtype", o->dtype, "fp16, bf16 or e4m3 (FP8)")
        ->check(non_empty("fp16, bf16 or e4m3"))
        ->check(CLI::IsMember({"fp16", "bf16", "e4m3"}))
        ->capture_default_str();
    cmd->add_option("--d-head", o->d_head, "head dimension")
        ->transform(integer_in(1, k_most_d_head))
        ->capture_default_str();
    cmd->add_option("--d-v", o->d_v,
                    "V's head dimension where it differs: 128 with --d-head 192 (default: d_head)")
        ->transform(integer_in(1, k_most_d_head));
    cmd->add_option("--seq", o->seq, "query sequence length (and key length unless --seq-k)")
        ->transform(seq_length())
        ->capture_default_str();
    cmd->add_option("--seq-k", o->seq_k, "key/value sequence length")->transform(seq_length());
    cmd->add_option("--batch", o->batch, "batch size")
        ->transform(batch_size())
        ->capture_default_str();
    cmd->add_option("--heads", o->heads, "query heads")
        ->transform(head_count())
        ->capture_default_str();
    cmd->add_option("--heads-kv", o->heads_kv, "key/value heads, dividing --heads")
        ->transform(head_count());
    cmd->add_flag("--causal", o->causal, "causal masking, aligned at the bottom right");
    cmd->add_flag("--backward", o->backward,
                  "the backward pass's kernel: the one backward() runs for the problem");
    add_deterministic_option(*cmd, o->deterministic);
    cmd->callback([o, &action] { action = [o] { return choose(*o); }; });
}

}  // namespace flash_attention::cli
