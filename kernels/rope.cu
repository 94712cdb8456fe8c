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
