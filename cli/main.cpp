// flash_attention: list, run, benchmark and tune the library's attention kernels.

#include "app.hpp"

int main(int argc, char** argv) {
    return flash_attention::cli::run_cli(argc, argv);
}
