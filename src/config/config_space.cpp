#include "config/config_space.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <string>
#include <unordered_set>

#include "common/small_file.hpp"
#include "common/text.hpp"
#include "config/builtin_choice.hpp"
#include "config/config_code.hpp"
#include "config/resources.hpp"
#include "flash_attention/error.hpp"

namespace flash_attention::space {

namespace {

constexpr int k_tiles_total(const KernelConfig& c) {
    return c.d_head / 16;
}  // Q·Kᵀ k extent
constexpr int v_tiles_total(const KernelConfig& c) {
    return c.B_c / 16;
}  // P·V k extent

// A load count of 0 means "everything at once".
constexpr int tiles_per_step(int tiles, int total) {
    return tiles == 0 ? total : tiles;
}

bool splits_a_gemm(const KernelConfig& c) {
    return tiles_per_step(c.sm80.K_mma_load_K_tiles, k_tiles_total(c)) < k_tiles_total(c) ||
           tiles_per_step(c.sm80.V_mma_load_K_tiles, v_tiles_total(c)) < v_tiles_total(c);
}

// Every cooperative copy gives each thread the same whole number of 16-byte chunks.
bool copies_split_evenly(const KernelConfig& c) {
    const int chunks_per_row = c.d_head / 8;
    return (c.B_r * chunks_per_row) % c.n_threads() == 0 &&
           (c.B_c * chunks_per_row) % c.n_threads() == 0;
}

// ptxas gives a thread at most 255 registers; past that it spills to local memory.
constexpr int k_register_budget = 255;

constexpr bool sm80(const KernelConfig& c) {
    return c.family == Family::sm80;
}
constexpr bool sm90(const KernelConfig& c) {
    return c.family == Family::sm90;
}

// Where half blocks can apply: a trimmed consumer's overlapped loop over B_c 128 blocks, whose
// last block can end in its first half (the half_needs_trim rule; halved() below).
constexpr bool can_halve(const KernelConfig& c) {
    return c.sm90.trim_blocks && c.sm90.intra_warpgroup_overlap && c.B_c == 128;
}

// The backward kernels' warps (sm80/backward_kernel.cuh, WarpLayout): 16-row groups over a
// tile's rows, the rest of the warps over its columns, each warp's share of the columns whole
// pairs of n8 tiles (one ldmatrix.x4 loads two).
constexpr bool backward_layout_fits(int rows, int cols, int warps) {
    const int groups = rows / 16;
    return rows % 16 == 0 && groups > 0 && warps % groups == 0 &&
           cols % (16 * (warps / groups)) == 0;
}

// Both backward kernels' tiles: the dK/dV kernel's scores (B_c x B_r) and gradients (B_c x
// d_head, and dV's B_c x V's head dim), the dQ kernel's scores (B_r x B_c) and gradient (B_r x
// d_head).
constexpr bool backward_tiles_fit(const KernelConfig& c) {
    return backward_layout_fits(c.B_c, c.B_r, c.n_warps) &&
           backward_layout_fits(c.B_c, c.d_head, c.n_warps) &&
           backward_layout_fits(c.B_c, c.v_head_dim(), c.n_warps) &&
           backward_layout_fits(c.B_r, c.B_c, c.n_warps) &&
           backward_layout_fits(c.B_r, c.d_head, c.n_warps);
}

constexpr std::array k_rules = {
    // First: the rules below compute sizes from the fields.
    Rule{"fields", RuleKind::validity,
         "every field fits the kernel code (d_head < 512, B_r and B_c < 256, n_warps < 32, "
         "load tiles < 16, stages < 8, none negative)",
         [](const KernelConfig& c) { return !fields_in_range(c); }},
    Rule{"family", RuleKind::validity, "the sm80 and sm90 families exist",
         [](const KernelConfig& c) { return !sm80(c) && !sm90(c); }},
    Rule{"dtype", RuleKind::validity,
         "FP16 and BF16 kernels exist in every form; E4M3 (FP8) in the sm90 forward (Traits::fp8): "
         "d_head 64, 128 or 256 (V's own), two consumers (B_r 128, as tested), B_c 128 (V's "
         "transposed tile a whole 128-byte swizzle row of keys), and of the knobs stages, overlap, "
         "pingpong, persistent, dynamic, lazy and vtrans",
         [](const KernelConfig& c) {
             if (c.dtype == DType::FP16 || c.dtype == DType::BF16)
                 return false;
             if (c.dtype != DType::E4M3 || !sm90(c) || c.backward || c.d_v != 0 ||
                 (c.d_head != 64 && c.d_head != 128 && c.d_head != 256) || c.B_r != 128 ||
                 c.n_warps != 12 || c.B_c != 128)
                 return true;
             const Sm90Knobs allowed{.stages = c.sm90.stages,
                                     .intra_warpgroup_overlap = c.sm90.intra_warpgroup_overlap,
                                     .pingpong = c.sm90.pingpong,
                                     .persistent = c.sm90.persistent,
                                     .dynamic_schedule = c.sm90.dynamic_schedule,
                                     .lazy_rescale = c.sm90.lazy_rescale,
                                     .transpose_v = c.sm90.transpose_v};
             return !(c.sm90 == allowed);
         }},
    Rule{"vtrans_fp8", RuleKind::validity,
         "vtrans transposes FP8's (E4M3) V blocks in the kernel (8-bit wgmma reads K-major "
         "operands only; 16-bit kernels read V as it is)",
         [](const KernelConfig& c) { return c.sm90.transpose_v && c.dtype != DType::E4M3; }},
    Rule{"d_head", RuleKind::validity, "head dims 64, 96, 128, 192 and 256 are instantiated",
         [](const KernelConfig& c) { return !is_head_dim(c.d_head); }},
    Rule{"d_v", RuleKind::validity,
         "dv_N (V's head dim apart from Q's and K's) is 128 with d_head 192 (DeepSeek's MLA); "
         "dv_0 means d_head and is not written",
         [](const KernelConfig& c) {
             return c.d_v != 0 && (c.d_v == c.d_head || !is_value_dim(c.d_head, c.d_v));
         }},
    Rule{"foreign_knobs", RuleKind::validity,
         "a config sets only its own family's knobs: async, eager, swizzled, load_Q_K_V_tiles, "
         "buffer and opt_softmax are sm80's; stages, overlap, pingpong, persistent and qreg are "
         "sm90's (TMA, 128-byte swizzling and the base-2 softmax are always on in sm90 kernels)",
         [](const KernelConfig& c) { return has_foreign_knobs(c); }},
    // The backward pass.
    Rule{"backward_knobs", RuleKind::validity,
         "a backward config sets its family's backward knobs only: sm80 async and swizzled (its "
         "GEMMs load whole k extents; eager, load_Q_K_V_tiles, buffer and opt_softmax are the "
         "forward's), sm90 stages (the depth of the Q/dO pipeline), persistent, dynamic, "
         "streamk, ordered and lagdq",
         [](const KernelConfig& c) {
             if (!c.backward)
                 return false;
             if (sm90(c))
                 return c.sm90 != Sm90Knobs{.stages = c.sm90.stages,
                                            .persistent = c.sm90.persistent,
                                            .dynamic_schedule = c.sm90.dynamic_schedule,
                                            .stream_k = c.sm90.stream_k,
                                            .ordered_dq = c.sm90.ordered_dq,
                                            .lag_dq = c.sm90.lag_dq};
             return c.sm80.eager_load_blocks || c.sm80.Q_mma_load_K_tiles != 0 ||
                    c.sm80.K_mma_load_K_tiles != 0 || c.sm80.V_mma_load_K_tiles != 0 ||
                    c.sm80.mma_double_buffer_loads || c.sm80.optimized_softmax;
         }},
    Rule{"ordered_is_backward", RuleKind::validity,
         "ordered orders the backward pass's dQ additions (add bwd)",
         [](const KernelConfig& c) { return c.sm90.ordered_dq && !c.backward; }},
    Rule{"lagdq_is_backward", RuleKind::validity,
         "lagdq computes the backward pass's dQ a step behind (add bwd) in the sm90 kernel whose "
         "consumers own 64 keys each (B_c = 64 x consumers; not d_head 256's shared keys), "
         "without ordered (not built: its dQ additions wait in key-block order)",
         [](const KernelConfig& c) {
             return c.sm90.lag_dq &&
                    (!c.backward || sm90_backward_split_head(c) || c.sm90.ordered_dq);
         }},
    Rule{"psmem_forward", RuleKind::validity,
         "psmem passes the forward's P to P·V through shared memory (not with bwd) in 64-row "
         "tiles of whole 64-key sub-tiles (B_c 64, 128 or 192), with V's head dim at most 192 "
         "(the wgmma N of P·V from shared memory), not with packgqa",
         [](const KernelConfig& c) {
             return c.sm90.p_in_smem && (c.backward || c.B_c % 64 != 0 ||
                                         tile_columns(c.v_head_dim()) > 192 || c.sm90.pack_gqa);
         }},
    Rule{"packgqa_forward", RuleKind::validity,
         "packgqa packs the forward's tiles (not with bwd) on the per-sequence kernel body, whose "
         "64-row consumers each take whole positions of a group of query heads; not with streamk "
         "(the dense body's split of the last round), dv_N or d_head 96 (not built with packed "
         "rows)",
         [](const KernelConfig& c) {
             return c.sm90.pack_gqa &&
                    (c.backward || c.sm90.stream_k || c.d_v != 0 || c.d_head % 64 != 0);
         }},
    Rule{"persistent_backward", RuleKind::validity,
         "a persistent backward kernel has consumers of 64 keys each (B_c = 64 x consumers; not "
         "d_head 256's shared keys) and no ordered (its dQ additions would wait on key blocks "
         "that a fixed share of tiles need not have started)",
         [](const KernelConfig& c) {
             return sm90(c) && c.backward && c.sm90.persistent &&
                    (sm90_backward_split_head(c) || c.sm90.ordered_dq);
         }},
    Rule{"backward_tiles", RuleKind::validity,
         "backward tiles: B_r and B_c 64 or 128, whose 16-row warp groups divide the warps and "
         "leave each warp whole pairs of n8 columns of every tile",
         [](const KernelConfig& c) {
             return sm80(c) && c.backward &&
                    ((c.B_r != 64 && c.B_r != 128) || (c.B_c != 64 && c.B_c != 128) ||
                     !backward_tiles_fit(c));
         }},
    Rule{"backward_warpgroups", RuleKind::validity,
         "an sm90 backward kernel has one producer warpgroup and consumers of 64 keys each (B_c "
         "= 64 x consumers, 8 or 12 warps), B_r 64 or 128 queries a step (the N of Sᵀ's wgmma), "
         "split into 64-row groups of dQ that divide the consumers, each consumer's share of dQ "
         "whole 64-column sub-tiles (d_head 96: two consumers, B_r 64, dQ's columns split 64 + "
         "32), and d_head 64, 96 or 128; "
         "or, d_head 192 and 256, two consumers on the same 64 keys (B_c 64, 12 warps, B_r 64), "
         "each with half of d_head's columns (256) or one of dK and dV (192)",
         [](const KernelConfig& c) {
             if (!sm90(c) || !c.backward)
                 return false;
             const int consumers = consumer_warpgroups(c);
             if (c.d_head == 192 || c.d_head == 256)
                 return c.n_warps != 12 || c.B_c != 64 || c.B_r != 64;
             const int row_groups = c.B_r / 64;
             return (c.n_warps != 8 && c.n_warps != 12) || c.B_c != 64 * consumers ||
                    (c.B_r != 64 && c.B_r != 128) || consumers % row_groups != 0 ||
                    ((tile_columns(c.d_head) * row_groups / consumers) % 64 != 0 &&
                     !sm90_backward_uneven_dq(c)) ||
                    (c.d_head != 64 && c.d_head != 96 && c.d_head != 128);
         }},
    // sm80 family.
    Rule{"n_warps", RuleKind::validity, "4 or 8 warps per CTA",
         [](const KernelConfig& c) { return sm80(c) && c.n_warps != 4 && c.n_warps != 8; }},
    Rule{"rows_per_warp", RuleKind::validity,
         "each warp owns 16 or 32 query rows (one or two m16 MMA tiles)",
         [](const KernelConfig& c) {
             return sm80(c) && !c.backward &&
                    (c.B_r % c.n_warps != 0 ||
                     (c.rows_per_warp() != 16 && c.rows_per_warp() != 32));
         }},
    Rule{"B_c", RuleKind::validity, "B_c is 16, 32, 64 or 128 (a whole number of k16 MMA tiles)",
         [](const KernelConfig& c) {
             return sm80(c) && c.B_c != 16 && c.B_c != 32 && c.B_c != 64 && c.B_c != 128;
         }},
    Rule{"swizzled_rows", RuleKind::validity,
         "swizzled rows are whole groups of 8 16-byte chunks: d_head and V's head dim multiples "
         "of 64 (not 96)",
         [](const KernelConfig& c) {
             return sm80(c) && c.sm80.swizzled && (c.d_head % 64 != 0 || c.v_head_dim() % 64 != 0);
         }},
    Rule{"copy_split", RuleKind::validity,
         "every thread copies the same number of 16-byte chunks of each tile",
         [](const KernelConfig& c) { return sm80(c) && !copies_split_evenly(c); }},
    Rule{"eager_needs_async", RuleKind::validity,
         "prefetching the next block only overlaps compute when the copy is asynchronous",
         [](const KernelConfig& c) {
             return sm80(c) && c.sm80.eager_load_blocks && !c.sm80.async_copy;
         }},
    Rule{"q_tiles", RuleKind::validity,
         "Q fragments are either held whole (0) or streamed in step with K's",
         [](const KernelConfig& c) {
             return sm80(c) && c.sm80.Q_mma_load_K_tiles != 0 &&
                    c.sm80.Q_mma_load_K_tiles != c.sm80.K_mma_load_K_tiles;
         }},
    Rule{"k_tiles", RuleKind::validity, "K's load count divides d_head/16 k-tiles",
         [](const KernelConfig& c) {
             return sm80(c) && (c.sm80.K_mma_load_K_tiles < 0 ||
                                c.sm80.K_mma_load_K_tiles > k_tiles_total(c) ||
                                (c.sm80.K_mma_load_K_tiles != 0 &&
                                 k_tiles_total(c) % c.sm80.K_mma_load_K_tiles != 0));
         }},
    Rule{"v_tiles", RuleKind::validity, "V's load count divides B_c/16 k-tiles",
         [](const KernelConfig& c) {
             return sm80(c) && (c.sm80.V_mma_load_K_tiles < 0 ||
                                c.sm80.V_mma_load_K_tiles > v_tiles_total(c) ||
                                (c.sm80.V_mma_load_K_tiles != 0 &&
                                 v_tiles_total(c) % c.sm80.V_mma_load_K_tiles != 0));
         }},
    Rule{"buffer_needs_steps", RuleKind::validity,
         "double buffering needs a GEMM whose fragments arrive in two or more steps",
         [](const KernelConfig& c) {
             return sm80(c) && c.sm80.mma_double_buffer_loads && !splits_a_gemm(c);
         }},
    Rule{"smem", RuleKind::validity,
         "shared memory fits one CTA on an A100 (163 KB), the smallest sm_80+ target we build",
         [](const KernelConfig& c) {
             return sm80(c) && smem_bytes(c) > static_cast<std::size_t>(
                                                   DeviceLimits::a100().smem_per_block_optin);
         }},
    // sm90 family.
    Rule{"dynamic_needs_persistent", RuleKind::validity,
         "the dynamic tile schedule hands persistent CTAs their next tile (add persistent)",
         [](const KernelConfig& c) { return c.sm90.dynamic_schedule && !c.sm90.persistent; }},
    Rule{"streamk_needs_static_persistent", RuleKind::validity,
         "the forward's stream-K splits the last round of the static schedule's persistent CTAs "
         "(add persistent; not with dynamic)",
         [](const KernelConfig& c) {
             return !c.backward && c.sm90.stream_k &&
                    (!c.sm90.persistent || c.sm90.dynamic_schedule);
         }},
    Rule{"streamk_backward", RuleKind::validity,
         "the backward's stream-K hands persistent CTAs the last round's steps on the dynamic "
         "schedule (add persistent, dynamic and lagdq); not at d_head 96 (its consumers' dQ "
         "widths differ)",
         [](const KernelConfig& c) {
             return c.backward && c.sm90.stream_k &&
                    (!c.sm90.dynamic_schedule || !c.sm90.lag_dq || sm90_backward_uneven_dq(c));
         }},
    Rule{"half_needs_trim", RuleKind::validity,
         "half blocks end a trimmed consumer's overlapped loop on the first half of a B_c 128 "
         "block (add trim and overlap; B_c 128)",
         [](const KernelConfig& c) { return c.sm90.half_blocks && !can_halve(c); }},
    Rule{"warpgroups", RuleKind::validity,
         "8, 12 or 16 warps: one producer warpgroup and 1 to 3 consumer warpgroups",
         [](const KernelConfig& c) {
             return sm90(c) && c.n_warps != 8 && c.n_warps != 12 && c.n_warps != 16;
         }},
    Rule{"warpgroup_rows", RuleKind::validity,
         "each consumer warpgroup owns 64 query rows (one m64 wgmma tile): B_r = 64 x consumers",
         [](const KernelConfig& c) {
             return sm90(c) && !c.backward && c.B_r != 64 * consumer_warpgroups(c);
         }},
    Rule{"wgmma_n", RuleKind::validity,
         "B_c is 64, 80, 112, 128, 176 or 192 (the N of S = Q·Kᵀ's wgmma, which this library "
         "instantiates)",
         [](const KernelConfig& c) { return sm90(c) && !c.backward && !is_wgmma_n(c.B_c); }},
    Rule{"stages", RuleKind::validity, "1 to 4 K/V pipeline stages",
         [](const KernelConfig& c) { return sm90(c) && (c.sm90.stages < 1 || c.sm90.stages > 4); }},
    Rule{"pingpong_needs_two", RuleKind::validity,
         "ping-pong alternates two or more consumer warpgroups",
         [](const KernelConfig& c) {
             return sm90(c) && c.sm90.pingpong && consumer_warpgroups(c) < 2;
         }},
    Rule{"sm90_smem", RuleKind::validity, "shared memory fits one CTA on an H100 (227 KB)",
         [](const KernelConfig& c) {
             return sm90(c) && smem_bytes(c) > static_cast<std::size_t>(
                                                   DeviceLimits::h100().smem_per_block_optin);
         }},
    Rule{"register_budget", RuleKind::pruning,
         "the live fragments and accumulators would exceed the register budget and spill",
         [](const KernelConfig& c) {
             return estimated_registers(c) > (sm90(c) ? consumer_registers(c) : k_register_budget);
         }},
};

// `from`'s elements that `to` lacks, appended in order. Hashed: the `all` set's unions of tens
// of thousands of configs took seconds with a linear search each.
template <class T>
void append_unique(std::vector<T>& to, const std::vector<T>& from) {
    std::unordered_set<T> held(to.begin(), to.end());
    for (const T& x : from) {
        if (held.insert(x).second)
            to.push_back(x);
    }
}

std::vector<KernelConfig> sorted_unique(std::vector<KernelConfig> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
}

std::vector<KernelConfig> parse_all(std::initializer_list<std::string_view> short_forms) {
    std::vector<KernelConfig> v;
    for (const auto s : short_forms)
        v.push_back(KernelConfig::parse(s));
    return v;
}

// The seed's optimisation ladder, one technique per step.
std::vector<KernelConfig> progression() {
    return parse_all({
        "(FP16, 128, 64, 64, 4): async+load_0_0_0_tiles",
        "(FP16, 128, 64, 64, 4): async+swizzled+load_0_0_0_tiles",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_0_0_0_tiles",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer+opt_softmax",
        "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_0_2_2_tiles+opt_softmax",
    });
}

// The Hopper ladder, one technique per step, at the shape the sm90 tune set favours
// for d_head 128: TMA + wgmma + a producer warpgroup with one consumer warpgroup and
// no pipelining, then a second consumer warpgroup, a two-stage K/V pipeline, softmax
// overlapped with the next block's GEMMs within a warpgroup, ping-pong between
// warpgroups, persistent CTAs, and Q held in registers.
std::vector<KernelConfig> progression_sm90() {
    return parse_all({
        "(BF16, 128, 64, 128, 8): sm90+stages_1",
        "(BF16, 128, 128, 128, 12): sm90+stages_1",
        "(BF16, 128, 128, 128, 12): sm90+stages_2",
        "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap",
        "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong",
        "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+persistent",
        "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+persistent+qreg",
    });
}

// The ladder repeated over block shapes; shapes the rules reject are left out.
std::vector<KernelConfig> progression_all_block_sizes() {
    std::vector<KernelConfig> v;
    for (const KernelConfig& step : progression()) {
        for (const int B_r : {64, 128}) {
            for (const int B_c : {32, 64, 128}) {
                for (const int n_warps : {4, 8}) {
                    KernelConfig c = step;
                    c.B_r = B_r;
                    c.B_c = B_c;
                    c.n_warps = n_warps;
                    if (!rejecting_rule(c, /*validity_only=*/true))
                        v.push_back(c);
                }
            }
        }
    }
    return v;
}

std::vector<std::array<int, 3>> every_load_tiles(std::initializer_list<int> counts) {
    std::vector<std::array<int, 3>> v;
    for (const int q : counts) {
        for (const int k : counts) {
            for (const int t : counts)
                v.push_back({q, k, t});
        }
    }
    return v;
}

ValueSets tune_values() {
    ValueSets v;
    v.dtype = {DType::FP16, DType::BF16};
    v.d_head = {64, 128, 192, 256};
    v.B_r = {64, 128};
    v.B_c = {32, 64, 128};
    v.n_warps = {4, 8};
    v.async_copy = {true};
    v.eager_load_blocks = {true};
    v.swizzled = {true};
    v.load_tiles = {{0, 1, 1}, {0, 2, 2}, {1, 1, 1}, {2, 2, 2}};
    v.mma_double_buffer_loads = {false, true};
    // The textbook softmax does strictly more FP32 work per score (a separate scale
    // multiply, per-iteration row-sum shuffles); the progression ladder measures it.
    v.optimized_softmax = {true};
    return v;
}

// Hopper: 2 or 3 consumer warpgroups, 2 or 3 stages, with intra-warpgroup overlap (the
// ladder measures it off), ping-pong on and off.
ValueSets tune_values_sm90() {
    ValueSets v;
    v.family = {Family::sm90};
    v.dtype = {DType::FP16, DType::BF16};
    v.d_head = {64, 96, 128, 256};
    v.B_r = {128, 192};
    v.B_c = {64, 128};
    v.n_warps = {12, 16};
    v.stages = {2, 3};
    v.intra_warpgroup_overlap = {true};
    v.pingpong = {false, true};
    v.persistent = {false, true};
    v.q_in_registers = {false, true};
    v.dynamic_schedule = {false, true};
    v.lazy_rescale = {false, true};
    return v;
}

// d_head 256 beyond B_c 64, where S = Q·Kᵀ with both operands in shared memory moves
// 4 KB per 131-kFLOP k-step: 128 bytes per clock at the tensor cores' rate, all that
// shared memory delivers. B_c 80 (FlashAttention-3's tile for d_head 256) moves 4.5 KB per
// 164 kFLOP (112 B/clk), and two stages of 80-row K and V tiles still fit beside Q (225 KiB
// of 227 KiB); O (128 registers) + S (40) + P (20) fit the 240 of two consumers. B_c 128
// moves 6 KB per 262 kFLOP (96 B/clk) but fits only one stage and, without
// intra-warpgroup overlap (S and P never live together), 240 registers: ping-pong keeps
// the tensor cores busy through each warpgroup's softmax instead.
std::vector<KernelConfig> tune_configs_sm90_d256() {
    ValueSets v = tune_values_sm90();
    v.d_head = {256};
    v.B_r = {128};
    v.B_c = {80};
    v.n_warps = {12};
    v.stages = {2};
    v.q_in_registers = {false};
    std::vector<KernelConfig> configs = v.expand();
    v.B_c = {128};
    v.stages = {1};
    v.intra_warpgroup_overlap = {false};
    v.pingpong = {true};
    append_unique(configs, v.expand());
    return configs;
}

// d_head 128's three-consumer tile at B_c 80: O (64 registers), S (40) and P (20) fit the
// 160 of three consumers; S = Q·Kᵀ reads 4.5 KB per 164 kFLOP (112 B/clk against B_c 64's
// 128) and a tile has a fifth fewer blocks. 2-5% ahead of B_c 64 from 2048 keys, causal or
// not (H200, 2026-11-25, docs/PERF.md).
std::vector<KernelConfig> tune_configs_sm90_d128_bc80() {
    ValueSets v = tune_values_sm90();
    v.d_head = {128};
    v.B_r = {192};
    v.B_c = {80};
    v.n_warps = {16};
    v.q_in_registers = {false};
    return v.expand();
}

// d_head 96's 192-row tiles (three consumers), FlashAttention-3's row count at 96: without
// intra-warpgroup overlap (with it and P in registers they spilled 240-288 bytes, ptxas 13.0),
// which led the 128-row tile by 5-6% non-causal (H100, 2026-12-05, bench/d96-forward.txt), and
// overlapped with P through shared memory (psmem), 3-7% ahead of those (H100, 2026-12-06,
// bench/d96-forward-psmem.txt).
std::vector<KernelConfig> tune_configs_sm90_d96() {
    ValueSets v = tune_values_sm90();
    v.d_head = {96};
    v.B_r = {192};
    v.B_c = {128};
    v.n_warps = {16};
    v.intra_warpgroup_overlap = {false};
    v.q_in_registers = {false};
    std::vector<KernelConfig> configs = v.expand();
    // With P through shared memory, whose freed registers let the overlap in (FlashAttention-3's
    // and -4's choice at 96).
    v.intra_warpgroup_overlap = {true};
    v.p_in_smem = {true};
    append_unique(configs, v.expand());
    return configs;
}

// The sm80 tune set's d_head 192 configs with V's head dim 128 (DeepSeek's MLA), and d_head 96's,
// whose rows of 12 chunks are not swizzled.
std::vector<KernelConfig> tune_configs_sm80_mla() {
    ValueSets v = tune_values();
    v.d_head = {192};
    v.d_v = {128};
    std::vector<KernelConfig> configs = v.expand();
    v = tune_values();
    v.d_head = {96};
    v.swizzled = {false};
    append_unique(configs, v.expand());
    return configs;
}

// d_head 192, and 192 with V's 128 (DeepSeek's MLA), on two consumers (B_r 128) with two K/V
// stages: FlashAttention-3's key blocks for them, 112 and 128, the widest whose stages fit beside
// Q (216 and 208 KB of 227), and 64; with V's 128 also 112, d_head 192's causal tile, which the
// built-in table takes for MLA's causal problems past 2k keys. O (96 or 64 registers), S and P
// fit the consumers' 240 without Q in registers (48 more).
std::vector<KernelConfig> tune_configs_sm90_d192() {
    ValueSets v = tune_values_sm90();
    v.d_head = {192};
    v.B_r = {128};
    v.B_c = {64, 112};
    v.n_warps = {12};
    v.stages = {2};
    v.q_in_registers = {false};
    std::vector<KernelConfig> configs = v.expand();
    v.d_v = {128};
    v.B_c = {64, 112, 128};
    append_unique(configs, v.expand());
    return configs;
}

// pack_gqa tiles (grouped-query problems of few queries, builtin_choice.cpp): one consumer of
// 64 (position, head) rows streaming a K/V head's keys, B_c 64 or 128 in two or three stages,
// Q in registers or not; the rules keep those whose shared memory and registers fit.
std::vector<KernelConfig> tune_configs_sm90_packed() {
    ValueSets v = tune_values_sm90();
    v.B_r = {64};
    v.n_warps = {8};
    v.pingpong = {false};
    v.persistent = {false};
    v.dynamic_schedule = {false};
    v.lazy_rescale = {true};
    v.pack_gqa = {true};
    return v.expand();
}

// With trim_blocks, the configs of `configs` whose consumers' rows can end in different K/V
// blocks of a causal tile: all but B_c = B_r, where on an aligned diagonal every consumer's
// last key lies in the tile's last block and the knob would only move ptxas's schedule of
// the main loop (docs/PERF.md, 2026-11-26).
std::vector<KernelConfig> trimmed(const std::vector<KernelConfig>& configs) {
    std::vector<KernelConfig> v;
    for (KernelConfig c : configs) {
        if (c.family == Family::sm90 && c.B_c != c.B_r) {
            c.sm90.trim_blocks = true;
            v.push_back(c);
        }
    }
    return v;
}

// With half_blocks, the configs of `configs` where they can apply (can_halve(); docs/PERF.md,
// 2026-11-26 and 2026-11-28).
std::vector<KernelConfig> halved(const std::vector<KernelConfig>& configs) {
    std::vector<KernelConfig> v;
    for (KernelConfig c : configs) {
        if (c.family == Family::sm90 && can_halve(c)) {
            c.sm90.half_blocks = true;
            v.push_back(c);
        }
    }
    return v;
}

// With stream_k, the persistent configs of `configs` on the static schedule (the
// streamk_needs_static_persistent rule): whether splitting a part-filled last round pays
// depends on the tile as well as on how full that round is (d_head 256 lost where d_head 64
// and 128 gained, docs/PERF.md, 2026-11-28), which `tune` finds per shape.
std::vector<KernelConfig> streamed(const std::vector<KernelConfig>& configs) {
    std::vector<KernelConfig> v;
    for (KernelConfig c : configs) {
        if (c.family == Family::sm90 && c.sm90.persistent && !c.sm90.dynamic_schedule) {
            c.sm90.stream_k = true;
            v.push_back(c);
        }
    }
    return v;
}

ValueSets all_values_sm90() {
    ValueSets v = tune_values_sm90();
    v.B_c = {64, 80, 128, 176, 192};
    v.B_r = {64, 128, 192};
    v.n_warps = {8, 12, 16};
    v.stages = {1, 2, 3, 4};
    v.intra_warpgroup_overlap = {false, true};
    v.trim_blocks = {false, true};
    v.half_blocks = {false, true};
    v.stream_k = {false, true};
    v.pack_gqa = {false, true};
    return v;
}

// The backward kernels' tiles: 64 or 128 query rows (B_r) and key rows (B_c), 4 or 8 warps,
// cp.async into swizzled tiles; the rules keep the ones whose warps split every tile evenly and
// whose dK and dV fit the registers.
ValueSets tune_values_backward() {
    ValueSets v;
    v.backward = {true};
    v.dtype = {DType::FP16, DType::BF16};
    v.d_head = {64, 128, 192, 256};
    v.B_r = {64, 128};
    v.B_c = {64, 128};
    v.n_warps = {4, 8};
    v.async_copy = {true};
    v.swizzled = {true};
    return v;
}

// The sm90 backward kernels: one or two consumers of 64 keys, 64 or 128 queries a step, a Q/dO
// pipeline of one to three stages; the rules keep the ones whose dQ split, registers and shared
// memory fit.
ValueSets tune_values_backward_sm90() {
    ValueSets v;
    v.family = {Family::sm90};
    v.backward = {true};
    v.dtype = {DType::FP16, DType::BF16};
    v.d_head = {64, 96, 128, 192, 256};
    v.B_r = {64, 128};
    v.B_c = {64, 128};
    v.n_warps = {8, 12};
    v.stages = {1, 2, 3};
    v.persistent = {false, true};
    v.dynamic_schedule = {false, true};
    v.ordered_dq = {false, true};
    v.lag_dq = {false, true};
    v.stream_k = {false, true};
    return v;
}

std::vector<KernelConfig> tune_backward() {
    std::vector<KernelConfig> v = tune_values_backward().expand();
    ValueSets mla = tune_values_backward();  // V's head dim 128 with 192 (DeepSeek's MLA)
    mla.d_head = {192};
    mla.d_v = {128};
    append_unique(v, mla.expand());
    ValueSets d96 = tune_values_backward();  // rows of 12 chunks: not swizzled
    d96.d_head = {96};
    d96.swizzled = {false};
    append_unique(v, d96.expand());
    append_unique(v, tune_values_backward_sm90().expand());
    ValueSets mla_sm90 = tune_values_backward_sm90();
    mla_sm90.d_head = {192};
    mla_sm90.d_v = {128};
    append_unique(v, mla_sm90.expand());
    return sorted_unique(std::move(v));
}

ValueSets all_values() {
    ValueSets v;
    v.dtype = {DType::FP16, DType::BF16};
    v.d_head = {64, 128, 192, 256};
    v.B_r = {64, 128};
    v.B_c = {16, 32, 64, 128};
    v.n_warps = {4, 8};
    v.async_copy = {false, true};
    v.eager_load_blocks = {false, true};
    v.swizzled = {false, true};
    v.load_tiles = every_load_tiles({0, 1, 2, 4});
    v.mma_double_buffer_loads = {false, true};
    v.optimized_softmax = {false, true};
    return v;
}

// What the default build compiles: every kernel the automatic choice's built-in table
// names (both families, fp16 and bf16, d_head 64/128/192/256), derived from the table so
// that the two cannot disagree.
std::vector<KernelConfig> release() {
    std::vector<KernelConfig> v;
    for (const BuiltinChoice& row : builtin_choices())
        v.push_back(row.config);
    return sorted_unique(std::move(v));
}

// The release set plus knob coverage, so every code path is compiled and tested: a
// plain-load unswizzled textbook-softmax kernel, a non-eager asynchronous one with 8
// warps and Q held in registers, and sm90 kernels without pipelining (one consumer),
// with three consumers that are not persistent, with ping-pong on top of overlap, with
// one Q buffer under the dynamic schedule (the release holds the other dynamic tile
// schedule's kernels), trimmed consumer blocks passing two GEMM turns a block (ping-pong
// without overlap; the release's trimmed kernels overlap), and stream-K pieces in a persistent
// CTA of one Q buffer with O staged apart (the release's stream-K kernels have two buffers),
// and P through shared memory with ping-pong and trimmed blocks (d_head 64's 192 rows; the
// release's psmem kernels, d_head 96's, neither);
// and backward kernels with one CTA a key block and (lagdq) on persistent CTAs' fixed share of
// key blocks (the release's backward kernels at d_head 64, 96 and 128 are persistent and dynamic).
// The FP8 (e4m3) forward's configs (rule dtype) on the sm90 kernel body: the release's (the
// built-in table's), the plain kernels (no overlap: the baseline), and the alternatives measured
// within 4% of the table's at some lengths (builtin_choice.cpp): d_head 128 two stages with and
// without ping-pong; d_head 256, whose block accumulators leave no room for overlap
// (estimated_registers()), without it: one CTA a tile, persistent, ping-pong; and the built-in
// rows with V transposed in the kernel (vtrans); d_head 64 (64-byte swizzled Q and K tiles), the
// plain kernel and d_head 128's row without vtrans (the table's has it). Three
// consumers of 128 keys spill 240 bytes at d_head 128 (ptxas 13.0).
std::vector<KernelConfig> fp8() {
    std::vector<KernelConfig> v;
    for (const KernelConfig& c : release()) {
        if (c.dtype == DType::E4M3)
            v.push_back(c);
    }
    append_unique(
        v, parse_all({
               "(E4M3, 128, 128, 128, 12): sm90+stages_2",
               "(E4M3, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+dynamic+lazy",
               "(E4M3, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+persistent+dynamic+lazy",
               "(E4M3, 256, 128, 128, 12): sm90+stages_2",
               "(E4M3, 256, 128, 128, 12): sm90+stages_2+lazy",
               "(E4M3, 256, 128, 128, 12): sm90+stages_2+persistent+dynamic+lazy",
               "(E4M3, 256, 128, 128, 12): sm90+stages_2+pingpong+persistent+dynamic+lazy",
               "(E4M3, 128, 128, 128, 12): sm90+stages_3+overlap+persistent+dynamic+lazy+vtrans",
               "(E4M3, 256, 128, 128, 12): sm90+stages_2+persistent+dynamic+lazy+vtrans",
               "(E4M3, 64, 128, 128, 12): sm90+stages_2",
               "(E4M3, 64, 128, 128, 12): sm90+stages_3+overlap+persistent+dynamic+lazy",
           }));
    return v;
}

std::vector<KernelConfig> ci() {
    std::vector<KernelConfig> v = release();
    append_unique(v, fp8());
    append_unique(
        v, parse_all({
               "(FP16, 128, 64, 32, 4): load_0_0_0_tiles",
               "(BF16, 64, 128, 64, 8): async+swizzled+load_0_2_2_tiles+opt_softmax",
               "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+persistent+qreg",
               "(FP16, 64, 192, 64, 16): sm90+stages_3+overlap+pingpong",
               "(BF16, 256, 64, 64, 8): sm90+stages_1",
               "(FP16, 256, 128, 80, 12): sm90+stages_2+overlap+pingpong+persistent+dynamic+lazy",
               "(BF16, 128, 192, 64, 16): sm90+stages_2+pingpong+persistent+dynamic+trim",
               "(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+persistent+lazy+trim+"
               "streamk",
               "(BF16, 64, 192, 128, 16): "
               "sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim+psmem",
               "(FP16, 128, 64, 128, 12): sm90+bwd+stages_2",
               "(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+lagdq",
           }));
    return v;
}

}  // namespace

std::string numbers_text(std::span<const int> numbers) {
    std::string text;
    for (std::size_t i = 0; i < numbers.size(); ++i) {
        text += (i == 0                    ? ""
                 : i + 1 == numbers.size() ? " or "
                                           : ", ") +
                std::to_string(numbers[i]);
    }
    return text;
}

std::string head_dims_text() {
    return numbers_text(k_head_dims);
}

std::string value_dim_pairs_text() {
    std::string text;
    for (const auto& [d, d_v] : k_value_dims) {
        text += (text.empty() ? "" : " or ") + std::to_string(d_v) + " with d_head " +
                std::to_string(d);
    }
    return text;
}

std::string value_dims_text(int d_head) {
    return std::to_string(d_head) + " (q's d_head), or " + value_dim_pairs_text();
}

int estimated_registers(const KernelConfig& c) {
    if (c.n_warps <= 0 || c.d_head <= 0 || c.B_c <= 0)
        return 0;
    if (c.family == Family::sm90 && c.backward) {
        // A consumer thread holds its 64 keys' dK and dV (64 x d_head fp32 each over 128
        // threads) and a step's Sᵀ and dPᵀ (64 x B_r fp32 each; split_head, d_head 256: its
        // share of both; d_head 192: one of dK and dV), plus addresses and the columns'
        // statistics. An estimate, not yet fitted to ptxas.
        const int share = sm90_backward_split_head(c) ? consumer_warpgroups(c) : 1;
        return tile_columns(c.d_head) / share + c.B_r / share + 24;
    }
    if (c.family == Family::sm90) {
        // A consumer thread holds its share of the warpgroup's m64 tiles: O (64 x d_head
        // fp32 over 128 threads), S (64 x B_c fp32) and P (S as 16-bit pairs), plus
        // addresses, barrier phases and softmax state, which grow with d_head (16 +
        // d_head / 8, fitted to ptxas, nvcc 13.0: d_head 256, B_c 128 without overlap,
        // estimate 240, no spills; with overlap, 272, spills 284 bytes; d_head 64, B_r 192,
        // B_c 128 with overlap, 152 of 160, no spills; the same with Q in registers, 168,
        // spills 96 bytes). Without intra-warpgroup overlap P replaces S (converted in
        // place, S dead); with it, S of the next block is computed while P of this one
        // feeds P·V. FP8 (E4M3): P packs four values a register, the rest grows as 16 +
        // d_head / 16, and each block's P·V goes to accumulators of their own (Traits::
        // pv_parts: 64 x min(d_v, 128) fp32, 64 registers), live beside S with overlap and
        // beside P alone without (ptxas 13.0: d_head 128 with overlap, estimate 232, no
        // spills; d_head 256 without, 240, no spills; with overlap 304, not compiled: a whole
        // block's accumulator there spilled 2604 bytes; three consumers at d_head 128 with
        // overlap, 168 of 160 before the accumulators, spills 240 bytes).
        const bool fp8 = c.dtype == DType::E4M3;
        const bool overlap = c.sm90.intra_warpgroup_overlap;
        const int p = overlap && !c.sm90.p_in_smem ? c.B_c / (fp8 ? 8 : 4) : 0;
        const int pv = fp8 ? std::min(tile_columns(c.v_head_dim()), 128) / 2 : 0;
        const int pv_beside_s = overlap ? pv : std::max(0, c.B_c / 8 + pv - c.B_c / 2);
        return tile_columns(c.v_head_dim()) / 2 + c.B_c / 2 + p + pv_beside_s +
               (c.sm90.q_in_registers ? c.d_head / 4 : 0) + 16 + c.d_head / (fp8 ? 16 : 8);
    }
    if (c.backward) {
        // The dK/dV kernel, the larger: a warp's 16 key rows of dK and dV over its share of
        // d_head (fp32, live through the loop), of Sᵀ and dPᵀ over its share of B_r, the B
        // fragments of one k16 tile of the gradient GEMMs (16-bit pairs), and addresses.
        // An estimate, not yet fitted to ptxas.
        const int groups = c.B_c / 16;
        const int column_groups = groups > 0 && c.n_warps >= groups ? c.n_warps / groups : 1;
        const int d = (c.d_head + c.v_head_dim()) / 2 / column_groups;  // dK's and dV's mean
        return d + c.B_r / column_groups + d / 4 + 48;
    }
    // fp32 accumulators of O and S (one register per 32 elements of a warp's tile),
    // Q's fragments when held whole (16-bit pairs), and the rest: fragments in flight,
    // addresses and softmax state, 48 up to d_head 128 and growing with the width of a
    // V fragment row beyond. Fitted to ptxas (nvcc 13.0, sm_90) over the 144 configs of
    // d_head {64, 128} x B_r {64, 128} x B_c {32, 64, 128} x n_warps {4, 8} x load tiles
    // x buffering: every config it puts above 255 spills 40 to 1408 bytes; at 240
    // (B_r 128 / 4 warps / B_c 64 at d_head 128, B_c 128 at d_head 64) ptxas uses 255
    // registers and spills at most 36 bytes; all others spill nothing. At d_head 256,
    // B_c 64 (estimate 240) uses 255 registers without spilling and B_c 128 (272)
    // spills 524 bytes. ptxas schedules fragment loads itself, so the load step and
    // buffering barely move the count.
    const int rows = c.rows_per_warp();
    const int o_accum = rows * c.v_head_dim() / 32;
    const int s_accum = rows * c.B_c / 32;
    const int q_held = c.sm80.Q_mma_load_K_tiles == 0 ? rows * c.d_head / 64 : 0;
    const int rest = std::max(48, c.d_head / 4 + 16);
    return o_accum + s_accum + q_held + rest;
}

const Rule* rejecting_rule(const KernelConfig& config, bool validity_only) {
    for (const Rule& rule : k_rules) {
        if (validity_only && rule.kind != RuleKind::validity)
            continue;
        if (rule.rejects(config))
            return &rule;
    }
    return nullptr;
}

namespace {

// Every config of `partial` once for each value of one knob.
template <class T, class Assign>
std::vector<KernelConfig> times(const std::vector<KernelConfig>& partial,
                                const std::vector<T>& values, Assign assign) {
    std::vector<KernelConfig> out;
    for (const KernelConfig& c : partial) {
        for (const T& value : values) {
            KernelConfig next = c;
            assign(next, value);
            out.push_back(next);
        }
    }
    return out;
}

}  // namespace

std::vector<KernelConfig> ValueSets::expand() const {
    std::vector<KernelConfig> v{KernelConfig{}};
    // Every field's list in table order, the load_Q_K_V_tiles fields as one.
#define FLASH_ATTENTION_EXPAND_ONE(family, name)                \
    v = times(v, name, [](KernelConfig& c, const auto& value) { \
        FLASH_ATTENTION_FIELD(c, family, name) = value;         \
    });
#define FLASH_ATTENTION_EXPAND_family(family, name) FLASH_ATTENTION_EXPAND_ONE(family, name)
#define FLASH_ATTENTION_EXPAND_dtype(family, name) FLASH_ATTENTION_EXPAND_ONE(family, name)
#define FLASH_ATTENTION_EXPAND_tuple(family, name) FLASH_ATTENTION_EXPAND_ONE(family, name)
#define FLASH_ATTENTION_EXPAND_flag(family, name) FLASH_ATTENTION_EXPAND_ONE(family, name)
#define FLASH_ATTENTION_EXPAND_count(family, name) FLASH_ATTENTION_EXPAND_ONE(family, name)
#define FLASH_ATTENTION_EXPAND_load_tiles(family, name)
#define FLASH_ATTENTION_EXPAND(type, name, init, bits, family, kind, token) \
    FLASH_ATTENTION_EXPAND_##kind(family, name)
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_EXPAND)
#undef FLASH_ATTENTION_EXPAND
    constexpr int first_load = [] {
        for (int i = 0; i < k_config_field_count; ++i) {
            if (k_config_fields[i].kind == FieldKind::load_tiles)
                return i;
        }
        return -1;
    }();
    static_assert(first_load >= 0, "the table has the load_Q_K_V_tiles fields");
    v = times(v, load_tiles, [](KernelConfig& c, const std::array<int, 3>& t) {
        for (int k = 0; k < 3; ++k)
            set_field_value(c, first_load + k, t[k]);
    });
    std::erase_if(v, [](const KernelConfig& c) { return rejecting_rule(c) != nullptr; });
    return sorted_unique(std::move(v));
}

namespace {

std::vector<KernelConfig> configs_in_file(std::string_view path) {
    // A kernel list is a few kilobytes: a FIFO, a device or a huge file is refused, not read.
    constexpr std::size_t max_bytes = 1 << 20;
    const std::string where = "kernel set \"@" + printable(path, 200) + "\": ";
    const SmallFile file = read_small_file(std::filesystem::path(path), max_bytes);
    if (file.missing)
        throw Error(ErrorCode::invalid_argument, where + "expected a regular file, found none");
    if (!file.problem.empty()) {
        throw Error(ErrorCode::invalid_argument,
                    where + "expected a regular file of at most 1 MiB, but it " + file.problem);
    }
    const std::string& text = file.text;
    std::vector<KernelConfig> configs;
    int number = 0;
    for (std::size_t start = 0; start < text.size();) {
        std::size_t end = text.find('\n', start);
        if (end == std::string::npos)
            end = text.size();
        std::string line = text.substr(start, end - start);
        start = end + 1;
        ++number;
        line = line.substr(0, line.find('#'));
        const auto first = line.find_first_not_of(" \t\r");
        if (first == std::string::npos)
            continue;
        const auto last = line.find_last_not_of(" \t\r");
        try {
            configs.push_back(KernelConfig::parse(line.substr(first, last - first + 1)));
        } catch (const Error& e) {
            throw Error(ErrorCode::invalid_argument,
                        where + "line " + std::to_string(number) + ": " + e.what());
        }
    }
    return configs;
}

}  // namespace

std::vector<std::string_view> set_names() {
    return {"release",
            "ci",
            "fp8",
            "progression",
            "progression-all",
            "progression-sm90",
            "tune",
            "tune-sm80",
            "tune-sm90",
            "tune-backward",
            "all"};
}

std::vector<KernelConfig> named_set(std::string_view name) {
    if (name.find(',') != std::string_view::npos) {
        std::vector<KernelConfig> all;
        for (std::size_t start = 0;;) {
            const std::size_t end = name.find(',', start);
            append_unique(all, named_set(name.substr(start, end - start)));
            if (end == std::string_view::npos)
                break;
            start = end + 1;
        }
        return sorted_unique(std::move(all));
    }
    if (name.starts_with('@'))
        return sorted_unique(configs_in_file(name.substr(1)));
    if (name == "release")
        return release();
    if (name == "ci")
        return sorted_unique(ci());
    if (name == "fp8")
        return sorted_unique(fp8());
    if (name == "progression")
        return progression();  // ladder order, not sorted
    if (name == "progression-all")
        return sorted_unique(progression_all_block_sizes());
    if (name == "progression-sm90")
        return progression_sm90();  // ladder order, not sorted
    if (name == "tune-sm80") {
        std::vector<KernelConfig> v = tune_values().expand();
        append_unique(v, tune_configs_sm80_mla());
        return sorted_unique(std::move(v));
    }
    if (name == "tune-sm90") {
        std::vector<KernelConfig> v = tune_values_sm90().expand();
        append_unique(v, tune_configs_sm90_d256());
        append_unique(v, tune_configs_sm90_d128_bc80());
        append_unique(v, tune_configs_sm90_d96());
        append_unique(v, tune_configs_sm90_d192());
        append_unique(v, tune_configs_sm90_packed());
        append_unique(v, trimmed(v));
        append_unique(v, halved(v));
        append_unique(v, streamed(v));
        append_unique(v, fp8());  // FP8's knobs are few: the whole set
        return sorted_unique(std::move(v));
    }
    if (name == "tune-backward")
        return tune_backward();
    if (name == "tune") {
        std::vector<KernelConfig> v = named_set("tune-sm80");
        append_unique(v, named_set("tune-sm90"));
        append_unique(v, tune_backward());
        return sorted_unique(std::move(v));
    }
    if (name == "all") {
        ValueSets backward = tune_values_backward();
        backward.async_copy = {false, true};
        backward.swizzled = {false, true};
        std::vector<KernelConfig> v = all_values().expand();
        append_unique(v, backward.expand());
        append_unique(v, tune_values_backward_sm90().expand());
        append_unique(v, all_values_sm90().expand());
        append_unique(v, progression_sm90());
        append_unique(v, progression_all_block_sizes());
        append_unique(v, ci());
        return sorted_unique(std::move(v));
    }
    std::string known;
    for (const auto n : set_names())
        known += (known.empty() ? "" : ", ") + std::string(n);
    throw Error(ErrorCode::invalid_argument,
                "unknown config set \"" + printable(name) + "\" (expected one of " + known + ")");
}

}  // namespace flash_attention::space
