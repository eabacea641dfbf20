// How fast can k warps a scheduler exponentiate a 64 x 128 block (d_head 64's softmax step)?
// Each warp repeats the fast path of one step: per score one FFMA, one MUFU.EX2 and one FADD
// into one of two row sums, and a F2FP pack a pair; the exponentials feed the next step's
// FFMAs (as fresh scores would), so each step has 64 independent chains. One CTA an SM,
// 4k warps: warp w runs on scheduler w % 4. Cycles per step and per warp (clock64), against
// the MUFU's bound of 64 x 8 = 512 cycles a step for each warp on a scheduler.
#include <cstdint>
#include <cstdio>

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__global__ void steps(float* out, float scale, int iters, long long* clk) {
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i)
        s[i] = 0.001f * (threadIdx.x + i);
    float sum0 = 0.f, sum1 = 0.f;
    std::uint32_t packed = 0;
    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
        const float m = 0.5f + 1e-7f * it;
#pragma unroll
        for (int i = 0; i < 64; ++i) {
            s[i] = ex2(fmaf(s[i], scale, -m));
            if (i % 4 < 2)
                sum0 += s[i];
            else
                sum1 += s[i];
        }
#pragma unroll
        for (int i = 0; i < 64; i += 2) {
            std::uint32_t p;
            asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(s[i + 1]), "f"(s[i]));
            packed ^= p;
        }
    }
    const long long t1 = clock64();
    float acc = sum0 + sum1 + __uint_as_float(packed & 0x3fffffffu);
#pragma unroll
    for (int i = 0; i < 64; ++i)
        acc += s[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    if (threadIdx.x % 32 == 0)
        clk[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}

int main() {
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float* out;
    long long* clk;
    cudaMalloc(&out, sizeof(float) * sms * 1024);
    cudaMalloc(&clk, sizeof(long long) * sms * 32);
    const int iters = 2000;
    for (int rep = 0; rep < 2; ++rep) {
        for (int per_scheduler = 1; per_scheduler <= 4; ++per_scheduler) {
            const int warps = 4 * per_scheduler;
            steps<<<sms, 32 * warps>>>(out, 0.125f, iters, clk);
            if (cudaDeviceSynchronize() != cudaSuccess) {
                printf("error %s\n", cudaGetErrorString(cudaGetLastError()));
                return 1;
            }
            long long host[32 * 132];
            cudaMemcpy(host, clk, sizeof(long long) * sms * 32, cudaMemcpyDeviceToHost);
            long long worst = 0;
            for (int b = 0; b < sms; ++b)
                for (int w = 0; w < warps; ++w)
                    worst = host[b * 32 + w] > worst ? host[b * 32 + w] : worst;
            const double per_step = double(worst) / iters;
            printf(
                "%d warp(s) a scheduler: %.0f cycles a step a warp; MUFU busy %.0f%% "
                "(bound %d cycles)\n",
                per_scheduler, per_step, 100.0 * 512 * per_scheduler / per_step,
                512 * per_scheduler);
        }
    }
    return 0;
}
