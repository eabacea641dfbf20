#include "api/choice.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "config/builtin_choice.hpp"
#include "kernels/serving/launch.hpp"
#include "registry/registry.hpp"
#include "tuning/tuning_cache.hpp"

namespace flash_attention {

ChoiceProblem choice_problem(const ForwardParams& p) {
    return {shape_of(p), tma_problem(p).empty(), 0, p.options.variants.any()};
}

bool can_run(const KernelConfig& c, const ChoiceProblem& p, const DeviceProperties& device) {
    return !c.backward && c.dtype == p.shape.dtype && c.d_head == p.shape.d_head &&
           c.d_v == p.shape.d_v && device_problem(c, device).empty() &&
           (c.family != Family::sm90 || p.tma_addressable) &&
           pack_gqa_problem(c, p.shape.heads, p.shape.heads_kv, p.shape.seq_q,
                            p.variants || p.shape.window_or_softcap)
               .empty();
}

namespace {

// Whether the sm90 kernels copy each K/V block of `config` from pages of `page_size` rows
// in long runs: the page and the block dividing one another (else runs shrink to their
// common divisor, 16 rows with B_c 80). Measured: chunked prefill (q512 k8192 b8 causal,
// d_head 128) on 64-row pages ran 10% behind the contiguous cache with B_c 80 (16-row runs)
// and level with B_c 128 (H200, 2026-11-25, docs/PERF.md; a copy a run and sub-tile then).
bool copies_whole_runs(const KernelConfig& config, std::int64_t page_size) {
    return page_size == 0 || config.family != Family::sm90 || page_size % config.B_c == 0 ||
           config.B_c % page_size == 0;
}

// Whether the automatic choice may give the problem a pack_gqa config: a grouped problem of
// few queries, as the table's pack_gqa rows admit (a tuned winner or a fallback too; named
// configs run wherever pack_gqa_problem() allows).
bool packs(const ChoiceProblem& p) {
    return p.shape.heads > p.shape.heads_kv && p.shape.seq_q <= space::k_packed_max_seq_q;
}

}  // namespace

std::optional<KernelConfig> heuristic_config(const ChoiceProblem& p,
                                             const DeviceProperties& device) {
    const std::int64_t seq = std::max(p.shape.seq_q, p.shape.seq_k);
    const std::int64_t group = p.shape.heads / p.shape.heads_kv;
    std::optional<KernelConfig> first;
    for (const space::BuiltinChoice& row : space::builtin_choices()) {
        if (row.admits(seq, p.shape.causal, p.shape.seq_q, group, p.shape.seq_k) &&
            can_run(row.config, p, device) && (!first || first->family == row.config.family)) {
            if (copies_whole_runs(row.config, p.page_size))
                return row.config;
            if (!first)
                first = row.config;
        }
    }
    if (first)
        return first;
    // A build whose set lacks the table's kernels (a tune or ladder build): the family
    // made for the device first, then larger tiles, which reuse each K/V byte loaded
    // from memory across more query rows.
    std::vector<KernelConfig> candidates;
    for (const KernelConfig& c : configs()) {
        if (can_run(c, p, device) && (packs(p) || !c.sm90.pack_gqa))
            candidates.push_back(c);
    }
    if (candidates.empty())
        return std::nullopt;
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const KernelConfig& a, const KernelConfig& b) {
                         if (a.family != b.family)
                             return a.family == Family::sm90;
                         return a.B_r * a.B_c > b.B_r * b.B_c;
                     });
    return candidates.front();
}

std::optional<KernelConfig> find_kernel_for(const ChoiceProblem& p,
                                            const DeviceProperties& device) {
    // A cached config this build lacks, or one that cannot run here, is skipped: a stale
    // cache costs speed, never a failure. A problem of the variant kernels without its own
    // entry takes the plain problem's winner (the same config's other instantiation). A
    // pack_gqa winner serves only the problems packs() admits: the key's length bucket does
    // not tell a few queries over many keys from a square problem.
    tuning::Key key = tuning::Key::of(device, p.shape);
    for (const bool variant : {key.window_or_softcap, false}) {
        key.window_or_softcap = variant;
        if (const auto tuned = tuning::lookup(key);
            tuned && can_run(*tuned, p, device) && (packs(p) || !tuned->sm90.pack_gqa))
            return *tuned;
    }
    return heuristic_config(p, device);
}

KernelConfig choose_kernel(const ChoiceProblem& p, const DeviceProperties& device) {
    if (const auto c = find_kernel_for(p, device))
        return *c;
    // Tensors TMA cannot copy need the sm80 family, which has no FP8 kernels: say so, since the
    // dtype and head dim may well be built.
    const char* layout = p.tma_addressable ? ""
                         : p.shape.dtype == DType::E4M3
                             ? "; E4M3 tensors need strides TMA can copy (the sm90 family's)"
                             : "; these tensors need an sm80-family one";
    throw Error(ErrorCode::unsupported,
                "q: expected a dtype and d_head that a built kernel runs on " + device.name +
                    " (kernel set \"" + std::string(built_kernel_set()) +
                    "\"; see flash_attention list" + layout + "), got " +
                    std::string(to_string(p.shape.dtype)) + " d_head " +
                    std::to_string(p.shape.d_head) +
                    (p.shape.d_v != 0 ? " d_v " + std::to_string(p.shape.d_v) : ""));
}

bool runs_split_kv(const ChoiceProblem& p, const DeviceProperties& device) {
    // At most one 64-row tile of (position, head) rows per K/V head, over at least 1024 keys:
    // measured on the H100 (2026-11-24, docs/PERF.md), decode b16 x 8192 ran
    // 522 µs dense and 196 µs split, b1 x 131072 2008 and 192, speculative decode (16
    // positions, 4 heads a K/V head) 84 and 122 TFLOP/s in the dense kernel's unpacked tiles.
    // Above 16 rows (speculative decoding) a pack_gqa config that the choice would run takes
    // them instead where its tiles, one a (sequence, K/V head) over all the keys, fill three
    // quarters of the SMs (batch 16 x 8 K/V heads: 128 on 132), as FlashAttention-4 runs them;
    // fewer tiles would leave SMs idle that the split-KV kernel's key ranges fill. Decoding (one
    // position, whatever the group) and up to 16 rows stay on the split-KV kernel, which
    // streams K/V at 4.1-4.3 TB/s (H200, 2026-11-26). Only at the head dims the split-KV kernel
    // is built for.
    constexpr std::int64_t most_rows = 64;
    constexpr std::int64_t decode_rows = 16;
    constexpr std::int64_t fewest_keys = 1024;
    const ProblemShape& shape = p.shape;
    const std::int64_t rows = shape.seq_q * (shape.heads / shape.heads_kv);
    // FP8 where no sm90 kernel takes it (a build without one at that head dim), every shape;
    // elsewhere its decoding shapes (its tiles of 128 rows would hold one).
    if (shape.dtype == DType::E4M3 && serving::has_split_kv(shape.d_head) && device.major >= 9 &&
        !find_kernel_for(p, device))
        return true;
    if (shape.window_or_softcap || !serving::has_split_kv(shape.d_head) || shape.d_v != 0 ||
        rows > most_rows || shape.seq_k < fewest_keys)
        return false;
    if (shape.seq_q == 1 || rows <= decode_rows)
        return true;
    const std::optional<KernelConfig> c = find_kernel_for(p, device);
    if (!c || !c->sm90.pack_gqa)
        return true;
    const std::int64_t tiles = shape.batch * shape.heads_kv * ((rows + c->B_r - 1) / c->B_r);
    return 4 * tiles < 3 * std::int64_t{device.sm_count};
}

}  // namespace flash_attention
