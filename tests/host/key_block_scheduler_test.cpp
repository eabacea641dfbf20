// The sm90 backward's grid order (kernels/key_block_scheduler.hpp): every CTA index names a
// distinct (key block, K/V head, sequence), each causal section runs its longest walks first
// (ordered causal without GQA: highest key blocks first), an ordered CTA never waits on a later
// one, and the adds before each key block's are counted as the walks make them.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/key_block_scheduler.hpp"

namespace fa = flash_attention;
using fa::sm90::KeyBlockScheduler;

namespace {

fa::BackwardArgs problem(int seq_k, int heads_kv, int batch, bool causal, int sm_count, int group) {
    fa::BackwardArgs a{};
    a.seq_q = seq_k;
    a.seq_k = seq_k;
    a.heads = group * heads_kv;
    a.heads_kv = heads_kv;
    a.batch = batch;
    a.causal = causal;
    a.band = {fa::k_unbounded_window, causal ? 0 : fa::k_unbounded_window};
    a.sm_count = sm_count;
    return a;
}

// The section of `pair` when `pairs` are split into `sections` whose sizes differ by one at
// most, the larger first (balanced_section_position).
int section_of(int pair, int sections, int pairs) {
    const int small = pairs / sections;
    const int larger_pairs = (pairs % sections) * (small + 1);
    return pair < larger_pairs ? pair / (small + 1)
                               : pairs % sections + (pair - larger_pairs) / small;
}

// Sections of two waves of CTAs at most, as few as that allows.
int causal_sections(int pairs, int sm_count, int key_blocks) {
    const int two_waves = std::max((2 * sm_count + key_blocks - 1) / key_blocks, 1);
    return (pairs + two_waves - 1) / two_waves;
}

struct Case {
    int seq_k, heads_kv, batch, sm_count, group;
    bool causal, ordered;
};

std::vector<Case> cases() {
    std::vector<Case> all;
    for (int seq_k : {1, 100, 2048, 8192})
        for (int heads_kv : {1, 3, 16})
            for (int batch : {1, 2, 5})
                for (int sm_count : {1, 132})
                    for (int group : {1, 4})
                        for (bool causal : {false, true})
                            for (bool ordered : {false, true})
                                all.push_back(
                                    {seq_k, heads_kv, batch, sm_count, group, causal, ordered});
    return all;
}

constexpr int B_c = 128;

}  // namespace

TEST(KeyBlockScheduler, EveryTileOnce) {
    for (const Case& c : cases()) {
        const auto s = KeyBlockScheduler::of(
            problem(c.seq_k, c.heads_kv, c.batch, c.causal, c.sm_count, c.group), B_c, c.ordered);
        ASSERT_EQ(s.count(), std::int64_t{(c.seq_k + B_c - 1) / B_c} * c.heads_kv * c.batch);
        std::set<std::tuple<int, int, int>> seen;
        for (int i = 0; i < s.count(); ++i) {
            const auto t = s.tile(i);
            ASSERT_TRUE(t.key_block >= 0 && t.key_block < s.key_blocks && t.kv_head >= 0 &&
                        t.kv_head < c.heads_kv && t.batch >= 0 && t.batch < c.batch)
                << "seq_k " << c.seq_k << " index " << i;
            seen.insert({t.key_block, t.kv_head, t.batch});
        }
        EXPECT_EQ(static_cast<std::int64_t>(seen.size()), s.count()) << "seq_k " << c.seq_k;
    }
}

// Without a mask, a pair's key blocks are neighbours (they stream the same Q and dO through L2).
TEST(KeyBlockScheduler, NonCausalKeyBlocksAreNeighbours) {
    for (const Case& c : cases()) {
        if (c.causal)
            continue;
        const auto s = KeyBlockScheduler::of(
            problem(c.seq_k, c.heads_kv, c.batch, false, c.sm_count, c.group), B_c, c.ordered);
        for (int i = 0; i < s.count(); ++i) {
            const auto t = s.tile(i);
            ASSERT_EQ(t.key_block, i % s.key_blocks);
            ASSERT_EQ(t.batch * c.heads_kv + t.kv_head, i / s.key_blocks);
        }
    }
}

// Causal: a section's pairs fill about two waves of CTAs (ordered with GQA: every pair in one
// section), and within a section the key blocks (whose walks shrink with their index) come in
// order, unless ordered without GQA. An ordered
// CTA in key-block order waits only on lower key blocks of its pair, which come before it.
TEST(KeyBlockScheduler, CausalSectionsRunLongestFirst) {
    for (const Case& c : cases()) {
        if (!c.causal || (c.ordered && c.group == 1))
            continue;
        const auto s = KeyBlockScheduler::of(
            problem(c.seq_k, c.heads_kv, c.batch, true, c.sm_count, c.group), B_c, c.ordered);
        const int pairs = c.heads_kv * c.batch;
        EXPECT_EQ(s.sections, c.ordered ? 1 : causal_sections(pairs, c.sm_count, s.key_blocks));
        std::vector<int> last_block(pairs, -1);
        int previous_section = 0, previous_block = 0;
        for (int i = 0; i < s.count(); ++i) {
            const auto t = s.tile(i);
            const int pair = t.batch * c.heads_kv + t.kv_head;
            const int section = section_of(pair, s.sections, pairs);
            ASSERT_GE(section, previous_section) << "index " << i;
            if (section == previous_section) {
                ASSERT_GE(t.key_block, previous_block) << "index " << i;
            }
            ASSERT_EQ(t.key_block, last_block[pair] + 1) << "index " << i;
            last_block[pair] = t.key_block;
            previous_section = section;
            previous_block = t.key_block;
        }
    }
}

// Sections whose sizes differ by one at most, the larger first: every (unit, rank) once, a
// section's units all at one rank before any takes the next. 32/8 heads at 8k on 132 SMs (64 key
// blocks, two waves of 5 pairs) run in sections of 4 and 4 pairs, not 5 and 3.
TEST(KeyBlockScheduler, SectionsAreBalanced) {
    for (const int units : {1, 2, 7, 8, 32, 33})
        for (const int blocks : {1, 3, 64})
            for (int sections = 1; sections <= units; ++sections) {
                std::vector<int> seen(units * blocks, 0), next_rank(units, 0), size(sections, 0);
                for (int u = 0; u < units; ++u)
                    ++size[section_of(u, sections, units)];
                for (int s = 0; s < sections; ++s) {
                    ASSERT_GE(size[s], units / sections);
                    ASSERT_LE(size[s], (units + sections - 1) / sections);
                    if (s > 0) {
                        ASSERT_LE(size[s], size[s - 1]);
                    }
                }
                int previous_section = 0, previous_rank = 0;
                for (int i = 0; i < units * blocks; ++i) {
                    const fa::SectionPosition at =
                        fa::balanced_section_position(i, blocks, sections, units);
                    ASSERT_TRUE(at.unit >= 0 && at.unit < units && at.rank >= 0 && at.rank < blocks)
                        << "index " << i;
                    ASSERT_EQ(seen[at.unit * blocks + at.rank]++, 0) << "index " << i;
                    ASSERT_EQ(at.rank, next_rank[at.unit]++) << "index " << i;
                    const int section = section_of(at.unit, sections, units);
                    ASSERT_GE(section, previous_section) << "index " << i;
                    if (section == previous_section) {
                        ASSERT_GE(at.rank, previous_rank) << "index " << i;
                    }
                    previous_section = section;
                    previous_rank = at.rank;
                }
            }
    const auto gqa = KeyBlockScheduler::of(problem(8192, 8, 1, true, 132, 4), B_c, false);
    EXPECT_EQ(gqa.sections, 2);
    for (int i = 0; i < 4 * gqa.key_blocks; ++i)
        ASSERT_LT(gqa.tile(i).kv_head, 4) << "index " << i;
}

// Ordered causal without GQA: a pair's key blocks run highest first, and within a section (as
// unordered) every pair's highest before any pair's next (shortest walks first): an ordered CTA
// waits only on higher key blocks of its pair, which have lower CTA indices.
TEST(KeyBlockScheduler, OrderedCausalWithoutGqaRunsHighestKeyBlockFirst) {
    for (const Case& c : cases()) {
        if (!c.ordered || !c.causal || c.group != 1)
            continue;
        const auto s = KeyBlockScheduler::of(
            problem(c.seq_k, c.heads_kv, c.batch, c.causal, c.sm_count, c.group), B_c, true);
        const int pairs = c.heads_kv * c.batch;
        EXPECT_EQ(s.sections, causal_sections(pairs, c.sm_count, s.key_blocks));
        std::vector<int> last_block(pairs, s.key_blocks);
        int previous_section = 0, previous_rank = 0;
        for (int i = 0; i < s.count(); ++i) {
            const auto t = s.tile(i);
            const int pair = t.batch * c.heads_kv + t.kv_head;
            ASSERT_EQ(t.key_block, last_block[pair] - 1) << "index " << i;
            last_block[pair] = t.key_block;
            const int rank = s.key_blocks - 1 - t.key_block;
            const int section = section_of(pair, s.sections, pairs);
            ASSERT_GE(section, previous_section) << "index " << i;
            if (section == previous_section) {
                ASSERT_GE(rank, previous_rank) << "index " << i;
            }
            previous_section = section;
            previous_rank = rank;
        }
    }
}

// A dense band that is causal masking alone (ALiBi's band kernels) is scheduled as the causal
// kernels are (sections, highest key blocks first when ordered); a window's band and packed
// sequences keep one pair a section in key-block order.
TEST(KeyBlockScheduler, CausalBandSchedulesAsCausal) {
    for (const bool ordered : {false, true}) {
        fa::BackwardArgs a = problem(8192, 3, 2, true, 132, 1);
        const auto plain = KeyBlockScheduler::of(a, B_c, ordered);
        a.banded = true;
        const auto band = KeyBlockScheduler::of(a, B_c, ordered);
        EXPECT_EQ(band.sections, plain.sections);
        EXPECT_EQ(band.descending, plain.descending);
        EXPECT_LT(band.sections, 6);  // sections of several pairs
        fa::BackwardArgs window = a;
        window.band.left = 1000;
        EXPECT_EQ(KeyBlockScheduler::of(window, B_c, ordered).sections, 6);  // a pair each
        EXPECT_FALSE(KeyBlockScheduler::of(window, B_c, ordered).descending);
        fa::BackwardArgs packed = a;
        const int offsets[] = {0, 8192};
        packed.cu_seqlens_q = offsets;
        EXPECT_EQ(KeyBlockScheduler::of(packed, B_c, ordered).sections, 6);
        EXPECT_FALSE(KeyBlockScheduler::of(packed, B_c, ordered).descending);
    }
}

// adds_before against the walks themselves: the key blocks whose walk (QueryBlocks, the kernels'
// own) reaches query block m are 0 .. L, and their adds count 0 .. L in the scheduler's order
// (L - n before key block n highest first, n before it in key-block order). Both alignments,
// seq_q != seq_k, query blocks larger and smaller than key blocks, with and without GQA.
TEST(KeyBlockScheduler, AddsBeforeCountsTheEarlierKeyBlocks) {
    for (const int seq_q : {1, 63, 64, 100, 257, 1000})
        for (const int seq_k : {1, 65, 100, 128, 129, 600, 1000})
            for (const bool causal : {false, true})
                for (const bool top_left : {false, true})
                    for (const int group : {1, 4})
                        for (const auto& [b_r, b_c] : {std::pair{64, 128}, std::pair{128, 128},
                                                       std::pair{128, 64}, std::pair{64, 64}}) {
                            fa::BackwardArgs a = problem(seq_k, 2, 1, causal, 132, group);
                            a.seq_q = seq_q;
                            a.diagonal_seq_q = fa::diagonal_queries(seq_q, seq_k, top_left);
                            const auto s = KeyBlockScheduler::of(a, b_c, true);
                            EXPECT_EQ(s.descending, causal && group == 1);
                            const int query_blocks = (seq_q + b_r - 1) / b_r;
                            std::vector<fa::QueryBlocks> walks;
                            for (int n = 0; n < s.key_blocks; ++n) {
                                walks.push_back(
                                    fa::QueryBlocks::of(fa::CausalMask::of(a), n * b_c,
                                                        std::min((n + 1) * b_c, seq_k) - 1, b_r));
                            }
                            for (int m = 0; m < query_blocks; ++m) {
                                int adders = 0;
                                for (int n = 0; n < s.key_blocks; ++n)
                                    if (walks[n].first <= m && m < walks[n].end) {
                                        ASSERT_EQ(n, adders) << "the adders are a prefix";
                                        ++adders;
                                    }
                                for (int n = 0; n < adders; ++n) {
                                    ASSERT_EQ(
                                        s.adds_before(a, fa::CausalMask::of(a), n, m, b_r, b_c),
                                        s.descending ? adders - 1 - n : n)
                                        << "seq_q " << seq_q << " seq_k " << seq_k << " causal "
                                        << causal << " top_left " << top_left << " group " << group
                                        << " B_r " << b_r << " B_c " << b_c << " m " << m;
                                }
                            }
                        }
}

// Deadlock freedom, the grid order and the add order together: along each query block's adds,
// the CTAs' indices rise, so that a CTA waits only on CTAs launched before it, whatever else
// shares the GPU. Several pairs and sections (sm_count 4 makes many), both alignments, GQA.
TEST(KeyBlockScheduler, OrderedCtasWaitOnlyOnEarlierOnes) {
    for (const int seq_q : {100, 1000})
        for (const int seq_k : {100, 600, 1000})
            for (const bool causal : {false, true})
                for (const bool top_left : {false, true})
                    for (const int group : {1, 4})
                        for (const int sm_count : {4, 132}) {
                            constexpr int b_r = 64;
                            fa::BackwardArgs a = problem(seq_k, 3, 2, causal, sm_count, group);
                            a.seq_q = seq_q;
                            a.diagonal_seq_q = fa::diagonal_queries(seq_q, seq_k, top_left);
                            const auto s = KeyBlockScheduler::of(a, B_c, true);
                            const int pairs = a.heads_kv * a.batch;
                            std::vector<int> index(static_cast<std::size_t>(pairs) * s.key_blocks);
                            for (int i = 0; i < s.count(); ++i) {
                                const auto t = s.tile(i);
                                index[(t.batch * a.heads_kv + t.kv_head) * s.key_blocks +
                                      t.key_block] = i;
                            }
                            const int query_blocks = (seq_q + b_r - 1) / b_r;
                            for (int pair = 0; pair < pairs; ++pair) {
                                for (int m = 0; m < query_blocks; ++m) {
                                    std::vector<int> by_rank(s.key_blocks, -1);
                                    for (int n = 0; n < s.key_blocks; ++n) {
                                        const int begin =
                                            causal
                                                ? std::max(0, n * B_c - (seq_k - a.diagonal_seq_q))
                                                : 0;
                                        if (std::min(begin / b_r, query_blocks) <= m)
                                            by_rank[s.adds_before(a, fa::CausalMask::of(a), n, m,
                                                                  b_r, B_c)] =
                                                index[pair * s.key_blocks + n];
                                    }
                                    int previous = -1;
                                    for (const int cta : by_rank) {
                                        if (cta < 0)
                                            break;
                                        ASSERT_GT(cta, previous)
                                            << "seq_q " << seq_q << " seq_k " << seq_k << " causal "
                                            << causal << " top_left " << top_left << " group "
                                            << group << " sms " << sm_count << " pair " << pair
                                            << " m " << m;
                                        previous = cta;
                                    }
                                }
                            }
                        }
}

namespace {

// Whether query q sees key k, straight from the definition: its diagonal position d (bottom
// right: q + seq_k - seq_q; top left: q), causal keys j <= d, a window d - left <= j <= d + right.
bool visible(const fa::BackwardArgs& a, int q, int k) {
    const int d = q + a.seq_k - a.diagonal_seq_q;
    const bool in_band = k >= d - a.band.left && k <= d + a.band.right;
    return q < a.seq_q && k < a.seq_k && (!a.causal || k <= d) && (!a.banded || in_band);
}

}  // namespace

// The walks (QueryBlocks) against the definition, for both masks: a key block walks exactly the
// query blocks holding a query that sees one of its keys, and leaves unmasked only blocks whose
// queries below seq_q see all of its keys below seq_k. Windows on either side or both, both
// alignments, seq_q != seq_k, windows past every key.
TEST(QueryBlocks, WalksMatchVisibility) {
    constexpr int b_r = 64, b_c = 128;
    for (const int seq_q : {1, 64, 100, 700})
        for (const int seq_k : {1, 128, 129, 600})
            for (const bool top_left : {false, true})
                for (const auto& [causal, left, right] :
                     {std::tuple{false, -1, -1}, std::tuple{true, -1, 0}, std::tuple{true, 0, 0},
                      std::tuple{true, 100, 0}, std::tuple{false, 37, 200}, std::tuple{false, 0, 0},
                      std::tuple{false, -1, 5}, std::tuple{false, 3000, 3000}}) {
                    fa::BackwardArgs a = problem(seq_k, 1, 1, causal, 132, 1);
                    a.seq_q = seq_q;
                    a.diagonal_seq_q = fa::diagonal_queries(seq_q, seq_k, top_left);
                    const bool banded = left != -1 || (!causal && right != -1);
                    a.banded = banded;
                    if (banded) {
                        a.band = {left < 0 ? fa::k_unbounded_window : left,
                                  right < 0 ? fa::k_unbounded_window : right};
                    }
                    const auto walk = [&](int n) {
                        const int k0 = n * b_c, last = std::min(k0 + b_c, seq_k) - 1;
                        return banded ? fa::QueryBlocks::of(fa::BandMask::of(a), k0, last, b_r)
                                      : fa::QueryBlocks::of(fa::CausalMask::of(a), k0, last, b_r);
                    };
                    const int query_blocks = (seq_q + b_r - 1) / b_r;
                    for (int n = 0; n < (seq_k + b_c - 1) / b_c; ++n) {
                        const fa::QueryBlocks w = walk(n);
                        for (int m = 0; m < query_blocks; ++m) {
                            bool any = false, all = true;
                            for (int q = m * b_r; q < std::min((m + 1) * b_r, seq_q); ++q)
                                for (int k = n * b_c; k < std::min((n + 1) * b_c, seq_k); ++k) {
                                    any = any || visible(a, q, k);
                                    all = all && visible(a, q, k);
                                }
                            const bool walked = m >= w.first && m < w.end;
                            ASSERT_EQ(walked, any)
                                << "seq_q " << seq_q << " seq_k " << seq_k << " top_left "
                                << top_left << " causal " << causal << " window " << left << ", "
                                << right << " key block " << n << " query block " << m;
                            if (walked && !w.masked(m)) {
                                ASSERT_TRUE(all)
                                    << "seq_q " << seq_q << " seq_k " << seq_k << " window " << left
                                    << ", " << right << " key block " << n << " query block " << m;
                            }
                        }
                    }
                }
}

// With a window, ordered dQ keeps key-block order, one pair a section: the adds to query block m
// before key block n's are those of the key blocks from the first whose walk reaches m.
TEST(KeyBlockScheduler, WindowAddsCountTheEarlierKeyBlocks) {
    constexpr int b_r = 64;
    for (const int seq : {100, 1000, 3000})
        for (const bool causal : {false, true})
            for (const int left : {0, 63, 500})
                for (const int group : {1, 4}) {
                    fa::BackwardArgs a = problem(seq, 2, 2, causal, 132, group);
                    a.diagonal_seq_q = seq;
                    a.banded = true;
                    a.band = {left, causal ? 0 : 70};
                    const auto s = KeyBlockScheduler::of(a, B_c, true);
                    EXPECT_FALSE(s.descending);
                    EXPECT_EQ(s.sections, 4);  // a pair each
                    const fa::BandMask mask = fa::BandMask::of(a);
                    for (int m = 0; m < (seq + b_r - 1) / b_r; ++m) {
                        int adders = 0, first = -1;
                        for (int n = 0; n < s.key_blocks; ++n) {
                            const auto w = fa::QueryBlocks::of(
                                mask, n * B_c, std::min((n + 1) * B_c, seq) - 1, b_r);
                            if (m < w.first || m >= w.end)
                                continue;
                            if (first < 0)
                                first = n;
                            ASSERT_EQ(n, first + adders) << "the adders are neighbours";
                            ASSERT_EQ(s.adds_before(a, mask, n, m, b_r, B_c), adders)
                                << "seq " << seq << " causal " << causal << " left " << left
                                << " m " << m << " n " << n;
                            ++adders;
                        }
                    }
                }
}

// A walk (QueryWalk, the kernels' own) visits each query head of its group and each of its key
// block's query blocks exactly once, a head's blocks together. In order from the first block
// unless rotated (the ordered dQ's adds assume it); rotated, each head from `start` (inside the
// walk's blocks, different for a sequence's first key blocks without a mask) to the end and
// then from the first. Both alignments, causal and not, seq_q != seq_k, GQA.
// A stream-K piece (QueryWalk::restrict) starts at the step of the whole walk's order that it
// names and goes on in that order.
template <bool Rotated>
void check_pieces(const fa::sm90::QueryWalk& walk, std::integral_constant<bool, Rotated>) {
    std::vector<fa::sm90::QueryWalk::Step> order;
    auto at = walk.first<Rotated>();
    for (int i = 0; i < walk.steps(); ++i, at.template advance<Rotated>(walk))
        order.push_back(at);
    for (int first = 0; first < walk.steps(); ++first) {
        fa::sm90::QueryWalk piece = walk;
        piece.restrict(first, walk.steps() - first);
        ASSERT_EQ(piece.steps<true>(), walk.steps() - first);
        ASSERT_EQ(piece.steps(), walk.steps()) << "without pieces, the whole walk";
        auto step = piece.first<Rotated, true>();
        for (int i = first; i < walk.steps(); ++i, step.template advance<Rotated>(piece)) {
            ASSERT_EQ(step.head, order[i].head) << "piece from " << first << ", step " << i;
            ASSERT_EQ(step.block, order[i].block) << "piece from " << first << ", step " << i;
        }
    }
}

TEST(QueryWalk, VisitsEveryBlockOnceAHeadAtATime) {
    const auto check = [](const fa::sm90::QueryWalk& walk, auto rotated) {
        constexpr bool Rotated = decltype(rotated)::value;
        std::set<std::pair<int, int>> seen;
        auto at = walk.first<Rotated>();
        ASSERT_EQ(at.block, Rotated ? walk.start : walk.blocks.first);
        for (int i = 0; i < walk.steps(); ++i, at.template advance<Rotated>(walk)) {
            ASSERT_EQ(at.head, i / walk.per_head()) << "step " << i;
            ASSERT_TRUE(at.block >= walk.blocks.first && at.block < walk.blocks.end)
                << "step " << i;
            const int offset =
                (i % walk.per_head() + (Rotated ? walk.start - walk.blocks.first : 0)) %
                walk.per_head();
            ASSERT_EQ(at.block, walk.blocks.first + offset) << "step " << i;
            seen.insert({at.head, at.block});
        }
        EXPECT_EQ(static_cast<int>(seen.size()), walk.steps());
    };
    for (const int seq_q : {1, 63, 100, 257, 1000})
        for (const int seq_k : {1, 100, 128, 600, 1000})
            for (const bool causal : {false, true})
                for (const bool top_left : {false, true})
                    for (const int group : {1, 4})
                        for (const auto& [b_r, b_c] :
                             {std::pair{64, 128}, std::pair{128, 128}, std::pair{64, 64}})
                            for (const bool rotate : {false, true}) {
                                fa::BackwardArgs a = problem(seq_k, 2, 1, causal, 132, group);
                                a.seq_q = seq_q;
                                a.diagonal_seq_q = fa::diagonal_queries(seq_q, seq_k, top_left);
                                const auto mask = fa::CausalMask::of(a);
                                std::set<int> starts;
                                const int key_blocks = (seq_k + b_c - 1) / b_c;
                                for (int n = 0; n < key_blocks; ++n) {
                                    const auto walk =
                                        fa::sm90::QueryWalk::of(a, mask, n * b_c, b_r, b_c, rotate);
                                    SCOPED_TRACE(::testing::Message()
                                                 << "seq_q " << seq_q << " seq_k " << seq_k
                                                 << " causal " << causal << " key block " << n
                                                 << " rotate " << rotate);
                                    EXPECT_EQ(walk.steps(), group * walk.per_head());
                                    if (walk.steps() == 0)
                                        continue;
                                    EXPECT_TRUE(walk.start >= walk.blocks.first &&
                                                walk.start < walk.blocks.end);
                                    if (!rotate) {
                                        EXPECT_EQ(walk.start, walk.blocks.first);
                                    }
                                    starts.insert(walk.start);
                                    check(walk, std::false_type{});
                                    check(walk, std::true_type{});
                                    check_pieces(walk, std::false_type{});
                                    check_pieces(walk, std::true_type{});
                                }
                                // Without a mask the walks are alike: rotated, their starts
                                // differ while there are blocks enough.
                                const int query_blocks = (seq_q + b_r - 1) / b_r;
                                if (rotate && !causal) {
                                    EXPECT_EQ(static_cast<int>(starts.size()),
                                              std::min(key_blocks, query_blocks));
                                }
                            }
}

// Stream-K's ranges (BackwardStreamK): the split key blocks' steps are covered once, by ranges of
// equal length within a step; a range holds at most three pieces, each inside one key block,
// numbered in step order among that block's pieces; a piece that is not a whole walk has a slot
// of its own, the one the merging piece computes for it; and the split leaves at least a round of
// whole key blocks, starting where the last full rounds end (or a round earlier when the last
// holds under a third of the CTAs). No split where the last round is full, for causal masks,
// windows or packed sequences.
TEST(BackwardStreamK, RangesCoverTheLastRoundsStepsOnce) {
    using fa::sm90::BackwardStreamK;
    int splits = 0;
    for (const int seq : {256, 1000, 2048, 4096, 8192})
        for (const int heads_kv : {1, 3, 16, 32})
            for (const int batch : {1, 2, 4})
                for (const int group : {1, 4})
                    for (const int sms : {7, 132})
                        for (const auto& [b_r, b_c] : {std::pair{64, 128}, std::pair{128, 128}}) {
                            const fa::BackwardArgs a =
                                problem(seq, heads_kv, batch, false, sms, group);
                            const std::int64_t key_blocks =
                                KeyBlockScheduler::of(a, b_c, false).count();
                            const std::int64_t ctas = std::min<std::int64_t>(key_blocks, sms);
                            const BackwardStreamK k = BackwardStreamK::of(a, b_r, b_c, ctas);
                            SCOPED_TRACE(::testing::Message()
                                         << "seq " << seq << " heads_kv " << heads_kv << " batch "
                                         << batch << " group " << group << " sms " << sms);
                            const std::int64_t tail = key_blocks % ctas;
                            if (tail == 0) {
                                EXPECT_FALSE(k.splits());
                                continue;
                            }
                            const std::int64_t split = 3 * tail < ctas ? tail + ctas : tail;
                            const int walk = group * ((seq + b_r - 1) / b_r);
                            if (!k.splits()) {  // no whole round left, or ranges too short
                                EXPECT_TRUE(key_blocks - split < ctas || split * walk < ctas ||
                                            walk - 1 > 3 * (split * walk / ctas));
                                continue;
                            }
                            ++splits;
                            EXPECT_EQ(k.walk, walk);
                            EXPECT_EQ(k.ranges, ctas);
                            EXPECT_EQ(k.blocks, split);
                            EXPECT_EQ(k.whole + k.blocks, key_blocks);
                            EXPECT_GE(k.whole, ctas);
                            std::vector<int> covered(static_cast<std::size_t>(k.units()), 0);
                            std::set<int> slots;
                            std::int64_t shortest = k.units(), longest = 0;
                            for (int r = 0; r < k.ranges; ++r) {
                                const std::int64_t length = k.start(r + 1) - k.start(r);
                                shortest = std::min(shortest, length);
                                longest = std::max(longest, length);
                                ASSERT_GE(k.pieces_in(r), 1);
                                ASSERT_LE(k.pieces_in(r), 3);
                                std::int64_t at = k.start(r);
                                for (int p = 0; p < k.pieces_in(r); ++p) {
                                    const BackwardStreamK::Piece piece = k.piece(r, p);
                                    ASSERT_EQ(std::int64_t{piece.block} * k.walk + piece.first, at)
                                        << "range " << r << " piece " << p;
                                    ASSERT_GT(piece.steps, 0);
                                    ASSERT_LE(piece.first + piece.steps, k.walk);
                                    ASSERT_EQ(k.first_range(piece.block) + piece.index, r);
                                    ASSERT_LT(piece.index, piece.pieces);
                                    ASSERT_LE(piece.pieces, BackwardStreamK::k_max_pieces);
                                    for (int i = 0; i < piece.steps; ++i)
                                        ++covered[static_cast<std::size_t>(at + i)];
                                    at += piece.steps;
                                    const bool whole = piece.steps == k.walk;
                                    ASSERT_EQ(whole, piece.pieces == 1);
                                    if (!whole) {
                                        const int slot = k.slot(piece.block, piece.index);
                                        ASSERT_EQ(slot, 2 * r + (p == 0 ? 0 : 1));
                                        ASSERT_TRUE(slots.insert(slot).second) << "slot " << slot;
                                    }
                                }
                                ASSERT_EQ(at, k.start(r + 1));
                            }
                            EXPECT_LE(longest - shortest, 1);
                            EXPECT_EQ(std::count(covered.begin(), covered.end(), 1),
                                      static_cast<std::ptrdiff_t>(covered.size()));
                        }
    EXPECT_GT(splits, 20) << "the cases split";
    fa::BackwardArgs a = problem(4096, 16, 2, false, 132, 1);  // 1024 key blocks of 128
    EXPECT_TRUE(BackwardStreamK::of(a, 64, 128, 132).splits());
    a.causal = true;
    EXPECT_FALSE(BackwardStreamK::of(a, 64, 128, 132).splits());
    a.causal = false;
    a.banded = true;  // a window, ALiBi or packed sequences
    EXPECT_FALSE(BackwardStreamK::of(a, 64, 128, 132).splits());
}
