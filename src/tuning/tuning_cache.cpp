#include "tuning/tuning_cache.hpp"

#include <unistd.h>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "flash_attention/error.hpp"

namespace flash_attention::tuning {

namespace {

constexpr int k_format_version = 1;

DType parse_dtype(const std::string& s) {
    if (s == "FP16")
        return DType::FP16;
    if (s == "BF16")
        return DType::BF16;
    throw std::invalid_argument("unknown dtype \"" + s + "\"");
}

nlohmann::json entry_json(const Entry& e) {
    nlohmann::json j = {{"gpu", e.key.gpu},
                        {"sm_count", e.key.sm_count},
                        {"dtype", std::string(to_string(e.key.dtype))},
                        {"d_head", e.key.d_head},
                        {"seq_bucket", e.key.seq_bucket},
                        {"causal", e.key.causal},
                        {"config", e.config.to_string()},
                        {"tflops", e.tflops},
                        {"measured", e.measured}};
    if (e.runner_up) {
        j["runner_up"] = e.runner_up->to_string();
        j["runner_up_tflops"] = e.runner_up_tflops;
    }
    return j;
}

Entry entry_from_json(const nlohmann::json& j) {
    Entry e;
    e.key.gpu = j.at("gpu").get<std::string>();
    e.key.sm_count = j.at("sm_count").get<int>();
    e.key.dtype = parse_dtype(j.at("dtype").get<std::string>());
    e.key.d_head = j.at("d_head").get<int>();
    e.key.seq_bucket = j.at("seq_bucket").get<int>();
    e.key.causal = j.value("causal", false);
    e.config = KernelConfig::parse(j.at("config").get<std::string>());
    e.tflops = j.value("tflops", 0.0);
    if (j.contains("runner_up")) {
        e.runner_up = KernelConfig::parse(j.at("runner_up").get<std::string>());
        e.runner_up_tflops = j.value("runner_up_tflops", 0.0);
    }
    e.measured = j.value("measured", "");
    return e;
}

}  // namespace

std::string Key::to_string() const {
    return gpu + " (" + std::to_string(sm_count) + " SMs), " +
           std::string(flash_attention::to_string(dtype)) + ", d_head " + std::to_string(d_head) +
           ", seq <= " + std::to_string(seq_bucket) + (causal ? ", causal" : "");
}

int seq_bucket(long long seq_q, long long seq_k) {
    const long long seq = std::max(seq_q, seq_k);
    long long bucket = 64;
    while (bucket < seq && bucket < (1LL << 30))
        bucket *= 2;
    return static_cast<int>(bucket);
}

std::filesystem::path default_path() {
    if (const char* p = std::getenv("FLASH_ATTENTION_TUNING"); p && *p)
        return p;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
        return std::filesystem::path(x) / "flash_attention" / "tuning.json";
    }
    if (const char* h = std::getenv("HOME"); h && *h) {
        return std::filesystem::path(h) / ".cache" / "flash_attention" / "tuning.json";
    }
    return "flash_attention_tuning.json";
}

LoadResult parse(const std::string& text, const std::string& source) {
    LoadResult result;
    nlohmann::json doc;
    try {
        doc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        result.corrupt = true;
        result.warnings.push_back("tuning cache " + source + " is not valid JSON (" + e.what() +
                                  ")");
        return result;
    }
    if (!doc.is_object() || !doc.contains("entries") || !doc["entries"].is_array()) {
        result.corrupt = true;
        result.warnings.push_back("tuning cache " + source + " has no \"entries\" list");
        return result;
    }
    if (doc.value("version", 0) != k_format_version) {
        result.corrupt = true;
        result.warnings.push_back("tuning cache " + source + " has format version " +
                                  doc.value("version", nlohmann::json(nullptr)).dump() +
                                  ", expected " + std::to_string(k_format_version));
        return result;
    }
    int skipped = 0;
    std::string first_problem;
    for (const auto& j : doc["entries"]) {
        try {
            result.entries.push_back(entry_from_json(j));
        } catch (const std::exception& e) {
            if (skipped++ == 0)
                first_problem = e.what();
        }
    }
    if (skipped > 0) {
        result.warnings.push_back("tuning cache " + source + ": skipped " +
                                  std::to_string(skipped) +
                                  " malformed entries (first: " + first_problem + ")");
    }
    return result;
}

LoadResult load(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
        return {};
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        LoadResult r;
        r.corrupt = true;
        r.warnings.push_back("tuning cache " + path.string() + " cannot be read");
        return r;
    }
    std::stringstream text;
    text << in.rdbuf();
    return parse(text.str(), path.string());
}

std::string to_json(const std::vector<Entry>& entries) {
    nlohmann::json doc = {{"version", k_format_version}, {"entries", nlohmann::json::array()}};
    for (const Entry& e : entries)
        doc["entries"].push_back(entry_json(e));
    return doc.dump(2) + "\n";
}

std::vector<Entry> merge(std::vector<Entry> existing, const std::vector<Entry>& updates) {
    for (const Entry& u : updates) {
        std::erase_if(existing, [&](const Entry& e) { return e.key == u.key; });
        existing.push_back(u);
    }
    std::sort(existing.begin(), existing.end(),
              [](const Entry& a, const Entry& b) { return a.key < b.key; });
    return existing;
}

void save_atomically(const std::filesystem::path& path, const std::vector<Entry>& entries) {
    const auto fail = [&](const std::string& what) {
        throw Error(ErrorCode::invalid_argument,
                    "tuning cache " + path.string() + ": expected a writable file, got " + what);
    };
    std::error_code ec;
    if (path.has_parent_path())
        std::filesystem::create_directories(path.parent_path(), ec);
    if (ec)
        fail("a folder that cannot be created (" + ec.message() + ")");
    const std::filesystem::path tmp =
        path.string() + ".tmp." + std::to_string(static_cast<long>(getpid()));
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << to_json(entries);
        out.flush();
        if (!out)
            fail("a write error on " + tmp.string());
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        fail("a failed rename (" + ec.message() + ")");
    }
}

namespace {

struct ProcessCache {
    std::mutex mutex;
    bool loaded = false;
    std::map<Key, KernelConfig> index;
};

ProcessCache& process_cache() {
    static ProcessCache cache;
    return cache;
}

}  // namespace

std::optional<KernelConfig> lookup(const Key& key) {
    ProcessCache& cache = process_cache();
    const std::lock_guard lock(cache.mutex);
    if (!cache.loaded) {
        cache.loaded = true;
        const LoadResult r = load(default_path());
        for (const std::string& w : r.warnings) {
            std::cerr << "flash_attention: warning: " << w << "; using the built-in table\n";
        }
        for (const Entry& e : r.entries)
            cache.index[e.key] = e.config;
    }
    const auto it = cache.index.find(key);
    if (it == cache.index.end())
        return std::nullopt;
    return it->second;
}

void reload() {
    ProcessCache& cache = process_cache();
    const std::lock_guard lock(cache.mutex);
    cache.loaded = false;
    cache.index.clear();
}

}  // namespace flash_attention::tuning
