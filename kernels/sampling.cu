/*
 * sampling.cu — token choice on the device. The greedy fast path (argmax, lowest id on ties as
 * common/sampling.c, plus the token's log-softmax) needs one block per row and sends 8 bytes per
 * request back instead of the whole vocabulary row; the sampler below does the same for
 * temperature / top-k / top-p / min-p requests, applies a request's penalties from its state
 * kept on the device (a penalty slot, counted as tokens are chosen), and reports the raw row's
 * top-n logprobs: nothing of the vocabulary row leaves the device.
 */
#include "kernels/kcommon.cuh"

using namespace pdk;

#define PDK_ARGMAX_THREADS 1024

static __global__ void __launch_bounds__(PDK_ARGMAX_THREADS)
    argmax_kernel(struct pd_kernel_argmax_params p) {
    __shared__ float shv[32];
    __shared__ int shi[32];
    __shared__ float shs[32];
    const float *l = p.logits + (int64_t)blockIdx.x * p.vocab;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int t = threadIdx.x; t < p.vocab; t += blockDim.x) {
        float v = l[t];
        if (v > best) { /* t ascends per thread: the first max of this thread wins */
            best = v;
            bi = t;
        }
    }
    /* (value desc, id asc) reduction */
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
            best = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        shv[wid] = best;
        shi[wid] = bi;
    }
    __syncthreads();
    best = lane < nw ? shv[lane] : -INFINITY;
    bi = lane < nw ? shi[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
            best = ov;
            bi = oi;
        }
    }
    if (bi == 0x7fffffff) /* every logit NaN: token 0, as the host loop would return */
        bi = 0;
    if (p.logprob) {
        float s = 0.0f;
        for (int t = threadIdx.x; t < p.vocab; t += blockDim.x)
            s += expf(l[t] - best);
        s = block_sum(s, shs);
        if (threadIdx.x == 0)
            p.logprob[blockIdx.x] = -logf(s);
    }
    if (threadIdx.x == 0)
        p.ids[blockIdx.x] = bi;
}

extern "C" int pd_kernel_argmax(const struct pd_kernel_argmax_params *p, cudaStream_t s) {
    if (p->rows <= 0)
        return PDK_OK;
    if (p->vocab < 1)
        return pd__cuda_status(cudaErrorInvalidValue, "argmax: empty vocabulary");
    argmax_kernel<<<(unsigned)p->rows, PDK_ARGMAX_THREADS, 0, s>>>(*p);
    return PDK_LAUNCHED("argmax");
}

/* ---- sampling: temperature, top-k / top-p / min-p and the draw, as common/sampling.c ---- *
 *
 * The host sorts candidates by (scaled logit desc, id asc) and walks prefixes of that order: the
 * top-p cut is the first token whose preceding mass exceeds top_p, min-p keeps a prefix (the
 * probabilities fall along the order), and the draw is the first token whose cumulative mass
 * exceeds u × the kept mass. Every one of those is "the first token in sorted order whose
 * inclusive cumulative weight exceeds a target", which a radix search finds without sorting:
 * four passes over the row, each a 256-bucket histogram of (count, mass) of the tokens under the
 * key prefix found so far, then thread 0 walks the buckets from the top. Tokens that share the
 * boundary value are a tie group ordered by id; how many of them the prefix takes is arithmetic,
 * and which id that is, another radix search over ids (only when it is not the group's first).
 *
 * Masses are summed as 2^-62 fixed point in 64-bit integers: exact and order-independent, so the
 * result does not depend on the schedule, and within ~1e-16 of the host's double sums; a
 * different token needs u to land that close to a boundary. Probabilities themselves are
 * computed as on the host: (float)(exp((double)(l/T - max)) / z), with l/T rounded, not fused. */

#define PDK_SAMPLE_THREADS 1024
#define PDK_FIX 0x1p62

struct samp_shared {
    unsigned long long mass[256];
    int cnt[256];
    int minid[256];
    double red_d[32];
    float red_f[32];
    int red_i[32];
    /* search state, written by thread 0 between barriers */
    uint32_t prefix, mask;
    int cnt_above, sel, found;
    unsigned long long mass_above;
    /* top-n candidates, gathered by every thread, sorted by thread 0 */
    int n_cand;
    int cand[PD_KERNEL_MAX_TOP];
};

struct samp_row {
    const float *l;
    const int32_t *st; /* [V] the row's penalty state, NULL: no penalties */
    int V;
    float inv_t, mx;
    float rep, freq, pres;
    double z;
};

struct samp_hit {
    bool ok;                 /* false: the whole row's weight does not exceed the target */
    int rank, id;            /* position in sorted order, token id */
    unsigned long long incl; /* mass (fixed point) of the tokens up to and including it */
};

/* Larger float → larger key; -0 and +0 share one (the host compares them equal). */
static __device__ __forceinline__ uint32_t okey(float v) {
    uint32_t b = __float_as_uint(v);
    if ((b << 1) == 0)
        b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static __device__ __forceinline__ float unkey(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* common/sampling.h's pd_sampling_penalize, operation for operation and never fused: repetition
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

/* The logit the choice sees: penalized, then divided by the temperature as the host does
 * (times its rounded reciprocal). */
static __device__ __forceinline__ float scaled(const samp_row &c, int t) {
    return __fmul_rn(penalized(c, t), c.inv_t);
}

static __device__ __forceinline__ float prob_of(const samp_row &c, float s) {
    return (float)(exp((double)__fsub_rn(s, c.mx)) / c.z);
}

static __device__ __forceinline__ unsigned long long fix_of(float w) {
    return __double2ull_rn((double)w * PDK_FIX);
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
            if (((uint32_t)t & mask) == prefix && okey(scaled(c, t)) == key)
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

/* The first token in (scaled logit desc, id asc) order whose inclusive cumulative weight
 * exceeds target: weight 1 per token when by_count, else its probability in fixed point. The
 * probability mass up to it (incl) is summed when by_count is false or with_mass. */
static __device__ samp_hit search(const samp_row &c, bool by_count, bool with_mass,
                                  unsigned long long target, samp_shared &sh) {
    with_mass = with_mass || !by_count;
    __syncthreads();
    if (threadIdx.x == 0) {
        sh.prefix = sh.mask = 0;
        sh.cnt_above = 0;
        sh.mass_above = 0;
        sh.found = 1;
        sh.sel = 0;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) {
            sh.cnt[i] = 0;
            sh.mass[i] = 0;
            sh.minid[i] = 0x7fffffff;
        }
        __syncthreads();
        uint32_t prefix = sh.prefix, mask = sh.mask;
        /* a thread's tokens mostly share the top digits (logits span a few binades), so runs of
         * one digit are summed in registers first: far fewer atomics on the same few buckets;
         * the integer sums come out the same in any order */
        int run_d = -1, run_n = 0;
        unsigned long long run_m = 0;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x) {
            float s = scaled(c, t);
            uint32_t k = okey(s);
            if ((k & mask) != prefix)
                continue;
            int d = (int)((k >> shift) & 255);
            if (d != run_d) {
                if (run_n) {
                    atomicAdd(&sh.cnt[run_d], run_n);
                    if (with_mass)
                        atomicAdd(&sh.mass[run_d], run_m);
                }
                run_d = d;
                run_n = 0;
                run_m = 0;
            }
            run_n++;
            if (with_mass)
                run_m += fix_of(prob_of(c, s));
            if (shift == 0)
                atomicMin(&sh.minid[d], t);
        }
        if (run_n) {
            atomicAdd(&sh.cnt[run_d], run_n);
            if (with_mass)
                atomicAdd(&sh.mass[run_d], run_m);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int ca = sh.cnt_above, sel = -1;
            unsigned long long ma = sh.mass_above;
            for (int d = 255; d >= 0; d--) {
                int n = sh.cnt[d];
                if (!n)
                    continue;
                unsigned long long cum = by_count ? (unsigned long long)(ca + n) : ma + sh.mass[d];
                if (cum > target) {
                    sel = d;
                    break;
                }
                ca += n;
                ma += sh.mass[d];
            }
            sh.cnt_above = ca;
            sh.mass_above = ma;
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
    h.incl = sh.mass_above;
    h.id = -1;
    if (!h.ok) {
        __syncthreads();
        return h;
    }
    /* the tie group at the boundary value: g tokens of weight wq each, in id order */
    uint32_t key = sh.prefix;
    int g = sh.cnt[sh.sel], first = sh.minid[sh.sel];
    unsigned long long wq = with_mass ? fix_of(prob_of(c, unkey(key))) : 0;
    unsigned long long step = by_count ? 1 : wq;
    unsigned long long before = by_count ? (unsigned long long)h.rank : h.incl;
    unsigned long long j = step ? (target - before) / step + 1 : 1;
    if (j > (unsigned long long)g)
        j = (unsigned long long)g;
    h.rank += (int)j - 1;
    h.incl += j * wq;
    h.id = j == 1 ? first : id_select(c, key, (int)j, sh);
    __syncthreads();
    return h;
}

/* The raw row's n (1..min(V, PD_KERNEL_MAX_TOP)) most likely tokens in (logit desc, id asc)
 * order, as pd_sampling_logprobs: the n-th is found by a radix search by count, every token
 * ranked at or before it is gathered (exactly n: those with a larger key, and the boundary
 * key's ids up to the n-th's), and thread 0 sorts the n and writes ids / lps (logit - lse). */
static __device__ void top_n(const samp_row &raw, int n, float lse, samp_shared &sh, int32_t *ids,
                             float *lps) {
    samp_hit h = search(raw, true, false, (unsigned long long)(n - 1), sh);
    if (!h.ok) /* fewer than n tokens: the caller clamps n to V, so never */
        return;
    uint32_t kb = okey(scaled(raw, h.id));
    if (threadIdx.x == 0)
        sh.n_cand = 0;
    __syncthreads();
    for (int t = threadIdx.x; t < raw.V; t += blockDim.x) {
        uint32_t k = okey(scaled(raw, t));
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
            uint32_t k = okey(scaled(raw, id));
            int j = i - 1;
            for (; j >= 0; j--) {
                int oj = sh.cand[j];
                uint32_t ko = okey(scaled(raw, oj));
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

static __global__ void __launch_bounds__(PDK_SAMPLE_THREADS)
    sample_kernel(struct pd_kernel_sample_params p) {
    __shared__ samp_shared sh;
    struct pd_kernel_sample_row r = p.row[blockIdx.x];
    samp_row c;
    c.l = p.logits + (int64_t)blockIdx.x * p.vocab;
    c.V = p.vocab;
    int32_t *st = r.slot >= 0 && r.slot < p.n_slots && p.state ? p.state + (int64_t)r.slot * p.vocab
                                                               : nullptr;
    c.st = st;
    c.rep = r.rep;
    c.freq = r.freq;
    c.pres = r.pres;
    bool greedy = r.temperature < 1e-5f || r.top_k == 1;
    c.inv_t = greedy ? 1.0f : __fdiv_rn(1.0f, r.temperature);
    c.mx = 0.0f;
    c.z = 1.0;
    int tok;
    if (greedy) {
        tok = search(c, true, false, 0, sh).id;
    } else {
        float mx = -INFINITY;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x)
            mx = fmaxf(mx, scaled(c, t));
        c.mx = block_max(mx, sh.red_f);
        double z = 0.0;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x)
            z += exp((double)__fsub_rn(scaled(c, t), c.mx));
        c.z = block_sum(z, sh.red_d);
        int k = r.top_k > 0 && r.top_k < c.V ? r.top_k : c.V;
        /* top-p: tokens up to and including the first whose inclusive mass exceeds top_p */
        double tp = (double)r.top_p * PDK_FIX;
        samp_hit hp = search(c, false, false, (unsigned long long)tp, sh);
        int keep = hp.ok && hp.rank + 1 < k ? hp.rank + 1 : k;
        /* min-p: the probabilities fall along the order, so the kept prefix is a count */
        float thr = __fmul_rn(r.min_p, (float)(1.0 / c.z));
        int above = 0;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x)
            above += prob_of(c, scaled(c, t)) >= thr;
        above = block_sum(above, sh.red_i);
        int n = above < keep ? above : keep;
        if (n < 1)
            n = 1;
        samp_hit last = search(c, true, true, (unsigned long long)(n - 1), sh);
        double tr = r.u * (double)last.incl;
        samp_hit hd = search(c, false, false, (unsigned long long)tr, sh);
        tok = hd.ok && hd.rank < n ? hd.id : last.id;
    }
    if (tok < 0) /* every logit NaN: token 0, as the host loop would return */
        tok = 0;
    /* logprobs are of the model's distribution: the raw row, no penalties, no temperature */
    int n_top = r.n_top < c.V ? r.n_top : c.V;
    if (n_top > PD_KERNEL_MAX_TOP)
        n_top = PD_KERNEL_MAX_TOP;
    if (!p.top_ids)
        n_top = 0;
    if (p.logprob || n_top > 0) {
        float mx = -INFINITY;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x)
            mx = fmaxf(mx, c.l[t]);
        mx = block_max(mx, sh.red_f);
        double s = 0.0;
        for (int t = threadIdx.x; t < c.V; t += blockDim.x)
            s += exp((double)(c.l[t] - mx));
        s = block_sum(s, sh.red_d);
        float lse = __fadd_rn(mx, (float)log(s));
        if (p.logprob && threadIdx.x == 0)
            p.logprob[blockIdx.x] = __fsub_rn(c.l[tok], lse);
        if (n_top > 0) {
            samp_row raw = c;
            raw.st = nullptr;
            raw.inv_t = 1.0f;
            top_n(raw, n_top, lse, sh, p.top_ids + (int64_t)blockIdx.x * PD_KERNEL_MAX_TOP,
                  p.top_lp + (int64_t)blockIdx.x * PD_KERNEL_MAX_TOP);
        }
    }
    /* every thread is done reading the penalty state (each search ends at a barrier, and the
     * logprob passes read only the logits): count the chosen token in it */
    __syncthreads();
    if (threadIdx.x == 0) {
        p.ids[blockIdx.x] = tok;
        if (st)
            st[tok] += 1;
    }
}

extern "C" int pd_kernel_sample(const struct pd_kernel_sample_params *p, cudaStream_t s) {
    if (p->rows <= 0)
        return PDK_OK;
    if (p->vocab < 1)
        return pd__cuda_status(cudaErrorInvalidValue, "sample: empty vocabulary");
    sample_kernel<<<(unsigned)p->rows, PDK_SAMPLE_THREADS, 0, s>>>(*p);
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
