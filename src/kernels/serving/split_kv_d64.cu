#include "kernels/serving/launch_split.cuh"

template void flash_attention::serving::launch_d_head<64>(const SplitKvArgs&, DType, std::int64_t,
                                                          int, Stream);
