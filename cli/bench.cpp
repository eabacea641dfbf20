#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "commands.hpp"
#include "config/config_space.hpp"
#include "measure.hpp"
#include "registry/registry.hpp"

namespace flash_attention::cli {

namespace {

std::atomic<bool> g_interrupted{false};

struct BenchOptions {
    std::string set;
    std::vector<std::string> configs;
    bool best = false;
    std::string seqs = "512,1024,2048,4096,8192,16384";
    std::string d_heads;
    std::string dtypes;
    int batch = 0;  // 0: 16384 / seq (16k tokens in total)
    int heads = 0;  // 0: 2048 / d_head (hidden size 2048)
    int warmup = 5;
    int runs = 20;
    std::string format = "table";
};

std::vector<int> parse_int_list(const std::string& text, const char* option) {
    std::vector<int> values;
    std::stringstream list(text);
    for (std::string item; std::getline(list, item, ',');) {
        std::size_t used = 0;
        int v = 0;
        try {
            v = std::stoi(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != item.size() || item.empty() || v <= 0) {
            throw UsageError(std::string(option) +
                             ": expected a comma-separated list of positive "
                             "integers, got \"" +
                             text + "\"");
        }
        values.push_back(v);
    }
    if (values.empty())
        throw UsageError(std::string(option) + ": expected at least one value, got \"\"");
    return values;
}

std::vector<DType> parse_dtype_list(const std::string& text) {
    std::vector<DType> values;
    std::stringstream list(text);
    for (std::string item; std::getline(list, item, ',');) {
        if (item == "fp16") {
            values.push_back(DType::FP16);
        } else if (item == "bf16") {
            values.push_back(DType::BF16);
        } else {
            throw UsageError("--dtype: expected a comma-separated list of fp16 and bf16, got \"" +
                             text + "\"");
        }
    }
    return values;
}

// A config, or the automatic choice (nullopt), benchmarked on its shapes.
struct Candidate {
    std::optional<KernelConfig> config;
    std::string label() const { return config ? config->to_string() : "automatic choice"; }
};

std::vector<Candidate> selected(const BenchOptions& o) {
    std::vector<Candidate> out;
    if (!o.set.empty()) {
        int not_built = 0;
        for (const KernelConfig& c : space::named_set(o.set)) {
            if (is_built(c)) {
                out.push_back({c});
            } else {
                ++not_built;
            }
        }
        if (not_built > 0) {
            std::cerr << "flash_attention bench: " << not_built << " configs of set \"" << o.set
                      << "\" are not in this build (kernel set \"" << built_kernel_set()
                      << "\") and are skipped\n";
        }
        if (out.empty()) {
            throw UsageError("--set: expected a set with configs in this build (kernel set \"" +
                             std::string(built_kernel_set()) + "\"), got \"" + o.set + "\"");
        }
    }
    for (const std::string& s : o.configs) {
        const KernelConfig c = KernelConfig::parse(s);
        if (!is_built(c)) {
            throw UsageError(
                "--config: expected a config in this build (see flash_attention list), got " + s);
        }
        out.push_back({c});
    }
    if (o.best || out.empty())
        out.push_back({std::nullopt});
    return out;
}

Shape shape_for(DType dtype, int d_head, int seq, const BenchOptions& o) {
    const int batch = o.batch > 0 ? o.batch : std::max(1, 16384 / seq);
    const int heads = o.heads > 0 ? o.heads : std::max(1, 2048 / d_head);
    return {dtype, d_head, batch, heads, seq, seq};
}

void progress(std::size_t done, std::size_t total) {
    if (!isatty(STDERR_FILENO))
        return;
    const int width = 40;
    const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
    std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu", filled, "########################################",
                 width - filled, "", done, total);
    if (done == total)
        std::fprintf(stderr, "\r%*s\r", width + 24, "");
    std::fflush(stderr);
}

void print(const std::vector<Measurement>& results, const std::vector<std::string>& labels,
           const std::string& format) {
    // Harmonic mean per label over the sequence lengths measured.
    std::vector<std::pair<std::string, std::vector<Measurement>>> by_label;
    for (std::size_t i = 0; i < results.size(); ++i) {
        if (by_label.empty() || by_label.back().first != labels[i])
            by_label.push_back({labels[i], {}});
        by_label.back().second.push_back(results[i]);
    }

    if (format == "json") {
        nlohmann::json j;
        j["device"] = current_device_description();
        j["measurements"] = nlohmann::json::array();
        for (std::size_t i = 0; i < results.size(); ++i) {
            const Measurement& m = results[i];
            j["measurements"].push_back({{"config", labels[i]},
                                         {"kernel", m.config.to_string()},
                                         {"dtype", to_string(m.shape.dtype)},
                                         {"d_head", m.shape.d_head},
                                         {"batch", m.shape.batch},
                                         {"heads", m.shape.heads},
                                         {"seq_q", m.shape.seq_q},
                                         {"seq_k", m.shape.seq_k},
                                         {"median_ms", m.median_ms},
                                         {"min_ms", m.min_ms},
                                         {"max_ms", m.max_ms},
                                         {"runs", m.runs},
                                         {"tflops", m.tflops()}});
        }
        for (const auto& [label, ms] : by_label)
            j["harmonic_mean_tflops"][label] = harmonic_mean_tflops(ms);
        std::cout << j.dump(2) << "\n";
        return;
    }
    if (format == "csv") {
        std::printf(
            "config,kernel,dtype,d_head,batch,heads,seq_q,seq_k,median_ms,min_ms,max_ms,runs,"
            "tflops\n");
        for (std::size_t i = 0; i < results.size(); ++i) {
            const Measurement& m = results[i];
            std::printf("\"%s\",\"%s\",%s,%d,%d,%d,%d,%d,%.5f,%.5f,%.5f,%d,%.2f\n",
                        labels[i].c_str(), m.config.to_string().c_str(),
                        std::string(to_string(m.shape.dtype)).c_str(), m.shape.d_head,
                        m.shape.batch, m.shape.heads, m.shape.seq_q, m.shape.seq_k, m.median_ms,
                        m.min_ms, m.max_ms, m.runs, m.tflops());
        }
        return;
    }
    std::printf("# device: %s\n", current_device_description().c_str());
    std::printf("%-86s %5s %5s %5s %5s %9s %10s %8s\n", "config", "d", "batch", "heads", "seq",
                "median_ms", "spread_%", "TFLOP/s");
    for (std::size_t i = 0; i < results.size(); ++i) {
        const Measurement& m = results[i];
        std::printf("%-86s %5d %5d %5d %5d %9.4f %10.1f %8.1f\n", labels[i].c_str(), m.shape.d_head,
                    m.shape.batch, m.shape.heads, m.shape.seq_q, m.median_ms, 100 * m.spread(),
                    m.tflops());
    }
    std::printf("\n%-86s %8s\n", "harmonic mean over sequence lengths", "TFLOP/s");
    for (const auto& [label, ms] : by_label) {
        std::printf("%-86s %8.1f\n", label.c_str(), harmonic_mean_tflops(ms));
    }
}

int bench(const BenchOptions& o) {
    const std::vector<Candidate> candidates = selected(o);
    const std::vector<int> seqs = parse_int_list(o.seqs, "--seq");
    const std::vector<int> d_filter =
        o.d_heads.empty() ? std::vector<int>{} : parse_int_list(o.d_heads, "--d-head");
    const std::vector<DType> dtype_filter =
        o.dtypes.empty() ? std::vector<DType>{} : parse_dtype_list(o.dtypes);
    if (cuda_device_count() == 0) {
        std::cerr << "flash_attention: no CUDA device found\n";
        return exit_failure;
    }
    const auto wanted = [](const auto& filter, auto v) {
        return filter.empty() || std::find(filter.begin(), filter.end(), v) != filter.end();
    };

    // (shape, candidate) pairs, grouped by shape so each workspace is built once.
    std::map<std::tuple<int, int, int>, std::vector<std::size_t>> by_shape;  // (dtype, d, seq)
    for (std::size_t i = 0; i < candidates.size(); ++i) {
        const auto& c = candidates[i].config;
        std::vector<DType> dtypes =
            c ? std::vector<DType>{c->dtype}
              : (dtype_filter.empty() ? std::vector<DType>{DType::BF16} : dtype_filter);
        std::vector<int> ds =
            c ? std::vector<int>{c->d_head} : (d_filter.empty() ? std::vector<int>{128} : d_filter);
        for (const DType dt : dtypes) {
            for (const int d : ds) {
                if (!wanted(dtype_filter, dt) || !wanted(d_filter, d))
                    continue;
                for (const int seq : seqs) {
                    if (c && (seq % c->B_r != 0 || seq % c->B_c != 0))
                        continue;
                    by_shape[{static_cast<int>(dt), d, seq}].push_back(i);
                }
            }
        }
    }
    if (by_shape.empty()) {
        throw UsageError("no built kernel supports the requested shapes (--seq " + o.seqs +
                         (o.d_heads.empty() ? "" : ", --d-head " + o.d_heads) +
                         (o.dtypes.empty() ? "" : ", --dtype " + o.dtypes) + ")");
    }
    std::size_t total = 0;
    for (const auto& [key, list] : by_shape)
        total += list.size();

    const auto previous = std::signal(SIGINT, [](int) { g_interrupted = true; });
    std::vector<Measurement> results;
    std::vector<std::string> labels;
    std::vector<std::size_t> candidate_of;
    std::size_t done = 0;
    const std::uint64_t seed = std::random_device{}();
    for (const auto& [key, list] : by_shape) {
        if (g_interrupted)
            break;
        const auto [dt, d, seq] = key;
        const Workspace workspace(shape_for(static_cast<DType>(dt), d, seq, o), seed + seq);
        for (const std::size_t i : list) {
            if (g_interrupted)
                break;
            const KernelConfig config =
                candidates[i].config.value_or(choose_config(workspace.params(0)));
            results.push_back(measure(config, workspace, o.warmup, o.runs));
            labels.push_back(candidates[i].label());
            candidate_of.push_back(i);
            progress(++done, total);
        }
    }
    std::signal(SIGINT, previous);
    if (g_interrupted) {
        std::cerr << "\nflash_attention bench: interrupted; " << results.size() << " of " << total
                  << " measurements done\n";
    }
    // Report in selection order (the ladder stays a ladder), then by shape.
    std::vector<std::size_t> order(results.size());
    for (std::size_t i = 0; i < order.size(); ++i)
        order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return std::tie(candidate_of[a], results[a].shape.d_head, results[a].shape.seq_q) <
               std::tie(candidate_of[b], results[b].shape.d_head, results[b].shape.seq_q);
    });
    std::vector<Measurement> sorted_results;
    std::vector<std::string> sorted_labels;
    for (const std::size_t i : order) {
        sorted_results.push_back(results[i]);
        sorted_labels.push_back(labels[i]);
    }
    print(sorted_results, sorted_labels, o.format);
    return g_interrupted ? exit_failure : exit_ok;
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action) {
    auto o = std::make_shared<BenchOptions>();
    CLI::App* cmd = app.add_subcommand(
        "bench", "Benchmark configs over sequence lengths (median of timed runs, L2-cold inputs)");
    const auto names = space::set_names();
    cmd->add_option("--set", o->set, "benchmark the built configs of a named set")
        ->check(CLI::IsMember(std::vector<std::string>(names.begin(), names.end())));
    cmd->add_option("--config", o->configs, "a config short form (repeatable)");
    cmd->add_flag("--best", o->best,
                  "the library's automatic choice (the default without --set/--config)");
    cmd->add_option("--seq", o->seqs, "comma-separated sequence lengths")->capture_default_str();
    cmd->add_option("--d-head", o->d_heads,
                    "comma-separated head dims to keep (automatic choice: default 128)");
    cmd->add_option("--dtype", o->dtypes,
                    "comma-separated dtypes to keep, fp16/bf16 (automatic choice: default bf16)");
    cmd->add_option("--batch", o->batch, "batch size (default 16384/seq: 16k tokens)")
        ->check(positive_integer);
    cmd->add_option("--heads", o->heads, "heads (default 2048/d_head: hidden size 2048)")
        ->check(positive_integer);
    cmd->add_option("--warmup", o->warmup, "untimed runs per measurement")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--runs", o->runs, "timed runs per measurement")
        ->check(positive_integer)
        ->capture_default_str();
    cmd->add_option("--format", o->format, "table, csv or json")
        ->check(CLI::IsMember({"table", "csv", "json"}))
        ->capture_default_str();
    cmd->callback([o, &action] { action = [o] { return bench(*o); }; });
}

}  // namespace flash_attention::cli
