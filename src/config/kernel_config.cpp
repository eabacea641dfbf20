#include "flash_attention/kernel_config.hpp"

#include <algorithm>
#include <array>
#include <bitset>
#include <cctype>
#include <charconv>
#include <string>
#include <vector>

#include "flash_attention/error.hpp"
#include "kernels/config_code.hpp"

namespace flash_attention {

std::string_view to_string(DType dtype) {
    switch (dtype) {
        case DType::FP16:
            return "FP16";
        case DType::BF16:
            return "BF16";
    }
    return "?";
}

std::string_view to_string(Family family) {
    switch (family) {
        case Family::sm80:
            return "sm80";
        case Family::sm90:
            return "sm90";
    }
    return "?";
}

int KernelConfig::ctas_per_sm(const DeviceLimits& limits) const {
    const auto smem = static_cast<long>(smem_bytes());
    if (smem > limits.smem_per_block_optin || n_threads() <= 0) {
        return 0;
    }
    const long by_smem = limits.smem_per_sm / (smem + limits.reserved_smem_per_block);
    const long by_threads = limits.max_threads_per_sm / n_threads();
    // An sm90 CTA's warpgroups reallocate registers (setmaxnreg) up to the whole register
    // file between them: one CTA per SM by design.
    const long by_registers = family == Family::sm90 ? 1 : limits.max_ctas_per_sm;
    return static_cast<int>(
        std::min({by_smem, by_threads, by_registers, long{limits.max_ctas_per_sm}}));
}

std::string KernelConfig::to_string() const {
    std::string s = "(" + std::string(flash_attention::to_string(dtype)) + ", " +
                    std::to_string(d_head) + ", " + std::to_string(B_r) + ", " +
                    std::to_string(B_c) + ", " + std::to_string(n_warps) + "): ";
    std::vector<std::string> flags;
    const bool sm90 = family == Family::sm90;
    if (sm90)
        flags.push_back("sm90");
    // sm80 knobs; set on an sm90 config only in invalid configs, printed so that
    // parse(to_string()) still round-trips them into the error message.
    if (async_copy)
        flags.push_back("async");
    if (eager_load_blocks)
        flags.push_back("eager");
    if (swizzled)
        flags.push_back("swizzled");
    if (!sm90 || Q_mma_load_K_tiles != 0 || K_mma_load_K_tiles != 0 || V_mma_load_K_tiles != 0) {
        flags.push_back("load_" + std::to_string(Q_mma_load_K_tiles) + "_" +
                        std::to_string(K_mma_load_K_tiles) + "_" +
                        std::to_string(V_mma_load_K_tiles) + "_tiles");
    }
    if (mma_double_buffer_loads)
        flags.push_back("buffer");
    if (optimized_softmax)
        flags.push_back("opt_softmax");
    if (sm90 || stages != 0)
        flags.push_back("stages_" + std::to_string(stages));
    if (intra_warpgroup_overlap)
        flags.push_back("overlap");
    if (pingpong)
        flags.push_back("pingpong");
    if (persistent)
        flags.push_back("persistent");
    if (q_in_registers)
        flags.push_back("qreg");
    for (std::size_t i = 0; i < flags.size(); ++i)
        s += (i ? "+" : "") + flags[i];
    return s;
}

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
        s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
        s.remove_suffix(1);
    return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> parts;
    for (std::size_t start = 0;;) {
        const std::size_t end = s.find(sep, start);
        parts.push_back(trim(s.substr(start, end - start)));
        if (end == std::string_view::npos)
            return parts;
        start = end + 1;
    }
}

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

// The longest short form is under 100 characters; anything much longer is not a config,
// and a bound keeps the parser's work (and its messages) small on hostile input.
constexpr std::size_t k_max_short_form = 256;

// Shown in messages: hostile input is cut short.
std::string excerpt(std::string_view s) {
    constexpr std::size_t shown = 100;
    return s.size() <= shown ? std::string(s) : std::string(s.substr(0, shown)) + "...";
}

class Parser {
  public:
    explicit Parser(std::string_view text) : text_(text) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw Error(ErrorCode::invalid_argument,
                    "invalid kernel config \"" + excerpt(text_) + "\": " + what);
    }

    // A decimal integer in [minimum, maximum].
    int bounded_int(std::string_view token, std::string_view what, int minimum, int maximum) const {
        int value = -1;
        const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
        if (token.empty() || ec != std::errc() || end != token.data() + token.size() ||
            value < minimum || value > maximum) {
            fail("expected an integer from " + std::to_string(minimum) + " to " +
                 std::to_string(maximum) + " for " + std::string(what) + ", got \"" +
                 excerpt(token) + "\"");
        }
        return value;
    }

    // "load_Q_K_V_tiles" (the "_tiles" suffix may be left off).
    void load_tiles(std::string_view token, KernelConfig& c) const {
        std::string_view body = token.substr(5);
        if (body.size() > 6 && body.substr(body.size() - 6) == "_tiles") {
            body.remove_suffix(6);
        }
        const auto numbers = split(body, '_');
        std::array<int, 3> tiles{};
        if (numbers.size() != 3) {
            fail("flag \"" + excerpt(token) + "\" must be load_Q_K_V_tiles with three counts");
        }
        for (int i = 0; i < 3; ++i) {
            tiles[i] = bounded_int(numbers[i], "a tile count of \"" + excerpt(token) + "\"", 0,
                                   field_max(field_bits::load_tiles));
        }
        c.Q_mma_load_K_tiles = tiles[0];
        c.K_mma_load_K_tiles = tiles[1];
        c.V_mma_load_K_tiles = tiles[2];
    }

    KernelConfig parse() const {
        if (text_.size() > k_max_short_form) {
            fail("expected at most " + std::to_string(k_max_short_form) + " characters, got " +
                 std::to_string(text_.size()));
        }
        const std::string_view s = trim(text_);
        if (s.empty() || s.front() != '(')
            fail("expected \"(\" at the start");
        const std::size_t close = s.find(')');
        if (close == std::string_view::npos)
            fail("missing \")\" after the tuple");
        const auto fields = split(s.substr(1, close - 1), ',');
        if (fields.size() != 5) {
            fail("expected 5 tuple fields (dtype, d_head, B_r, B_c, n_warps), got " +
                 std::to_string(fields.size()));
        }
        KernelConfig c;
        if (iequals(fields[0], "FP16")) {
            c.dtype = DType::FP16;
        } else if (iequals(fields[0], "BF16")) {
            c.dtype = DType::BF16;
        } else {
            fail("unknown dtype \"" + excerpt(fields[0]) + "\" (expected FP16 or BF16)");
        }
        c.d_head = bounded_int(fields[1], "d_head", 1, field_max(field_bits::d_head));
        c.B_r = bounded_int(fields[2], "B_r", 1, field_max(field_bits::B_r));
        c.B_c = bounded_int(fields[3], "B_c", 1, field_max(field_bits::B_c));
        c.n_warps = bounded_int(fields[4], "n_warps", 1, field_max(field_bits::n_warps));

        std::string_view rest = trim(s.substr(close + 1));
        if (rest.empty() || rest.front() != ':')
            fail("expected \":\" after the tuple");
        rest = trim(rest.substr(1));
        if (rest.empty())
            fail("missing flags after \":\" (at least load_Q_K_V_tiles, or sm90+stages_N)");

        // Each kind of flag once: stages_2+stages_3 or two load_ flags contradict each other.
        enum Kind {
            async,
            eager,
            swizzled,
            buffer,
            opt_softmax,
            sm90,
            stages,
            overlap,
            pingpong,
            persistent,
            qreg,
            load,
            kinds
        };
        std::bitset<kinds> seen;
        const auto once = [&](Kind kind, std::string_view token) {
            if (seen[kind]) {
                fail(kind == stages || kind == load
                         ? "more than one " +
                               std::string(kind == stages ? "stages_N" : "load_Q_K_V_tiles") +
                               " flag (\"" + excerpt(token) + "\" is the second)"
                         : "flag \"" + excerpt(token) + "\" given twice");
            }
            seen.set(kind);
        };
        for (const std::string_view token : split(rest, '+')) {
            if (token.empty())
                fail("empty flag between \"+\" signs");
            if (token == "async") {
                once(async, token);
                c.async_copy = true;
            } else if (token == "eager") {
                once(eager, token);
                c.eager_load_blocks = true;
            } else if (token == "swizzled") {
                once(swizzled, token);
                c.swizzled = true;
            } else if (token == "buffer") {
                once(buffer, token);
                c.mma_double_buffer_loads = true;
            } else if (token == "opt_softmax") {
                once(opt_softmax, token);
                c.optimized_softmax = true;
            } else if (token == "sm90") {
                once(sm90, token);
                c.family = Family::sm90;
            } else if (token.starts_with("stages_")) {
                once(stages, token);
                c.stages =
                    bounded_int(token.substr(7), "the stage count of \"" + excerpt(token) + "\"", 0,
                                field_max(field_bits::stages));
            } else if (token == "overlap") {
                once(overlap, token);
                c.intra_warpgroup_overlap = true;
            } else if (token == "pingpong") {
                once(pingpong, token);
                c.pingpong = true;
            } else if (token == "persistent") {
                once(persistent, token);
                c.persistent = true;
            } else if (token == "qreg") {
                once(qreg, token);
                c.q_in_registers = true;
            } else if (token.starts_with("load_")) {
                once(load, token);
                load_tiles(token, c);
            } else {
                fail("unknown flag \"" + excerpt(token) +
                     "\" (expected async, eager, swizzled, load_Q_K_V_tiles, buffer, "
                     "opt_softmax, sm90, stages_N, overlap, pingpong, persistent or qreg)");
            }
        }
        const bool seen_load = seen[load];
        if (!seen_load && c.family == Family::sm80)
            fail("missing the load_Q_K_V_tiles flag (or sm90 for a Hopper kernel)");
        return c;
    }

  private:
    std::string_view text_;
};

}  // namespace

KernelConfig KernelConfig::parse(std::string_view short_form) {
    return Parser(short_form).parse();
}

}  // namespace flash_attention

std::size_t std::hash<flash_attention::KernelConfig>::operator()(
    const flash_attention::KernelConfig& c) const noexcept {
    // Every field is small; pack them into one word and mix.
    std::size_t h = static_cast<std::size_t>(c.dtype);
    for (const int v : {int(c.family), c.d_head, c.B_r, c.B_c, c.n_warps, int(c.async_copy),
                        int(c.eager_load_blocks), int(c.swizzled), c.Q_mma_load_K_tiles,
                        c.K_mma_load_K_tiles, c.V_mma_load_K_tiles, int(c.mma_double_buffer_loads),
                        int(c.optimized_softmax), c.stages, int(c.intra_warpgroup_overlap),
                        int(c.pingpong), int(c.persistent), int(c.q_in_registers)}) {
        h = h * 1000003u ^ static_cast<std::size_t>(v);
    }
    return h ^ (h >> 29);
}
