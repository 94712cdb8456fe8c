/*
 * sampling.cu — token choice on the device. The greedy fast path (argmax, lowest id on ties as
 * common/sampling.c, plus the token's log-softmax) needs one block per row and sends 8 bytes per
 * request back instead of the whole vocabulary row.
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
