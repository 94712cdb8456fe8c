/*
 * attention.cu — paged attention over the page-major KV pool, one kernel for both extend (a
 * chunk of a request's queries, causal within the chunk, over all of its pages) and decode (one
 * query per request, its keys split over several blocks when the batch alone cannot fill the
 * GPU, then combined by the reduce kernel: split-K / flash-decoding).
 *
 * Work item (planned on the host, pd_kernel_attn_plan): up to R flattened rows (query token ×
 * head of one GQA group) of one request, one kv head (grid.y), one key range. A block of 128
 * threads walks the range in tiles of 128 keys: each thread scores one key against all R rows
 * (the K row is read once per item, whatever the group size — GQA's saving), an online softmax
 * (running max and sum per row) rescales, then threads own output dims and accumulate P·V.
 * Scores and accumulators are f32; K/V are read in the pool's dtype (f32, bf16, f16, fp8:
 * widened on load, scale 1.0).
 * Invariants: rows past a query's causal limit score -inf; a range with no valid key leaves
 * (max -inf, sum 0), which the reduce kernel weighs as zero; items with req < 0 are padding.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

#define PDK_ATTN_THREADS 128
#define PDK_ATTN_TILE 128 /* keys per tile: one per thread in the score phase */

/* 8 consecutive elements from p as f32; full = 16-byte aligned and all 8 inside the row. */
template <typename T> __device__ __forceinline__ void load8(const T *p, bool full, int n, float *o);
template <>
__device__ __forceinline__ void load8<float>(const float *p, bool full, int n, float *o) {
    if (full) {
        float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z,
        o[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = e < n ? p[e] : 0.0f;
    }
}
template <typename H2, typename H>
__device__ __forceinline__ void load8_half(const H *p, bool full, int n, float *o) {
    if (full) {
        int4 raw = *(const int4 *)p;
        const H *h = (const H *)&raw;
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = to_f(h[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = e < n ? to_f(p[e]) : 0.0f;
    }
}
template <>
__device__ __forceinline__ void load8<__nv_bfloat16>(const __nv_bfloat16 *p, bool full, int n,
                                                     float *o) {
    load8_half<__nv_bfloat162>(p, full, n, o);
}
template <>
__device__ __forceinline__ void load8<__half>(const __half *p, bool full, int n, float *o) {
    load8_half<__half2>(p, full, n, o);
}
/* fp8: one 8-byte load (full rows are 8-byte aligned: hd % 8 == 0 and pages of whole rows) */
template <typename F>
__device__ __forceinline__ void load8_fp8(const F *p, bool full, int n, float *o) {
    if (full) {
        uint2 raw = *(const uint2 *)p;
        const uint16_t *h = (const uint16_t *)&raw;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 f = fp8x2_to_f2<F>(h[e]);
            o[2 * e] = f.x, o[2 * e + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = e < n ? to_f(p[e]) : 0.0f;
    }
}
template <>
__device__ __forceinline__ void load8<fp8_e4m3>(const fp8_e4m3 *p, bool full, int n, float *o) {
    load8_fp8(p, full, n, o);
}
template <>
__device__ __forceinline__ void load8<fp8_e5m2>(const fp8_e5m2 *p, bool full, int n, float *o) {
    load8_fp8(p, full, n, o);
}

template <typename T, int HDM, int R>
static __global__ void __launch_bounds__(PDK_ATTN_THREADS)
    attn_kernel(struct pd_kernel_attn_params p) {
    constexpr int NT = PDK_ATTN_THREADS, TK = PDK_ATTN_TILE;
    constexpr int DPT = HDM > NT ? HDM / NT : 1;    /* output dims per thread */
    constexpr int KSPLIT = HDM < NT ? NT / HDM : 1; /* threads sharing one dim (keys split) */
    __shared__ __align__(16) float q_s[R][HDM];
    __shared__ __align__(16) float p_s[R][TK];
    __shared__ int64_t koff_s[TK];
    __shared__ float alpha_s[R], m_s[R], l_s[R];
    __shared__ int lim_s[R];

    const struct pd_kernel_attn_item it = p.b.items[blockIdx.x];
    if (it.req < 0)
        return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, hd = p.kv.head_dim, kv_heads = p.kv.kv_heads;
    const int G = p.heads / kv_heads;
    const int t0 = p.b.req_tok_start[it.req], n_new = p.b.req_tok_start[it.req + 1] - t0;
    const int kv_len = p.b.req_kv_len[it.req];
    const int nrows = min(R, n_new * G - it.row0);
    if (nrows <= 0)
        return;

    for (int idx = tid; idx < R * HDM; idx += NT) {
        int r = idx / HDM, d = idx % HDM;
        float v = 0.0f;
        if (r < nrows && d < hd) {
            int flat = it.row0 + r, tok = t0 + flat / G, head = kvh * G + flat % G;
            v = p.q[((int64_t)tok * p.heads + head) * hd + d] * p.scale;
        }
        q_s[r][d] = v;
    }
    if (tid < R) {
        lim_s[tid] = tid < nrows ? kv_len - n_new + (it.row0 + tid) / G + 1 : 0;
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    __syncthreads();

    const int kbeg = it.kv_begin;
    const int kend = min(it.kv_end, kv_len - n_new + (it.row0 + nrows - 1) / G + 1);
    const int ps = p.kv.page_size;
    const size_t plane_bytes = (size_t)ps * kv_heads * hd * sizeof(T);
    const size_t layer_off = (size_t)p.layer * 2 * plane_bytes;
    const int32_t *pages = p.b.page_table + p.b.req_page_start[it.req];
    const char *base = (const char *)p.kv.base;
    const bool vec = hd % 8 == 0;

    float acc[DPT][R];
#pragma unroll
    for (int k = 0; k < DPT; k++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[k][r] = 0.0f;

    const int ks = KSPLIT > 1 ? tid / HDM : 0;
    const int dthr = KSPLIT > 1 ? tid % HDM : tid;

    for (int tile = kbeg; tile < kend; tile += TK) {
        /* scores: this thread's key against every row */
        int j = tile + tid;
        float s[R];
        if (j < kend) {
            int64_t off = (int64_t)pages[j / ps] * (int64_t)p.kv.page_bytes + (int64_t)layer_off +
                          ((int64_t)(j % ps) * kv_heads + kvh) * hd * (int64_t)sizeof(T);
            koff_s[tid] = off;
            const T *kr = (const T *)(base + off);
#pragma unroll
            for (int r = 0; r < R; r++)
                s[r] = 0.0f;
#pragma unroll
            for (int d0 = 0; d0 < HDM; d0 += 8) {
                if (d0 < hd) {
                    float kf[8];
                    load8<T>(kr + d0, vec, hd - d0, kf);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float4 a = *(const float4 *)&q_s[r][d0];
                        float4 b = *(const float4 *)&q_s[r][d0 + 4];
                        s[r] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] +
                                b.x * kf[4] + b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++)
                if (j >= lim_s[r])
                    s[r] = -INFINITY;
        } else {
#pragma unroll
            for (int r = 0; r < R; r++)
                s[r] = -INFINITY;
        }
#pragma unroll
        for (int r = 0; r < R; r++)
            p_s[r][tid] = s[r];
        __syncthreads();

        /* online softmax: one warp per row */
        for (int r = warp; r < R; r += NT / 32) {
            float v[TK / 32], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < TK / 32; i++) {
                v[i] = p_s[r][lane + 32 * i];
                mx = fmaxf(mx, v[i]);
            }
            mx = warp_max(mx);
            float m_old = m_s[r], m_new = fmaxf(m_old, mx), sum = 0.0f;
#pragma unroll
            for (int i = 0; i < TK / 32; i++) {
                float e = m_new == -INFINITY ? 0.0f : expf(v[i] - m_new);
                p_s[r][lane + 32 * i] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                l_s[r] = l_s[r] * alpha + sum;
                m_s[r] = m_new;
                alpha_s[r] = alpha;
            }
        }
        __syncthreads();

        /* P·V: this thread's dims over its share of the tile's keys */
#pragma unroll
        for (int r = 0; r < R; r++) {
            float a = alpha_s[r];
#pragma unroll
            for (int k = 0; k < DPT; k++)
                acc[k][r] *= a;
        }
        const int ntile = min(TK, kend - tile);
        for (int jj = ks * 4; jj < ntile; jj += 4 * KSPLIT) {
            float v[4][DPT];
#pragma unroll
            for (int e = 0; e < 4; e++) {
#pragma unroll
                for (int k = 0; k < DPT; k++) {
                    int d = dthr + k * NT;
                    v[e][k] = 0.0f;
                    if (jj + e < ntile && d < hd)
                        v[e][k] = to_f(((const T *)(base + koff_s[jj + e] + plane_bytes))[d]);
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float4 pp = *(const float4 *)&p_s[r][jj];
#pragma unroll
                for (int k = 0; k < DPT; k++)
                    acc[k][r] += pp.x * v[0][k] + pp.y * v[1][k] + pp.z * v[2][k] + pp.w * v[3][k];
            }
        }
        __syncthreads();
    }

    if (KSPLIT > 1) {
        /* threads sharing a dim add up their key shares through p_s (R * NT floats) */
        float *red = &p_s[0][0];
#pragma unroll
        for (int r = 0; r < R; r++)
            red[r * NT + tid] = acc[0][r];
        __syncthreads();
        if (ks == 0) {
#pragma unroll
            for (int r = 0; r < R; r++)
                for (int q = 1; q < KSPLIT; q++)
                    acc[0][r] += red[r * NT + q * HDM + dthr];
        }
        if (ks != 0)
            return;
    }
    for (int r = 0; r < nrows; r++) {
        int flat = it.row0 + r, tok = t0 + flat / G, head = kvh * G + flat % G;
        int64_t th = (int64_t)tok * p.heads + head;
        float l = l_s[r];
#pragma unroll
        for (int k = 0; k < DPT; k++) {
            int d = dthr + k * NT;
            if (d >= hd)
                continue;
            if (it.n_splits <= 1) {
                p.out[th * hd + d] = l > 0.0f ? acc[k][r] / l : 0.0f;
            } else {
                p.part_o[(th * PD_KERNEL_ATTN_MAX_SPLITS + it.split) * hd + d] = acc[k][r];
            }
        }
        if (it.n_splits > 1 && tid == 0) {
            float *ml = p.part_ml + (th * PD_KERNEL_ATTN_MAX_SPLITS + it.split) * 2;
            ml[0] = m_s[r];
            ml[1] = l;
        }
    }
}

/* Combines a token's split partials: Σ e^(m_s - M) acc_s / Σ e^(m_s - M) l_s. */
static __global__ void attn_reduce_kernel(struct pd_kernel_attn_params p) {
    int64_t th = blockIdx.x;
    int tok = (int)(th / p.heads);
    int S = p.b.tok_splits[tok];
    if (S <= 1)
        return;
    const float *ml = p.part_ml + th * PD_KERNEL_ATTN_MAX_SPLITS * 2;
    float M = -INFINITY;
    for (int s = 0; s < S; s++)
        M = fmaxf(M, ml[2 * s]);
    float den = 0.0f, w[PD_KERNEL_ATTN_MAX_SPLITS];
    for (int s = 0; s < PD_KERNEL_ATTN_MAX_SPLITS; s++) {
        w[s] = s < S && ml[2 * s] != -INFINITY ? expf(ml[2 * s] - M) : 0.0f;
        den += s < S ? w[s] * ml[2 * s + 1] : 0.0f;
    }
    int hd = p.kv.head_dim;
    const float *po = p.part_o + th * PD_KERNEL_ATTN_MAX_SPLITS * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f;
        for (int s = 0; s < S; s++)
            num += w[s] * po[s * hd + d];
        p.out[th * hd + d] = den > 0.0f ? num / den : 0.0f;
    }
}

template <typename T, int HDM>
static void attn_launch_hd(const struct pd_kernel_attn_params &p, int rows, cudaStream_t s) {
    dim3 grid((unsigned)p.b.n_items, (unsigned)p.kv.kv_heads);
    if (rows <= 4)
        attn_kernel<T, HDM, 4><<<grid, PDK_ATTN_THREADS, 0, s>>>(p);
    else
        attn_kernel<T, HDM, PD_KERNEL_ATTN_ROWS><<<grid, PDK_ATTN_THREADS, 0, s>>>(p);
}

template <typename T>
static void attn_launch(const struct pd_kernel_attn_params &p, cudaStream_t s) {
    int hd = p.kv.head_dim;
    if (hd <= 64)
        attn_launch_hd<T, 64>(p, p.b.rows_per_item, s);
    else if (hd <= 128)
        attn_launch_hd<T, 128>(p, p.b.rows_per_item, s);
    else
        attn_launch_hd<T, 256>(p, p.b.rows_per_item, s);
    if (p.b.max_splits > 1)
        attn_reduce_kernel<<<(unsigned)(p.b.n_tokens * p.heads), 64, 0, s>>>(p);
}

extern "C" int pd_kernel_attention(const struct pd_kernel_attn_params *p, cudaStream_t s) {
    if (p->b.n_items <= 0 || p->b.n_tokens <= 0)
        return PDK_OK;
    if (p->kv.head_dim < 2 || p->kv.head_dim > 256 || p->kv.head_dim % 2 ||
        p->heads % p->kv.kv_heads)
        return pd__cuda_status(cudaErrorInvalidValue,
                               "attention: head_dim must be even and <= 256, heads a multiple "
                               "of kv heads");
    PDK_DISPATCH_KV(p->kv.dtype, attn_launch<T>(*p, s));
    return PDK_LAUNCHED("paged attention");
}
