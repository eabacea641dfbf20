// generate_kernels --set NAME --shards N [--sm90-shards M] --out DIR
// Writes the kernel translation units and the registry table for a kernel set. A file
// whose contents did not change is left untouched, so the build recompiles only the
// shards that changed. A build-time tool with four options: it parses them itself, so
// a library-only build needs no command-line library.

#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

#include "flash_attention/error.hpp"
#include "generator/generator.hpp"

namespace {

int usage(const std::string& problem) {
    std::cerr << "generate_kernels: " << problem
              << "\nusage: generate_kernels --set NAME --shards N [--sm90-shards M] --out DIR\n";
    return 2;
}

bool to_int(std::string_view text, int minimum, int& value) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    return ec == std::errc() && end == text.data() + text.size() && value >= minimum;
}

}  // namespace

int main(int argc, char** argv) {
    std::map<std::string, std::string> options{{"--shards", "8"}, {"--sm90-shards", "0"}};
    for (int i = 1; i < argc; i += 2) {
        const std::string name = argv[i];
        if (name != "--set" && name != "--shards" && name != "--sm90-shards" && name != "--out")
            return usage("unknown option \"" + name + "\"");
        if (i + 1 >= argc)
            return usage(name + ": expected a value");
        options[name] = argv[i + 1];
    }
    if (!options.contains("--set") || !options.contains("--out"))
        return usage("--set and --out are required");
    int shards = 0;
    int sm90_shards = 0;
    if (!to_int(options["--shards"], 1, shards))
        return usage("--shards: expected a positive integer, got \"" + options["--shards"] + "\"");
    if (!to_int(options["--sm90-shards"], 0, sm90_shards)) {
        return usage("--sm90-shards: expected a non-negative integer, got \"" +
                     options["--sm90-shards"] + "\"");
    }
    const std::filesystem::path out = options["--out"];

    try {
        std::filesystem::create_directories(out);
        for (const auto& [name, contents] :
             flash_attention::generator::generate(options["--set"], shards, sm90_shards)) {
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
