#pragma once

// Inline PTX for the sm80 family, one wrapper per instruction; each comment names
// the PTX ISA instruction and section it wraps.

#include <cstdint>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention::ptx {

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async.cg.shared.global [dst], [src], 16 — PTX ISA "Data Movement and Conversion
// Instructions: cp.async". .cg caches in L2 only: each K/V byte is read once per CTA.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// cp.async.cg.shared.global [dst], [src], 16, src_size — the same, reading only src_size
// (0 or 16) bytes and zero-filling the rest: rows past the end of a sequence land in
// shared memory as zeros, never as stale data.
__device__ __forceinline__ void cp_async_16_zfill(std::uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}

// createpolicy.fractional.L2::evict_first.b64 / ...L2::evict_normal.b64 — PTX ISA
// "createpolicy": an L2 cache policy for the accesses that carry it; evict_first marks the
// lines they bring in as the first to go (data read once, streamed past the cache).
__device__ __forceinline__ std::uint64_t l2_policy(bool evict_first) {
    std::uint64_t policy;
    if (evict_first)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0;\n" : "=l"(policy));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0;\n" : "=l"(policy));
    return policy;
}

// cp.async.cg.shared.global.L2::cache_hint [dst], [src], 16, src_size, policy — PTX ISA
// "cp.async": cp_async_16_zfill under an L2 cache policy (l2_policy).
__device__ __forceinline__ void cp_async_16_zfill(std::uint32_t dst, const void* src, bool valid,
                                                  std::uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(valid ? 16 : 0), "l"(policy));
}

// cp.async.commit_group — PTX ISA "cp.async.commit_group".
__device__ __forceinline__ void cp_async_commit_group() {
    asm volatile("cp.async.commit_group;\n" ::);
}

// cp.async.wait_group N — PTX ISA "cp.async.wait_group": waits until at most N of
// this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ld.global.v4.u32 / st.shared.v4.u32 — PTX ISA "Data Movement: ld", "st": the
// 16-byte synchronous copy used when async_copy is off.
__device__ __forceinline__ uint4 ld_global_16(const void* src) {
    return *static_cast<const uint4*>(src);
}
__device__ __forceinline__ void st_shared_16(std::uint32_t dst, const uint4& v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ uint4 ld_shared_16(std::uint32_t src) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(src));
    return v;
}
__device__ __forceinline__ std::uint32_t ld_shared_4(std::uint32_t src) {
    std::uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(src));
    return v;
}
__device__ __forceinline__ void st_shared_4(std::uint32_t dst, std::uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v));
}
__device__ __forceinline__ void st_global_16(void* dst, const uint4& v) {
    *static_cast<uint4*>(dst) = v;
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 — PTX ISA "Warp-level Matrix Load
// Instruction: ldmatrix". Lanes 8i..8i+7 address the rows of matrix i.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 — as above, each 8x8 matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 — PTX ISA "Warp-level
// Matrix Multiply-Accumulate Instructions: mma", shape m16n8k16, fp32 accumulators.
template <DType dtype>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const std::uint32_t (&a)[4],
                                             const std::uint32_t (&b)[2]) {
    if constexpr (dtype == DType::FP16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// ex2.approx.ftz.f32 — PTX ISA "Floating Point Instructions: ex2": one MUFU.EX2.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh.approx.f32 — PTX ISA "Floating Point Instructions: tanh" (sm_75+): one MUFU.TANH,
// maximum relative error 2^-11.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// cvt.rn.{f16x2,bf16x2}.f32 — PTX ISA "Data Movement and Conversion Instructions: cvt":
// two fp32 values rounded into one register, lo in the low half.
template <DType dtype>
__device__ __forceinline__ std::uint32_t pack_rn(float lo, float hi) {
    std::uint32_t r;
    if constexpr (dtype == DType::FP16) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

// The two 16-bit values of pack_rn() back as fp32 (exact), lo first: bf16 is fp32's upper
// half; cvt.f32.f16 — PTX ISA "Data Movement and Conversion Instructions: cvt".
template <DType dtype>
__device__ __forceinline__ float2 unpack(std::uint32_t packed) {
    float2 r;
    if constexpr (dtype == DType::FP16) {
        asm("{\n"
            ".reg .b16 lo, hi;\n"
            "mov.b32 {lo, hi}, %2;\n"
            "cvt.f32.f16 %0, lo;\n"
            "cvt.f32.f16 %1, hi;\n"
            "}\n"
            : "=f"(r.x), "=f"(r.y)
            : "r"(packed));
    } else {
        r.x = __uint_as_float(packed << 16);
        r.y = __uint_as_float(packed & 0xffff0000u);
    }
    return r;
}

// griddepcontrol.launch_dependents / griddepcontrol.wait — PTX ISA "Parallel Synchronization
// and Communication Instructions: griddepcontrol" (sm_90 on), through the runtime's device
// functions. Programmatic dependent launch: the stream's next kernel, launched with
// LaunchOrder::after_trigger, may be scheduled once every CTA of this grid has called
// launch_dependents() or exited; wait_for_previous_grid() blocks until the grid before this one
// has completed and its writes are visible. Both do nothing before sm_90 and in launches
// without the attribute.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
#endif
}

}  // namespace flash_attention::ptx
