#include <cstdio>
__global__ void k(int* p) {
    extern __shared__ int s[];
    if (p)
        p[0] = s[threadIdx.x];
}
int main() {
    int smem = 200 * 1024;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int cl : {1, 2, 4}) {
        cudaLaunchConfig_t c{};
        c.gridDim = dim3(cl);
        c.blockDim = dim3(384);
        c.dynamicSmemBytes = smem;
        cudaLaunchAttribute a{};
        a.id = cudaLaunchAttributeClusterDimension;
        a.val.clusterDim = {(unsigned)cl, 1, 1};
        c.attrs = &a;
        c.numAttrs = 1;
        int n = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&n, k, &c);
        printf("cluster %d: max active clusters %d (%d CTAs) %s\n", cl, n, n * cl,
               cudaGetErrorString(e));
    }
}
