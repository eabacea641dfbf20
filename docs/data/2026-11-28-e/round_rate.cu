// How long is a round of d_head 64's main loop when nothing but the consumers runs?
// Each consumer warpgroup repeats the release kernel's overlapped step on shared-memory
// tiles that never change (no producer, no mbarrier waits, no masks): take the GEMM turn,
// issue S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1}, hand the turn on, wait for S_j, exponentiate
// it against the kept references (the vote included), retire P·V, pack P. The library's own
// primitives do the work (warpgroup GEMMs, OnlineSoftmax, the A-fragment packing), so the
// instruction stream is the kernel's less its memory pipeline. Variants: the GEMMs alone,
// the softmax alone, ping-pong off, the turn handed on between S and P·V, the row max every
// block instead of the kept references, two consumers. Cycles a round (each consumer one
// block), the worst warp of all CTAs, and the units' shares: tensor cores at 512 cycles a
// consumer's block (2 x 64 x 128 x 64 x 2 flops at 4096 a clock), the MUFU at 512 (8192
// exponentials at 16 a clock).
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/warpgroup_gemm.cuh"

using namespace flash_attention;

constexpr int D = 64;
constexpr int BC = 128;
constexpr int stages = 2;
using QTile = Swizzle128Tile<64, D>;
using KVTile = Swizzle128Tile<BC, D>;
constexpr DType dt = DType::BF16;

// softmax_beside_gemms: the consumers' softmax alone while the fourth warpgroup issues
// GEMMs (Hog) back to back until they finish.
enum Mode { full, softmax_only, softmax_beside_gemms };
enum Vote { vote, no_vote };  // no_vote: each warp trusts its own kept check (timing only)
// The GEMM warpgroup: groups of four m64nNk16 (K = 64), A from shared memory or registers
// (rs), one group in flight behind the one running or none (drained); alone: the consumers
// idle meanwhile.
struct Hog {
    int n = 64;
    bool rs = false;
    bool drained = false;
    bool alone = false;
};
enum Turn { pingpong, none, split };  // split: the turn goes on after S, before P·V
// bare: FFMA + MUFU.EX2 a score against a fixed reference, no sums, no vote (timing only);
// bare_7_8: every eighth score not exponentiated; bare_poly: every eighth on the FMA pipe
// (floor and F2I); magic3 / magic2: the same with a cubic / quadratic behind 1.5 * 2^23's
// rounding (FADD and integer ops only; the fmaexp knob's of 2026-11-24 is magic3), Emu
// eighths of the scores (an eighth when Emu is 0).
enum Ref { kept, row_max, bare, bare_7_8, bare_poly, magic3, magic2 };

__device__ __forceinline__ float exp2_magic(float x, bool cubic) {
    x = fmaxf(x, -126.0f);
    constexpr float shifter = 12582912.0f;
    const float t = x + shifter;
    const float f = x - (t - shifter);
    const float p =
        cubic ? fmaf(fmaf(fmaf(0.05517145f, f, 0.24261062f), f, 0.69326097f), f, 0.99992812f)
              : fmaf(fmaf(0.23842697f, f, 0.7034453f), f, 1.00044307f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

template <int Consumers>
constexpr int smem_bytes = Consumers* QTile::bytes + 2 * stages* KVTile::bytes;

template <int Consumers, Turn T>
struct Turns {
    int consumer;
    bool started = false;
    __device__ void acquire() {
        if constexpr (T != none) {
            if (!started && consumer == Consumers - 1)
                ptx::named_barrier_arrive(1, 256);
            started = true;
            ptx::named_barrier_sync(1 + consumer, 256);
        }
    }
    __device__ void release() const {
        if constexpr (T != none)
            ptx::named_barrier_arrive(1 + (consumer + 1) % Consumers, 256);
    }
    __device__ void finish() const {
        if (T != none && started && consumer == 0)
            ptx::named_barrier_sync(1, 256);
    }
};

// Trace: warp w's clock at each event of rounds [trace_from, trace_from + trace_rounds), CTA 0.
constexpr int trace_from = 500;
constexpr int trace_rounds = 6;
constexpr int trace_events = 6;  // turn held, GEMMs issued, S_j ready, exponentiated,
                                 // P·V retired, P packed (round j; its start: the previous end)
__device__ long long g_trace[16][trace_rounds][trace_events];

template <int Consumers, Mode M, Turn T, Ref R, bool Trace = false, Vote V = vote, Hog H = Hog{},
          bool QReg = false, int Emu = 0>
__global__ void __launch_bounds__(128 * (Consumers + 1), 1)
    rounds(int iters, long long* clk, float* out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    for (int i = threadIdx.x; i < smem_bytes<Consumers> / 4; i += blockDim.x)
        reinterpret_cast<std::uint32_t*>(smem)[i] = 0x3c243c24u;  // bf16 0.01 pairs
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int wg = threadIdx.x / 128;
    const std::uint32_t base = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
    __shared__ int consumers_done;
    if (threadIdx.x == 0)
        consumers_done = 0;
    __syncthreads();
    if (wg == Consumers) {
        if constexpr (M == softmax_beside_gemms) {
            // No setmaxnreg here: ptxas does not bound a path's registers by it, so every
            // warpgroup keeps the launch's 128.
            constexpr int N = H.n;
            using BTile = Swizzle128Tile<N, D>;
            float d[1][N / 8][4];
            zero(d);
            std::uint32_t a[D / 16][4];
            if constexpr (H.rs)
                load_a_fragments<QTile>(a, base, (threadIdx.x / 32 % 4) * 16);
            long long groups = 0;
            const long long h0 = clock64();
            // wgmma is warpgroup-wide: the warps agree on when to stop (bar.red), every 16
            // groups.
            while (groups % 16 != 0 ||
                   !ptx::named_barrier_all(
                       15, 128, *static_cast<volatile int*>(&consumers_done) == Consumers)) {
                ptx::fence_operands(d[0]);
                ptx::wgmma_fence();
                if constexpr (H.rs)
                    warpgroup_gemm_qk<dt, BTile>(d[0], a, base);
                else
                    warpgroup_gemm_qk<dt, QTile, BTile>(d[0], base, base);
                ptx::wgmma_commit_group();
                if constexpr (H.drained)
                    ptx::wgmma_wait<0>();
                else
                    ptx::wgmma_wait<1>();
                ++groups;
            }
            ptx::wgmma_wait<0>();
            ptx::fence_operands(d[0]);
            const long long h1 = clock64();
            out[blockIdx.x * blockDim.x + threadIdx.x] = d[0][0][0];
            if (threadIdx.x % 128 == 0)  // GEMM cycles a group of 4 x m64nNk16
                clk[blockIdx.x * 16 + 15] = (h1 - h0) * 1000 / (groups > 0 ? groups : 1);
        } else {
            ptx::setmaxnreg_dec<Consumers >= 3 ? 32 : 24>();
        }
        return;
    }
    if constexpr (M != softmax_beside_gemms)
        ptx::setmaxnreg_inc<Consumers >= 3 ? 160 : 240>();
    const std::uint32_t q = base + wg * QTile::bytes;
    const std::uint32_t k0 = base + Consumers * QTile::bytes;
    const std::uint32_t v0 = k0 + stages * KVTile::bytes;
    const auto k = [&](int j) { return k0 + (j % stages) * KVTile::bytes; };
    const auto v = [&](int j) { return v0 + (j % stages) * KVTile::bytes; };
    const int vote_id = 1 + Consumers + wg;
    const auto agree = [&](bool value) {
        return V == vote ? ptx::named_barrier_all(vote_id, 128, value) : value;
    };

    if constexpr (H.alone) {
        const long long i0 = clock64();
        while (clock64() - i0 < 1500000) {
        }
        if (threadIdx.x % 128 == 0)
            atomicAdd(&consumers_done, 1);
        return;
    }
    float s[1][BC / 8][4];
    float o[1][D / 8][4];
    std::uint32_t p[1][BC / 16][4];
    zero(o);
    zero(s);
    accumulators_to_a_fragments<dt>(s, p);
    using Softmax = OnlineSoftmax<1, true, R == kept ? RowReference::lazy : RowReference::max>;
    Softmax softmax(0.125f, 0.125f * 1.4426950408889634f);
    Turns<Consumers, T> turns{wg};

    // QReg: Q as A fragments (S from registers and K), as the qreg knob does.
    std::uint32_t qf[D / 16][4];
    if constexpr (QReg)
        load_a_fragments<QTile>(qf, q, (threadIdx.x / 32 % 4) * 16);
    const auto issue_qk = [&](int j) {
        ptx::fence_operands(s[0]);
        ptx::wgmma_fence();
        if constexpr (QReg)
            warpgroup_gemm_qk<dt, KVTile>(s[0], qf, k(j));
        else
            warpgroup_gemm_qk<dt, QTile, KVTile>(s[0], q, k(j));
        ptx::wgmma_commit_group();
        ptx::fence_operands(s[0]);
    };
    const auto issue_pv = [&](int j) {
        ptx::fence_operands(o[0]);
        ptx::wgmma_fence();
        warpgroup_gemm_pv<dt, KVTile>(o[0], p[0], v(j));
        ptx::wgmma_commit_group();
        ptx::fence_operands(o[0]);
    };
    const auto exponentiate = [&](int j) {
        {
            if constexpr (R == kept) {
                if (j == 0 || !softmax.exponentiate_kept(s, agree))
                    softmax.exponentiate_to_max(s);
            } else if constexpr (R == row_max) {
                softmax.exponentiate(s);
            } else {
#pragma unroll
                for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float x = fmaf(s[0][nt][e], 0.18f, -0.5f);
                        const int share = Emu == 0 ? 1 : Emu;  // eighths on the FMA pipe
                        if constexpr (R == magic3 || R == magic2) {
                            s[0][nt][e] = (nt * 4 + e) % 8 >= 8 - share ? exp2_magic(x, R == magic3)
                                                                        : ptx::ex2(x);
                        } else if ((R == bare_7_8 || R == bare_poly) && (nt * 4 + e) % 8 == 7) {
                            if constexpr (R == bare_poly) {
                                const float fl = floorf(x);
                                const float f = x - fl;
                                const float p2 = fmaf(
                                    fmaf(fmaf(0.0790209f, f, 0.2249044f), f, 0.6960656f), f, 1.0f);
                                s[0][nt][e] =
                                    __int_as_float(__float_as_int(p2) + (__float2int_rn(fl) << 23));
                            } else {
                                s[0][nt][e] = x;
                            }
                        } else {
                            s[0][nt][e] = ptx::ex2(x);
                        }
                    }
                }
            }
        }
    };

    if constexpr (M == full) {
        turns.acquire();
        issue_qk(0);
        turns.release();
        ptx::wgmma_wait<0>();
        ptx::fence_operands(s[0]);
    }
    exponentiate(0);
    accumulators_to_a_fragments<dt>(s, p);
    __syncwarp();
    const long long t0 = clock64();
    const bool tracer = Trace && blockIdx.x == 0 && threadIdx.x % 32 == 0;
    const auto stamp = [&](int j, int event) {
        if constexpr (Trace) {
            const int r = j - trace_from;
            if (tracer && r >= 0 && r < trace_rounds)
                g_trace[threadIdx.x / 32][r][event] = clock64();
        }
    };
    for (int j = 1; j <= iters; ++j) {
        if constexpr (M == full) {
            turns.acquire();
            stamp(j, 0);
            issue_qk(j);
            if constexpr (T == split)
                turns.release();
            issue_pv(j - 1);
            if constexpr (T != split)
                turns.release();
            stamp(j, 1);
            ptx::wgmma_wait<1>();
            ptx::fence_operands(s[0]);
            if constexpr (QReg)
                ptx::fence_operands(qf);
            stamp(j, 2);
        }
        exponentiate(j);
        stamp(j, 3);
        if constexpr (M == full) {
            ptx::wgmma_wait<0>();
            ptx::fence_operands(o[0]);
            ptx::fence_operands(p[0]);
        }
        stamp(j, 4);
        if constexpr (R == kept || R == row_max)
            softmax.rescale(o);
        accumulators_to_a_fragments<dt>(s, p);
        stamp(j, 5);
    }
    __syncwarp();
    const long long t1 = clock64();
    if (threadIdx.x % 128 == 0)
        atomicAdd(&consumers_done, 1);
    if constexpr (M == full) {
        turns.acquire();
        issue_pv(iters);
        turns.release();
        ptx::wgmma_wait<0>();
        ptx::fence_operands(o[0]);
        turns.finish();
    }
    softmax.finalize(o);
    float acc = 0.0f;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
        acc += o[0][nt][0] + o[0][nt][1] + o[0][nt][2] + o[0][nt][3];
#pragma unroll
    for (int kt = 0; kt < BC / 16; ++kt)
        acc += __uint_as_float(p[0][kt][0] & 0x3fffffffu);
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    if (threadIdx.x % 32 == 0)
        clk[blockIdx.x * 16 + threadIdx.x / 32] = t1 - t0;
}

template <int Consumers, Mode M, Turn T, Ref R, bool Trace = false, Vote V = vote, Hog H = Hog{},
          bool QReg = false, int Emu = 0>
void measure(const char* name, int sms, long long* clk, float* out, int iters = 1000) {
    const auto kernel = rounds<Consumers, M, T, R, Trace, V, H, QReg, Emu>;
    constexpr int bytes = smem_bytes<Consumers>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    double best = 1e30;
    float best_ms = 1e30f;
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int rep = 0; rep < 3; ++rep) {
        cudaEventRecord(start);
        kernel<<<sms, 128 * (Consumers + 1), bytes>>>(iters, clk, out);
        cudaEventRecord(stop);
        if (cudaDeviceSynchronize() != cudaSuccess) {
            printf("%s: error %s\n", name, cudaGetErrorString(cudaGetLastError()));
            std::exit(1);
        }
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, start, stop);
        best_ms = std::min(best_ms, ms);
        static long long host[16 * 1024];
        cudaMemcpy(host, clk, sizeof(long long) * sms * 16, cudaMemcpyDeviceToHost);
        long long worst = 0;
        for (int b = 0; b < sms; ++b)
            for (int w = 0; w < 4 * Consumers; ++w)
                worst = host[b * 16 + w] > worst ? host[b * 16 + w] : worst;
        best = std::min(best, double(worst) / iters);
    }
    const double bound = 512.0 * Consumers;
    // Wall-clock cross-check: the GEMMs' flops over the kernel's time (prologue included).
    const double flops = 2.0 * 2 * 64 * BC * D * double(Consumers) * (iters + 1) * sms;
    printf(
        "%-40s %6.0f cycles a round; tensor/MUFU work %4.0f%% of it; %.3f ms, %.0f GEMM TFLOP/s\n",
        name, best, 100.0 * bound / best, best_ms, flops / (best_ms * 1e-3) / 1e12);
    // Cycles over wall time: the clock the SMs ran at (in a sustained run, the power-capped one).
    printf("  clock: %.0f MHz\n", best * iters / (best_ms * 1e3));
    if constexpr (M == softmax_beside_gemms) {
        static long long h[16];
        cudaMemcpy(h, clk, sizeof(h), cudaMemcpyDeviceToHost);
        const int n = H.n;
        printf(
            "  beside them, CTA 0's GEMM warpgroup: %.1f cycles a group of 4 m64n%dk16 "
            "(%d at the tensor cores' peak)\n",
            h[15] / 1000.0, n, 2 * n);
    }
    if constexpr (Trace) {
        // Each consumer's warp on scheduler 0 (warp 4c), cycles from the first stamp.
        static long long t[16][trace_rounds][trace_events];
        cudaMemcpyFromSymbol(t, g_trace, sizeof(t));
        long long origin = t[0][0][0];
        for (int c = 0; c < Consumers; ++c)
            origin = std::min(origin, t[4 * c][0][0]);
        printf(
            "  trace (CTA 0, scheduler 0's warps; cycles): round: consumer: turn held / "
            "issued / S ready / exponentiated / P.V retired / packed\n");
        for (int r = 0; r < trace_rounds; ++r)
            for (int c = 0; c < Consumers; ++c) {
                printf("  %d: c%d:", r, c);
                for (int e = 0; e < trace_events; ++e)
                    printf(" %6lld", t[4 * c][r][e] - origin);
                printf("\n");
            }
    }
}

int main(int argc, char** argv) {
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float* out;
    long long* clk;
    cudaMalloc(&out, sizeof(float) * sms * 512);
    cudaMalloc(&clk, sizeof(long long) * sms * 16);
    if (argc > 1) {  // sustained: the release step for argv[1] rounds (seconds, to reach the cap)
        measure<3, full, pingpong, kept>("3 consumers, the release step, sustained", sms, clk, out,
                                         std::atoi(argv[1]));
        return 0;
    }
    measure<3, full, pingpong, kept>("3 consumers, the release step", sms, clk, out);
    measure<3, full, pingpong, bare>("3 consumers, bare exponentials", sms, clk, out);
    measure<3, full, pingpong, bare_7_8>("3 consumers, bare, 7/8 exponentiated", sms, clk, out);
    measure<3, full, pingpong, bare_poly>("3 consumers, bare, 1/8 on the FMA pipe", sms, clk, out);
    measure<3, full, pingpong, magic3>("3 consumers, bare, 1/8 magic cubic", sms, clk, out);
    measure<3, full, pingpong, magic2>("3 consumers, bare, 1/8 magic quadratic", sms, clk, out);
    measure<3, full, pingpong, magic2, false, vote, Hog{}, false, 2>(
        "3 consumers, bare, 2/8 magic quadratic", sms, clk, out);
    measure<3, full, pingpong, magic2, false, vote, Hog{}, false, 3>(
        "3 consumers, bare, 3/8 magic quadratic", sms, clk, out);
    measure<3, full, pingpong, magic2, false, vote, Hog{}, false, 4>(
        "3 consumers, bare, 4/8 magic quadratic", sms, clk, out);
    measure<3, full, pingpong, magic3, false, vote, Hog{}, false, 2>(
        "3 consumers, bare, 2/8 magic cubic", sms, clk, out);
    measure<3, full, pingpong, magic3, false, vote, Hog{}, false, 3>(
        "3 consumers, bare, 3/8 magic cubic", sms, clk, out);
    measure<3, full, pingpong, kept, false, vote, Hog{}, true>("3 consumers, Q in registers", sms,
                                                               clk, out);
    measure<3, full, pingpong, kept, true>("3 consumers, the release step, traced", sms, clk, out);
    measure<2, full, pingpong, kept, true>("2 consumers, the release step, traced", sms, clk, out);
    measure<3, softmax_only, none, kept>("3 consumers, softmax only", sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept>("3 consumers, softmax beside GEMMs", sms, clk,
                                                 out);
    measure<3, softmax_beside_gemms, none, kept, false, vote, Hog{.drained = true}>(
        "3 consumers, softmax beside drained GEMMs", sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept, false, vote, Hog{.n = 192}>(
        "3 consumers, softmax beside wide GEMMs", sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept, false, vote, Hog{.rs = true}>(
        "3 consumers, softmax beside RS GEMMs", sms, clk, out);
    // The GEMM shapes alone: S = Q·Kᵀ (N = B_c = 128, Q from shared memory or registers),
    // P·V (A from registers, N = d_head = 64), and both at N = 64 and 192.
    measure<3, softmax_beside_gemms, none, kept, false, vote, Hog{.alone = true}>(
        "GEMMs alone: SS N=64", sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept, false, vote, Hog{.n = 128, .alone = true}>(
        "GEMMs alone: SS N=128 (S)", sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept, false, vote,
            Hog{.n = 128, .rs = true, .alone = true}>("GEMMs alone: RS N=128 (S, Q in registers)",
                                                      sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept, false, vote, Hog{.rs = true, .alone = true}>(
        "GEMMs alone: RS N=64 (P.V)", sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept, false, vote, Hog{.n = 192, .alone = true}>(
        "GEMMs alone: SS N=192", sms, clk, out);
    measure<3, softmax_beside_gemms, none, kept, false, vote,
            Hog{.n = 192, .rs = true, .alone = true}>("GEMMs alone: RS N=192", sms, clk, out);
    measure<3, full, pingpong, kept, false, no_vote>("3 consumers, release step without the vote",
                                                     sms, clk, out);
    measure<3, full, none, kept>("3 consumers, no ping-pong", sms, clk, out);
    measure<3, full, split, kept>("3 consumers, turn handed on after S", sms, clk, out);
    measure<3, full, pingpong, row_max>("3 consumers, row max every block", sms, clk, out);
    measure<2, full, pingpong, kept>("2 consumers, the release step", sms, clk, out);
    measure<2, full, none, kept>("2 consumers, no ping-pong", sms, clk, out);
    return 0;
}
