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

}  // namespace flash_attention
