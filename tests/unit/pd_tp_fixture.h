/*
 * pd_tp_fixture.h — what the tensor-parallel tests share: the model a tp group loads (written by
 * pdserve-mkmodel's writer), the batch it runs (test_tp_group on the cpu, test_tp_cuda on GPUs,
 * so the GPU test covers the batch the cpu test proved), and one rank's all-reduce on a thread
 * of its own (test_tp, test_tp_group).
 */
#ifndef PD_TP_FIXTURE_H
#define PD_TP_FIXTURE_H

#include "pd_test.h"

#include "model/backend.h"
#include "tools/mkmodel/mkmodel.h"
#include "model/model.h"
#include "model/tp.h"

#include <stdio.h>

/* Writes pdserve-mkmodel's tiny model of family fam (weights in dt, generated from seed) to
 * <test tmpdir>/<sub>/<family name>; dir gets that path. */
static inline int tp_write_model(char *dir, size_t size, const char *sub,
                                 enum pd_mkmodel_family fam, enum pd_dtype dt, uint64_t seed) {
    struct pd_mkmodel_opts o;
    pd_mkmodel_opts_defaults(&o);
    o.family = (int)fam;
    o.dtype = dt;
    o.seed = seed;
    snprintf(dir, size, "%s/%s/%s", pd_test_tmpdir(), sub, pd_mkmodel_family_names[fam]);
    return pd_mkmodel_write(&o, dir);
}

#define TP_BATCH_NREQ 3

/* Three prompts of 37, 16 and 5 tokens (past two pages and a 32-token chunk, one full page,
 * under a page) on pages scattered over a pool of at least 21 pages, token ids spread over a
 * vocabulary of V; s[q] is request q's whole prompt, 64 tokens room each. */
struct tp_batch {
    int32_t toks[TP_BATCH_NREQ][64];
    int plen[TP_BATCH_NREQ];
    int32_t pages[TP_BATCH_NREQ][4];
    struct pd_model_seq s[TP_BATCH_NREQ];
};

static inline void tp_batch_init(struct tp_batch *b, int V) {
    static const int plen[TP_BATCH_NREQ] = {37, 16, 5};
    static const int32_t pages[TP_BATCH_NREQ][4] = {{3, 9, 1, 14}, {2, 20, 5, 6}, {11, 0, 7, 8}};
    for (int q = 0; q < TP_BATCH_NREQ; q++) {
        b->plen[q] = plen[q];
        for (int p = 0; p < 4; p++)
            b->pages[q][p] = pages[q][p];
        for (int i = 0; i < 64; i++)
            b->toks[q][i] = (int32_t)((i * (q + 5) + 11 * q + 1) % V);
        b->s[q] = (struct pd_model_seq){.tokens = b->toks[q],
                                        .n_new = plen[q],
                                        .n_cached = 0,
                                        .pages = b->pages[q],
                                        .n_pages = 4};
    }
}

/* Request q's decode step st (0: the first token after the prompt): the one token *tok. */
static inline struct pd_model_seq tp_batch_step(const struct tp_batch *b, int q, int st,
                                                const int32_t *tok) {
    return (struct pd_model_seq){
        .tokens = tok, .n_new = 1, .n_cached = b->plen[q] + st, .pages = b->pages[q], .n_pages = 4};
}

/* One rank's all_reduce_sum of buf[0..count) on a thread: a cpu backend of its own (as each
 * rank of a group has), rc the call's status (or the backend's, when that could not start). */
struct tp_reduce {
    const struct pd_tp_comm *c;
    float buf[8];
    size_t count;
    int rc;
};

static inline void *tp_reduce_main(void *arg) {
    struct tp_reduce *x = arg;
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    x->rc = pd_backend_new(&bo, &be);
    if (!x->rc)
        x->rc = x->c->all_reduce_sum(x->c, be, x->buf, x->count);
    pd_backend_free(be);
    return NULL;
}

#endif
