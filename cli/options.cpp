#include "options.hpp"

#include <sstream>

#include "config/config_space.hpp"
#include "flash_attention/error.hpp"

namespace flash_attention::cli {

std::vector<int> parse_int_list(const std::string& text, const std::string& option) {
    std::vector<int> values;
    std::stringstream list(text);
    for (std::string item; std::getline(list, item, ',');) {
        std::size_t used = 0;
        long v = 0;
        try {
            v = std::stol(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (item.empty() || used != item.size() || v <= 0 || v > 1 << 30) {
            throw UsageError(option +
                             ": expected a comma-separated list of positive integers, got \"" +
                             text + "\"");
        }
        values.push_back(static_cast<int>(v));
    }
    if (values.empty())
        throw UsageError(option + ": expected at least one value, got \"\"");
    return values;
}

std::vector<DType> parse_dtype_list(const std::string& text, const std::string& option) {
    std::vector<DType> values;
    std::stringstream list(text);
    for (std::string item; std::getline(list, item, ',');) {
        if (item == "fp16") {
            values.push_back(DType::FP16);
        } else if (item == "bf16") {
            values.push_back(DType::BF16);
        } else {
            throw UsageError(option + ": expected a comma-separated list of fp16 and bf16, got \"" +
                             text + "\"");
        }
    }
    if (values.empty())
        throw UsageError(option + ": expected at least one dtype, got \"\"");
    return values;
}

KernelConfig parse_config(const std::string& short_form, const std::string& option) {
    try {
        return KernelConfig::parse(short_form);
    } catch (const Error& e) {
        throw UsageError(option + ": " + e.what());
    }
}

CLI::Validator set_name_validator() {
    return CLI::Validator(
        [](std::string& name) -> std::string {
            try {
                space::named_set(name);
            } catch (const Error& e) {
                return e.what();
            }
            return {};
        },
        "SET");
}

void GridOptions::add_to(CLI::App& cmd) {
    cmd.add_option("--seq", seqs, "comma-separated sequence lengths (seq_q = seq_k)")
        ->capture_default_str();
    cmd.add_option("--d-head", d_heads,
                   "comma-separated head dims (default: those of the configs, else 128)");
    cmd.add_option("--dtype", dtypes,
                   "comma-separated dtypes, fp16/bf16 (default: those of the configs, else bf16)");
    cmd.add_option("--batch", batch, "batch size (default 16384/seq: 16k tokens)")
        ->check(positive_integer);
    cmd.add_option("--heads", heads, "heads (default 2048/d_head: hidden size 2048)")
        ->check(positive_integer);
}

}  // namespace flash_attention::cli
