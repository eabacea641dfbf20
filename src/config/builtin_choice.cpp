#include "config/builtin_choice.hpp"

#include <string_view>
#include <vector>

namespace flash_attention::space {

namespace {

struct Row {
    std::string_view config;
    std::int64_t max_seq = 0;
    bool causal_only = false;
    std::int64_t max_grouped_seq_q = 0;
    std::int64_t max_seq_k = 0;
};

// Why these: on Hopper the sm90 family first: wgmma at 64 rows per consumer warpgroup,
// two consumers (three at d_head 64, where O and S leave room), a two-stage K/V
// pipeline, intra-warpgroup overlap, persistent CTAs and, where registers allow, Q held
// in registers (a third less shared-memory traffic for S = Q·Kᵀ: +3-4% at d_head 128).
// d_head 64 takes FlashAttention-3's 192 x 128 tile with ping-pong between its three
// consumers: 9-17% faster than 192 x 64 from 512 to 16k keys (Q stays in shared memory:
// in registers it spills at 160), causal too since its consumers' blocks are trimmed (below:
// 1.7-1.8% ahead of 128 x 128 with Q in registers at 512-1024 keys, 8% from 2048; H200,
// 2026-11-26), with three K/V stages: +3.5-3.9% at 512-2048 keys, +2.6% at 4k, level above
// non-causal, +1.7-3.4% causal up to 2k (compare.py); a fourth stage adds nothing (H200,
// 2026-11-26). H100, 2026-11-24, docs/PERF.md.
// B_c 128 fills wgmma's N (25% faster than 64 at d_head 128 with two consumers); from 2048
// keys non-causal d_head 128 takes three consumers instead (ping-pong, lazy rescaling: a
// third warpgroup's softmax overlaps the other two's GEMMs) at B_c 80, the widest key block
// whose O, S and P fit their 160 registers: 2-5% ahead of B_c 64 from 2048 keys in two
// runs (a fifth fewer blocks, and S's shared-memory reads at 112 B/clk instead of 128;
// H200, 2026-11-25, docs/PERF.md); 3% behind at 512, whose last block is ragged. Its ring
// holds three blocks of 80 keys (217 KB of shared memory with two Q buffers): +4-5% at 2k-4k keys
// non-causal, +1-1.5% from 8k and causal (compare.py, H200, 2026-11-26); the 128 x 128 tiles lose
// 7-20% with a third stage (their second Q buffer no longer fits) and keep two. d_head 256's
// causal tiles above 8192 keys take B_c 80, the widest key block whose O (128 registers), S and
// P fit 240 with two K/V stages (16% faster than an untrimmed B_c 64 at seq 8192: S's
// shared-memory operands no longer saturate shared memory); up to 8192 keys the trimmed B_c 64
// tile with ping-pong is the table's row. Short non-causal problems take one stage of B_c
// 128 with ping-pong (a tile has few blocks, each costs its fixed overheads once per 128 keys);
// longer ones B_c 64 with ping-pong on top of overlap (1-5% ahead of overlap alone from 4096
// keys at B_c 80, 2026-11-24). Both leave room for O's own staging region, where B_c 80's
// 224 KB does not (resources.hpp, o_staged_apart(): the one Q buffer goes back after the last
// S GEMM, +6% at 512 keys, +4.5% at 1k); with it B_c 64 leads B_c 80 by 3-6% at 1k-2k and 2%
// at 4k, level (±1%) at 16k (H200, 2026-11-26, docs/PERF.md). At d_head 64 and 256 lazy
// rescaling (the reference max moves only by 2^8, so most blocks skip O's rescaling):
// +2-9% at d_head 256 and +1-4% at 64 against the same kernels without it; at d_head 128
// it measured 2-4% slower non-causal and level causal (2026-11-24, docs/PERF.md); since lazy
// steps skip the row max, d_head 128's 128 x 128 rows take it too (+2-6% at 512-4096 keys,
// H200, 2026-11-26). With lazy rescaling, two stages with overlap gained more than B_c 128
// (one stage, no overlap): the latter wins only up to 512 keys non-causal (1024 causal).
// The tunes of 2026-11-23 picked these (docs/PERF.md). Causal problems (rows first):
// tiles differ in length, and the static stride left one CTA up to 1.7x the mean work,
// so d_head 64 and 128 take the dynamic tile schedule (1.3-1.7x faster where the stride
// was uneven). Plain CTAs, one per tile, in the order the hardware hands them out, beat
// both at d_head 256 at every length (+6-42% over the static B_c 128 tile up to 2048 and
// +10-23% over the dynamic B_c 80 one from 4096; ping-pong on top from 2048 to 8192 keys:
// +1-3.4% in compare.py (H100, 2026-11-24), and at 16k too since lazy steps skip the row max
// with ping-pong only: +1.2% over the tile without it, H200, 2026-11-26, docs/PERF.md) and
// at d_head 128 from 2048 keys, where the
// three-consumer 192 x 80 tile leads 128 x 128 by 3-5% from 8192 keys (H100, 2026-11-24, and
// H200, 2026-11-25, docs/PERF.md); trimmed and without ping-pong (its consumers then run
// free, each to its own rows' last block) it leads the ping-pong tile by 0.5-1% from 8k and
// the dynamic 128 x 128 one by 1.9% at 2k and 4.1% at 4k, and trails it by 9% at 1k (bf16,
// H200, 2026-11-28, docs/PERF.md). A paged
// cache whose pages B_c 80 does not divide (64, 256 rows) takes the 128 x 128 rows that
// follow the 192 x 80 ones instead (heuristic_config(): whole-page copies). Causal d_head
// 64 (192 x 128) and the d_head 256 rows of two stages trim each consumer's blocks to its own
// rows' keys (`trim`): +6.7/+4.8/+1.4% at 2k/4k/8k causal d_head 64, +1-2.7% causal and
// +0.5-1% non-causal d_head 256 (at B_c 80); d_head 128's 192 x 80 and d_head 64's non-causal rows
// lose 0.2-1.6% with it under ping-pong and keep the plain kernels; causal d_head 128's 192 x 80
// gains with it once ping-pong goes (above). A trimmed 192 x 64 tile for causal d_head 128 at
// 2k-4k keys, 1-2% ahead in `bench`, lost 1-2.4% in compare.py: not taken. Causal
// d_head 256 up to 8192 keys then takes B_c 64, whose first consumer passes the diagonal
// block a 128 x 128 tile's computes half masked: 2.4-2.9% ahead of that one-stage tile up to 1k
// keys, and of B_c 80 by 1.5-2% at 2k-4k and 0.2-0.4% at 8k, level at 16k (H200, 2026-11-26,
// docs/PERF.md). Non-causal d_head 64 up to 1024 keys takes the causal rows' kernel: a head's
// last 192-row tile holds 128 rows at 512 keys and 64 at 1k, and with `trim` its idle consumers
// compute nothing, but only the dynamic schedule hands the time saved to other tiles (3 and 6
// query blocks a head divide 132, so the static stride gives every CTA the same query block in
// every round): +1.2% at 512, +3.5% at 1k, level from 2k, where `dynamic` alone costs 0-1.5%
// (H200, 2026-11-28, docs/PERF.md; d_head 128's 192 x 80 lost 0.5-1.6% with both from 2k).
// Half blocks (`half`: a trimmed consumer whose rows see only the first half of its last
// block computes that half) only up to 1024 causal keys: +2.2-3.6% at 512 causal, level at
// 1k-4k, but their code costs the loop 1.3-2.8% at 8k-16k causal and 1-2% non-causal at
// 512-1k, where no block is half (H200, 2026-11-28, docs/PERF.md). Those short causal tiles also
// run without ping-pong: free-running consumers drift apart across tiles of one to four blocks (a
// trimmed consumer with fewer blocks starts the next tile first), so their tile boundaries stop
// coinciding and one's first softmax and last P·V overlap another's blocks: +4.7-5.3% at 512
// causal keys and +1-2% at 1k in both dtypes, while from 2k ping-pong is level or ahead (H200,
// 2026-11-28, docs/PERF.md). Causal d_head 256 keeps ping-pong: its two
// consumers' GEMMs (P·V alone is m64n256) collide without turns, -1.2-2.7% at 2k-16k
// free-running (H200, 2026-11-28, docs/PERF.md).
// The non-causal persistent rows of d_head 64 and 128 split a part-filled last round along
// the keys (`streamk`) where it leaves a third of the CTAs or more idle (stream_k_plan()):
// +1.4-1.7% at 8k-16k keys for d_head 128 (56 of 132 tiles in the last round), +1.6% at 4k for
// d_head 64 (44 of 132); elsewhere on the grid the plan does not split and the kernels run as
// without it. d_head 256's rows do not take it: with 100 of 132 tiles in its grid's last
// rounds it measured -1.2% at 8k and +0.8% at 16k (bf16, H200, 2026-11-28,
// docs/PERF.md).
// Off Hopper the sm90 rows cannot run and the sm80 rows below them are the choice.
// sm80: B_r = 128 with 4 warps gives each warp two m16 tiles, so every K and V
// fragment read from shared memory feeds two MMAs; with 16 rows per warp the
// ldmatrix traffic (about 170 B/clk/SM at H100 mma.sync rates) exceeds shared
// memory's 128 B/clk. One k-tile per step, double-buffered, is the largest fragment
// step that keeps O (128 fp32 registers at d_head 128) and S within 255 registers.
// At d_head 256, O alone takes 128 registers per warp of 16 rows: B_r 64 / B_c 64 is the
// largest tile the register rule keeps without spills (untuned).
constexpr Row k_rows[] = {
    // Grouped-query problems of at most 64 queries (speculative decoding, short chunks): the
    // query heads of a K/V head packed into one tile's rows (`packgqa`), so that 16 positions
    // of 4 heads fill a consumer's 64 rows, where a tile of one head's rows would hold 16 of
    // 128 (FlashAttention-4's sm90 choice: flash-attn-4 4.0.0b36's interface.py). One consumer
    // (B_r 64) over 128-key blocks in three stages: a K/V head's tile streams its keys once,
    // bound by memory (speculative decoding b16: 128 tiles, 2 MB of K and V each).
    {"(BF16, 128, 64, 128, 8): sm90+stages_3+overlap+qreg+lazy+packgqa", 0, false,
     k_packed_max_seq_q},
    {"(FP16, 128, 64, 128, 8): sm90+stages_3+overlap+qreg+lazy+packgqa", 0, false,
     k_packed_max_seq_q},
    {"(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic+lazy", 1024, true},
    {"(FP16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic+lazy", 1024, true},
    {"(BF16, 128, 192, 80, 16): sm90+stages_3+overlap+lazy+trim", 0, true},
    {"(FP16, 128, 192, 80, 16): sm90+stages_3+overlap+lazy+trim", 0, true},
    {"(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic+lazy", 0, true},
    {"(FP16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic+lazy", 0, true},
    {"(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+persistent+dynamic+lazy+trim+half", 1024,
     true},
    {"(FP16, 64, 192, 128, 16): sm90+stages_3+overlap+persistent+dynamic+lazy+trim+half", 1024,
     true},
    {"(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim", 0,
     true},
    {"(FP16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim", 0,
     true},
    {"(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+lazy+trim", 8192, true},
    {"(FP16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+lazy+trim", 8192, true},
    {"(BF16, 256, 128, 80, 12): sm90+stages_2+overlap+pingpong+lazy+trim", 0, true},
    {"(FP16, 256, 128, 80, 12): sm90+stages_2+overlap+pingpong+lazy+trim", 0, true},
    {"(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+lazy", 1024},
    {"(FP16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+lazy", 1024},
    {"(BF16, 128, 192, 80, 16): sm90+stages_3+overlap+pingpong+persistent+lazy+streamk"},
    {"(FP16, 128, 192, 80, 16): sm90+stages_3+overlap+pingpong+persistent+lazy+streamk"},
    {"(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+lazy"},
    {"(FP16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+lazy"},
    {"(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim", 1024},
    {"(FP16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim", 1024},
    // Short keys (at most 256) under long queries, cross-attention's shape: the same tile as up
    // to 1024, not stream-K's, which has nothing to split in one or two key blocks: +7.5% at
    // 4096 x 77 and +6.3% at 4096 x 128 (bf16, batch 2, 16 heads, 3 rounds; the stream-K row
    // read with a 47% spread; H100, 2026-12-05, bench/short-keys.txt).
    {"(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim", 0,
     false, 0, k_short_max_seq_k},
    {"(FP16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+dynamic+lazy+trim", 0,
     false, 0, k_short_max_seq_k},
    {"(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+lazy+streamk"},
    {"(FP16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+lazy+streamk"},
    {"(BF16, 256, 128, 128, 12): sm90+stages_1+pingpong+persistent+lazy", 512},
    {"(FP16, 256, 128, 128, 12): sm90+stages_1+pingpong+persistent+lazy", 512},
    {"(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+persistent+lazy+trim"},
    {"(FP16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+persistent+lazy+trim"},
    // d_head 192, and 192 with V's 128 (DeepSeek's MLA): FlashAttention-3's tiles for them, 128
    // queries x 112 keys and 128 x 128, the widest whose two K/V stages fit beside Q; causal
    // d_head 192 as d_head 256's causal rows (trimmed, ping-pong, one CTA a tile: its persistent
    // dynamic instance spills 16-44 bytes in ptxas 13.0), the rest as d_head 128's 128 x 128
    // rows without Q in registers (48 registers more than O, S and P leave). MLA's causal rows
    // past 2k keys: d_head 192's causal tile, one CTA a tile, +5.4/+5.1/+11.3% bf16 at 4k/8k/16k
    // (fp16 +4.8/+10.1/+10.4%) over the persistent dynamic tile, which leads at 2k by 4.1%
    // (bf16, 16 heads, 3 rounds in one binary, bench/mla-forward-causal.txt; at 4k with 128
    // heads +2.7% in one run, level in another; H100, 2026-12-06, docs/PERF.md). The plain
    // 128 x 128 tile read level with it (ahead at bf16 8k, behind in fp16): the 112 keys are
    // d_head 192's causal tile, one kernel of both. Paged caches whose pages 112 keys do not
    // divide take the persistent dynamic tile again (the row after it), not the non-causal row.
    {"(BF16, 192, 128, 112, 12): sm90+stages_2+overlap+pingpong+lazy+trim", 0, true},
    {"(FP16, 192, 128, 112, 12): sm90+stages_2+overlap+pingpong+lazy+trim", 0, true},
    {"(BF16, 192, 128, 112, 12): sm90+stages_2+overlap+pingpong+persistent+lazy"},
    {"(FP16, 192, 128, 112, 12): sm90+stages_2+overlap+pingpong+persistent+lazy"},
    {"(BF16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+dynamic+lazy", 2048, true},
    {"(FP16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+dynamic+lazy", 2048, true},
    {"(BF16, 192, 128, 112, 12): sm90+dv_128+stages_2+overlap+pingpong+lazy+trim", 0, true},
    {"(FP16, 192, 128, 112, 12): sm90+dv_128+stages_2+overlap+pingpong+lazy+trim", 0, true},
    {"(BF16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+dynamic+lazy", 0, true},
    {"(FP16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+dynamic+lazy", 0, true},
    {"(BF16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+lazy"},
    {"(FP16, 192, 128, 128, 12): sm90+dv_128+stages_2+overlap+persistent+lazy"},
    // d_head 96: 64-byte swizzled tiles of 96 columns. Causal: d_head 128's 128 x 128 rows with
    // Q in registers (6 k-steps). Non-causal: 192 rows in three consumers, FlashAttention-3's
    // row count at 96, overlapped with P through shared memory (psmem; with P in registers the
    // overlap spilled): +3.3% at 2k and +6.8% at 8k over the same tile without overlap, which was
    // +5.0% / +5.9% over the 128-row tile (bench/d96-forward.txt, 2026-12-05); causal it is level
    // at 8k and -4.6% at 2k against the 128-row tile (bf16, 21 heads, 3 rounds, H100,
    // 2026-12-06, bench/d96-forward-psmem.txt).
    {"(BF16, 96, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic+lazy", 0, true},
    {"(FP16, 96, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic+lazy", 0, true},
    {"(BF16, 96, 192, 128, 16): sm90+stages_2+overlap+persistent+dynamic+lazy+psmem"},
    {"(FP16, 96, 192, 128, 16): sm90+stages_2+overlap+persistent+dynamic+lazy+psmem"},
    {"(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(BF16, 64, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(FP16, 64, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(BF16, 256, 64, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(FP16, 256, 64, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    // d_head 96 as 128, without the swizzle (rows of 12 16-byte chunks).
    {"(BF16, 96, 128, 64, 4): async+eager+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(FP16, 96, 128, 64, 4): async+eager+load_1_1_1_tiles+buffer+opt_softmax"},
    // d_head 192 as 256 (O, 96 registers a thread at 16 rows a warp, leaves S its room).
    {"(BF16, 192, 64, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(FP16, 192, 64, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(BF16, 192, 64, 64, 4): dv_128+async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {"(FP16, 192, 64, 64, 4): dv_128+async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    // FP8 (e4m3, forward() only) on the sm90 kernel body: lazy rescaling within 2^0.8, persistent
    // CTAs on the dynamic schedule; d_head 128 with overlap, at 0.86-1.12 of cuDNN's FP8
    // (cudnn-frontend) in one run over 16k tokens, bound by latency between its softmax and
    // GEMMs (ncu); two stages with and without ping-pong within 4% of it at every length (a third
    // stage led at 1k and 16k non-causal), key blocks of 256 without overlap 4-19% behind
    // (H100, 2026-12-06, docs/PERF.md).
    // Each block's P·V goes to accumulators of its own, added to O in fp32 (mainloop.cuh,
    // Consumer::pv_block): accumulated in the tensor cores across blocks O ran 0.36 / 0.14 off
    // at d_head 128 / 256 over 16k keys of V of one sign (H100, 2026-12-06). At d_head 128 a
    // whole block's accumulator fits beside O, S and P without spills; at 256 it takes P·V in
    // four parts of 64 columns, without overlap (Traits::pv_parts; estimated_registers()). d_head
    // 256's row against the fp8 set's others: best or within 2% at 1k-16k non-causal and 1k-4k
    // causal (1018 TFLOP/s at 16k, cuDNN's FP8 1002; 0.79-0.96 of it at 1k-4k, where V's
    // transpose pass, a kernel of its own, weighs most); one CTA a tile leads causal 16k (1019
    // against 949), ping-pong trails but at 1k (H100, 2026-12-06, docs/PERF.md).
    // Up to 2048 keys d_head 128 transposes V in the kernel (vtrans: the producer warpgroup's
    // other warps, from a staging tile a stage) instead of by a pass before it: +23 / +13 / +4%
    // at 512 / 1k / 2k non-causal, +23 / +18 / +11% causal; from 4k 1-5% behind (the
    // transposers' issue slots and shared-memory traffic beside the consumers', by estimate).
    // d_head 256's staging tiles leave one Q buffer: since O leaves the registers in 16-byte
    // pieces (quad_transpose), vtrans there leads the pass by +5% at 512 non-causal (-1% at 1k)
    // and by +18 / +11 / +5% at 512 / 1k / 2k causal (H100, 2026-12-07; +9 / +3 / +1% the day
    // before, with 4-byte stores), so it takes those.
    // d_head 64 (Q's and K's 64-byte rows on 64-byte swizzled tiles) transposes V in the kernel at
    // every length: against d_head 128's row without it, level or ahead at 512-16k (+1 to +16%),
    // but 1% behind at causal 16k, within two runs' spread; 0.87-1.02 of cuDNN's FP8 non-causal
    // (bound by the exponentials, as our bf16 d_head 64: 531 TFLOP/s at 16k against cuDNN's
    // 584-605), 0.96-1.21 causal (H100, 2026-12-07, bench/fp8-d64.txt).
    {"(E4M3, 64, 128, 128, 12): sm90+stages_3+overlap+persistent+dynamic+lazy+vtrans"},
    {"(E4M3, 128, 128, 128, 12): sm90+stages_3+overlap+persistent+dynamic+lazy+vtrans", 2048},
    {"(E4M3, 128, 128, 128, 12): sm90+stages_3+overlap+persistent+dynamic+lazy"},
    {"(E4M3, 256, 128, 128, 12): sm90+stages_2+persistent+dynamic+lazy+vtrans", 512},
    {"(E4M3, 256, 128, 128, 12): sm90+stages_2+persistent+dynamic+lazy+vtrans", 2048, true},
    {"(E4M3, 256, 128, 128, 12): sm90+stages_2+persistent+dynamic+lazy"},
    // The backward pass (choose_backward_config: the first row of the dtype and head dim that
    // fits the problem and runs on the device). sm90: two consumers of 64 keys, FlashAttention-4's
    // d_head 64 and 128 tiles (B_r 128 and 64 queries a step), a two-stage Q/dO pipeline; d_head
    // 256, two consumers on the same 64 keys with half of d_head's columns each and one Q/dO
    // stage (209 KB of shared memory): 1.5-1.6x the sm80 kernel (H200, 2026-12-02).
    // The deterministic kernel would be the default wherever it costs under 5%: against the
    // persistent kernel below it costs 7.6% at 1k and 6.0% at 2k causal d_head 64 (bf16; fp16
    // 7.4% and 5.6%; three rounds, H200, 2026-12-04), and more elsewhere (5-13% from 4k against the
    // lagged kernel, 6-34% causal at d_head 256: H200, 2026-12-02), so it is taken only when asked
    // for. GQA's deterministic order is another (KeyBlockScheduler), not measured at these head
    // dims. d_head 64 computes dQ a step behind (lagdq): against the kernel in step, bf16
    // non-causal +0.5% at 1k, +3.9% at 2k, +7.1% at 8k, +8.1% at 16k; causal -1.7% at 1k, +2.9% to
    // +8.4% from 2k; causal GQA 32/8 +3.8% to +9.3%; fp16 alike (H200, 2026-12-04). d_head 64 and
    // 128 run persistent CTAs on the dynamic schedule: one an SM, each taking its next key block
    // from a counter in the schedule's order, the next key block's K and V loading while the last
    // one's dK and dV are stored. Against the same kernels one CTA a key block: d_head 64
    // (lagdq) +5.1/+2.5/+2.9/+2.5% non-causal at 1k/2k/4k/8k and +6.8/+4.8/+3.2/+2.2% causal;
    // d_head 128 +2.9/+1.0/+0.8/+0.8% and +3.1/+1.6/+0.8/+0.8%; at 16k +0.9%/+1.3% (d_head 64)
    // and +0.5% (128) (bf16, three rounds, H200, 2026-12-04). A fixed share of key blocks a CTA
    // (no counter) lost causal d_head 64 16.5% at 2k: causal walks differ in length.
    // With a step's statistics copied beside its Q tile (BackwardTraits::stats_in_stages), lagdq
    // against the kernel in step: d_head 128 +0.0/+2.0/+3.8/+3.2/+2.6% non-causal at
    // 1k/2k/4k/8k/16k, causal -1.8/-0.7/+1.6/+2.1/+2.9%; d_head 64 causal 1k +1.4% (bf16, three
    // rounds, H200, 2026-12-04). Short walks pay for the lag's last dQ after each walk: up to 512
    // keys d_head 64's kernel in step led the lagged one by 2.3-4.6% before the statistics moved
    // (H200, 2026-12-04).
    // Stream-K (streamk: the last part-filled round's steps in even ranges, design §12) from 4k
    // keys at d_head 64 and 8k at 128, non-causal (it splits nothing else, and its kernels' extra
    // registers spill outside the HGMMA loop): against the same kernel without it, d_head 64
    // -3.1/+1.5/+3.2/+4.6/+4.9% at 1k/2k/4k/8k/16k, d_head 128 -4.5/-1.4/+0.4/+1.8/+2.4%; causal
    // (nothing split) 2k -2.4/-3.7%, 8k +1.8/-0.4% (bf16, spreads 8-18%; H100, 2026-12-07). A
    // second run: d_head 64 -3.4/+1.2/+3.1/+4.7/+5.5%, d_head 128 -5.3/-1.8/+0.9/+2.7/+3.4%.
    // fp16 alike: d_head 64 -2.9/+1.0/+2.9/+4.0/+6.3%, d_head 128 -4.1/-1.8/+2.1/+3.1/+4.2%
    // (H100, 2026-12-08).
    {"(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 512},
    {"(FP16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 512},
    {"(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 2048},
    {"(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 0, true},
    {"(FP16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 2048},
    {"(FP16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 0, true},
    {"(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq"},
    {"(FP16, 64, 128, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq"},
    {"(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 1024},
    {"(FP16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 1024},
    {"(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 2048, true},
    {"(FP16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 2048, true},
    {"(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 4096},
    {"(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 0, true},
    {"(FP16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 4096},
    {"(FP16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq", 0, true},
    {"(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq"},
    {"(FP16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+streamk+lagdq"},
    // d_head 96: d_head 128's kernels, on 64-byte swizzled tiles of 96 columns (dQ split
    // 64 + 32): 486-559 TFLOP/s bf16 non-causal at 2k-8k, 0.95-1.01 of FA4 (H100, 2026-12-05),
    // where tiles padded to 128 columns ran at 0.81-0.92 and the sm80 kernel at 0.07-0.09.
    // lagdq from 1k keys, causal too (d_head 128 waits to 2k causal): at 2k it led the kernel in
    // step by 3.5% causal and not, every one of three rounds (bf16, H100, 2026-12-05).
    {"(BF16, 96, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 1024},
    {"(FP16, 96, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic", 1024},
    {"(BF16, 96, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq"},
    {"(FP16, 96, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq"},
    {"(BF16, 256, 64, 64, 12): sm90+bwd+stages_1"},
    {"(FP16, 256, 64, 64, 12): sm90+bwd+stages_1"},
    // d_head 192 and DeepSeek's 192/128: two consumers on the same 64 keys, as d_head 256's, one
    // holding dK and the other dV (BackwardTraits::split_gradients), two Q/dO stages (227 KB of
    // shared memory at 192): 315-451 TFLOP/s bf16 at 2k-8k, 0.82-0.93 of FA4 (MLA causal 4k:
    // 0.75), about 2.8x the sm80 kernel (H100 and H200, 2026-12-05).
    {"(BF16, 192, 64, 64, 12): sm90+bwd+stages_2"},
    {"(FP16, 192, 64, 64, 12): sm90+bwd+stages_2"},
    {"(BF16, 192, 64, 64, 12): sm90+dv_128+bwd+stages_2"},
    {"(FP16, 192, 64, 64, 12): sm90+dv_128+bwd+stages_2"},
    // Deterministic (BackwardParams::deterministic): the same, each query block's dQ added in a
    // fixed key-block order.
    {"(BF16, 64, 128, 128, 12): sm90+bwd+stages_2+ordered"},
    {"(FP16, 64, 128, 128, 12): sm90+bwd+stages_2+ordered"},
    {"(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+ordered"},
    {"(FP16, 128, 64, 128, 12): sm90+bwd+stages_2+ordered"},
    {"(BF16, 96, 64, 128, 12): sm90+bwd+stages_2+ordered"},
    {"(FP16, 96, 64, 128, 12): sm90+bwd+stages_2+ordered"},
    {"(BF16, 256, 64, 64, 12): sm90+bwd+stages_1+ordered"},
    {"(FP16, 256, 64, 64, 12): sm90+bwd+stages_1+ordered"},
    {"(BF16, 192, 64, 64, 12): sm90+bwd+stages_2+ordered"},
    {"(FP16, 192, 64, 64, 12): sm90+bwd+stages_2+ordered"},
    {"(BF16, 192, 64, 64, 12): sm90+dv_128+bwd+stages_2+ordered"},
    {"(FP16, 192, 64, 64, 12): sm90+dv_128+bwd+stages_2+ordered"},
    // sm80, on every GPU (on Hopper where TMA cannot address the tensors): 64 x 64 tiles over 8
    // warps, whose dK and dV (d_head 256: 128 fp32 registers a thread) leave room for the score
    // tiles. Untuned.
    {"(BF16, 64, 64, 64, 8): bwd+async+swizzled"},
    {"(FP16, 64, 64, 64, 8): bwd+async+swizzled"},
    {"(BF16, 128, 64, 64, 8): bwd+async+swizzled"},
    {"(FP16, 128, 64, 64, 8): bwd+async+swizzled"},
    {"(BF16, 256, 64, 64, 8): bwd+async+swizzled"},
    {"(FP16, 256, 64, 64, 8): bwd+async+swizzled"},
    // d_head 96 (rows not swizzled), 192, and 192 with V's 128 (DeepSeek's MLA).
    {"(BF16, 96, 64, 64, 8): bwd+async"},
    {"(FP16, 96, 64, 64, 8): bwd+async"},
    {"(BF16, 192, 64, 64, 8): bwd+async+swizzled"},
    {"(FP16, 192, 64, 64, 8): bwd+async+swizzled"},
    {"(BF16, 192, 64, 64, 8): dv_128+bwd+async+swizzled"},
    {"(FP16, 192, 64, 64, 8): dv_128+bwd+async+swizzled"},
};

}  // namespace

std::span<const BuiltinChoice> builtin_choices() {
    // Parsed once: the automatic choice reads this on every forward() without a tuned entry.
    static const std::vector<BuiltinChoice> table = [] {
        std::vector<BuiltinChoice> v;
        for (const Row& row : k_rows)
            v.push_back({KernelConfig::parse(row.config), row.max_seq, row.causal_only,
                         row.max_grouped_seq_q, row.max_seq_k});
        return v;
    }();
    return table;
}

}  // namespace flash_attention::space
