/*
 * sched_coloc.h — the colocated daemon's scheduling policy (pdserve-decode --disaggregation-mode
 * null): one process runs prefill and decode, as SGLang's scheduler without disaggregation.
 * Pure: time and events in, plain structs out; no I/O, threads, locks, clocks, and no allocation
 * after pd_sched_coloc_add, so a step never calls malloc.
 *
 * Queues: waiting (FIFO) → prefilling (admitted; the half-done request between steps) → running
 * (one token per step) → ended. Admission is SGLang's PrefillAdder (sched_common.h): the token
 * budget min(--chunked-prefill-size, --max-prefill-tokens), the half-done request first, then
 * waiting requests in order, a request that does not fit cut at a page boundary; a request is
 * admitted only while prefilling + running stay under max_running_requests and when its uncached
 * pages fit with the decode scheduler's output reservation (new_token_ratio × the tokens every
 * admitted request may still generate), evicting prefix-cache entries if needed.
 *
 * Mixed chunk (SGLang --enable-mixed-chunk): the step carries the prefill chunks and one decode
 * token for every running request, and the chunk budget shrinks by the decode tokens. Without
 * it a step is a prefill batch when one can be built, else a decode batch (SGLang's order).
 *
 * Token accounting: a prefill's last chunk produces the first output token; decode step k feeds
 * the latest token, writes its KV at position prompt_len + n_output - 1 and produces the next. A
 * request takes a page when that position crosses into a new one; when none is free (after
 * evicting the prefix cache) the running request that loses least (fewest tokens generated, then
 * the longest prompt) is retracted: its pages go back and it returns to the head of the waiting
 * queue, to be prefilled again over prompt + generated tokens (its tokens array holds them).
 * Every page a request takes goes back however it ends; the prefix cache keeps its own references
 * (on a prompt's pages after each chunk, and on prompt + output when a request finishes).
 */
#ifndef PD_SCHED_COLOC_H
#define PD_SCHED_COLOC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sched_common.h"

struct pd_page_alloc;
struct pd_radix_cache;
struct pd_sched_coloc;

struct pd_sched_coloc_config {
    int32_t page_size;
    int32_t chunked_prefill_size; /* token budget of a step; <= 0: no chunking */
    int32_t max_prefill_tokens;   /* cap on a step's prompt tokens */
    int32_t max_running_requests; /* prefilling + running, and so the rows of a step */
    int32_t max_queued_requests;  /* live + unpopped ended requests; beyond: PD_EFULL */
    bool mixed_chunk;             /* prefill chunks and decode tokens in one step */
    double init_new_token_ratio;  /* SGLang: 0.7 */
    double min_new_token_ratio;   /* SGLang: 0.1 */
    double new_token_ratio_decay; /* per step; SGLang: (0.7 - 0.1) / 600 */
    int32_t retract_decode_steps; /* SGLang: 20 */
};

/* SGLang's ratio and retraction values, mixed chunk on; sizes left as given. */
void pd_sched_coloc_config_defaults(struct pd_sched_coloc_config *cfg);

struct pd_coloc_chunk {
    uint64_t room;
    int32_t start;        /* first token computed in this step */
    int32_t len;          /* tokens computed */
    bool last;            /* the prompt is complete after it: sample the next output token */
    const int32_t *pages; /* [n_pages] the request's pages, covering start + len */
    int32_t n_pages;
    int32_t cached_tokens; /* tokens the prefix cache gave this admission */
    int32_t slot_;         /* internal */
};

struct pd_coloc_decode {
    uint64_t room;
    int32_t pos;          /* KV position written this step (the fed token's index) */
    const int32_t *pages; /* [n_pages] covers pos */
    int32_t n_pages;
    int32_t slot_; /* internal */
};

/* One forward step: the chunks first, then the decode tokens (SGLang's mixed layout). */
struct pd_coloc_step {
    /* arrays scheduler-owned, valid until the next step */
    struct pd_coloc_chunk *chunks;
    int32_t n_chunks;
    int32_t n_prefill_tokens; /* sum of chunk lengths */
    struct pd_coloc_decode *decodes;
    int32_t n_decodes;
    int32_t n_retracted; /* requests sent back to waiting this step */
    double new_token_ratio;
};

struct pd_coloc_counts {
    int32_t waiting;    /* including the half-done one waiting for its next chunk */
    int32_t prefilling; /* the half-done one */
    int32_t running, ended_unpopped;
    int64_t retracted; /* retractions so far */
};

/* pa and rc (NULL: no prefix cache) outlive the scheduler. PD_EINVAL, PD_ENOMEM. */
int pd_sched_coloc_new(const struct pd_sched_coloc_config *cfg, struct pd_page_alloc *pa,
                       struct pd_radix_cache *rc, struct pd_sched_coloc **out);
/* Ends whatever is live (pages back) and frees the scheduler. */
void pd_sched_coloc_free(struct pd_sched_coloc *s);

/* A tokenized request enters waiting. tokens is borrowed until its end is popped:
 * [prompt_len + max_new_tokens - 1], the prompt, then each output token written by the caller
 * before the next step (a retracted request is prefilled again over them).
 * PD_EINVAL (room live, bad lengths), PD_ERANGE (prompt + output larger than the pool),
 * PD_EFULL (max_queued_requests), PD_ENOMEM. */
int pd_sched_coloc_add(struct pd_sched_coloc *s, uint64_t room, const int32_t *tokens,
                       int32_t prompt_len, int32_t max_new_tokens, double now_s);
/* The room's prefix-cache hits cover at most max_tokens tokens (call right after add): a
 * request with input logprobs needs the logits from there on, so they are computed. PD_ENOENT. */
int pd_sched_coloc_limit_cache(struct pd_sched_coloc *s, uint64_t room, int32_t max_tokens);
/* Page growth and retractions, then this step's chunks and decode tokens (possibly none). The
 * previous step must have been given back (PD_EINVAL otherwise). */
int pd_sched_coloc_step(struct pd_sched_coloc *s, double now_s, struct pd_coloc_step *st);
/* The step ran. stopped: [n_chunks + n_decodes] (chunks first; read for last chunks and decode
 * tokens) — EOS / stop token / context full ends that request done, as max_new_tokens does.
 * NULL: none stopped. */
int pd_sched_coloc_step_done(struct pd_sched_coloc *s, const struct pd_coloc_step *st,
                             const bool *stopped, double now_s);
/* Abort at any point; a request in the outstanding step ends at step_done. PD_ENOENT. */
int pd_sched_coloc_abort(struct pd_sched_coloc *s, uint64_t room);
/* Oldest end: PD_OK, or PD_EAGAIN when none. */
int pd_sched_coloc_pop_ended(struct pd_sched_coloc *s, struct pd_sched_end *e);

void pd_sched_coloc_counts(const struct pd_sched_coloc *s, struct pd_coloc_counts *c);
/* Recounts page holders (requests + cache) and queues; PD_EINTERNAL with a message. For tests. */
int pd_sched_coloc_check(const struct pd_sched_coloc *s);

#endif
