/*
 * swiglu.cu — the elementwise ops of a layer: SwiGLU (silu(gate) * up, the MLP activation), the
 * residual add when it could not be fused into the next RMSNorm, and the bias add after a GEMM.
 * Memory-bound: 16-byte accesses when every pointer is 16-byte aligned and the count a multiple
 * of 4, a grid-stride loop otherwise.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

template <bool ADD>
static __global__ void swiglu_vec_kernel(const float4 *g, const float4 *u, float4 *o, int64_t n4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = g[i], b = u[i], r;
        if (ADD) {
            r = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        } else {
            r = make_float4(silu_mul(a.x, b.x), silu_mul(a.y, b.y), silu_mul(a.z, b.z),
                            silu_mul(a.w, b.w));
        }
        o[i] = r;
    }
}

template <bool ADD>
static __global__ void swiglu_kernel(const float *g, const float *u, float *o, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        o[i] = ADD ? g[i] + u[i] : silu_mul(g[i], u[i]);
}

static unsigned stride_grid(int64_t work) {
    /* enough blocks to fill any current GPU several times over; the loop covers the rest */
    unsigned b = blocks_for(work, 256);
    return b > 65536 ? 65536 : b;
}

template <bool ADD>
static void swiglu_launch(const struct pd_kernel_swiglu_params &p, cudaStream_t s) {
    bool vec =
        p.count % 4 == 0 && ((uintptr_t)p.gate | (uintptr_t)p.up | (uintptr_t)p.out) % 16 == 0;
    if (vec)
        swiglu_vec_kernel<ADD><<<stride_grid(p.count / 4), 256, 0, s>>>(
            (const float4 *)p.gate, (const float4 *)p.up, (float4 *)p.out, p.count / 4);
    else
        swiglu_kernel<ADD><<<stride_grid(p.count), 256, 0, s>>>(p.gate, p.up, p.out, p.count);
}

extern "C" int pd_kernel_swiglu(const struct pd_kernel_swiglu_params *p, cudaStream_t s) {
    if (p->count <= 0)
        return PDK_OK;
    if (p->add_only)
        swiglu_launch<true>(*p, s);
    else
        swiglu_launch<false>(*p, s);
    return PDK_LAUNCHED(p->add_only ? "add" : "swiglu");
}

template <typename B>
static __global__ void bias_kernel(float *y, const B *bias, int64_t rows, int64_t m) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * m;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += to_f(bias[i % m]);
}

extern "C" int pd_kernel_bias(const struct pd_kernel_bias_params *p, cudaStream_t s) {
    if (p->rows <= 0 || p->m <= 0)
        return PDK_OK;
    PDK_DISPATCH(p->bias_dtype, bias_kernel<T><<<stride_grid(p->rows * p->m), 256, 0, s>>>(
                                    p->y, (const T *)p->bias, p->rows, p->m));
    return PDK_LAUNCHED("bias add");
}

/* One thread per (row, unit): a unit is an output column of a segment, or with silu_pair a
 * gate/up column pair. */
template <typename B> static __global__ void split_kernel(struct pd_kernel_split_params p) {
    int64_t width = 0, units = p.silu_pair ? p.seg[0].m : 0;
    for (int i = 0; i < p.n_seg; i++)
        width += p.seg[i].m;
    if (!p.silu_pair)
        units = width;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < p.rows * units;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = t / units, j = t % units;
        const float *src = p.src + r * width;
        if (p.silu_pair) {
            const struct pd_kernel_product_seg &g = p.seg[0], &u = p.seg[1];
            float vg = src[j], vu = src[g.m + j];
            if (g.bias)
                vg += to_f(((const B *)g.bias)[j]);
            if (u.bias)
                vu += to_f(((const B *)u.bias)[j]);
            g.y[r * g.m + j] = silu_mul(vg, vu);
            u.y[r * u.m + j] = vu;
            continue;
        }
        int64_t c = j;
        int s = product_seg(p.seg, p.n_seg, c);
        float v = src[j];
        if (p.seg[s].bias)
            v += to_f(((const B *)p.seg[s].bias)[c]);
        p.seg[s].y[r * p.seg[s].m + c] = v;
    }
}

extern "C" int pd_kernel_split(const struct pd_kernel_split_params *p, cudaStream_t s) {
    if (p->n_seg < 1 || p->n_seg > PD_KERNEL_PRODUCT_SEGS ||
        (p->silu_pair && (p->n_seg != 2 || p->seg[0].m != p->seg[1].m)))
        return pd__cuda_status(cudaErrorInvalidValue, "product split: bad segments");
    int64_t width = 0;
    for (int i = 0; i < p->n_seg; i++)
        width += p->seg[i].m;
    if (p->rows <= 0 || width <= 0)
        return PDK_OK;
    PDK_DISPATCH(p->bias_dtype, split_kernel<T><<<stride_grid(p->rows * width), 256, 0, s>>>(*p));
    return PDK_LAUNCHED("product split");
}
