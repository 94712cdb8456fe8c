/*
 * gemv.cu — products of a few rows (the decode step of 1..PD_KERNEL_GEMV_MAX_ROWS requests):
 * y = x · wᵀ (+ bias), 2-byte weights streamed once with 16-byte loads on CUDA cores, f32
 * accumulation. cuBLAS spends most of such a launch on a tile shaped for many rows; here a warp
 * owns an output column at a time and reads its weight row once for all input rows.
 *
 * The input rows are rounded to the weight's type as they are staged in shared memory (what
 * the cuBLAS path's conversion does), so both paths multiply the same values. One launch covers
 * up to PD_KERNEL_PRODUCT_SEGS products of one input by weights stored back to back (q, k and v;
 * gate and up), each with its own output and bias, and gate/up may finish as SwiGLU in the same
 * launch (silu_pair: a warp computes gate column j and up column j together).
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

#define PDK_GEMV_THREADS 256
#define PDK_GEMV_WARPS (PDK_GEMV_THREADS / 32)

static int smem_optin; /* bytes of shared memory a block may opt into (pd_kernel_gemv_init) */

/* two 2-byte values as f32 */
__device__ __forceinline__ float2 pair_f2(__nv_bfloat162 v) {
    return __bfloat1622float2(v);
}
__device__ __forceinline__ float2 pair_f2(__half2 v) {
    return __half22float2(v);
}
template <typename W> struct pair_of;
template <> struct pair_of<__nv_bfloat16> { typedef __nv_bfloat162 type; };
template <> struct pair_of<__half> { typedef __half2 type; };

/* 8 weights (16 bytes) times 8 staged inputs, added to acc */
template <typename W> __device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
    typedef typename pair_of<W>::type W2;
    const W2 *a = (const W2 *)&w, *b = (const W2 *)&x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 fa = pair_f2(a[i]), fb = pair_f2(b[i]);
        acc = fmaf(fa.x, fb.x, acc);
        acc = fmaf(fa.y, fb.y, acc);
    }
    return acc;
}

/* acc[n][r] += weight row n (chunks of 8) · staged row r, this lane's share: PDK_GEMV_UNROLL
 * loads of each weight row in flight before the first product (a qwen2.5-1.5b row of 1536 is
 * one such round) */
#define PDK_GEMV_UNROLL 8
template <typename W, int R, int NW>
__device__ __forceinline__ void row_dot(const uint4 *const *w, const uint4 *xs, int chunks,
                                        int lane, float (*acc)[R]) {
    for (int c0 = lane; c0 < chunks; c0 += 32 * PDK_GEMV_UNROLL) {
        uint4 wv[NW][PDK_GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < PDK_GEMV_UNROLL; u++)
#pragma unroll
            for (int n = 0; n < NW; n++)
                wv[n][u] =
                    c0 + 32 * u < chunks ? __ldg(w[n] + c0 + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < PDK_GEMV_UNROLL; u++) {
            int c = c0 + 32 * u;
            if (c >= chunks)
                break;
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint4 x = xs[(size_t)r * chunks + c];
#pragma unroll
                for (int n = 0; n < NW; n++)
                    acc[n][r] = dot8<W>(wv[n][u], x, acc[n][r]);
            }
        }
    }
}

template <typename W>
__device__ __forceinline__ float bias_of(const struct pd_kernel_product_seg &s, int64_t j) {
    return s.bias ? to_f(((const W *)s.bias)[j]) : 0.0f;
}

/* grid: blocks of PDK_GEMV_WARPS warps, each warp per_warp consecutive units (an output column,
 * or a gate/up pair); dynamic shared memory: R rows of k staged inputs */
template <typename W, int R>
static __global__ void __launch_bounds__(PDK_GEMV_THREADS)
    gemv_kernel(struct pd_kernel_gemv_params p, int64_t units, int per_warp) {
    extern __shared__ uint4 xs[];
    W *xw = (W *)xs;
    int64_t k = p.k;
    for (int64_t i = threadIdx.x; i < R * k; i += PDK_GEMV_THREADS)
        xw[i] = from_f<W>(p.x[i]);
    __syncthreads();
    int lane = threadIdx.x & 31, chunks = (int)(k / 8);
    int64_t u0 = ((int64_t)blockIdx.x * PDK_GEMV_WARPS + (threadIdx.x >> 5)) * per_warp;
    for (int64_t u = u0; u < u0 + per_warp && u < units; u++) {
        if (p.silu_pair) {
            const struct pd_kernel_product_seg &g = p.seg[0], &up = p.seg[1];
            float acc[2][R];
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[0][r] = acc[1][r] = 0.0f;
            const uint4 *rows[2] = {(const uint4 *)((const W *)g.w + u * k),
                                    (const uint4 *)((const W *)up.w + u * k)};
            row_dot<W, R, 2>(rows, xs, chunks, lane, acc);
#pragma unroll
            for (int r = 0; r < R; r++) {
                acc[0][r] = warp_sum(acc[0][r]);
                acc[1][r] = warp_sum(acc[1][r]);
            }
            if (lane == 0) {
                float bg = bias_of<W>(g, u), bu = bias_of<W>(up, u);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float vu = acc[1][r] + bu;
                    g.y[r * g.m + u] = silu_mul(acc[0][r] + bg, vu);
                    up.y[r * up.m + u] = vu;
                }
            }
            continue;
        }
        int64_t j = u;
        const struct pd_kernel_product_seg &sg = p.seg[product_seg(p.seg, p.n_seg, j)];
        float acc[1][R];
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[0][r] = 0.0f;
        const uint4 *row = (const uint4 *)((const W *)sg.w + j * k);
        row_dot<W, R, 1>(&row, xs, chunks, lane, acc);
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[0][r] = warp_sum(acc[0][r]);
        if (lane == 0) {
            float b = bias_of<W>(sg, j);
#pragma unroll
            for (int r = 0; r < R; r++)
                sg.y[r * sg.m + j] = acc[0][r] + b;
        }
    }
}

template <typename T> struct dtype_of;
template <> struct dtype_of<__nv_bfloat16> {
    static constexpr enum pd_dtype value = PD_DTYPE_BF16;
};
template <> struct dtype_of<__half> { static constexpr enum pd_dtype value = PD_DTYPE_F16; };

#define PDK_GEMV_EACH(X)                                                                           \
    X(__nv_bfloat16, 1)                                                                            \
    X(__nv_bfloat16, 2)                                                                            \
    X(__nv_bfloat16, 3) X(__nv_bfloat16, 4) X(__half, 1) X(__half, 2) X(__half, 3) X(__half, 4)

extern "C" int pd_kernel_gemv_init(void) {
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
#define PDK_GEMV_OPTIN(T, R)                                                                       \
    if (e == cudaSuccess)                                                                          \
        e = cudaFuncSetAttribute(gemv_kernel<T, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,   \
                                 optin);
    PDK_GEMV_EACH(PDK_GEMV_OPTIN)
#undef PDK_GEMV_OPTIN
    if (e != cudaSuccess)
        return pd__cuda_status(e, "setting up the few-row product");
    smem_optin = optin;
    return PDK_OK;
}

extern "C" bool pd_kernel_gemv_takes(int64_t rows, int64_t k, enum pd_dtype dtype) {
    return rows >= 1 && rows <= PD_KERNEL_GEMV_MAX_ROWS && k % 8 == 0 && k <= 0x7fffffff &&
           (dtype == PD_DTYPE_BF16 || dtype == PD_DTYPE_F16) &&
           (size_t)(rows * k) * 2 <= (size_t)smem_optin;
}

template <typename W, int R>
static void gemv_launch(const struct pd_kernel_gemv_params &p, int64_t units, cudaStream_t s) {
    /* about four blocks an SM, so staging the input is paid a few times per SM, not per column */
    int64_t want = (int64_t)(p.sms > 0 ? p.sms : 1) * 4 * PDK_GEMV_WARPS;
    int per_warp = (int)((units + want - 1) / want);
    unsigned blocks = blocks_for(units, PDK_GEMV_WARPS * per_warp);
    gemv_kernel<W, R><<<blocks, PDK_GEMV_THREADS, (size_t)(R * p.k) * 2, s>>>(p, units, per_warp);
}

extern "C" int pd_kernel_gemv(const struct pd_kernel_gemv_params *p, cudaStream_t s) {
    if (!pd_kernel_gemv_takes(p->rows, p->k, p->dtype) || p->n_seg < 1 ||
        p->n_seg > PD_KERNEL_PRODUCT_SEGS || (p->silu_pair && p->seg[0].m != p->seg[1].m))
        return pd__cuda_status(cudaErrorInvalidValue, "few-row product: shape it does not take");
    int64_t units = 0;
    for (int i = 0; i < p->n_seg; i++) {
        if (((uintptr_t)p->seg[i].w) % 16)
            return pd__cuda_status(cudaErrorInvalidValue, "few-row product: unaligned weight");
        units += p->seg[i].m;
    }
    if (p->silu_pair)
        units = p->seg[0].m;
    if (units <= 0)
        return PDK_OK;
#define PDK_GEMV_CASE(T, R)                                                                        \
    if (p->rows == R && p->dtype == dtype_of<T>::value)                                            \
        gemv_launch<T, R>(*p, units, s);
    PDK_GEMV_EACH(PDK_GEMV_CASE)
#undef PDK_GEMV_CASE
    return PDK_LAUNCHED("few-row product");
}
