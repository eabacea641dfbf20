#pragma once

// Inline PTX for the sm90 family that CCCL's cuda::ptx does not wrap: warpgroup MMA
// (wgmma), register reallocation (setmaxnreg) and named barriers. mbarriers, TMA and
// proxy fences come from cuda::ptx. Each comment names the PTX ISA instruction it wraps.
// wgmma and setmaxnreg exist only in sm_90a machine code: every caller compiles for it.

#include <cstdint>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention::ptx {

// wgmma.fence.sync.aligned — PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
// Instructions: wgmma.fence": orders this warpgroup's register accesses to accumulators
// and A fragments before the wgmma.mma_async that reads them.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// wgmma.commit_group.sync.aligned — PTX ISA "wgmma.commit_group": closes a group of
// wgmma.mma_async operations that wgmma_wait<N> can wait for.
__device__ __forceinline__ void wgmma_commit_group() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// wgmma.wait_group.sync.aligned N — PTX ISA "wgmma.wait_group": waits until at most N of
// this warpgroup's committed groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across a
// wgmma that is still writing them (an empty asm that "modifies" each register).
template <int NT>
__device__ __forceinline__ void fence_operands(float (&d)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            asm volatile("" : "+f"(d[nt][e])::"memory");
    }
}

// The same for A fragments a wgmma reads from registers: keeps them live, so their
// registers are not reused, until after the wait that retires that wgmma.
template <int KT>
__device__ __forceinline__ void fence_operands(std::uint32_t (&a)[KT][4]) {
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            asm volatile("" : "+r"(a[kt][e])::"memory");
    }
}

// Operand lists of the wgmma wrappers below (undefined at the end of this header): the
// accumulator registers of d[N / 8][4] in order (function-like, so that they expand only
// inside FA_WGMMA's operand list, not as arguments on the way), and their "%i" names in
// the PTX string.
#define FA_WGMMA_D4(t) "+f"(d[t][0]), "+f"(d[t][1]), "+f"(d[t][2]), "+f"(d[t][3])
#define FA_WGMMA_D16_AT(t) \
    FA_WGMMA_D4(t), FA_WGMMA_D4(t + 1), FA_WGMMA_D4(t + 2), FA_WGMMA_D4(t + 3)
#define FA_WGMMA_D16() FA_WGMMA_D16_AT(0)
#define FA_WGMMA_D32() FA_WGMMA_D16_AT(0), FA_WGMMA_D16_AT(4)
#define FA_WGMMA_D40() FA_WGMMA_D32(), FA_WGMMA_D4(8), FA_WGMMA_D4(9)
#define FA_WGMMA_D48() FA_WGMMA_D32(), FA_WGMMA_D16_AT(8)
#define FA_WGMMA_D56() FA_WGMMA_D32(), FA_WGMMA_D16_AT(8), FA_WGMMA_D4(12), FA_WGMMA_D4(13)
#define FA_WGMMA_D64() FA_WGMMA_D32(), FA_WGMMA_D16_AT(8), FA_WGMMA_D16_AT(12)
#define FA_WGMMA_D88() FA_WGMMA_D64(), FA_WGMMA_D16_AT(16), FA_WGMMA_D4(20), FA_WGMMA_D4(21)
#define FA_WGMMA_D96() FA_WGMMA_D64(), FA_WGMMA_D16_AT(16), FA_WGMMA_D16_AT(20)
#define FA_WGMMA_D128() FA_WGMMA_D96(), FA_WGMMA_D16_AT(24), FA_WGMMA_D16_AT(28)
#define FA_WGMMA_N0_31                                                                           \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FA_WGMMA_N32_39 "%32, %33, %34, %35, %36, %37, %38, %39"
#define FA_WGMMA_N40_47 "%40, %41, %42, %43, %44, %45, %46, %47"
#define FA_WGMMA_N40_55 \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55"
#define FA_WGMMA_N40_63                                                                          \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, " \
    "%58, %59, %60, %61, %62, %63"
#define FA_WGMMA_N64_87                                                                          \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87"
#define FA_WGMMA_N88_95 "%88, %89, %90, %91, %92, %93, %94, %95"
#define FA_WGMMA_N96_127                                                                           \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
    "%127"
#define FA_WGMMA_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FA_WGMMA_R32 "{" FA_WGMMA_N0_31 "}"
#define FA_WGMMA_R40 "{" FA_WGMMA_N0_31 ", " FA_WGMMA_N32_39 "}"
#define FA_WGMMA_R48 "{" FA_WGMMA_N0_31 ", " FA_WGMMA_N32_39 ", " FA_WGMMA_N40_47 "}"
#define FA_WGMMA_R56 "{" FA_WGMMA_N0_31 ", " FA_WGMMA_N32_39 ", " FA_WGMMA_N40_55 "}"
#define FA_WGMMA_R64 "{" FA_WGMMA_N0_31 ", " FA_WGMMA_N32_39 ", " FA_WGMMA_N40_63 "}"
#define FA_WGMMA_R88 \
    "{" FA_WGMMA_N0_31 ", " FA_WGMMA_N32_39 ", " FA_WGMMA_N40_63 ", " FA_WGMMA_N64_87 "}"
#define FA_WGMMA_R96                                                                  \
    "{" FA_WGMMA_N0_31 ", " FA_WGMMA_N32_39 ", " FA_WGMMA_N40_63 ", " FA_WGMMA_N64_87 \
    ", " FA_WGMMA_N88_95 "}"
#define FA_WGMMA_R128                                                                 \
    "{" FA_WGMMA_N0_31 ", " FA_WGMMA_N32_39 ", " FA_WGMMA_N40_63 ", " FA_WGMMA_N64_87 \
    ", " FA_WGMMA_N88_95 ", " FA_WGMMA_N96_127 "}"
// One wgmma.mma_async: shape N, the k-step and types ("k16.f32.bf16.bf16"), accumulator names
// and registers, then the names of the A and B operands, the scale-d predicate's source and the
// tail after the scales (the transposes' immediates, which 8-bit types do not take).
#define FA_WGMMA(N, K_TYPES, D_NAMES, D_REGS, A, B, P, TAIL, ...)                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P                                    \
                 ", 0;\n"                                                                   \
                 "wgmma.mma_async.sync.aligned.m64n" #N K_TYPES " " D_NAMES ", " A ", %" #B \
                 ", p, 1, 1" TAIL ";\n}\n"                                                  \
                 : D_REGS()                                                                 \
                 : __VA_ARGS__)
// The same for the wrapper's dtype: f16 or bf16 (k-steps of 16, with the transposes T), or e4m3
// (k-steps of 32 bytes too, 32 elements; K-major operands only: the transposes are not passed).
#define FA_WGMMA_TYPED(N, D_NAMES, D_REGS, A, B, P, T, ...)                              \
    if constexpr (dtype == DType::FP16) {                                                \
        FA_WGMMA(N, "k16.f32.f16.f16", D_NAMES, D_REGS, A, B, P, ", " T, __VA_ARGS__);   \
    } else if constexpr (dtype == DType::BF16) {                                         \
        FA_WGMMA(N, "k16.f32.bf16.bf16", D_NAMES, D_REGS, A, B, P, ", " T, __VA_ARGS__); \
    } else {                                                                             \
        static_assert(dtype == DType::E4M3, "wgmma types: f16, bf16, e4m3");             \
        FA_WGMMA(N, "k32.f32.e4m3.e4m3", D_NAMES, D_REGS, A, B, P, "", __VA_ARGS__);     \
    }
// Operands after the accumulators: A and B descriptors, or A's four registers and B's
// descriptor; then the scale-d source and the transposes (A's only from shared memory).
#define FA_WGMMA_SS_ARGS \
    "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(TransA)), "n"(int(TransB))
#define FA_WGMMA_RS_ARGS \
    "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(int(TransB))

template <int N>
inline constexpr bool wgmma_n_wrapped = false;

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} (m64nNk32.f32.e4m3.e4m3)
// with A and B in shared memory — PTX ISA "wgmma.mma_async": D (64 x N fp32, m16n8 accumulator
// tiles per warp) += A (64 x 16, or 32 8-bit) · B (16 x N, or 32 x N). A and B are K-major unless
// TransA (A MN-major: d_head 256's backward reads Pᵀ and dSᵀ from queries x keys tiles) and
// TransB; 8-bit operands are K-major only. accumulate = false: D = A·B.
// N: the values below (space::k_wgmma_n says which B_c the configs may use).
template <DType dtype, int N, bool TransB, bool TransA = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], std::uint64_t desc_a,
                                         std::uint64_t desc_b, bool accumulate) {
    static_assert(dtype != DType::E4M3 || (!TransA && !TransB), "8-bit operands: K-major only");
    if constexpr (N == 32) {
        FA_WGMMA_TYPED(32, FA_WGMMA_R16, FA_WGMMA_D16, "%16", 17, 18, "%19, %20", FA_WGMMA_SS_ARGS)
    } else if constexpr (N == 64) {
        FA_WGMMA_TYPED(64, FA_WGMMA_R32, FA_WGMMA_D32, "%32", 33, 34, "%35, %36", FA_WGMMA_SS_ARGS)
    } else if constexpr (N == 80) {
        FA_WGMMA_TYPED(80, FA_WGMMA_R40, FA_WGMMA_D40, "%40", 41, 42, "%43, %44", FA_WGMMA_SS_ARGS)
    } else if constexpr (N == 96) {  // d_head 96's P·V with P from shared memory (psmem)
        FA_WGMMA_TYPED(96, FA_WGMMA_R48, FA_WGMMA_D48, "%48", 49, 50, "%51, %52", FA_WGMMA_SS_ARGS)
    } else if constexpr (N == 112) {
        FA_WGMMA_TYPED(112, FA_WGMMA_R56, FA_WGMMA_D56, "%56", 57, 58, "%59, %60", FA_WGMMA_SS_ARGS)
    } else if constexpr (N == 128) {
        FA_WGMMA_TYPED(128, FA_WGMMA_R64, FA_WGMMA_D64, "%64", 65, 66, "%67, %68", FA_WGMMA_SS_ARGS)
    } else if constexpr (N == 176) {
        FA_WGMMA_TYPED(176, FA_WGMMA_R88, FA_WGMMA_D88, "%88", 89, 90, "%91, %92", FA_WGMMA_SS_ARGS)
    } else if constexpr (N == 192) {
        FA_WGMMA_TYPED(192, FA_WGMMA_R96, FA_WGMMA_D96, "%96", 97, 98, "%99, %100",
                       FA_WGMMA_SS_ARGS)
    } else {
        static_assert(wgmma_n_wrapped<N>, "wgmma N wrapped: 32, 64, 80, 96, 112, 128, 176 and 192");
    }
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} (m64nNk32.f32.e4m3.e4m3)
// with A in registers — PTX ISA "wgmma.mma_async": A is this warp's 16 rows as an m16k16
// fragment (the layout of mma.sync's A operand; 8-bit: m16k32, register i holding row lane / 4
// + 8 (i % 2), columns 4 (lane % 4) + 16 (i / 2) + {0..3}, the first in the low byte), B from
// shared memory, MN-major when TransB (16-bit types only).
template <DType dtype, int N, bool TransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const std::uint32_t (&a)[4],
                                         std::uint64_t desc_b, bool accumulate) {
    static_assert(dtype != DType::E4M3 || !TransB, "8-bit operands: K-major only");
    if constexpr (N == 64) {
        FA_WGMMA_TYPED(64, FA_WGMMA_R32, FA_WGMMA_D32, "{%32, %33, %34, %35}", 36, 37, "%38",
                       FA_WGMMA_RS_ARGS)
    } else if constexpr (N == 80) {
        FA_WGMMA_TYPED(80, FA_WGMMA_R40, FA_WGMMA_D40, "{%40, %41, %42, %43}", 44, 45, "%46",
                       FA_WGMMA_RS_ARGS)
    } else if constexpr (N == 96) {  // d_head 96's P·V (64-byte swizzled V)
        FA_WGMMA_TYPED(96, FA_WGMMA_R48, FA_WGMMA_D48, "{%48, %49, %50, %51}", 52, 53, "%54",
                       FA_WGMMA_RS_ARGS)
    } else if constexpr (N == 112) {
        FA_WGMMA_TYPED(112, FA_WGMMA_R56, FA_WGMMA_D56, "{%56, %57, %58, %59}", 60, 61, "%62",
                       FA_WGMMA_RS_ARGS)
    } else if constexpr (N == 128) {
        FA_WGMMA_TYPED(128, FA_WGMMA_R64, FA_WGMMA_D64, "{%64, %65, %66, %67}", 68, 69, "%70",
                       FA_WGMMA_RS_ARGS)
    } else if constexpr (N == 176) {
        FA_WGMMA_TYPED(176, FA_WGMMA_R88, FA_WGMMA_D88, "{%88, %89, %90, %91}", 92, 93, "%94",
                       FA_WGMMA_RS_ARGS)
    } else if constexpr (N == 192) {
        FA_WGMMA_TYPED(192, FA_WGMMA_R96, FA_WGMMA_D96, "{%96, %97, %98, %99}", 100, 101, "%102",
                       FA_WGMMA_RS_ARGS)
    } else if constexpr (N == 256) {
        FA_WGMMA_TYPED(256, FA_WGMMA_R128, FA_WGMMA_D128, "{%128, %129, %130, %131}", 132, 133,
                       "%134", FA_WGMMA_RS_ARGS)
    } else {
        static_assert(wgmma_n_wrapped<N>,
                      "wgmma N wrapped: 64, 80, 96, 112, 128, 176, 192 and 256");
    }
}

#undef FA_WGMMA_RS_ARGS
#undef FA_WGMMA_SS_ARGS
#undef FA_WGMMA_TYPED
#undef FA_WGMMA
#undef FA_WGMMA_R128
#undef FA_WGMMA_R96
#undef FA_WGMMA_R88
#undef FA_WGMMA_R64
#undef FA_WGMMA_R56
#undef FA_WGMMA_R48
#undef FA_WGMMA_R40
#undef FA_WGMMA_R32
#undef FA_WGMMA_R16
#undef FA_WGMMA_N96_127
#undef FA_WGMMA_N88_95
#undef FA_WGMMA_N64_87
#undef FA_WGMMA_N40_63
#undef FA_WGMMA_N40_55
#undef FA_WGMMA_N40_47
#undef FA_WGMMA_N32_39
#undef FA_WGMMA_N0_31
#undef FA_WGMMA_D128
#undef FA_WGMMA_D96
#undef FA_WGMMA_D88
#undef FA_WGMMA_D64
#undef FA_WGMMA_D56
#undef FA_WGMMA_D48
#undef FA_WGMMA_D40
#undef FA_WGMMA_D32
#undef FA_WGMMA_D16
#undef FA_WGMMA_D16_AT
#undef FA_WGMMA_D4

// cvt.rn.satfinite.e4m3x2.f32 — PTX ISA "Data Movement and Conversion Instructions: cvt"
// (sm_89 and later): four floats to e4m3, rounded to nearest even, finite values beyond ±448
// saturated, packed with x0 in the low byte (the order of an 8-bit wgmma A fragment's
// register). cvt's two-element form puts its first source in the upper byte.
__device__ __forceinline__ std::uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
    std::uint32_t packed;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(packed)
        : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
    return packed;
}

// setmaxnreg.inc.sync.aligned.u32 / setmaxnreg.dec.sync.aligned.u32 — PTX ISA "setmaxnreg":
// moves this warpgroup's per-thread register limit (a multiple of 8 in [24, 256]).
template <int Registers>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

// stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 — PTX ISA "Warp-level Matrix Store
// Instruction: stmatrix" (sm_90): four 8x8 16-bit matrices. Register i of every lane holds its
// fragment of matrix i (row lane / 4, columns 2 (lane % 4) + {0, 1}, as an mma accumulator's);
// lanes 8i..8i+7 give the addresses of matrix i's 16-byte rows, or with .trans of its columns,
// which become rows.
__device__ __forceinline__ void stmatrix_x4(std::uint32_t addr, const std::uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
__device__ __forceinline__ void stmatrix_x4_trans(std::uint32_t addr, const std::uint32_t (&r)[4]) {
    asm volatile(
        "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
        "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
        : "memory");
}

// bar.sync id, count / bar.arrive id, count — PTX ISA "Parallel Synchronization and
// Communication Instructions: bar, barrier": a named barrier among `count` threads
// (a multiple of 32); arrive does not wait.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// bar.red.and.pred — PTX ISA "Parallel Synchronization and Communication Instructions: bar,
// barrier": a named barrier among `count` threads that also returns whether `value` holds
// in every one of them.
__device__ __forceinline__ bool named_barrier_all(int id, int count, bool value) {
    std::uint32_t all;
    asm volatile(
        "{\n .reg .pred v, a;\n setp.ne.u32 v, %1, 0;\n bar.red.and.pred a, %2, %3, v;\n"
        " selp.u32 %0, 1, 0, a;\n}\n"
        : "=r"(all)
        : "r"(static_cast<std::uint32_t>(value)), "r"(id), "r"(count)
        : "memory");
    return all != 0;
}
// Whether `value` holds in any of them: not all of them hold its negation.
__device__ __forceinline__ bool named_barrier_any(int id, int count, bool value) {
    return !named_barrier_all(id, count, !value);
}

}  // namespace flash_attention::ptx
