/*
 * tp.h — tensor parallelism (DESIGN.md §4): the one collective a Llama-family forward needs, a
 * sum all-reduce of the rows after the attention output and MLP down projections, behind an
 * interface so the model does not know who carries it. Two carriers:
 *  - the in-process group below: one thread per rank, each with its own backend and model,
 *    summing through shared memory (the CPU backend's sharding test and tp on one host's CPU);
 *  - NCCL on the cuda backend (kernels/), the thin GPU path.
 *
 * Sharding (Megatron style, as SGLang and vLLM do): q/k/v, gate and up are split by output rows
 * (heads / intermediate columns) and o_proj and down_proj by input columns, so each rank computes
 * a partial sum of the residual update; all-reduce makes every rank's copy the full one. Norms,
 * the embedding and lm_head are replicated. o_proj's bias is added by rank 0 only.
 */
#ifndef PD_TP_H
#define PD_TP_H

#include <stddef.h>

#define PD_TP_MAX 8 /* ranks of one group: the GPUs of a node */

struct pd_backend;

struct pd_tp_comm {
    int rank, size;
    /* buf (device, count floats of be) = the sum of every rank's buf, the same bits on all
     * ranks. Called by every rank in the same order; returns when this rank's buf holds the sum
     * (enqueued on be's stream for a device carrier). Every rank runs the same steps, so a
     * step one rank refuses (bad input) is refused by all before any all-reduce. A rank that
     * fails otherwise (a device error) calls fail: the others then get PD_EPEER from the
     * all-reduce they wait in (or enter next) instead of waiting for it forever. */
    int (*all_reduce_sum)(const struct pd_tp_comm *c, struct pd_backend *be, float *buf,
                          size_t count);
    /* This rank gives the current step up (see above). Any thread, any time. */
    void (*fail)(const struct pd_tp_comm *c);
    /* Before a step, while no rank is inside one: forgets a failed step so the next runs. A
     * carrier that cannot recover (NCCL: the communicators were aborted) says why. */
    int (*reset)(const struct pd_tp_comm *c);
    void *ctx;
};

/* An in-process group of size ranks, one thread each. */
struct pd_tp_local;

int pd_tp_local_new(int size, struct pd_tp_local **out);
void pd_tp_local_free(struct pd_tp_local *g);
/* Rank r's communicator (valid while g lives). */
const struct pd_tp_comm *pd_tp_local_comm(struct pd_tp_local *g, int rank);
/* Ranks that reached the all-reduce's current barrier and wait there for the others (a test
 * sees with it that ranks block on a peer; any thread). After a rank gave the step up it stays
 * as it was until reset. */
int pd_tp_local_waiting(struct pd_tp_local *g);

/* NCCL (kernels/tp_nccl.c, present when pdserve was built with CUDA and found nccl.h; reach it
 * through the registry, model/backend_reg.h, whose cuda entry names these functions then and has
 * NULL for them otherwise): size ranks, rank r on GPU devices[r], one communicator each
 * (ncclCommInitAll: one process, one thread per rank). The all-reduce is ncclAllReduce in place
 * on the rank backend's stream, after the ops the backend has queued. After a rank fails, the
 * communicators are aborted (that is what unblocks the peers) and the group refuses every
 * later step: restart the process. */
struct pd_tp_nccl;

int pd_tp_nccl_new(int size, const int *devices, struct pd_tp_nccl **out);
void pd_tp_nccl_free(struct pd_tp_nccl *g);
const struct pd_tp_comm *pd_tp_nccl_comm(struct pd_tp_nccl *g, int rank);

#endif
