/*
 * tp_group.h — a model run over tensor-parallel ranks (model/tp.h), driven as one: the engine
 * and pdserve-generate call pd_tp_group_extend / _decode* where they would call pd_model_*.
 *
 * Rank r has its own backend (cpu: a share of the threads, at least one; cuda: GPU
 * device_index + r, as SGLang's base-gpu-id + rank), its own share of the model and its own KV
 * pool. Every pool has the same n_pages, and logical page p is page p of every rank's pool, so
 * the page allocator and the schedulers see one pool of n_pages and do not know about ranks.
 * Rank 0 runs on the caller's thread; ranks 1..size-1 each on a worker thread of the group that
 * runs the same forward pass in lockstep (its own setup and teardown too, so a cuda rank's
 * thread keeps its device current). lm_head is replicated, so rank 0's logits are the model's:
 * results (logits, greedy ids, sampled rows) come from rank 0; the workers compute the forward
 * pass only. A step every rank refuses (bad input) is refused identically; a rank failing alone
 * breaks the step for all (tp.h's fail), never leaves one waiting. The group's error names the
 * rank that failed first. Nothing is allocated per step.
 *
 * With size 1 there is no carrier and no thread: the calls are pd_model_*'s.
 */
#ifndef PD_TP_GROUP_H
#define PD_TP_GROUP_H

#include <stdbool.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/kv_pool.h"
#include "model/model.h"
#include "model/tp.h"

struct pd_tp_group_opts {
    int size; /* ranks, 1..PD_TP_MAX */
    /* the backend: cpu threads = all the ranks' (0: one per online core), split evenly, at
     * least one each; cuda: rank r on GPU device_index + r */
    struct pd_backend_opts backend;
    const char *model_path;
    struct pd_model_opts model; /* .tp is set per rank */
    enum pd_dtype kv_dtype;
    /* --kv-cache-dtype auto: kv_dtype is ignored and becomes the model's torch_dtype
     * (config.json) on cuda, f32 on cpu (the CPU backend computes in f32) */
    bool kv_dtype_auto;
    /* pages of every rank's pool: > 0 exactly; 0 from mem_fraction_static (cpu: the ranks
     * share host memory, so the logical page of all ranks is what is sized; cuda: each rank's
     * GPU, the smallest count for all) */
    int64_t n_pages;
    double mem_fraction_static; /* 0: pd_model_kv_opts' default */
};

struct pd_tp_group;

/* Loads every rank (in parallel), sizes and allocates the pools. A rank that cannot start fails
 * the whole group, with its rank named. PD_EUNSUPPORTED for cuda ranks without NCCL built in. */
int pd_tp_group_new(const struct pd_tp_group_opts *o, struct pd_tp_group **out);
void pd_tp_group_free(struct pd_tp_group *g);

int pd_tp_group_size(const struct pd_tp_group *g);
/* Rank r's model, pool and backend (valid while g lives; use rank 0's for the config, the
 * context length and the logical geometry). Only rank r's thread may run them. */
struct pd_model *pd_tp_group_model(struct pd_tp_group *g, int rank);
struct pd_kv_pool *pd_tp_group_kv(struct pd_tp_group *g, int rank);
struct pd_backend *pd_tp_group_backend(struct pd_tp_group *g, int rank);
/* Bytes of one logical page: size x one rank's page. */
size_t pd_tp_group_page_bytes(const struct pd_tp_group *g);

/* pd_model_extend / _decode / _decode_greedy / _decode_sample over every rank; outputs (host)
 * as those give them, from rank 0. */
int pd_tp_group_extend(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                       bool all_logits, float *logits);
int pd_tp_group_decode(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                       float *logits);
int pd_tp_group_decode_greedy(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                              int32_t *ids, float *logprobs);
int pd_tp_group_decode_sample(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                              const struct pd_sample_row *rows, int32_t *ids, float *logprobs);

#endif
