#pragma once

#include <compare>
#include <cstddef>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>

namespace flash_attention {

// E4M3: 8-bit floats (4 exponent bits, 3 mantissa bits, bias 7, no infinities: FP8's e4m3fn,
// PyTorch's torch.float8_e4m3fn), for FP8 attention's Q, K and V: the sm90 family's kernels
// of the config rule `dtype`, and forward_kvcache's split-KV kernel.
enum class DType : int { FP16, BF16, E4M3 };

std::string_view to_string(DType dtype);

// Kernel families: sm80 (mma.sync, ldmatrix, cp.async; Ampere and later) and sm90
// (TMA, wgmma, warp specialisation; sm_90a machine code, so Hopper only).
enum class Family : int { sm80, sm90 };

std::string_view to_string(Family family);
constexpr std::size_t element_bytes(DType dtype) {
    return dtype == DType::E4M3 ? 1 : 2;
}

// Whose knob a field is, and how the short form spells it.
enum class FieldFamily { common, sm80, sm90 };
enum class FieldKind {
    family,      // the family: its token ("sm90") when it is not the default
    dtype,       // first in the parentheses, by name
    tuple,       // a number in the parentheses, in table order
    flag,        // a token when true
    load_tiles,  // three consecutive fields in one token: load_Q_K_V_tiles
    count,       // token_N
};

// The one list of KernelConfig's fields, in declaration (and packing) order:
//   X(type, name, default, bits in the kernel code, family, kind, short-form token)
// The struct (each family's knobs in its own nested part), its printing, parsing, hashing
// and packing, the config space's value sets, the generator and the Python binding all
// iterate it: a new knob is one row here plus the kernel code that reads it.
#define FLASH_ATTENTION_CONFIG_FIELDS(X)                                                  \
    X(Family, family, Family::sm80, 1, common, family, "sm90")                            \
    X(DType, dtype, DType::FP16, 2, common, dtype, "dtype")                               \
    X(int, d_head, 128, 9, common, tuple, "d_head")                                       \
    /* V's and O's columns where they differ from Q's and K's (DeepSeek's MLA: 192 and */ \
    /* 128); 0 means d_head. Read it through v_head_dim() */                              \
    X(int, d_v, 0, 9, common, count, "dv")                                                \
    /* the backward pass (dQ, dK, dV): B_r query rows and B_c key rows per tile */        \
    X(bool, backward, false, 1, common, flag, "bwd")                                      \
    /* query rows per CTA */                                                              \
    X(int, B_r, 64, 8, common, tuple, "B_r")                                              \
    /* key/value rows per main-loop iteration (backward: keys per CTA) */                 \
    X(int, B_c, 64, 8, common, tuple, "B_c")                                              \
    X(int, n_warps, 4, 5, common, tuple, "n_warps")                                       \
    /* cp.async GMEM->SMEM instead of load + store through registers */                   \
    X(bool, async_copy, false, 1, sm80, flag, "async")                                    \
    /* prefetch the next K (V) block while computing on this one */                       \
    X(bool, eager_load_blocks, false, 1, sm80, flag, "eager")                             \
    /* XOR-swizzled SMEM rows instead of plain row-major */                               \
    X(bool, swizzled, false, 1, sm80, flag, "swizzled")                                   \
    /* fragments loaded SMEM->registers per step of the inner GEMM loop, in 16-wide */    \
    /* k-tiles; 0 loads the whole k extent at once (Q: once per CTA, held) */             \
    X(int, Q_mma_load_K_tiles, 0, 4, sm80, load_tiles, "load")                            \
    X(int, K_mma_load_K_tiles, 0, 4, sm80, load_tiles, "load")                            \
    X(int, V_mma_load_K_tiles, 0, 4, sm80, load_tiles, "load")                            \
    /* load step s+1's fragments before step s's MMAs */                                  \
    X(bool, mma_double_buffer_loads, false, 1, sm80, flag, "buffer")                      \
    /* scale folded into one FFMA per exp2, deferred row sums */                          \
    X(bool, optimized_softmax, false, 1, sm80, flag, "opt_softmax")                       \
    /* K/V tiles in flight: the depth of the TMA pipeline */                              \
    X(int, stages, 0, 3, sm90, count, "stages")                                           \
    /* issue S_{j+1} = Q·K_{j+1}ᵀ before O += P_j·V_j so the softmax of one block */  \
    /* overlaps the GEMMs of the next within a warpgroup */                               \
    X(bool, intra_warpgroup_overlap, false, 1, sm90, flag, "overlap")                     \
    /* consumer warpgroups take turns issuing GEMMs: one's softmax overlaps another's */  \
    X(bool, pingpong, false, 1, sm90, flag, "pingpong")                                   \
    /* one CTA per SM loops over tiles: the next tile's K/V stream in during this */      \
    /* tile's epilogue, and no CTA launch separates them */                               \
    X(bool, persistent, false, 1, sm90, flag, "persistent")                               \
    /* Q as register fragments for S = Q·Kᵀ: shared memory serves only K to it */      \
    X(bool, q_in_registers, false, 1, sm90, flag, "qreg")                                 \
    /* persistent CTAs take their next tile from a global counter (atomicAdd) instead */  \
    /* of a fixed stride: causal tiles differ in length, and a fixed share can leave */   \
    /* one CTA half again the mean work (tile_scheduler.cuh) */                           \
    X(bool, dynamic_schedule, false, 1, sm90, flag, "dynamic")                            \
    /* a row's reference max moves only when the row gains 2^8 on it, so most blocks */   \
    /* skip O's rescaling (online_softmax.cuh) */                                         \
    X(bool, lazy_rescale, false, 1, sm90, flag, "lazy")                                   \
    /* each consumer computes only the K/V blocks its own rows see and passes the */      \
    /* rest (causal: a tile's later rows reach further; rows past the sequence) */        \
    X(bool, trim_blocks, false, 1, sm90, flag, "trim")                                    \
    /* trimmed, B_c 128: a consumer whose rows see only the first half of its last */     \
    /* block computes that half alone (pays in short causal tiles only) */                \
    X(bool, half_blocks, false, 1, sm90, flag, "half")                                    \
    /* stream-K: the static schedule's last, part-filled round of a dense non-causal */   \
    /* problem split along the keys, so every CTA ends together (tile_scheduler.cuh) */   \
    X(bool, stream_k, false, 1, sm90, flag, "streamk")                                    \
    /* backward: each query block's dQ is added in key-block order (a semaphore per */    \
    /* block), so gradients are bitwise identical run to run (deterministic mode) */      \
    X(bool, ordered_dq, false, 1, sm90, flag, "ordered")                                  \
    /* backward: each step computes the previous step's dQ, so that the consumers need */ \
    /* not wait for each other's dS within a step (sm90/backward_kernel.cuh) */           \
    X(bool, lag_dq, false, 1, sm90, flag, "lagdq")                                        \
    /* forward: a tile's rows are (query position, query head) pairs of the query */      \
    /* heads of one K/V head, so that few positions fill it (speculative decoding) */     \
    X(bool, pack_gqa, false, 1, sm90, flag, "packgqa")                                    \
    /* forward: P through shared memory for P·V (both operands from shared memory), */   \
    /* so that its registers are free for intra-warpgroup overlap */                      \
    X(bool, p_in_smem, false, 1, sm90, flag, "psmem")                                     \
    /* FP8 forward: the producer warpgroup transposes each V block in shared memory */    \
    /* for P·V (8-bit wgmma reads K-major operands only), instead of a pass over V */    \
    /* into a V-sized workspace before the kernel */                                      \
    X(bool, transpose_v, false, 1, sm90, flag, "vtrans")

// Member access by a field's family: common fields are KernelConfig's own, each family's
// knobs sit in its nested part (c.sm80.swizzled, c.sm90.stages).
#define FLASH_ATTENTION_PART_common(c) (c)
#define FLASH_ATTENTION_PART_sm80(c) (c).sm80
#define FLASH_ATTENTION_PART_sm90(c) (c).sm90
#define FLASH_ATTENTION_FIELD(c, family, name) FLASH_ATTENTION_PART_##family(c).name

// A member declaration for the rows of one family only.
#define FLASH_ATTENTION_MEMBER_common_common(type, name, init) type name = init;
#define FLASH_ATTENTION_MEMBER_common_sm80(type, name, init)
#define FLASH_ATTENTION_MEMBER_common_sm90(type, name, init)
#define FLASH_ATTENTION_MEMBER_sm80_common(type, name, init)
#define FLASH_ATTENTION_MEMBER_sm80_sm80(type, name, init) type name = init;
#define FLASH_ATTENTION_MEMBER_sm80_sm90(type, name, init)
#define FLASH_ATTENTION_MEMBER_sm90_common(type, name, init)
#define FLASH_ATTENTION_MEMBER_sm90_sm80(type, name, init)
#define FLASH_ATTENTION_MEMBER_sm90_sm90(type, name, init) type name = init;
#define FLASH_ATTENTION_MEMBER_common(type, name, init, bits, family, ...) \
    FLASH_ATTENTION_MEMBER_common_##family(type, name, init)
#define FLASH_ATTENTION_MEMBER_sm80(type, name, init, bits, family, ...) \
    FLASH_ATTENTION_MEMBER_sm80_##family(type, name, init)
#define FLASH_ATTENTION_MEMBER_sm90(type, name, init, bits, family, ...) \
    FLASH_ATTENTION_MEMBER_sm90_##family(type, name, init)

// The sm80 family's knobs (mma.sync, ldmatrix, cp.async); all at their defaults in an sm90
// config.
struct Sm80Knobs {
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_MEMBER_sm80)
    friend constexpr auto operator<=>(const Sm80Knobs&, const Sm80Knobs&) = default;
    friend constexpr bool operator==(const Sm80Knobs&, const Sm80Knobs&) = default;
};

// The sm90 family's knobs (TMA, wgmma, warp specialisation); all at their defaults in an
// sm80 config.
struct Sm90Knobs {
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_MEMBER_sm90)
    friend constexpr auto operator<=>(const Sm90Knobs&, const Sm90Knobs&) = default;
    friend constexpr bool operator==(const Sm90Knobs&, const Sm90Knobs&) = default;
};

// Every knob of one compiled forward kernel. A structural type, so a KernelConfig value
// is itself the template argument of the kernel it names.
//
// Short form: (dtype, d_head, B_r, B_c, n_warps) followed by the enabled flags (dv_N where V's
// head dim differs from Q's and K's).
//   sm80: "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer+opt_softmax"
//   sm90: "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+persistent"
// An sm90 kernel has one producer warpgroup (TMA) and n_warps / 4 - 1 consumer
// warpgroups of 64 query rows each, so B_r = 64 * consumer warpgroups.
struct KernelConfig {
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_MEMBER_common)
    Sm80Knobs sm80{};
    Sm90Knobs sm90{};

    friend constexpr auto operator<=>(const KernelConfig&, const KernelConfig&) = default;

    constexpr int n_threads() const { return n_warps * 32; }
    // The columns of V, O and dV: d_v where set, else d_head.
    constexpr int v_head_dim() const { return d_v != 0 ? d_v : d_head; }
    constexpr int rows_per_warp() const { return n_warps > 0 ? B_r / n_warps : 0; }

    std::string to_string() const;
    // Inverse of to_string(). Throws flash_attention::Error naming the offending token.
    static KernelConfig parse(std::string_view short_form);
};

// The table's metadata, for code that walks the fields.
struct FieldInfo {
    std::string_view name;
    int bits;  // in the kernel code: values from 0 to 2^bits - 1
    FieldFamily family;
    FieldKind kind;
    std::string_view token;
    int default_value;
};

inline constexpr FieldInfo k_config_fields[] = {
#define FLASH_ATTENTION_CONFIG_INFO(type, name, init, bits, family, kind, token) \
    {#name, bits, FieldFamily::family, FieldKind::kind, token, static_cast<int>(init)},
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_CONFIG_INFO)
#undef FLASH_ATTENTION_CONFIG_INFO
};
inline constexpr int k_config_field_count = static_cast<int>(std::size(k_config_fields));
// The rows are grouped common, sm80, sm90: the order of KernelConfig's members (its own,
// then the nested parts), which designated initializers and the packing follow.
static_assert([] {
    for (int i = 1; i < k_config_field_count; ++i) {
        if (k_config_fields[i].family < k_config_fields[i - 1].family)
            return false;
    }
    return true;
}());

// Field i (table order) of a config as an int: enums and bools by value.
constexpr int field_value(const KernelConfig& c, int i) {
    int index = 0;
#define FLASH_ATTENTION_CONFIG_GET(type, name, init, bits, family, ...) \
    if (i == index++)                                                   \
        return static_cast<int>(FLASH_ATTENTION_FIELD(c, family, name));
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_CONFIG_GET)
#undef FLASH_ATTENTION_CONFIG_GET
    return 0;
}

constexpr void set_field_value(KernelConfig& c, int i, int value) {
    int index = 0;
#define FLASH_ATTENTION_CONFIG_SET(type, name, init, bits, family, ...)    \
    if (i == index++) {                                                    \
        FLASH_ATTENTION_FIELD(c, family, name) = static_cast<type>(value); \
        return;                                                            \
    }
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_CONFIG_SET)
#undef FLASH_ATTENTION_CONFIG_SET
}

// Whether c sets a knob of the other family than its own.
constexpr bool has_foreign_knobs(const KernelConfig& c) {
    return c.family == Family::sm80 ? c.sm90 != Sm90Knobs{} : c.sm80 != Sm80Knobs{};
}

}  // namespace flash_attention

template <>
struct std::hash<flash_attention::KernelConfig> {
    std::size_t operator()(const flash_attention::KernelConfig& c) const noexcept;
};
