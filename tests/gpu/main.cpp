// GPU test entry point: without a CUDA device every test would be skipped, so say
// why once and exit with 77, which CTest reports as "skipped" rather than "passed".

#include <gtest/gtest.h>

#include <iostream>

#include "flash_attention/tools.hpp"

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    if (GTEST_FLAG_GET(list_tests))
        return RUN_ALL_TESTS();
    if (flash_attention::device_count() == 0) {
        std::cout << "SKIPPED: no CUDA device on this machine; the GPU tests run on the device "
                     "machine (docs/PERF.md records their results)\n";
        return 77;
    }
    std::cout << "device: " << flash_attention::DeviceProperties::current().description() << "\n";
    return RUN_ALL_TESTS();
}
