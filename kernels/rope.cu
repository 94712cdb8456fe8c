/*
 * rope.cu — half-split rotary embedding in place (transformers' apply_rotary_pos_emb with
 * rotate_half): angle = position * inv_freq[d] in f32, precise sincosf (positions reach 1e5 and
 * more, where the fast intrinsics lose the angle). The inv_freq table comes from the model, so
 * llama3 scaling and any other rope variant that only rescales frequencies need no code here.
 *
 * One thread per (token, frequency) computes sin/cos once and rotates that pair in every head.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

static __global__ void rope_kernel(struct pd_kernel_rope_params p) {
    int half = p.head_dim / 2;
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.n * half)
        return;
    int64_t i = t / half;
    int d = (int)(t % half);
    float s, c;
    sincosf((float)p.positions[i] * p.inv_freq[d], &s, &c);
    float *x = p.x + i * p.heads * p.head_dim;
    for (int h = 0; h < p.heads; h++, x += p.head_dim) {
        float x0 = x[d], x1 = x[d + half];
        x[d] = x0 * c - x1 * s;
        x[d + half] = x1 * c + x0 * s;
    }
}

static void rope_launch(const struct pd_kernel_rope_params &p, cudaStream_t s) {
    int64_t work = p.n * (p.head_dim / 2);
    rope_kernel<<<blocks_for(work, 256), 256, 0, s>>>(p);
}

extern "C" int pd_kernel_rope(const struct pd_kernel_rope_params *p, cudaStream_t s) {
    if (p->n <= 0 || p->heads <= 0)
        return PDK_OK;
    if (p->head_dim < 2 || p->head_dim % 2)
        return pd__cuda_status(cudaErrorInvalidValue, "rope: head_dim must be even");
    rope_launch(*p, s);
    return PDK_LAUNCHED("rope");
}

/* A block per token: a thread per (pair d, head group) rotates pair (d, d + half) of its heads
 * with one sincosf (the arithmetic of rope_kernel, so the results are the same bits), then the
 * block stores the token's K and V rows at its slot (as kv_store_kernel) and, when asked, the
 * rotated q in the attention kernel's 2-byte type. */
template <typename KV, typename Q>
static __global__ void rope_store_kernel(struct pd_kernel_rope_store_params p) {
    int64_t i = blockIdx.x;
    int hd = p.kv.head_dim, half = hd / 2, kvh = p.kv.kv_heads, width = kvh * hd;
    float *q = p.q + i * p.heads * hd, *k = p.k + i * width;
    float pos = (float)p.positions[i];
    /* thread (d, g) of half x G: pair d of heads g, g + G, ... over q's heads then k's */
    int G = (int)blockDim.x >= half ? (int)blockDim.x / half : 1, g = threadIdx.x / half;
    for (int d = threadIdx.x % half; g < G && d < half; d += blockDim.x) {
        float s, c;
        sincosf(pos * p.inv_freq[d], &s, &c);
        for (int h = g; h < p.heads + kvh; h += G) {
            float *x = h < p.heads ? q + h * hd : k + (h - p.heads) * hd, x0 = x[d],
                  x1 = x[d + half];
            x[d] = x0 * c - x1 * s;
            x[d + half] = x1 * c + x0 * s;
        }
    }
    __syncthreads(); /* the rotated rows, written by other threads, are read below */
    if (p.q_out) {
        Q *qo = (Q *)p.q_out + i * p.heads * hd;
        for (int j = threadIdx.x; j < p.heads * hd; j += blockDim.x)
            qo[j] = from_f<Q>(q[j]);
    }
    int32_t slot = p.slots[i];
    if (slot < 0)
        return;
    int page = slot / p.kv.page_size, off = slot % p.kv.page_size;
    size_t plane = (size_t)p.kv.page_size * width;
    KV *kdst = (KV *)((char *)p.kv.base + (size_t)page * p.kv.page_bytes) +
               (size_t)p.layer * 2 * plane + (size_t)off * width;
    KV *vdst = kdst + plane;
    const float *v = p.v + i * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        kdst[j] = from_f<KV>(k[j]);
        vdst[j] = from_f<KV>(v[j]);
    }
}

template <typename KV>
static int rope_store_launch(const struct pd_kernel_rope_store_params &p, cudaStream_t s) {
    /* a thread per pair and head group: all of a token's heads at once for short heads */
    int half = p.kv.head_dim / 2, heads = p.heads + p.kv.kv_heads;
    int groups = half >= 256 ? 1 : 256 / half;
    groups = groups > heads ? heads : groups;
    int threads = half >= 256 ? 256 : half * groups;
    if (p.q_out && p.q_out_dtype == PD_DTYPE_F16)
        rope_store_kernel<KV, __half><<<(unsigned)p.n, threads, 0, s>>>(p);
    else
        rope_store_kernel<KV, __nv_bfloat16><<<(unsigned)p.n, threads, 0, s>>>(p);
    return PDK_OK;
}

extern "C" int pd_kernel_rope_store(const struct pd_kernel_rope_store_params *p, cudaStream_t s) {
    if (p->n <= 0)
        return PDK_OK;
    if (p->kv.head_dim < 2 || p->kv.head_dim % 2 || p->heads < 1 || p->n > 0x7fffffff ||
        (p->q_out && p->q_out_dtype != PD_DTYPE_BF16 && p->q_out_dtype != PD_DTYPE_F16))
        return pd__cuda_status(cudaErrorInvalidValue,
                               "rope + kv store: head_dim must be even, q_out bf16 or f16");
    PDK_DISPATCH_KV(p->kv.dtype, rope_store_launch<T>(*p, s));
    return PDK_LAUNCHED("rope + kv store");
}
