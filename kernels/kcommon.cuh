/*
 * kcommon.cuh — device helpers shared by the kernels/ .cu files: element loads/stores for the
 * three dtypes (always widened to f32 for arithmetic) and the two fp8 KV-cache types,
 * warp/block reductions, and the dtype-dispatch macros launchers use (PDK_DISPATCH for weights
 * and activations, PDK_DISPATCH_KV for the KV pool, which adds fp8). Header-only, no state.
 */
#ifndef PD_KCOMMON_CUH
#define PD_KCOMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* PD_OK of common/status.h, which is C-only (_Noreturn); entries return this or pd__cuda_status. */
#define PDK_OK 0

namespace pdk {

/* One byte of the KV pool in fp8. Stores round with model/fp8.h, the function the CPU backend
 * uses (torch's rounding and overflow; cuda_fp8.h's float constructor saturates e4m3 instead),
 * so both backends write identical bytes. Loads widen with the hardware's fp8 -> f16 convert
 * (sm_89+; cuda_fp8.h emulates it below), which is exact — every fp8 value is an f16 — so they
 * read the values model/fp8.h's decoder gives (NaN stays NaN), two elements an instruction. */
struct fp8_e4m3 {
    uint8_t b;
};
struct fp8_e5m2 {
    uint8_t b;
};

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) {
    return v;
}
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float to_f<__half>(__half v) {
    return __half2float(v);
}

template <> __device__ __forceinline__ float to_f<fp8_e4m3>(fp8_e4m3 v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.b, __NV_E4M3)));
}
template <> __device__ __forceinline__ float to_f<fp8_e5m2>(fp8_e5m2 v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.b, __NV_E5M2)));
}
/* Two fp8 of one kind (low byte first) as f32. */
template <typename F> __device__ __forceinline__ float2 fp8x2_to_f2(uint16_t two);
template <> __device__ __forceinline__ float2 fp8x2_to_f2<fp8_e4m3>(uint16_t two) {
    return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3)));
}
template <> __device__ __forceinline__ float2 fp8x2_to_f2<fp8_e5m2>(uint16_t two) {
    return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(two, __NV_E5M2)));
}

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) {
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ fp8_e4m3 from_f<fp8_e4m3>(float v) {
    return fp8_e4m3{pd_fp8_e4m3_from_f32_bits(__float_as_uint(v))};
}
template <> __device__ __forceinline__ fp8_e5m2 from_f<fp8_e5m2>(float v) {
    return fp8_e5m2{pd_fp8_e5m2_from_f32_bits(__float_as_uint(v))};
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * sh: 32 floats of shared memory. */
__device__ __forceinline__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

/* SwiGLU's activation of one gate/up pair: silu(g) * u. */
__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

/* The segment of a product group (kernels.h) that holds column j of the group; j becomes the
 * column inside it. */
__device__ __forceinline__ int product_seg(const struct pd_kernel_product_seg *seg, int n,
                                           int64_t &j) {
    int s = 0;
    while (s + 1 < n && j >= seg[s].m)
        j -= seg[s++].m;
    return s;
}

static inline unsigned blocks_for(int64_t work, int per_block) {
    int64_t b = (work + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : (b > 0x7fffffff ? 0x7fffffff : b));
}

} // namespace pdk

/* One case of a dtype switch: the statements with T the C++ type of that pd_dtype. */
#define PDK_CASE(dt, type, ...)                                                                    \
    case dt: {                                                                                     \
        typedef type T;                                                                            \
        __VA_ARGS__;                                                                               \
    } break;
#define PDK_CASES_FLOAT(...)                                                                       \
    PDK_CASE(PD_DTYPE_F32, float, __VA_ARGS__)                                                     \
    PDK_CASE(PD_DTYPE_BF16, __nv_bfloat16, __VA_ARGS__)                                            \
    PDK_CASE(PD_DTYPE_F16, __half, __VA_ARGS__)

/* Runs the statements with T the C++ type of a pd_dtype (weights, activations: no fp8). */
#define PDK_DISPATCH(dtype, ...)                                                                   \
    do {                                                                                           \
        switch (dtype) {                                                                           \
            PDK_CASES_FLOAT(__VA_ARGS__)                                                           \
        case PD_DTYPE_F8E4M3:                                                                      \
        case PD_DTYPE_F8E5M2:                                                                      \
            return pd__cuda_status(cudaErrorInvalidValue, "fp8 is KV-cache only");                 \
        }                                                                                          \
    } while (0)

/* PDK_DISPATCH over the KV pool's types: the three above and the fp8 ones. */
#define PDK_DISPATCH_KV(dtype, ...)                                                                \
    do {                                                                                           \
        switch (dtype) {                                                                           \
            PDK_CASES_FLOAT(__VA_ARGS__)                                                           \
            PDK_CASE(PD_DTYPE_F8E4M3, pdk::fp8_e4m3, __VA_ARGS__)                                  \
            PDK_CASE(PD_DTYPE_F8E5M2, pdk::fp8_e5m2, __VA_ARGS__)                                  \
        }                                                                                          \
    } while (0)

#define PDK_LAUNCHED(what) pd__cuda_status(cudaGetLastError(), what)

#endif
