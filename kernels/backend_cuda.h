/*
 * backend_cuda.h — what the cuda backend offers beyond model/backend.h, for tests and benches:
 * switching CUDA graphs off (to compare a graph replay with eager launches) and counting what
 * its steps did. The backend itself is reached through pd_backend_new with PD_BACKEND_CUDA: the
 * constructors below are for the registry (model/backend_reg.c) alone.
 */
#ifndef PD_BACKEND_CUDA_H
#define PD_BACKEND_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/devmem.h"

/* The cuda backend (backend_cuda.c) and the device memory of the KV transfer over the CUDA
 * runtime (devmem_cuda.c), as the registry names them. */
int pd__backend_cuda_new(const struct pd_backend_opts *opts, struct pd_backend **out);
int pd__devmem_cuda_new(const struct pd_devmem_opts *o, struct pd_devmem **out);

struct pd_backend_cuda_stats {
    int64_t steps;          /* flushed op logs (one per model step) */
    int64_t graph_launches; /* steps replayed from a captured graph */
    int64_t graph_captures; /* graphs captured (first step of a bucket, or a changed op list) */
    int64_t fused_norms;    /* residual add + RMSNorm pairs run as one kernel */
    int64_t fused_products; /* products (and SwiGLUs) run inside another's launch: a group */
    int64_t reused_inputs;  /* GEMM inputs whose conversion an earlier kernel had written */
    int64_t fused_ropes;    /* rope q + rope k + kv store (+ FlashInfer's q) as one kernel */
    int n_buckets;          /* decode batch-size buckets graphs are kept for */
    int buckets[16];
};

/* Both take a cuda backend (PD_BACKEND_CUDA); anything else is a bug (asserted). */
void pd_backend_cuda_stats(struct pd_backend *be, struct pd_backend_cuda_stats *out);
/* Graphs are on by default (off with the environment variable PD_CUDA_GRAPHS=0). */
void pd_backend_cuda_set_graphs(struct pd_backend *be, bool on);
/* Launches every op queued so far (the rest of the step then runs eagerly: a step cut by a
 * collective is no graph) and gives the stream (cudaStream_t) they run on, so work enqueued there
 * afterwards runs after them: the NCCL all-reduce of tensor parallelism (kernels/tp_nccl.c).
 * Makes be's GPU the calling thread's current device. The first error of a queued op, if any. */
int pd_backend_cuda_flush(struct pd_backend *be, void **stream);

/* Per-op timing (the perf mode's --breakdown): while a profile is set, every step runs eagerly
 * (no graph) with a CUDA event between every two ops and waits for itself, and each op's time is
 * added to the profile under what the op is ("matmul 1536x8960", "attention", "add+rmsnorm",
 * ...). NULL turns it off. The profile is the caller's; the backend only adds to it. */
#define PD_CUDA_PROFILE_OPS 64
struct pd_backend_cuda_profile {
    struct {
        char name[48];
        double us;
        int64_t calls;
    } op[PD_CUDA_PROFILE_OPS];
    int n;
    double total_us;
};
int pd_backend_cuda_profile(struct pd_backend *be, struct pd_backend_cuda_profile *prof);

#endif
