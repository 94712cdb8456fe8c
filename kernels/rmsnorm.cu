/*
 * rmsnorm.cu — RMSNorm as transformers' LlamaRMSNorm (mean of squares in f32, x * 1/sqrt(ms +
 * eps), then * weight), optionally fused with the residual add before it (x += add, written
 * back), which saves one pass over the residual stream per norm, and optionally writing the
 * output a second time in bf16/f16 for the GEMM that reads it (saving that GEMM's conversion).
 *
 * Rows up to 1024 wide (q/k norms over head_dim, small hidden sizes) take a warp each; wider
 * rows take a block of 256 threads. Both keep the row in registers between the two passes.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

#define PDK_NORM_WARP_MAX 1024 /* widest row a single warp handles (32 values per lane) */
#define PDK_NORM_BLOCK 256
#define PDK_NORM_BLOCK_VALS 32 /* values per thread in the block kernel, so dims <= 8192 */

/* the output again in the next GEMM's 2-byte type */
static __device__ __forceinline__ void store2(const struct pd_kernel_rmsnorm_params &p, int64_t i,
                                              float v) {
    if (p.out2_dtype == PD_DTYPE_F16)
        ((__half *)p.out2)[i] = from_f<__half>(v);
    else
        ((__nv_bfloat16 *)p.out2)[i] = from_f<__nv_bfloat16>(v);
}

template <typename W, int PER>
static __global__ void rmsnorm_warp_kernel(struct pd_kernel_rmsnorm_params p) {
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= p.rows)
        return;
    float *x = p.x + row * p.dim;
    const float *a = p.add ? p.add + row * p.dim : nullptr;
    float v[PER];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int d = lane + i * 32;
        v[i] = 0.0f;
        if (d < p.dim) {
            v[i] = x[d];
            if (a) {
                v[i] += a[d];
                x[d] = v[i];
            }
        }
        ss += v[i] * v[i];
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)p.dim + p.eps);
    const W *w = (const W *)p.w;
    float *o = p.out + row * p.dim;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int d = lane + i * 32;
        if (d < p.dim) {
            o[d] = to_f(w[d]) * (v[i] * r);
            if (p.out2)
                store2(p, row * p.dim + d, o[d]);
        }
    }
}

template <typename W>
static __global__ void __launch_bounds__(PDK_NORM_BLOCK)
    rmsnorm_block_kernel(struct pd_kernel_rmsnorm_params p) {
    __shared__ float sh[32];
    int64_t row = blockIdx.x;
    float *x = p.x + row * p.dim;
    const float *a = p.add ? p.add + row * p.dim : nullptr;
    float v[PDK_NORM_BLOCK_VALS];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < PDK_NORM_BLOCK_VALS; i++) {
        int d = threadIdx.x + i * PDK_NORM_BLOCK;
        v[i] = 0.0f;
        if (d < p.dim) {
            v[i] = x[d];
            if (a) {
                v[i] += a[d];
                x[d] = v[i];
            }
        }
        ss += v[i] * v[i];
    }
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / (float)p.dim + p.eps);
    const W *w = (const W *)p.w;
    float *o = p.out + row * p.dim;
#pragma unroll
    for (int i = 0; i < PDK_NORM_BLOCK_VALS; i++) {
        int d = threadIdx.x + i * PDK_NORM_BLOCK;
        if (d < p.dim) {
            o[d] = to_f(w[d]) * (v[i] * r);
            if (p.out2)
                store2(p, row * p.dim + d, o[d]);
        }
    }
}

template <typename W>
static void rmsnorm_launch(const struct pd_kernel_rmsnorm_params &p, cudaStream_t s) {
    if (p.dim <= 128) {
        rmsnorm_warp_kernel<W, 4><<<blocks_for(p.rows, 8), 256, 0, s>>>(p);
    } else if (p.dim <= 256) {
        rmsnorm_warp_kernel<W, 8><<<blocks_for(p.rows, 8), 256, 0, s>>>(p);
    } else if (p.dim <= PDK_NORM_WARP_MAX && p.rows >= 1024) {
        rmsnorm_warp_kernel<W, 32><<<blocks_for(p.rows, 4), 128, 0, s>>>(p);
    } else {
        rmsnorm_block_kernel<W><<<(unsigned)p.rows, PDK_NORM_BLOCK, 0, s>>>(p);
    }
}

extern "C" int pd_kernel_rmsnorm(const struct pd_kernel_rmsnorm_params *p, cudaStream_t s) {
    if (p->rows <= 0)
        return PDK_OK;
    if (p->dim < 1 || p->dim > PDK_NORM_BLOCK * PDK_NORM_BLOCK_VALS)
        return pd__cuda_status(cudaErrorInvalidValue, "rmsnorm: row width outside 1..8192");
    if (p->out2 && p->out2_dtype != PD_DTYPE_BF16 && p->out2_dtype != PD_DTYPE_F16)
        return pd__cuda_status(cudaErrorInvalidValue, "rmsnorm: second output must be 2-byte");
    PDK_DISPATCH(p->w_dtype, rmsnorm_launch<T>(*p, s));
    return PDK_LAUNCHED("rmsnorm");
}
