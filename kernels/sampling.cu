/*
 * sampling.cu — token choice on the device. The greedy fast path (argmax, lowest id on ties as
 * model/sampling.c, plus the token's log-softmax) needs one block per row and sends 8 bytes per
 * request back instead of the whole vocabulary row; the sampler below does the same for
 * temperature / top-k / top-p / min-p requests (the draw by FlashInfer's kernels,
 * kernels/flashinfer/), applies a request's penalties from its state kept on the device (a
 * penalty slot, counted as tokens are chosen), and reports the raw row's top-n logprobs:
 * nothing of the vocabulary row leaves the device.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

/* Rows are cut into slices of PDK_SLICE logits, one block each (a Qwen row: 19 blocks), so even
 * one row spreads over the GPU; each block leaves its slice's partial, and a second launch (a
 * warp a row) combines them. */
#define PDK_SLICE 8192
#define PDK_SLICE_THREADS 256

static int n_slices(int vocab) {
    return (vocab + PDK_SLICE - 1) / PDK_SLICE;
}

/* argmax partial of a slice: its max, the lowest id holding it, and sum exp(l - max) */
struct amax_part {
    float mx, sum;
    int id;
};

/* (value desc, id asc) order of two candidates: true when b beats a */
static __device__ __forceinline__ bool beats(float bv, int bi, float av, int ai) {
    return bv > av || (bv == av && bi < ai);
}

/* an online (max, sum exp(x - max)) pair merged with another */
static __device__ __forceinline__ void lse_merge(float &m, float &s, float om, float os) {
    if (om == -INFINITY)
        return;
    if (om > m) {
        s = s * __expf(m - om) + os;
        m = om;
    } else {
        s += os * __expf(om - m);
    }
}

/* the warp's (value desc, id asc) winner with the sums rescaled to it, in every lane */
static __device__ __forceinline__ void amax_warp(float &best, float &sum, int &bi) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o), os = __shfl_xor_sync(0xffffffffu, sum, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        float m = best;
        lse_merge(m, sum, ov, os);
        if (beats(ov, oi, best, bi))
            bi = oi;
        best = m;
    }
}

static __global__ void __launch_bounds__(PDK_SLICE_THREADS)
    argmax_part_kernel(struct pd_kernel_argmax_params p, struct amax_part *part, int S) {
    __shared__ float shv[32], shs[32];
    __shared__ int shi[32];
    const float *l = p.logits + (int64_t)blockIdx.y * p.vocab;
    int t0 = blockIdx.x * PDK_SLICE, t1 = min(t0 + PDK_SLICE, p.vocab);
    float best = -INFINITY, sum = 0.0f;
    int bi = 0x7fffffff;
    for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
        float v = l[t];
        if (v > best) { /* t ascends per thread: the first max of this thread wins */
            sum = sum * __expf(best - v) + 1.0f;
            best = v;
            bi = t;
        } else {
            sum += __expf(v - best);
        }
    }
    amax_warp(best, sum, bi);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        shv[wid] = best;
        shs[wid] = sum;
        shi[wid] = bi;
    }
    __syncthreads();
    if (wid == 0) {
        best = lane < nw ? shv[lane] : -INFINITY;
        sum = lane < nw ? shs[lane] : 0.0f;
        bi = lane < nw ? shi[lane] : 0x7fffffff;
        amax_warp(best, sum, bi);
        if (lane == 0)
            part[(int64_t)blockIdx.y * S + blockIdx.x] = {best, sum, bi};
    }
}

/* one warp a row: the slices' partials → the id and its log-softmax */
static __global__ void argmax_done_kernel(struct pd_kernel_argmax_params p,
                                          const struct amax_part *part, int S) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= p.rows)
        return;
    float best = -INFINITY, sum = 0.0f;
    int bi = 0x7fffffff;
    for (int j = lane; j < S; j += 32) {
        struct amax_part q = part[(int64_t)r * S + j];
        float m = best;
        lse_merge(m, sum, q.mx, q.sum);
        if (beats(q.mx, q.id, best, bi))
            bi = q.id;
        best = m;
    }
    amax_warp(best, sum, bi);
    if (lane == 0) {
        if (bi == 0x7fffffff) /* every logit NaN: token 0, as the host loop would return */
            bi = 0;
        p.ids[r] = bi;
        if (p.logprob) /* the max's own log-softmax: -log(sum exp(l - max)) */
            p.logprob[r] = -logf(sum);
    }
}

extern "C" size_t pd_kernel_argmax_scratch_bytes(int64_t rows, int vocab) {
    return (size_t)rows * (size_t)n_slices(vocab) * sizeof(struct amax_part);
}

extern "C" int pd_kernel_argmax(const struct pd_kernel_argmax_params *p, cudaStream_t s) {
    if (p->rows <= 0)
        return PDK_OK;
    if (p->vocab < 1)
        return pd__cuda_status(cudaErrorInvalidValue, "argmax: empty vocabulary");
    if (!p->scratch || p->scratch_bytes < pd_kernel_argmax_scratch_bytes(p->rows, p->vocab))
        return pd__cuda_status(cudaErrorInvalidValue, "argmax: scratch smaller than needed");
    int S = n_slices(p->vocab);
    struct amax_part *part = (struct amax_part *)p->scratch;
    argmax_part_kernel<<<dim3((unsigned)S, (unsigned)p->rows), PDK_SLICE_THREADS, 0, s>>>(*p, part,
                                                                                          S);
    int rc = PDK_LAUNCHED("argmax");
    if (rc)
        return rc;
    argmax_done_kernel<<<blocks_for(p->rows, 8), 256, 0, s>>>(*p, part, S);
    return PDK_LAUNCHED("argmax");
}

/* ---- sampling: penalties, the draw (FlashInfer), logprobs and top-n ---- *
 *
 * A launch of rows that are not all greedy:
 *  1. the rows' FlashInfer arguments (temperature, top-k, top-p, the Philox seed from the
 *     request's uniform draw u, so a seeded request repeats its tokens);
 *  2. penalized rows: every row's logits through pd_sampling_penalize into the probs buffer;
 *  3. FlashInfer's softmax with the row's temperature (in place when 2 ran);
 *  4. min-p rows: probabilities under min_p × the top one zeroed, the rest renormalized, and the
 *     row's top-p divided by the kept mass, so the top-p cut stays where it was on the whole row
 *     (model/sampling.c cuts top-k, top-p and min-p on the same probabilities);
 *  5. FlashInfer's joint top-k/top-p rejection sampler;
 *  6. one block a row: greedy rows take the argmax of their penalized logits (lowest id on
 *     ties, as the host), the others FlashInfer's token; then the logprob under the raw row, the
 *     top-n, and the chosen token counted in the penalty state.
 * GPU draws need not equal the host sampler's (other random numbers); their distribution does
 * (tests/kernels: χ² against the exact filtered softmax). Greedy rows are bit-equal to argmax. */

#define PDK_SAMPLE_THREADS 1024

struct samp_shared {
    int cnt[256];
    int minid[256];
    double red_d[32];
    float red_f[32];
    int red_i[32];
    /* search state, written by thread 0 between barriers */
    uint32_t prefix, mask;
    int cnt_above, sel, found;
    /* top-n candidates, gathered by every thread, sorted by thread 0 */
    int n_cand;
    int cand[PD_KERNEL_MAX_TOP];
};

struct samp_row {
    const float *l;
    const int32_t *st; /* [V] the row's penalty state, NULL: no penalties */
    int V;
    float rep, freq, pres;
};

struct samp_hit {
    bool ok;      /* false: fewer tokens than the target */
    int rank, id; /* position in sorted order, token id */
};

/* Larger float → larger key; -0 and +0 share one (the host compares them equal). */
static __device__ __forceinline__ uint32_t okey(float v) {
    uint32_t b = __float_as_uint(v);
    if ((b << 1) == 0)
        b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* model/sampling.h's pd_sampling_penalize, operation for operation and never fused: repetition
 * over prompt and output tokens, then frequency × count + presence over output tokens. */
static __device__ __forceinline__ float penalized(const samp_row &c, int t) {
    float v = c.l[t];
    if (!c.st)
        return v;
    int32_t s = c.st[t];
    int count = s & 0x7fffffff;
    if (c.rep != 1.0f && s != 0) /* s != 0: an output count or the prompt bit */
        v = v > 0.0f ? __fdiv_rn(v, c.rep) : __fmul_rn(v, c.rep);
    if (count)
        v = __fsub_rn(v, __fadd_rn(__fmul_rn(c.freq, __int2float_rn(count)), c.pres));
    return v;
}

/* The sum of v over the block (every thread gets it); sh holds one T per warp. */
template <typename T> static __device__ __forceinline__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The need-th (1-based) smallest id among the tokens whose key is key. */
static __device__ int id_select(const samp_row &c, uint32_t key, int need, samp_shared &sh) {
    __syncthreads();
    if (threadIdx.x == 0) {
        sh.prefix = 0;
        sh.mask = 0;
        sh.cnt_above = need;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            sh.cnt[i] = 0;
        __syncthreads();
        uint32_t prefix = sh.prefix, mask = sh.mask;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x)
            if (((uint32_t)t & mask) == prefix && okey(penalized(c, t)) == key)
                atomicAdd(&sh.cnt[((uint32_t)t >> shift) & 255], 1);
        __syncthreads();
        if (threadIdx.x == 0) {
            int left = sh.cnt_above, d = 0;
            for (; d < 255 && left > sh.cnt[d]; d++)
                left -= sh.cnt[d];
            sh.cnt_above = left;
            sh.prefix |= (uint32_t)d << shift;
            sh.mask |= 255u << shift;
        }
        __syncthreads();
    }
    int id = (int)sh.prefix;
    __syncthreads();
    return id;
}

/* The (target+1)-th token in (penalized logit desc, id asc) order, found without sorting: four
 * passes over the row, each a 256-bucket histogram of the keys under the prefix found so far,
 * then thread 0 walks the buckets from the top. Tokens sharing the boundary value are a tie
 * group ordered by id; which id the target lands on is another radix search over ids (only
 * when it is not the group's first). */
static __device__ samp_hit search(const samp_row &c, int target, samp_shared &sh) {
    __syncthreads();
    if (threadIdx.x == 0) {
        sh.prefix = sh.mask = 0;
        sh.cnt_above = 0;
        sh.found = 1;
        sh.sel = 0;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) {
            sh.cnt[i] = 0;
            sh.minid[i] = 0x7fffffff;
        }
        __syncthreads();
        uint32_t prefix = sh.prefix, mask = sh.mask;
        /* a thread's tokens mostly share the top digits (logits span a few binades), so runs of
         * one digit are counted in registers first: far fewer atomics on the same few buckets */
        int run_d = -1, run_n = 0;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x) {
            uint32_t k = okey(penalized(c, t));
            if ((k & mask) != prefix)
                continue;
            int d = (int)((k >> shift) & 255);
            if (d != run_d) {
                if (run_n)
                    atomicAdd(&sh.cnt[run_d], run_n);
                run_d = d;
                run_n = 0;
            }
            run_n++;
            if (shift == 0)
                atomicMin(&sh.minid[d], t);
        }
        if (run_n)
            atomicAdd(&sh.cnt[run_d], run_n);
        __syncthreads();
        if (threadIdx.x == 0) {
            int ca = sh.cnt_above, sel = -1;
            for (int d = 255; d >= 0; d--) {
                int n = sh.cnt[d];
                if (!n)
                    continue;
                if (ca + n > target) {
                    sel = d;
                    break;
                }
                ca += n;
            }
            sh.cnt_above = ca;
            if (sel < 0) {
                sh.found = 0;
            } else {
                sh.sel = sel;
                sh.prefix |= (uint32_t)sel << shift;
                sh.mask |= 255u << shift;
            }
        }
        __syncthreads();
        if (!sh.found)
            break;
    }
    samp_hit h;
    h.ok = sh.found != 0;
    h.rank = sh.cnt_above;
    h.id = -1;
    if (!h.ok) {
        __syncthreads();
        return h;
    }
    uint32_t key = sh.prefix;
    int g = sh.cnt[sh.sel], first = sh.minid[sh.sel];
    int j = target - h.rank + 1;
    j = j > g ? g : j;
    h.rank += j - 1;
    h.id = j == 1 ? first : id_select(c, key, j, sh);
    __syncthreads();
    return h;
}

/* The raw row's n (1..min(V, PD_KERNEL_MAX_TOP)) most likely tokens in (logit desc, id asc)
 * order, as pd_sampling_logprobs: the n-th is found by a radix search by count, every token
 * ranked at or before it is gathered (exactly n: those with a larger key, and the boundary
 * key's ids up to the n-th's), and thread 0 sorts the n and writes ids / lps (logit - lse). */
static __device__ void top_n(const samp_row &raw, int n, float lse, samp_shared &sh, int32_t *ids,
                             float *lps) {
    samp_hit h = search(raw, n - 1, sh);
    if (!h.ok) /* fewer than n tokens: the caller clamps n to V, so never */
        return;
    uint32_t kb = okey(raw.l[h.id]);
    if (threadIdx.x == 0)
        sh.n_cand = 0;
    __syncthreads();
    for (int t = threadIdx.x; t < raw.V; t += blockDim.x) {
        uint32_t k = okey(raw.l[t]);
        if (k > kb || (k == kb && t <= h.id)) {
            int j = atomicAdd(&sh.n_cand, 1);
            if (j < PD_KERNEL_MAX_TOP)
                sh.cand[j] = t;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int m = sh.n_cand < n ? sh.n_cand : n;
        for (int i = 1; i < m; i++) { /* insertion sort of at most 20 */
            int id = sh.cand[i];
            uint32_t k = okey(raw.l[id]);
            int j = i - 1;
            for (; j >= 0; j--) {
                int oj = sh.cand[j];
                uint32_t ko = okey(raw.l[oj]);
                if (ko > k || (ko == k && oj < id))
                    break;
                sh.cand[j + 1] = oj;
            }
            sh.cand[j + 1] = id;
        }
        for (int i = 0; i < m; i++) {
            ids[i] = sh.cand[i];
            lps[i] = __fsub_rn(raw.l[sh.cand[i]], lse);
        }
    }
    __syncthreads();
}

static __device__ __forceinline__ bool row_greedy(const struct pd_kernel_sample_row &r) {
    return r.temperature < 1e-5f || r.top_k == 1;
}

static __device__ samp_row row_view(const struct pd_kernel_sample_params &p, int r,
                                    const struct pd_kernel_sample_row &q) {
    samp_row c;
    c.l = p.logits + (int64_t)r * p.vocab;
    c.V = p.vocab;
    c.st = q.slot >= 0 && q.slot < p.n_slots && p.state ? p.state + (int64_t)q.slot * p.vocab
                                                        : nullptr;
    c.rep = q.rep;
    c.freq = q.freq;
    c.pres = q.pres;
    return c;
}

/* The scratch of one launch: FlashInfer's per-row arguments, the probabilities, and each row's
 * per-slice partials (raw and scaled). */
struct samp_part {
    float raw_m, raw_s; /* the raw row's max and sum exp(l - max) over the slice */
    float m, s;         /* the same of the penalized logits over the temperature */
    float kept;         /* min-p rows: the probability the slice keeps (pass 2) */
};

struct draw_bufs {
    float *probs; /* [rows][vocab] */
    float *temp, *top_p;
    int32_t *top_k, *chosen;
    uint64_t *seed, *offset;
    bool *valid;
    struct samp_part *part; /* [rows][n_slices] */
};

static size_t align256(size_t v) {
    return (v + 255) & ~(size_t)255;
}

static size_t draw_layout(int64_t rows, int vocab, char *base, struct draw_bufs *d) {
    size_t o = 0, R = (size_t)rows;
    struct draw_bufs b;
#define PDK_TAKE(field, type, n)                                                                   \
    b.field = (type *)(base ? base + o : nullptr);                                                 \
    o = align256(o + (n) * sizeof(type))
    PDK_TAKE(probs, float, R *(size_t)vocab);
    PDK_TAKE(temp, float, R);
    PDK_TAKE(top_p, float, R);
    PDK_TAKE(top_k, int32_t, R);
    PDK_TAKE(chosen, int32_t, R);
    PDK_TAKE(seed, uint64_t, R);
    PDK_TAKE(offset, uint64_t, R);
    PDK_TAKE(valid, bool, R);
    PDK_TAKE(part, struct samp_part, R * (size_t)n_slices(vocab));
#undef PDK_TAKE
    if (d)
        *d = b;
    return o;
}

extern "C" size_t pd_kernel_sample_scratch_bytes(int64_t rows, int vocab) {
    return draw_layout(rows, vocab, nullptr, nullptr);
}

/* The draw's per-row arguments for FlashInfer's sampler, written by the stats pass. */
static __device__ void draw_args(const struct pd_kernel_sample_params &p, const draw_bufs &d, int r,
                                 const struct pd_kernel_sample_row &q, float temp) {
    d.temp[r] = temp;
    d.top_k[r] = q.top_k > 0 && q.top_k < p.vocab ? q.top_k : p.vocab;
    d.top_p[r] = q.top_p;
    /* the request's own uniform draw keys Philox: a seeded request draws the same numbers */
    d.seed[r] = (uint64_t)__double_as_longlong(q.u) ^ 0x9e3779b97f4a7c15ull;
    d.offset[r] = 0;
}

#define PDK_SLICE_PER (PDK_SLICE / PDK_SLICE_THREADS) /* logits a thread holds */

/* Pass 1, a block per (slice, row): the slice's max and sum exp(l - max) of the raw logits (the
 * logprob's normaliser) and of the penalized logits over the row's temperature (the draw's).
 * Each thread keeps its PDK_SLICE_PER logits in registers (all loads in flight at once), takes
 * the block's maxima, then the sums: one exp per value and sum, no rescaling. Block (0, r) also
 * writes row r's draw arguments. */
/* Value j of this thread's share of its block's slice: with VEC, 16-byte groups of four
 * (rows 16-byte aligned), else one value per thread in turn; both coalesced. */
template <bool VEC> static __device__ __forceinline__ int slice_index(int j) {
    int base = blockIdx.x * PDK_SLICE;
    if (VEC)
        return base + (j / 4 * PDK_SLICE_THREADS + threadIdx.x) * 4 + j % 4;
    return base + j * PDK_SLICE_THREADS + threadIdx.x;
}

/* The thread's PDK_SLICE_PER values of row (those past vocab: fill), all loads in flight. */
template <bool VEC>
static __device__ __forceinline__ void slice_load(const float *row, int vocab, float fill,
                                                  float *v) {
#pragma unroll
    for (int j = 0; j < PDK_SLICE_PER; j += VEC ? 4 : 1) {
        int t = slice_index<VEC>(j);
        if (VEC && t < vocab) { /* vocab % 4 == 0: the whole group is in the row */
            float4 f = *(const float4 *)(row + t);
            v[j] = f.x;
            v[j + (VEC ? 1 : 0)] = f.y;
            v[j + (VEC ? 2 : 0)] = f.z;
            v[j + (VEC ? 3 : 0)] = f.w;
        } else if (VEC) {
            v[j] = v[j + (VEC ? 1 : 0)] = v[j + (VEC ? 2 : 0)] = v[j + (VEC ? 3 : 0)] = fill;
        } else {
            v[j] = t < vocab ? row[t] : fill;
        }
    }
}

template <bool VEC>
static __global__ void __launch_bounds__(PDK_SLICE_THREADS)
    samp_stats_kernel(struct pd_kernel_sample_params p, struct draw_bufs d, int S) {
    __shared__ float sh[2][32];
    int r = blockIdx.y;
    struct pd_kernel_sample_row q = p.row[r];
    samp_row c = row_view(p, r, q);
    float temp = row_greedy(q) ? 1.0f : q.temperature, inv_t = 1.0f / temp;
    if (blockIdx.x == 0 && threadIdx.x == 0)
        draw_args(p, d, r, q, temp);
    float raw[PDK_SLICE_PER], sc[PDK_SLICE_PER];
    float rm = -INFINITY, m = -INFINITY;
    slice_load<VEC>(c.l, p.vocab, -INFINITY, raw);
#pragma unroll
    for (int j = 0; j < PDK_SLICE_PER; j++) {
        int t = slice_index<VEC>(j);
        sc[j] = t < p.vocab ? (c.st ? penalized(c, t) : raw[j]) * inv_t : -INFINITY;
        rm = fmaxf(rm, raw[j]);
        m = fmaxf(m, sc[j]);
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = PDK_SLICE_THREADS / 32;
    rm = warp_max(rm);
    m = warp_max(m);
    if (lane == 0) {
        sh[0][wid] = rm;
        sh[1][wid] = m;
    }
    __syncthreads();
    rm = warp_max(lane < nw ? sh[0][lane] : -INFINITY);
    m = warp_max(lane < nw ? sh[1][lane] : -INFINITY);
    float rs = 0.0f, sm = 0.0f;
    if (rm > -INFINITY)
#pragma unroll
        for (int j = 0; j < PDK_SLICE_PER; j++)
            rs += __expf(raw[j] - rm);
    if (m > -INFINITY)
#pragma unroll
        for (int j = 0; j < PDK_SLICE_PER; j++)
            sm += __expf(sc[j] - m);
    rs = warp_sum(rs);
    sm = warp_sum(sm);
    __syncthreads(); /* the maxima are read: sh takes the sums */
    if (lane == 0) {
        sh[0][wid] = rs;
        sh[1][wid] = sm;
    }
    __syncthreads();
    if (wid == 0) {
        rs = warp_sum(lane < nw ? sh[0][lane] : 0.0f);
        sm = warp_sum(lane < nw ? sh[1][lane] : 0.0f);
        if (lane == 0)
            d.part[(int64_t)r * S + blockIdx.x] = {rm, rs, m, sm, 1.0f};
    }
}

/* A row's partials merged by the calling warp: raw = false gives the draw's (max, sum), true the
 * raw row's. */
static __device__ __forceinline__ void row_total(const struct draw_bufs &d, int r, int S, bool raw,
                                                 float &m, float &sm) {
    /* a whole warp: lane j merges partials j, j + 32, ..., then the lanes merge, lane 0's total
     * for all (the merge order differs between lanes, so their last bits may) */
    int lane = threadIdx.x & 31;
    m = -INFINITY;
    sm = 0.0f;
    for (int j = lane; j < S; j += 32) {
        struct samp_part q = d.part[(int64_t)r * S + j];
        lse_merge(m, sm, raw ? q.raw_m : q.m, raw ? q.raw_s : q.s);
    }
    for (int o = 16; o > 0; o >>= 1)
        lse_merge(m, sm, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, sm, o));
    m = __shfl_sync(0xffffffffu, m, 0);
    sm = __shfl_sync(0xffffffffu, sm, 0);
}

/* min-p as a cut on the scaled logit: p >= min_p × p_max ⟺ s - max >= log(min_p) */
static __device__ __forceinline__ float min_p_cut(const struct pd_kernel_sample_row &q) {
    return q.min_p > 0.0f && !row_greedy(q) ? logf(q.min_p) : -INFINITY;
}

/* Pass 2, a block per (slice, row): probs = softmax(penalized / T) of the slice; a min-p row's
 * tokens under its cut get 0, and the slice's kept probability goes to its partial (pass 3
 * renormalizes). */
template <bool VEC>
static __global__ void __launch_bounds__(PDK_SLICE_THREADS)
    samp_softmax_kernel(struct pd_kernel_sample_params p, struct draw_bufs d, int S) {
    __shared__ float tot[2], red[32];
    int r = blockIdx.y;
    struct pd_kernel_sample_row q = p.row[r];
    samp_row c = row_view(p, r, q);
    float x[PDK_SLICE_PER];
    slice_load<VEC>(c.l, p.vocab, 0.0f, x); /* in flight while warp 0 merges the row's totals */
    if (threadIdx.x < 32) {
        float m, sm;
        row_total(d, r, S, false, m, sm);
        if (threadIdx.x == 0) {
            tot[0] = m;
            tot[1] = 1.0f / sm;
        }
    }
    __syncthreads();
    float inv_t = 1.0f / d.temp[r], m = tot[0], inv_z = tot[1], cut = min_p_cut(q);
    float *pr = d.probs + (int64_t)r * p.vocab, kept = 0.0f;
#pragma unroll
    for (int j = 0; j < PDK_SLICE_PER; j++) {
        int t = slice_index<VEC>(j);
        float y = (c.st && t < p.vocab ? penalized(c, t) : x[j]) * inv_t - m;
        x[j] = y >= cut ? __expf(y) * inv_z : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < PDK_SLICE_PER; j += VEC ? 4 : 1) {
        int t = slice_index<VEC>(j);
        if (t >= p.vocab)
            continue;
        if (VEC) {
            float4 f = {x[j], x[j + (VEC ? 1 : 0)], x[j + (VEC ? 2 : 0)], x[j + (VEC ? 3 : 0)]};
            *(float4 *)(pr + t) = f;
            kept += (f.x + f.y) + (f.z + f.w);
        } else {
            pr[t] = x[j];
            kept += x[j];
        }
    }
    if (cut == -INFINITY) /* uniform per block: every thread of it skips the reduction */
        return;
    kept = block_sum(kept, red);
    if (threadIdx.x == 0)
        d.part[(int64_t)r * S + blockIdx.x].kept = kept;
}

/* Pass 3 (when a row has min-p), a block per (slice, row): a min-p row's probabilities over the
 * mass it keeps, and its top-p over the same (the top-p cut stays where it was on the whole
 * row: the tokens above a kept token are all kept). */
static __global__ void __launch_bounds__(PDK_SLICE_THREADS)
    samp_renorm_kernel(struct pd_kernel_sample_params p, struct draw_bufs d, int S) {
    int r = blockIdx.y;
    struct pd_kernel_sample_row q = p.row[r];
    if (min_p_cut(q) == -INFINITY)
        return;
    float kept = 0.0f;
    for (int j = 0; j < S; j++)
        kept += d.part[(int64_t)r * S + j].kept;
    float inv = 1.0f / kept;
    float *pr = d.probs + (int64_t)r * p.vocab;
    int t0 = blockIdx.x * PDK_SLICE, t1 = min(t0 + PDK_SLICE, p.vocab);
    for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x)
        pr[t] *= inv;
    if (blockIdx.x == 0 && threadIdx.x == 0)
        d.top_p[r] = fminf(1.0f, q.top_p * inv);
}

static __global__ void __launch_bounds__(PDK_SAMPLE_THREADS)
    finish_kernel(struct pd_kernel_sample_params p, const int32_t *chosen, const bool *valid,
                  struct draw_bufs d, int S) {
    __shared__ samp_shared sh;
    struct pd_kernel_sample_row r = p.row[blockIdx.x];
    samp_row c = row_view(p, blockIdx.x, r);
    int tok;
    if (row_greedy(r) || !chosen || !valid[blockIdx.x]) /* NaN rows: the argmax as greedy */
        tok = search(c, 0, sh).id;
    else
        tok = chosen[blockIdx.x];
    if (tok < 0 || tok >= c.V) /* every logit NaN: token 0, as the host loop would return */
        tok = 0;
    /* logprobs are of the model's distribution: the raw row, no penalties, no temperature */
    int n_top = r.n_top < c.V ? r.n_top : c.V;
    if (n_top > PD_KERNEL_MAX_TOP)
        n_top = PD_KERNEL_MAX_TOP;
    if (!p.top_ids)
        n_top = 0;
    if (p.logprob || n_top > 0) {
        float lse;
        if (chosen) { /* the stats pass summed the raw row already */
            float mx, sm;
            row_total(d, blockIdx.x, S, true, mx, sm);
            lse = __fadd_rn(mx, logf(sm));
        } else {
            float mx = -INFINITY;
            for (int t = threadIdx.x; t < c.V; t += blockDim.x)
                mx = fmaxf(mx, c.l[t]);
            mx = block_max(mx, sh.red_f);
            double s = 0.0;
            for (int t = threadIdx.x; t < c.V; t += blockDim.x)
                s += exp((double)(c.l[t] - mx));
            s = block_sum(s, sh.red_d);
            lse = __fadd_rn(mx, (float)log(s));
        }
        if (p.logprob && threadIdx.x == 0)
            p.logprob[blockIdx.x] = __fsub_rn(c.l[tok], lse);
        if (n_top > 0) {
            samp_row raw = c;
            raw.st = nullptr;
            top_n(raw, n_top, lse, sh, p.top_ids + (int64_t)blockIdx.x * PD_KERNEL_MAX_TOP,
                  p.top_lp + (int64_t)blockIdx.x * PD_KERNEL_MAX_TOP);
        }
    }
    /* every thread is done reading the penalty state (each search ends at a barrier, and the
     * logprob passes read only the logits): count the chosen token in it */
    __syncthreads();
    if (threadIdx.x == 0) {
        p.ids[blockIdx.x] = tok;
        if (c.st)
            const_cast<int32_t *>(c.st)[tok] += 1;
    }
}

/* The perf mode's phase timing (pd_kernel_sample_trace): an event recorded after each launch. */
static cudaEvent_t *trace_ev;
static int trace_n;

extern "C" void pd_kernel_sample_trace(cudaEvent_t *ev, int n) {
    trace_ev = ev;
    trace_n = ev ? n : 0;
}

static void trace(int phase, cudaStream_t s) {
    if (phase < trace_n)
        cudaEventRecord(trace_ev[phase], s);
}

extern "C" int pd_kernel_sample(const struct pd_kernel_sample_params *p, cudaStream_t s) {
    if (p->rows <= 0)
        return PDK_OK;
    if (p->vocab < 1)
        return pd__cuda_status(cudaErrorInvalidValue, "sample: empty vocabulary");
    const int32_t *chosen = nullptr;
    const bool *valid = nullptr;
    struct draw_bufs d = {};
    int S = n_slices(p->vocab);
    if (p->any_drawn) {
        size_t need = draw_layout(p->rows, p->vocab, (char *)p->scratch, &d);
        if (!p->scratch || p->scratch_bytes < need)
            return pd__cuda_status(cudaErrorInvalidValue,
                                   "sample: scratch smaller than the draw needs");
        char err[256];
        int rc;
        dim3 grid((unsigned)S, (unsigned)p->rows);
        trace(0, s);
        /* rows of 16-byte aligned logits and probabilities: vector loads and stores */
        bool vec = p->vocab % 4 == 0 && (uintptr_t)p->logits % 16 == 0;
        if (vec)
            samp_stats_kernel<true><<<grid, PDK_SLICE_THREADS, 0, s>>>(*p, d, S);
        else
            samp_stats_kernel<false><<<grid, PDK_SLICE_THREADS, 0, s>>>(*p, d, S);
        if ((rc = PDK_LAUNCHED("sampling softmax")))
            return rc;
        trace(1, s);
        if (vec)
            samp_softmax_kernel<true><<<grid, PDK_SLICE_THREADS, 0, s>>>(*p, d, S);
        else
            samp_softmax_kernel<false><<<grid, PDK_SLICE_THREADS, 0, s>>>(*p, d, S);
        if ((rc = PDK_LAUNCHED("sampling softmax")))
            return rc;
        if (p->any_min_p) {
            samp_renorm_kernel<<<grid, PDK_SLICE_THREADS, 0, s>>>(*p, d, S);
            if ((rc = PDK_LAUNCHED("min-p")))
                return rc;
        }
        trace(2, s);
        struct pdfi_sample_args sa = {d.probs,
                                      (int)p->rows,
                                      p->vocab,
                                      d.top_k,
                                      d.top_p,
                                      d.seed,
                                      d.offset,
                                      d.chosen,
                                      d.valid,
                                      p->any_top_k,
                                      p->any_top_p || p->any_min_p};
        if ((rc = pdfi_sample(&sa, s, err, sizeof(err))))
            return pd__pdfi_status(rc, err);
        trace(3, s);
        chosen = d.chosen;
        valid = d.valid;
    }
    finish_kernel<<<(unsigned)p->rows, PDK_SAMPLE_THREADS, 0, s>>>(*p, chosen, valid, d, S);
    trace(4, s);
    return PDK_LAUNCHED("sample");
}

/* ---- penalty state ---- */

static __global__ void penalty_set_kernel(struct pd_kernel_penalty_set_params p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n_prompt + p.n_out)
        return;
    int32_t id = p.ids[i];
    if (id < 0 || id >= p.vocab)
        return;
    /* the prompt bit and the count live in one word: or and add commute, so any order of the
     * ids gives the same state */
    if (i < p.n_prompt)
        atomicOr(&p.state_row[id], (int32_t)0x80000000u);
    else
        atomicAdd(&p.state_row[id], 1);
}

extern "C" int pd_kernel_penalty_set(const struct pd_kernel_penalty_set_params *p, cudaStream_t s) {
    if (p->vocab < 1 || p->n_prompt < 0 || p->n_out < 0)
        return pd__cuda_status(cudaErrorInvalidValue, "penalty set: bad sizes");
    int rc =
        pd__cuda_status(cudaMemsetAsync(p->state_row, 0, (size_t)p->vocab * sizeof(int32_t), s),
                        "clearing a penalty slot");
    int n = p->n_prompt + p->n_out;
    if (rc || n == 0)
        return rc;
    penalty_set_kernel<<<blocks_for(n, 256), 256, 0, s>>>(*p);
    return PDK_LAUNCHED("penalty set");
}
