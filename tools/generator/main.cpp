// generate_kernels --set NAME --shards N [--sm90-shards M] --out DIR
// Writes the kernel translation units and the registry table for a kernel set. A file
// whose contents did not change is left untouched, so the build recompiles only the
// shards that changed.

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "flash_attention/error.hpp"
#include "generator/generator.hpp"

int main(int argc, char** argv) {
    CLI::App app{"Generates kernel instantiations and the registry table for a kernel set"};
    std::string set;
    int shards = 8;
    int sm90_shards = 0;
    std::filesystem::path out;
    app.add_option(
           "--set", set,
           "kernel set (ci, progression, progression-all, progression-sm90, tune, tune-sm80, "
           "tune-sm90, all)")
        ->required();
    app.add_option("--shards", shards, "number of kernel translation units")
        ->check(CLI::PositiveNumber);
    app.add_option("--sm90-shards", sm90_shards,
                   "translation units for the sm90 family (0: leave the family out)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--out", out, "output folder")->required();
    CLI11_PARSE(app, argc, argv);

    try {
        std::filesystem::create_directories(out);
        for (const auto& [name, contents] :
             flash_attention::generator::generate(set, shards, sm90_shards)) {
            const auto path = out / name;
            std::ifstream old(path, std::ios::binary);
            std::stringstream existing;
            existing << old.rdbuf();
            if (old && existing.str() == contents)
                continue;
            old.close();
            const auto tmp = path.string() + ".tmp";
            std::ofstream(tmp, std::ios::binary) << contents;
            std::filesystem::rename(tmp, path);
        }
    } catch (const flash_attention::Error& e) {
        std::cerr << "generate_kernels: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "generate_kernels: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
