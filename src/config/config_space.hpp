#pragma once

// The space of kernel configs of both families: the value set of every knob, the rules
// that drop invalid or wasteful combinations, and the named sets that builds,
// tests and the command line draw from. Host code only; no CUDA needed.

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention::space {

// The head dims the kernels are instantiated for (the sm80 family's swizzled rows need 8 16-byte
// chunks, the sm90 family pads its tiles to whole 64-column sub-tiles; the register budget ends
// at 256).
inline constexpr std::array<int, 5> k_head_dims{64, 96, 128, 192, 256};

constexpr bool is_head_dim(std::int64_t d) {
    return std::find(k_head_dims.begin(), k_head_dims.end(), d) != k_head_dims.end();
}

// The N of S = Q·Kᵀ's wgmma that the sm90 family instantiates: its B_c values (112, 176 and
// 192: FlashAttention-3's key blocks for d_head 192, 128 and 64 without causal masking).
inline constexpr std::array<int, 6> k_wgmma_n{64, 80, 112, 128, 176, 192};

constexpr bool is_wgmma_n(int n) {
    return std::find(k_wgmma_n.begin(), k_wgmma_n.end(), n) != k_wgmma_n.end();
}

// "64, 96, 128, 192 or 256", for messages.
std::string head_dims_text();
// Numbers as a message lists them: "64, 128 or 256".
std::string numbers_text(std::span<const int> numbers);

// The head dims of V (and O) apart from Q's and K's that the kernels are built for, as
// (d_head, d_v): DeepSeek's MLA (192, 128), forward and backward.
inline constexpr std::array<std::array<int, 2>, 1> k_value_dims{{{192, 128}}};

// Whether V's head dim d_v goes with Q's d_head: equal, or a pair of k_value_dims.
constexpr bool is_value_dim(std::int64_t d_head, std::int64_t d_v) {
    return (d_v == d_head && is_head_dim(d_head)) ||
           std::find(k_value_dims.begin(), k_value_dims.end(),
                     std::array<int, 2>{static_cast<int>(d_head), static_cast<int>(d_v)}) !=
               k_value_dims.end();
}

// "128 with d_head 192" (k_value_dims), and "256 (q's d_head), or 128 with d_head 192", for
// messages.
std::string value_dim_pairs_text();
std::string value_dims_text(int d_head);

enum class RuleKind {
    validity,  // the kernel template cannot be instantiated for this config
    pruning,   // it can, but measurement or the register budget says it is not worth building
};

struct Rule {
    std::string_view name;
    RuleKind kind;
    std::string_view why;
    bool (*rejects)(const KernelConfig&);
};

// The first rule that rejects the config, or nullptr. With validity_only, pruning
// rules are skipped (hand-picked sets such as the progression ladder may keep a
// wasteful config on purpose).
const Rule* rejecting_rule(const KernelConfig& config, bool validity_only = false);

// Registers per thread the main loop needs, estimated from the tile shapes (sm90: per
// consumer thread).
int estimated_registers(const KernelConfig& config);

// One value list per knob of the field table (each defaults to the field's default
// value), except the load_Q_K_V_tiles fields, whose (Q, K, V) combinations are listed
// together; expand() is their filtered Cartesian product.
struct ValueSets {
#define FLASH_ATTENTION_VALUES_family(type, name, init) std::vector<type> name{init};
#define FLASH_ATTENTION_VALUES_dtype(type, name, init) std::vector<type> name{init};
#define FLASH_ATTENTION_VALUES_tuple(type, name, init) std::vector<type> name{init};
#define FLASH_ATTENTION_VALUES_flag(type, name, init) std::vector<type> name{init};
#define FLASH_ATTENTION_VALUES_count(type, name, init) std::vector<type> name{init};
#define FLASH_ATTENTION_VALUES_load_tiles(type, name, init)
#define FLASH_ATTENTION_VALUES(type, name, init, bits, family, kind, token) \
    FLASH_ATTENTION_VALUES_##kind(type, name, init)
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_VALUES)
#undef FLASH_ATTENTION_VALUES
    std::vector<std::array<int, 3>> load_tiles{{0, 0, 0}};  // (Q, K, V)_mma_load_K_tiles

    std::vector<KernelConfig> expand() const;
};

// Names accepted by named_set(): release (the built-in table's kernels: the default
// build), ci (release plus knob coverage), progression, progression-all, progression-sm90,
// tune, tune-sm80 and tune-sm90 (the tune set's forward configs of one family: tuning or
// measuring the sm80 family on a Hopper GPU, Hopper-only builds), tune-backward (its
// backward configs), all.
std::vector<std::string_view> set_names();

// The configs of a named set, sorted and unique (the progression ladder in step order),
// of "@FILE" (a text file of short forms, one per line, "#" starting a comment: say the
// winners of a tune, for a build of just those), or of a comma-separated union such as
// "tune,progression" or "release,@winners.txt". Throws flash_attention::Error
// (invalid_argument) naming the set and the known names when the name is unknown, and the
// file and line when a file cannot be read or holds a line that is no short form.
std::vector<KernelConfig> named_set(std::string_view name);

}  // namespace flash_attention::space
