#include "tuning/tuning_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>
#include <utility>

#include "common/small_file.hpp"
#include "common/text.hpp"
#include "flash_attention/error.hpp"

namespace flash_attention::tuning {

namespace {

constexpr int k_format_version = 1;

// Bounds generous for any real GPU and problem; they keep hostile values out of ints.
constexpr std::size_t k_max_text = 256;
constexpr int k_max_sm_count = 1 << 16;
constexpr int k_max_d_head = 1 << 16;

// What one entry field may hold; anything else makes the entry malformed.
std::string string_field(const nlohmann::json& j, const char* name, std::size_t max_length) {
    const nlohmann::json& v = j.at(name);
    if (!v.is_string() || v.get_ref<const std::string&>().size() > max_length) {
        throw std::invalid_argument(std::string("\"") + name + "\" is not a string of at most " +
                                    std::to_string(max_length) + " characters");
    }
    return v.get<std::string>();
}

int int_field(const nlohmann::json& j, const char* name, int min, int max) {
    const nlohmann::json& v = j.at(name);
    if (!v.is_number_integer() || v.get<long long>() < min || v.get<long long>() > max) {
        throw std::invalid_argument(std::string("\"") + name + "\" is not an integer in [" +
                                    std::to_string(min) + ", " + std::to_string(max) + "]");
    }
    return static_cast<int>(v.get<long long>());
}

double number_field(const nlohmann::json& j, const char* name) {
    if (!j.contains(name))
        return 0;
    const nlohmann::json& v = j.at(name);
    if (!v.is_number())
        throw std::invalid_argument(std::string("\"") + name + "\" is not a number");
    return v.get<double>();
}

bool bool_field(const nlohmann::json& j, const char* name) {
    if (!j.contains(name))
        return false;
    if (!j.at(name).is_boolean())
        throw std::invalid_argument(std::string("\"") + name + "\" is not a boolean");
    return j.at(name).get<bool>();
}

// In Pass's order.
constexpr std::array<std::string_view, 3> k_pass_names = {"forward", "backward",
                                                          "backward-deterministic"};

// The enum value named `s` among `names` (in the enum's order).
template <class E, std::size_t N>
E parse_named(const std::array<std::string_view, N>& names, const std::string& s, const char* what,
              const char* expected) {
    for (std::size_t i = 0; i < N; ++i) {
        if (s == names[i])
            return static_cast<E>(i);
    }
    throw std::invalid_argument("unknown " + std::string(what) + " \"" + s + "\" (expected " +
                                expected + ")");
}

// In Lengths's order.
constexpr std::array<std::string_view, 3> k_lengths_names = {"general", "few-queries",
                                                             "short-keys"};

Lengths parse_lengths(const std::string& s) {
    return parse_named<Lengths>(k_lengths_names, s, "lengths",
                                "general, few-queries or short-keys");
}

Pass parse_pass(const std::string& s) {
    return parse_named<Pass>(k_pass_names, s, "pass",
                             "forward, backward or backward-deterministic");
}

// A config fit for an entry of `pass`: a backward key's is a backward config (a deterministic
// one for backward-deterministic), a forward key's a forward config. Any other config is no
// winner `tune` writes for that key: the entry is malformed, and said so, rather than
// silently never chosen.
KernelConfig config_field(const nlohmann::json& j, const char* name, Pass pass) {
    const KernelConfig c = KernelConfig::parse(string_field(j, name, k_max_text));
    if (c.backward != (pass != Pass::forward)) {
        throw std::invalid_argument(std::string("\"") + name + "\" is a " +
                                    (c.backward ? "backward" : "forward") + " config in a " +
                                    std::string(to_string(pass)) + " entry");
    }
    if (pass == Pass::backward_deterministic && !is_deterministic(c)) {
        throw std::invalid_argument(std::string("\"") + name +
                                    "\" is not a deterministic config (sm80, or sm90 with "
                                    "ordered) in a backward-deterministic entry");
    }
    return c;
}

DType parse_dtype(const std::string& s) {
    if (s == "FP16")
        return DType::FP16;
    if (s == "BF16")
        return DType::BF16;
    if (s == "E4M3")  // FP8: `tune --dtype e4m3` writes such entries
        return DType::E4M3;
    throw std::invalid_argument("unknown dtype \"" + s + "\"");
}

nlohmann::json entry_json(const Entry& e) {
    nlohmann::json j = {{"gpu", e.key.gpu},
                        {"sm_count", e.key.sm_count},
                        {"dtype", std::string(to_string(e.key.dtype))},
                        {"d_head", e.key.d_head},
                        {"seq_bucket", e.key.seq_bucket},
                        {"causal", e.key.causal},
                        {"tflops", e.tflops},
                        {"measured", e.measured}};
    if (e.key.pass != Pass::forward)
        j["pass"] = std::string(to_string(e.key.pass));
    if (e.key.d_v != 0)
        j["d_v"] = e.key.d_v;
    if (e.key.window_or_softcap)
        j["window_or_softcap"] = true;
    if (e.key.lengths != Lengths::general)
        j["lengths"] = std::string(to_string(e.key.lengths));
    if (e.key.paged)
        j["paged"] = true;
    if (e.key.rows_bucket > 0) {
        j["rows_bucket"] = e.key.rows_bucket;
        j["splits"] = e.splits;
        if (e.runner_up_splits > 0) {
            j["runner_up_splits"] = e.runner_up_splits;
            j["runner_up_tflops"] = e.runner_up_tflops;
        }
        return j;
    }
    j["config"] = e.config.to_string();
    if (e.runner_up) {
        j["runner_up"] = e.runner_up->to_string();
        j["runner_up_tflops"] = e.runner_up_tflops;
    }
    return j;
}

Entry entry_from_json(const nlohmann::json& j) {
    if (!j.is_object())
        throw std::invalid_argument("an entry is not an object");
    Entry e;
    e.key.gpu = string_field(j, "gpu", k_max_text);
    e.key.sm_count = int_field(j, "sm_count", 1, k_max_sm_count);
    e.key.dtype = parse_dtype(string_field(j, "dtype", k_max_text));
    e.key.d_head = int_field(j, "d_head", 1, k_max_d_head);
    if (j.contains("d_v"))
        e.key.d_v = int_field(j, "d_v", 1, k_max_d_head);
    e.key.seq_bucket = int_field(j, "seq_bucket", 1, std::numeric_limits<int>::max());
    e.key.causal = bool_field(j, "causal");
    e.key.paged = bool_field(j, "paged");
    e.key.window_or_softcap = bool_field(j, "window_or_softcap");
    if (j.contains("lengths"))
        e.key.lengths = parse_lengths(string_field(j, "lengths", k_max_text));
    if (j.contains("pass"))
        e.key.pass = parse_pass(string_field(j, "pass", k_max_text));
    // The backward pass takes no variants and has no split-KV kernel: such a key would never
    // be asked for.
    if (e.key.pass != Pass::forward &&
        (e.key.window_or_softcap || e.key.paged || j.contains("rows_bucket"))) {
        throw std::invalid_argument(
            "a " + std::string(to_string(e.key.pass)) +
            " entry has \"window_or_softcap\", \"paged\" or \"rows_bucket\"");
    }
    e.tflops = number_field(j, "tflops");
    if (j.contains("measured"))
        e.measured = string_field(j, "measured", k_max_text);
    if (j.contains("rows_bucket")) {
        // Key::of_splits: the rows bucket tells the proportions.
        if (j.contains("lengths"))
            throw std::invalid_argument("a split count's entry has \"lengths\"");
        e.key.rows_bucket = int_field(j, "rows_bucket", 1, std::numeric_limits<int>::max());
        e.splits = int_field(j, "splits", 1, k_max_splits);
        if (j.contains("runner_up_splits")) {
            e.runner_up_splits = int_field(j, "runner_up_splits", 1, k_max_splits);
            e.runner_up_tflops = number_field(j, "runner_up_tflops");
        }
        return e;
    }
    e.config = config_field(j, "config", e.key.pass);
    if (j.contains("runner_up")) {
        e.runner_up = config_field(j, "runner_up", e.key.pass);
        e.runner_up_tflops = number_field(j, "runner_up_tflops");
    }
    return e;
}

// A cache nests three levels (the document, its entries, an entry). nlohmann's parser
// builds any depth, but dump(), copies and comparisons recurse once per level (and so does
// the destructor in older releases): a "version" nested 100,000 levels deep overflowed the
// stack in dump(). Counting brackets before parsing bounds every later walk of the
// document.
constexpr int k_max_depth = 32;

// Whether arrays and objects in `text` nest deeper than `limit` (brackets inside strings
// are text). Only a bound: the parser still judges whether the text is JSON.
bool nests_deeper_than(std::string_view text, int limit) {
    int depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;  // the escaped character cannot end the string
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > limit)
                return true;
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return false;
}

LoadResult corrupt(const std::string& warning) {
    LoadResult r;
    r.corrupt = true;
    // The warning may quote the file (a JSON parser's last token) and its path: escaped.
    r.warnings.push_back(printable(warning, 1000));
    return r;
}

[[noreturn]] void write_failure(const std::filesystem::path& path, const std::string& what) {
    throw Error(ErrorCode::invalid_argument,
                "tuning cache " + path.string() + ": expected a writable file, got " + what);
}

std::string errno_text() {
    return std::strerror(errno);
}

}  // namespace

std::string_view to_string(Pass pass) {
    return k_pass_names.at(static_cast<std::size_t>(pass));
}

std::string_view to_string(Lengths lengths) {
    return k_lengths_names.at(static_cast<std::size_t>(lengths));
}

Lengths lengths_of(long long seq_q, long long seq_k) {
    if (seq_q <= k_few_queries && seq_q < seq_k)
        return Lengths::few_queries;
    return seq_k <= k_short_keys && seq_k < seq_q ? Lengths::short_keys : Lengths::general;
}

std::string Key::to_string() const {
    return gpu + " (" + std::to_string(sm_count) + " SMs), " +
           std::string(flash_attention::to_string(dtype)) + ", d_head " + std::to_string(d_head) +
           (d_v != 0 ? ", d_v " + std::to_string(d_v) : "") +
           ", seq <= " + std::to_string(seq_bucket) +
           (lengths != Lengths::general ? ", " + std::string(tuning::to_string(lengths)) : "") +
           (causal ? ", causal" : "") + (window_or_softcap ? ", window/softcap" : "") +
           (rows_bucket > 0 ? ", split-KV rows <= " + std::to_string(rows_bucket) : "") +
           (paged ? ", paged" : "") +
           (pass != Pass::forward ? ", " + std::string(tuning::to_string(pass)) : "");
}

Key Key::of(const DeviceProperties& device, const ProblemShape& problem) {
    Key key{device.name,
            device.sm_count,
            problem.dtype,
            problem.d_head,
            tuning::seq_bucket(problem.seq_q, problem.seq_k),
            problem.causal};
    key.window_or_softcap = problem.window_or_softcap;
    key.d_v = problem.d_v;
    key.lengths = lengths_of(problem.seq_q, problem.seq_k);
    return key;
}

Key Key::of_splits(const DeviceProperties& device, const ProblemShape& problem, bool paged) {
    Key key = of(device, problem);
    key.lengths = Lengths::general;  // the rows bucket tells them
    key.paged = paged;
    long long rows = problem.seq_q * (problem.heads / std::max<long long>(problem.heads_kv, 1));
    key.rows_bucket = 1;
    while (key.rows_bucket < rows && key.rows_bucket < (1 << 30))
        key.rows_bucket *= 2;
    return key;
}

Key Key::of_backward(const DeviceProperties& device, const ProblemShape& problem,
                     bool deterministic) {
    Key key = of(device, problem);
    key.pass = deterministic ? Pass::backward_deterministic : Pass::backward;
    // A window's or softcap's backward runs instances of the same configs (their band kernels):
    // the plain problem's winner is theirs.
    key.window_or_softcap = false;
    return key;
}

int seq_bucket(long long seq_q, long long seq_k) {
    const long long seq = std::max(seq_q, seq_k);
    long long bucket = 64;
    while (bucket < seq && bucket < (1LL << 30))
        bucket *= 2;
    return static_cast<int>(bucket);
}

std::optional<std::filesystem::path> default_path() {
    if (const char* p = std::getenv("FLASH_ATTENTION_TUNING"); p && *p)
        return std::filesystem::path(p);
    // The XDG Base Directory spec: a relative path is invalid and ignored (it would name a
    // file of whatever the working directory is).
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/')
        return std::filesystem::path(x) / "flash_attention" / "tuning.json";
    if (const char* h = std::getenv("HOME"); h && *h)
        return std::filesystem::path(h) / ".cache" / "flash_attention" / "tuning.json";
    return std::nullopt;
}

LoadResult parse(const std::string& text, const std::string& source) {
    if (nests_deeper_than(text, k_max_depth)) {
        return corrupt("tuning cache " + source + " is nested more than " +
                       std::to_string(k_max_depth) + " levels deep");
    }
    nlohmann::json doc;
    try {
        doc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        return corrupt("tuning cache " + source + " is not valid JSON (" + e.what() + ")");
    }
    if (!doc.is_object() || !doc.contains("entries") || !doc["entries"].is_array())
        return corrupt("tuning cache " + source + " has no \"entries\" list");
    const auto version = doc.find("version");
    if (version == doc.end() || !version->is_number_integer() ||
        version->get<long long>() != k_format_version) {
        std::string given = version == doc.end() ? "none" : version->dump();
        if (given.size() > 40)
            given = given.substr(0, 40) + "...";
        return corrupt("tuning cache " + source + " has format version " + given + ", expected " +
                       std::to_string(k_format_version));
    }
    LoadResult result;
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
        // The problem quotes the file's text: escaped, so that a hostile cache's control
        // characters never reach the terminal (and a warning stays one line).
        result.warnings.push_back(
            "tuning cache " + source + ": skipped " + std::to_string(skipped) +
            " malformed entries (first: " + printable(first_problem, 200) + ")");
    }
    return result;
}

LoadResult load(const std::filesystem::path& path) {
    const SmallFile file = read_small_file(path, k_max_file_bytes);
    if (file.missing)
        return {};
    if (!file.problem.empty())
        return corrupt("tuning cache " + path.string() + " " + file.problem);
    return parse(file.text, path.string());
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
    std::error_code ec;
    if (path.has_parent_path())
        std::filesystem::create_directories(path.parent_path(), ec);
    if (ec)
        write_failure(path, "a folder that cannot be created (" + ec.message() + ")");
    if (const std::string problem = write_file_atomically(path, to_json(entries)); !problem.empty())
        write_failure(path, problem);
}

namespace {

std::string lock_path_of(const std::filesystem::path& path) {
    return path.string() + ".lock";
}

void create_folders(const std::filesystem::path& path) {
    std::error_code ec;
    if (path.has_parent_path())
        std::filesystem::create_directories(path.parent_path(), ec);
    if (ec)
        write_failure(path, "a folder that cannot be created (" + ec.message() + ")");
}

// An exclusive lock on `path`.lock (never a link), held while the descriptor lives. A lock
// another process holds is waited for as `wait` says: flock() alone would wait forever,
// silently, and Ctrl-C could not end the wait with the caller's exit code.
Fd lock_file(const std::filesystem::path& path, const LockWait& wait) {
    create_folders(path);
    const std::string lock_path = lock_path_of(path);
    Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (lock.get() < 0)
        write_failure(path, "no lock file " + lock_path + " (" + errno_text() + ")");
    const auto deadline = std::chrono::steady_clock::now() + wait.timeout;
    bool told = false;
    while (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno == EINTR)
            continue;
        if (errno != EWOULDBLOCK)
            write_failure(path, "no lock on " + lock_path + " (" + errno_text() + ")");
        if (!told && wait.waiting)
            wait.waiting(lock_path);
        told = true;
        if (wait.interrupted && wait.interrupted())
            throw LockNotTaken("interrupted while waiting for the lock " + lock_path, true);
        if (std::chrono::steady_clock::now() >= deadline) {
            throw LockNotTaken(
                "gave up waiting for the lock " + lock_path + " after " +
                    std::to_string(
                        std::chrono::duration_cast<std::chrono::seconds>(wait.timeout).count()) +
                    " s (another process holds it)",
                false);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return lock;
}

}  // namespace

void check_path(const std::filesystem::path& path) {
    if (const std::string problem = write_problem(path, true); !problem.empty())
        write_failure(path, problem);
    const std::string lock_path = lock_path_of(path);
    if (struct stat st{}; ::lstat(lock_path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        write_failure(path, "a lock file " + lock_path + " that is not a regular file");
}

void check_writable(const std::filesystem::path& path) {
    check_path(path);
    create_folders(path);
    std::string tmp = path.string() + std::string(k_temporary_suffix);
    const Fd fd(::mkstemp(tmp.data()));
    if (fd.get() < 0)
        write_failure(path, "no temporary file beside it (" + errno_text() + ")");
    ::unlink(tmp.c_str());
}

std::vector<std::string> update(const std::filesystem::path& path,
                                const std::vector<Entry>& entries, const LockWait& wait) {
    const Fd lock = lock_file(path, wait);
    // Under the lock: the file as the last writer left it.
    LoadResult current = load(path);
    if (current.corrupt) {
        // Kept beside the new one rather than overwritten.
        const std::string backup = path.string() + ".corrupt";
        if (::rename(path.c_str(), backup.c_str()) == 0)
            current.warnings.push_back("moved the unreadable cache to " + backup);
        current.entries.clear();
    }
    save_atomically(path, merge(std::move(current.entries), entries));
    return current.warnings;  // the lock goes with the descriptor
}

namespace {

struct ProcessCache {
    std::mutex mutex;
    bool loaded = false;
    std::map<Key, Entry> index;
};

ProcessCache& process_cache() {
    static ProcessCache cache;
    return cache;
}

// The entry of `key` in the process-wide cache, read on first use.
std::optional<Entry> cached_entry(const Key& key) {
    ProcessCache& cache = process_cache();
    const std::lock_guard lock(cache.mutex);
    if (!cache.loaded) {
        cache.loaded = true;
        if (const auto path = default_path()) {
            const LoadResult r = load(*path);
            for (const std::string& w : r.warnings) {
                std::cerr << "flash_attention: warning: " << w << "; using the built-in table\n";
            }
            for (const Entry& e : r.entries)
                cache.index[e.key] = e;
        }
    }
    const auto it = cache.index.find(key);
    if (it == cache.index.end())
        return std::nullopt;
    return it->second;
}

}  // namespace

std::optional<KernelConfig> lookup(const Key& key) {
    if (key.rows_bucket > 0)
        return std::nullopt;
    const std::optional<Entry> e = cached_entry(key);
    return e ? std::optional(e->config) : std::nullopt;
}

std::optional<int> lookup_splits(const Key& key) {
    if (key.rows_bucket == 0)
        return std::nullopt;
    const std::optional<Entry> e = cached_entry(key);
    return e ? std::optional(e->splits) : std::nullopt;
}

void reload() {
    ProcessCache& cache = process_cache();
    const std::lock_guard lock(cache.mutex);
    cache.loaded = false;
    cache.index.clear();
}

}  // namespace flash_attention::tuning
