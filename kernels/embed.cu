/*
 * embed.cu — row movement: embedding lookup (table rows widened to f32), the gather of the rows
 * whose logits are wanted, and the f32 → bf16/f16 conversion of GEMM inputs. One block per
 * output row for the row ops; a grid-stride loop for the conversion.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

template <typename T> static __global__ void embed_kernel(struct pd_kernel_embed_params p) {
    int64_t i = blockIdx.x;
    int32_t id = p.ids[i];
    float *o = p.out + i * p.dim;
    if (id < 0 || id >= p.vocab) {
        for (int d = threadIdx.x; d < p.dim; d += blockDim.x)
            o[d] = 0.0f;
        return;
    }
    const T *row = (const T *)p.table + (int64_t)id * p.dim;
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x)
        o[d] = to_f(row[d]);
}

extern "C" int pd_kernel_embed(const struct pd_kernel_embed_params *p, cudaStream_t s) {
    if (p->n <= 0)
        return PDK_OK;
    PDK_DISPATCH(p->dtype, embed_kernel<T><<<(unsigned)p->n, 256, 0, s>>>(*p));
    return PDK_LAUNCHED("embedding lookup");
}

static __global__ void gather_kernel(struct pd_kernel_gather_params p) {
    int64_t j = blockIdx.x;
    const float *src = p.src + (int64_t)p.rows[j] * p.width;
    float *dst = p.dst + j * p.width;
    for (int d = threadIdx.x; d < p.width; d += blockDim.x)
        dst[d] = src[d];
}

extern "C" int pd_kernel_gather_rows(const struct pd_kernel_gather_params *p, cudaStream_t s) {
    if (p->n <= 0)
        return PDK_OK;
    gather_kernel<<<(unsigned)p->n, 256, 0, s>>>(*p);
    return PDK_LAUNCHED("row gather");
}

template <typename T> static __global__ void convert_kernel(const float *src, T *dst, int64_t n) {
    int64_t i2 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    for (; i2 < n; i2 += (int64_t)gridDim.x * blockDim.x * 2) {
        dst[i2] = from_f<T>(src[i2]);
        if (i2 + 1 < n)
            dst[i2 + 1] = from_f<T>(src[i2 + 1]);
    }
}

extern "C" int pd_kernel_convert(const struct pd_kernel_convert_params *p, cudaStream_t s) {
    if (p->count <= 0)
        return PDK_OK;
    unsigned b = blocks_for((p->count + 1) / 2, 256);
    b = b > 65536 ? 65536 : b;
    PDK_DISPATCH(p->dtype, convert_kernel<T><<<b, 256, 0, s>>>(p->src, (T *)p->dst, p->count));
    return PDK_LAUNCHED("f32 conversion");
}

template <typename T> static __global__ void widen_kernel(const T *src, float *dst, int64_t n) {
    int64_t i2 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    for (; i2 < n; i2 += (int64_t)gridDim.x * blockDim.x * 2) {
        dst[i2] = to_f(src[i2]);
        if (i2 + 1 < n)
            dst[i2 + 1] = to_f(src[i2 + 1]);
    }
}

extern "C" int pd_kernel_widen(const struct pd_kernel_widen_params *p, cudaStream_t s) {
    if (p->count <= 0)
        return PDK_OK;
    unsigned b = blocks_for((p->count + 1) / 2, 256);
    b = b > 65536 ? 65536 : b;
    PDK_DISPATCH(p->dtype, widen_kernel<T><<<b, 256, 0, s>>>((const T *)p->src, p->dst, p->count));
    return PDK_LAUNCHED("widening to f32");
}
