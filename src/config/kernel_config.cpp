#include "flash_attention/kernel_config.hpp"

#include <algorithm>
#include <array>
#include <bitset>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#include "common/text.hpp"
#include "config/config_code.hpp"
#include "config/resources.hpp"
#include "flash_attention/error.hpp"

namespace flash_attention {

std::string_view to_string(DType dtype) {
    switch (dtype) {
        case DType::FP16:
            return "FP16";
        case DType::BF16:
            return "BF16";
        case DType::E4M3:
            return "E4M3";
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

int ctas_per_sm(const KernelConfig& c, const DeviceLimits& limits) {
    const auto smem = static_cast<long>(smem_bytes(c));
    if (smem > limits.smem_per_block_optin || c.n_threads() <= 0) {
        return 0;
    }
    const long by_smem = limits.smem_per_sm / (smem + limits.reserved_smem_per_block);
    const long by_threads = limits.max_threads_per_sm / c.n_threads();
    // An sm90 CTA's warpgroups reallocate registers (setmaxnreg) up to the whole register
    // file between them: one CTA per SM by design.
    const long by_registers = c.family == Family::sm90 ? 1 : limits.max_ctas_per_sm;
    return static_cast<int>(
        std::min({by_smem, by_threads, by_registers, long{limits.max_ctas_per_sm}}));
}

namespace {

// The family a field belongs to, as a config's family.
bool belongs_to(FieldFamily field, Family family) {
    return field == FieldFamily::common || (field == FieldFamily::sm80) == (family == Family::sm80);
}

}  // namespace

// Walks the field table: the tuple fields in the parentheses, then one token per knob that
// is set. A counted knob (stages_N, load_Q_K_V_tiles) is printed when its family is the
// config's or it is not zero (a common one, dv_N, only when not zero); knobs of the other family
// appear only in invalid configs (which parse() refuses), printed so that a message about such a
// config shows them.
std::string KernelConfig::to_string() const {
    std::vector<std::string> tuple;
    std::vector<std::string> flags;
    for (int i = 0; i < k_config_field_count; ++i) {
        const FieldInfo& f = k_config_fields[i];
        const int value = field_value(*this, i);
        switch (f.kind) {
            case FieldKind::family:
                if (value != f.default_value)
                    flags.emplace_back(f.token);
                break;
            case FieldKind::dtype:
                tuple.emplace_back(flash_attention::to_string(static_cast<DType>(value)));
                break;
            case FieldKind::tuple:
                tuple.push_back(std::to_string(value));
                break;
            case FieldKind::flag:
                if (value != 0)
                    flags.emplace_back(f.token);
                break;
            case FieldKind::count:
                // A family's counts always (stages_2); a common one (dv_N) where set.
                if ((belongs_to(f.family, family) && f.family != FieldFamily::common) || value != 0)
                    flags.push_back(std::string(f.token) + "_" + std::to_string(value));
                break;
            case FieldKind::load_tiles:
                // The first of the three consecutive fields prints the token for all.
                if (i > 0 && k_config_fields[i - 1].kind == FieldKind::load_tiles)
                    break;
                // A backward config's GEMMs load whole k extents: no token unless set.
                if ((belongs_to(f.family, family) && !backward) || value != 0 ||
                    field_value(*this, i + 1) != 0 || field_value(*this, i + 2) != 0) {
                    flags.push_back(std::string(f.token) + "_" + std::to_string(value) + "_" +
                                    std::to_string(field_value(*this, i + 1)) + "_" +
                                    std::to_string(field_value(*this, i + 2)) + "_tiles");
                }
                break;
        }
    }
    std::string s = "(";
    for (std::size_t i = 0; i < tuple.size(); ++i)
        s += (i ? ", " : "") + tuple[i];
    s += "): ";
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

bool is_space(char c) {
    return std::isspace(static_cast<unsigned char>(c)) != 0;
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

// Shown in messages: hostile input is cut short, control characters escaped.
std::string excerpt(std::string_view s) {
    return printable(s, 100);
}

class Parser {
  public:
    explicit Parser(std::string_view text) : text_(text) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw Error(ErrorCode::invalid_argument,
                    "invalid kernel config \"" + excerpt(text_) + "\": " + what);
    }

    // A decimal integer in [minimum, maximum], digits only: from_chars alone takes "-0".
    int bounded_int(std::string_view token, std::string_view what, int minimum, int maximum) const {
        int value = -1;
        const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
        const bool digits = std::all_of(token.begin(), token.end(), [](char c) {
            return std::isdigit(static_cast<unsigned char>(c)) != 0;
        });
        if (token.empty() || !digits || ec != std::errc() || end != token.data() + token.size() ||
            value < minimum || value > maximum) {
            fail("expected an integer from " + std::to_string(minimum) + " to " +
                 std::to_string(maximum) + " for " + std::string(what) + ", got \"" +
                 excerpt(token) + "\"");
        }
        return value;
    }

    // The three counts of "load_Q_K_V_tiles" (the "_tiles" suffix may be left off) into
    // fields first .. first + 2.
    void load_tiles(std::string_view token, KernelConfig& c, int first) const {
        std::string_view body = token.substr(k_config_fields[first].token.size() + 1);
        if (body.size() > 6 && body.substr(body.size() - 6) == "_tiles")
            body.remove_suffix(6);
        const auto numbers = split(body, '_');
        if (numbers.size() != 3)
            fail("flag \"" + excerpt(token) + "\" must be load_Q_K_V_tiles with three counts");
        for (int i = 0; i < 3; ++i) {
            set_field_value(c, first + i,
                            bounded_int(numbers[i], "a tile count of \"" + excerpt(token) + "\"", 0,
                                        field_max(k_config_fields[first + i].bits)));
        }
    }

    // The table row a flag token names, with the text after "token_" for counted ones.
    struct Match {
        int field = -1;
        std::string_view rest;
    };
    static Match match(std::string_view token) {
        for (int i = 0; i < k_config_field_count; ++i) {
            const FieldInfo& f = k_config_fields[i];
            switch (f.kind) {
                case FieldKind::family:
                case FieldKind::flag:
                    if (token == f.token)
                        return {i, {}};
                    break;
                case FieldKind::count:
                case FieldKind::load_tiles:
                    if (token.size() > f.token.size() + 1 && token.starts_with(f.token) &&
                        token[f.token.size()] == '_')
                        return {i, token.substr(f.token.size() + 1)};
                    break;
                case FieldKind::dtype:
                case FieldKind::tuple:
                    break;
            }
        }
        return {};
    }

    // Whitespace may surround a token, never split one ("load_1_ 1_1_tiles").
    void check_unbroken(std::string_view token) const {
        if (std::any_of(token.begin(), token.end(), is_space))
            fail("whitespace inside \"" + excerpt(token) + "\"");
    }

    static std::string known_flags() {
        std::string known;
        for (int i = 0; i < k_config_field_count; ++i) {
            const FieldInfo& f = k_config_fields[i];
            std::string name;
            if (f.kind == FieldKind::flag || f.kind == FieldKind::family)
                name = std::string(f.token);
            else if (f.kind == FieldKind::count)
                name = std::string(f.token) + "_N";
            else if (f.kind == FieldKind::load_tiles &&
                     k_config_fields[i - 1].kind != FieldKind::load_tiles)
                name = std::string(f.token) + "_Q_K_V_tiles";
            if (!name.empty())
                known += (known.empty() ? "" : ", ") + name;
        }
        return known;
    }

    KernelConfig parse() const {
        if (text_.size() > k_max_short_form) {
            fail("expected at most " + std::to_string(k_max_short_form) + " characters, got " +
                 std::to_string(text_.size()));
        }
        // A NUL or another control character is never part of a config (a C caller's copy of
        // the text would end at a NUL and read a different config).
        for (std::size_t i = 0; i < text_.size(); ++i) {
            const auto c = static_cast<unsigned char>(text_[i]);
            if ((c < 0x20 || c == 0x7F) && !is_space(text_[i])) {
                fail("unexpected control character " + printable(text_.substr(i, 1)) +
                     " at position " + std::to_string(i));
            }
        }
        const std::string_view s = trim(text_);
        if (s.empty() || s.front() != '(')
            fail("expected \"(\" at the start");
        const std::size_t close = s.find(')');
        if (close == std::string_view::npos)
            fail("missing \")\" after the tuple");
        const auto fields = split(s.substr(1, close - 1), ',');
        std::string tuple_names;
        std::size_t tuple_fields = 0;
        for (const FieldInfo& f : k_config_fields) {
            if (f.kind == FieldKind::dtype || f.kind == FieldKind::tuple) {
                tuple_names += (tuple_fields++ ? ", " : "") + std::string(f.name);
            }
        }
        if (fields.size() != tuple_fields) {
            fail("expected " + std::to_string(tuple_fields) + " tuple fields (" + tuple_names +
                 "), got " + std::to_string(fields.size()));
        }
        for (const std::string_view field : fields)
            check_unbroken(field);
        KernelConfig c;
        std::size_t position = 0;
        for (int i = 0; i < k_config_field_count; ++i) {
            const FieldInfo& f = k_config_fields[i];
            if (f.kind == FieldKind::dtype) {
                const std::string_view name = fields[position++];
                if (iequals(name, "FP16"))
                    c.dtype = DType::FP16;
                else if (iequals(name, "BF16"))
                    c.dtype = DType::BF16;
                else if (iequals(name, "E4M3"))
                    c.dtype = DType::E4M3;
                else
                    fail("unknown dtype \"" + excerpt(name) + "\" (expected FP16, BF16 or E4M3)");
            } else if (f.kind == FieldKind::tuple) {
                set_field_value(c, i,
                                bounded_int(fields[position++], f.name, 1, field_max(f.bits)));
            }
        }

        std::string_view rest = trim(s.substr(close + 1));
        if (rest.empty() || rest.front() != ':')
            fail("expected \":\" after the tuple");
        rest = trim(rest.substr(1));
        if (rest.empty()) {
            fail(
                "missing flags after \":\" (at least load_Q_K_V_tiles, sm90+stages_N or "
                "bwd)");
        }

        // Each field once: stages_2+stages_3 or two load_ flags contradict each other.
        std::bitset<k_config_field_count> seen;
        std::array<std::string_view, k_config_field_count> tokens;
        for (const std::string_view token : split(rest, '+')) {
            if (token.empty())
                fail("empty flag between \"+\" signs");
            check_unbroken(token);
            const Match m = match(token);
            if (m.field < 0) {
                fail("unknown flag \"" + excerpt(token) + "\" (expected " + known_flags() + ")");
            }
            const FieldInfo& f = k_config_fields[m.field];
            if (seen[m.field]) {
                fail(f.kind == FieldKind::flag || f.kind == FieldKind::family
                         ? "flag \"" + excerpt(token) + "\" given twice"
                         : "more than one " +
                               (f.kind == FieldKind::count
                                    ? std::string(f.token) + "_N"
                                    : std::string(f.token) + "_Q_K_V_tiles") +
                               " flag (\"" + excerpt(token) + "\" is the second)");
            }
            seen.set(m.field);
            tokens[m.field] = token;
            switch (f.kind) {
                case FieldKind::family:
                    c.family = Family::sm90;
                    break;
                case FieldKind::flag:
                    set_field_value(c, m.field, 1);
                    break;
                case FieldKind::count:
                    set_field_value(c, m.field,
                                    bounded_int(m.rest, "the count of \"" + excerpt(token) + "\"",
                                                0, field_max(f.bits)));
                    break;
                case FieldKind::load_tiles:
                    load_tiles(token, c, m.field);
                    break;
                case FieldKind::dtype:
                case FieldKind::tuple:
                    break;
            }
        }
        // An sm80 forward config names its fragment loading (the family's one required token;
        // a backward config's GEMMs load whole k extents).
        bool loads = false;
        for (int i = 0; i < k_config_field_count; ++i)
            loads = loads || (k_config_fields[i].kind == FieldKind::load_tiles && seen[i]);
        if (!loads && c.family == Family::sm80 && !c.backward)
            fail(
                "missing the load_Q_K_V_tiles flag (or sm90 for a Hopper kernel, bwd for a "
                "backward one)");
        // A config is of one family (sm90 may come anywhere among the flags): the other
        // family's knobs belong to no kernel (the config space's foreign_knobs rule).
        for (int i = 0; i < k_config_field_count; ++i) {
            const FieldInfo& f = k_config_fields[i];
            if (seen[i] && !belongs_to(f.family, c.family)) {
                fail("flag \"" + excerpt(tokens[i]) + "\" is an " +
                     (f.family == FieldFamily::sm80 ? "sm80 knob, but the config is sm90"
                                                    : "sm90 knob, but the config is sm80 (no sm90 "
                                                      "flag)"));
            }
        }
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
    // Every field, through the packing the field table defines (out-of-range values are
    // masked, as in the kernel code; equal configs always hash equal), then mixed
    // (SplitMix64's finaliser): the packed codes differ in a few bits, and Python reduces a
    // hash modulo 2^61 - 1, where unmixed codes of two release configs collided.
    const auto mix = [](std::uint64_t x) {
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        return x ^ (x >> 31);
    };
    const flash_attention::ConfigCode code = flash_attention::pack(c);
    return static_cast<std::size_t>(mix(code.lo ^ mix(code.hi)));
}
