// Links the installed library and asks it what a user asks first, without a GPU: its
// version, its kernels, and which one runs on an H100.

#include <flash_attention/flash_attention.hpp>

#include <cstdio>

int main() {
    namespace fa = flash_attention;
    const fa::ProblemShape problem{.dtype = fa::DType::BF16,
                                   .d_head = 128,
                                   .seq_q = 4096,
                                   .seq_k = 4096,
                                   .heads = 16,
                                   .heads_kv = 16};
    const fa::KernelConfig chosen = fa::choose_config(problem, fa::DeviceProperties::model("h100"));
    std::printf("flash_attention %s, %zu kernels; on an H100: %s\n",
                std::string(fa::version()).c_str(), fa::configs().size(),
                chosen.to_string().c_str());
    return fa::configs().empty() ? 1 : 0;
}
