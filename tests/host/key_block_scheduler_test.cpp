// The sm90 backward's grid order (kernels/key_block_scheduler.hpp): every CTA index names a
// distinct (key block, K/V head, sequence), each causal section runs its longest walks first
// (ordered causal without GQA: highest key blocks first), an ordered CTA never waits on a later
// one, and the adds before each key block's are counted as the walks make them.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>
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
    a.sm_count = sm_count;
    return a;
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
        const int two_waves = (2 * c.sm_count + s.key_blocks - 1) / s.key_blocks;
        EXPECT_EQ(s.section, c.ordered ? pairs : std::min(std::max(two_waves, 1), pairs));
        std::vector<int> last_block(pairs, -1);
        int previous_section = 0, previous_block = 0;
        for (int i = 0; i < s.count(); ++i) {
            const auto t = s.tile(i);
            const int pair = t.batch * c.heads_kv + t.kv_head;
            const int section = pair / s.section;
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
        const int two_waves = (2 * c.sm_count + s.key_blocks - 1) / s.key_blocks;
        EXPECT_EQ(s.section, std::min(std::max(two_waves, 1), pairs));
        std::vector<int> last_block(pairs, s.key_blocks);
        int previous_section = 0, previous_rank = 0;
        for (int i = 0; i < s.count(); ++i) {
            const auto t = s.tile(i);
            const int pair = t.batch * c.heads_kv + t.kv_head;
            ASSERT_EQ(t.key_block, last_block[pair] - 1) << "index " << i;
            last_block[pair] = t.key_block;
            const int rank = s.key_blocks - 1 - t.key_block;
            const int section = pair / s.section;
            ASSERT_GE(section, previous_section) << "index " << i;
            if (section == previous_section) {
                ASSERT_GE(rank, previous_rank) << "index " << i;
            }
            previous_section = section;
            previous_rank = rank;
        }
    }
}

// adds_before against the walks themselves: the key blocks whose walk (QueryWalk: from the query
// block holding their first key's first query) reaches query block m are 0 .. L, and their adds
// count 0 .. L in the scheduler's order (L - n before key block n highest first, n before it in
// key-block order). Both alignments, seq_q != seq_k, both tile shapes, with and without GQA.
TEST(KeyBlockScheduler, AddsBeforeCountsTheEarlierKeyBlocks) {
    for (const int seq_q : {1, 63, 64, 100, 257, 1000})
        for (const int seq_k : {1, 100, 128, 129, 600, 1000})
            for (const bool causal : {false, true})
                for (const bool top_left : {false, true})
                    for (const int group : {1, 4})
                        for (const int B_r : {64, 128}) {
                            fa::BackwardArgs a = problem(seq_k, 2, 1, causal, 132, group);
                            a.seq_q = seq_q;
                            a.diagonal_seq_q = fa::diagonal_queries(seq_q, seq_k, top_left);
                            const auto s = KeyBlockScheduler::of(a, B_c, true);
                            EXPECT_EQ(s.descending, causal && group == 1);
                            const int query_blocks = (seq_q + B_r - 1) / B_r;
                            std::vector<int> first(s.key_blocks);
                            for (int n = 0; n < s.key_blocks; ++n) {
                                const int begin =
                                    causal ? std::max(0, n * B_c - (seq_k - a.diagonal_seq_q)) : 0;
                                first[n] = std::min(begin / B_r, query_blocks);
                            }
                            for (int m = 0; m < query_blocks; ++m) {
                                int adders = 0;
                                for (int n = 0; n < s.key_blocks; ++n)
                                    if (first[n] <= m) {
                                        ASSERT_EQ(n, adders) << "the adders are a prefix";
                                        ++adders;
                                    }
                                for (int n = 0; n < adders; ++n) {
                                    ASSERT_EQ(s.adds_before(a, n, m, B_r, B_c),
                                              s.descending ? adders - 1 - n : n)
                                        << "seq_q " << seq_q << " seq_k " << seq_k << " causal "
                                        << causal << " top_left " << top_left << " group " << group
                                        << " B_r " << B_r << " m " << m;
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
                                            by_rank[s.adds_before(a, n, m, b_r, B_c)] =
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
