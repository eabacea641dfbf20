#include <cstdint>
#include <cstdio>
template <int Kind>
__global__ void k(uint32_t* out, uint32_t seed, int iters, long long* clk) {
    uint32_t a[8];
    for (int i = 0; i < 8; ++i)
        a[i] = seed * (threadIdx.x + i);
    long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if constexpr (Kind == 0)
                asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+r"(a[i]));
            else if constexpr (Kind == 1)
                asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(a[i]));
            else
                asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(a[i]));
        }
    }
    long long t1 = clock64();
    uint32_t s = 0;
    for (int i = 0; i < 8; ++i)
        s ^= a[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *clk = t1 - t0;
}
int main() {
    uint32_t* out;
    long long* clk;
    cudaMalloc(&out, 1 << 24);
    cudaMalloc(&clk, 8);
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int iters = 4096, threads = 1024;
    auto run = [&](auto kern, const char* name, int per_instr) {
        kern<<<sms, threads>>>(out, 0x3f800001u, iters, clk);
        cudaDeviceSynchronize();
        long long c;
        cudaMemcpy(&c, clk, 8, cudaMemcpyDeviceToHost);
        double elems = double(threads) * iters * 8 * per_instr;  // per SM
        printf("%-8s %lld clk  %.2f elements/clk/SM  %.2f instr(warp-lanes)/clk/SM\n", name, c,
               elems / c, elems / per_instr / c);
    };
    for (int r = 0; r < 2; ++r) {
        run(k<0>, "f32", 1);
        run(k<1>, "f16x2", 2);
        run(k<2>, "bf16x2", 2);
    }
    printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
