#include "kernels/serving/launch_split.cuh"

namespace flash_attention::serving {

void launch_d64(const SplitKvArgs& args, DType dtype, std::int64_t max_seq_k, int splits,
                Stream stream) {
    if (dtype == DType::BF16)
        launch_for<DType::BF16, 64>(args, max_seq_k, splits, stream);
    else
        launch_for<DType::FP16, 64>(args, max_seq_k, splits, stream);
}

}  // namespace flash_attention::serving
