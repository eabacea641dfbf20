#pragma once

// Tile numbers in sections, for the grids of both passes: `units` (the forward's heads of the
// batch, the backward's (K/V head, sequence) pairs) in sections of `section` units, the last
// possibly smaller, each unit's blocks ranked; a section's units all take one rank before any
// takes the next. Ranked by length (causal masking), every unit's longest blocks start first,
// while the CTAs running at one time read the rows of one section's units, which stay in L2.
// The forward numbers query-block tiles (sm90/tile_scheduler.cuh), the backward its key-block
// CTAs (key_block_scheduler.hpp). constexpr: host code and device code
// (--expt-relaxed-constexpr) share it.

#include <algorithm>

namespace flash_attention {

struct SectionPosition {
    int unit, rank;
};

// index in [0, units x blocks), below 2^31.
constexpr SectionPosition section_position(int index, int blocks, int section, int units) {
    const int per_section = section * blocks;
    const int s = index / per_section;
    const int first = s * section;
    const int size = std::min(section, units - first);  // the last section may hold fewer
    const int in_section = index - s * per_section;
    const int rank = in_section / size;
    return {first + in_section - rank * size, rank};
}

// The same numbering with the units split into `sections` sections (1 to units) whose sizes
// differ by one at most, the larger first, so that no section is left with a few units. The
// backward's causal grids run in these: the key blocks of its last section's units start their
// walks, the longest first, only as the section before ends, and a small last section leaves
// them alone at the end (bench/tile_order.py --backward: a model of the dynamic schedule, walks of
// the group's heads times the query blocks above each key block: 32/8 heads at 8k in sections of 5
// and 3 pairs end 11% after an even share of the work, in 4 and 4 0.7%; the MHA grid's cells 4-10%
// at 2k-16k, 0.1-1.8%).
constexpr SectionPosition balanced_section_position(int index, int blocks, int sections,
                                                    int units) {
    const int small = units / sections;
    const int larger = units % sections;  // sections of small + 1 units
    const int larger_units = larger * (small + 1);
    if (index < larger_units * blocks)
        return section_position(index, blocks, small + 1, larger_units);
    const SectionPosition at =
        section_position(index - larger_units * blocks, blocks, small, units - larger_units);
    return {larger_units + at.unit, at.rank};
}

}  // namespace flash_attention
