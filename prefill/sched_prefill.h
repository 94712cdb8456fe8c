/*
 * sched_prefill.h — the prefill daemon's scheduling policy (DESIGN.md §2): the queues bootstrap →
 * waiting → inflight, the chunked-prefill batch builder, and which KV pages become sendable after
 * each chunk. Pure: time and events come in as arguments, decisions come out as plain structs;
 * no I/O, threads, locks or clocks, and no allocation after pd_sched_prefill_add.
 *
 * Batch rule (SGLang PrefillAdder): token budget min(--chunked-prefill-size, --max-prefill-tokens);
 * the half-done request goes first, then waiting requests strictly in FIFO order; a request whose
 * rest does not fit is cut at a page boundary (rest of budget rounded down to whole pages) and
 * becomes the half-done one, which ends the batch. A new request is admitted only when all pages
 * of its prompt not served by the prefix cache can be taken (evicting cache entries if needed);
 * otherwise the batch stops there, so nobody overtakes it. max_new_tokens is 1 on prefill: the
 * first token is sampled from the last chunk and needs no KV page, so nothing is reserved for it.
 *
 * Sends: after a chunk, the whole pages it completed are sendable; the partial last page goes with
 * the last chunk; cached prefix pages go with the first chunk. Pages a request has sent may still
 * be read by the transfer engine, so ending such a request early (abort) passes through
 * "draining" until the daemon has force-closed the peer's endpoint and calls ..._release.
 */
#ifndef PD_SCHED_PREFILL_H
#define PD_SCHED_PREFILL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sched_common.h"

struct pd_page_alloc;
struct pd_radix_cache;
struct pd_sched_prefill;

struct pd_sched_prefill_config {
    int32_t page_size;            /* tokens per page */
    int32_t chunked_prefill_size; /* token budget of a step; <= 0: no chunking */
    int32_t max_prefill_tokens;   /* cap on a batch's tokens (one longer prompt still runs alone
                                     when chunking is off) */
    int32_t max_queued_requests;  /* live + unpopped ended requests; beyond: PD_EFULL */
    double bootstrap_timeout_s;   /* not paired this long after add: ends with PD_END_TIMEOUT */
    bool eager; /* compute a prompt before its decode's Transfer arrives (admission in arrival
                   order from bootstrap and waiting alike); its pages are held until then */
};

struct pd_prefill_chunk {
    uint64_t room;
    int32_t start;         /* first prompt token computed in this step */
    int32_t len;           /* tokens computed */
    bool last;             /* the prompt is complete after it: sample the first output token */
    int32_t send_begin;    /* pages[send_begin, send_end) are sendable once the step ran */
    int32_t send_end;      /* (indices into pages, not page numbers); empty while held */
    const int32_t *pages;  /* [n_pages] the request's KV pages; valid until its end is popped */
    int32_t n_pages;       /* ceil(prompt tokens / page size) */
    int32_t cached_tokens; /* prompt tokens taken from the prefix cache */
    bool dropped;          /* set by batch_done: aborted/failed during the step, send nothing */
    bool held;     /* set by batch_done (eager): the Transfer has not come, nothing goes out yet;
                      pd_sched_prefill_bootstrapped returns what is computed by then */
    bool quiesce;  /* with dropped: earlier sends may be in flight, the daemon must force-close
                      the endpoint, then call pd_sched_prefill_release */
    int32_t slot_; /* internal */
};

struct pd_prefill_batch {
    struct pd_prefill_chunk *chunks; /* scheduler-owned, valid until the next step */
    int32_t n;
    int32_t n_tokens; /* sum of len */
};

struct pd_prefill_counts {
    int32_t bootstrap, waiting, inflight, draining, ended_unpopped;
};

/* pa and rc (rc may be NULL: no prefix cache) outlive the scheduler. PD_EINVAL, PD_ENOMEM. */
int pd_sched_prefill_new(const struct pd_sched_prefill_config *cfg, struct pd_page_alloc *pa,
                         struct pd_radix_cache *rc, struct pd_sched_prefill **out);
/* Ends whatever is still live (their pages go back) and frees the scheduler. */
void pd_sched_prefill_free(struct pd_sched_prefill *s);

/* A parsed, tokenized request enters bootstrap. tokens are borrowed until its end is popped.
 * PD_EINVAL (room already live, empty prompt), PD_ERANGE (prompt larger than the pool),
 * PD_EFULL (max_queued_requests), PD_ENOMEM. */
int pd_sched_prefill_add(struct pd_sched_prefill *s, uint64_t room, const int32_t *tokens,
                         int32_t n_tokens, double now_s);
/* The room's prefix-cache hit covers at most max_tokens tokens (call right after add): a
 * request with input logprobs needs the logits from there on, so they are computed. PD_ENOENT. */
int pd_sched_prefill_limit_cache(struct pd_sched_prefill *s, uint64_t room, int32_t max_tokens);
/* What a Transfer that came after its request's computing began makes sendable at once. */
struct pd_prefill_send {
    int32_t begin, end;    /* pages[begin, end) (indices into pages); empty: nothing yet */
    bool last;             /* the prompt is computed: its first token goes with these pages */
    const int32_t *pages;  /* the request's pages (as pd_prefill_chunk's) */
    int32_t cached_tokens; /* prompt tokens taken from the prefix cache */
};

/* Decode's Transfer for the room arrived (destination pages known): bootstrap → waiting, or
 * (eager) the request computing or computed already is paired, and *out says which of its pages
 * can go now (empty while it is in the running step: batch_done widens that chunk's sends).
 * PD_ENOENT (no live request), PD_EINVAL (paired already, or draining). */
int pd_sched_prefill_bootstrapped(struct pd_sched_prefill *s, uint64_t room, double now_s,
                                  struct pd_prefill_send *out);

/* Expires bootstrap timeouts, then builds this step's batch (possibly empty). The previous batch
 * must have been given back with batch_done (PD_EINVAL otherwise). */
int pd_sched_prefill_step(struct pd_sched_prefill *s, double now_s, struct pd_prefill_batch *b);
/* The step's forward ran: progress is committed, computed whole pages enter the prefix cache,
 * finished prompts move to inflight. Marks chunks of requests aborted meanwhile as dropped. */
int pd_sched_prefill_batch_done(struct pd_sched_prefill *s, struct pd_prefill_batch *b,
                                double now_s);

/* The transfer engine is finished with the room: status PD_OK (all sent, decode acknowledged;
 * only in inflight) ends it done; any error ends it failed, in any queue — the engine calls this
 * only once nothing of the room can still be read. PD_ENOENT, PD_EINVAL. */
int pd_sched_prefill_transfer_done(struct pd_sched_prefill *s, uint64_t room, int status,
                                   double now_s);
/* Abort at any point. *quiesce is set when pages were already sent: the request drains until
 * pd_sched_prefill_release; otherwise it ends now (or at batch_done if it is in the running
 * step). PD_ENOENT when no live request has the room. */
int pd_sched_prefill_abort(struct pd_sched_prefill *s, uint64_t room, bool *quiesce);
/* The peer's endpoint is closed: a draining request ends (aborted), its pages go back. */
int pd_sched_prefill_release(struct pd_sched_prefill *s, uint64_t room);

/* Pops the oldest end: PD_OK, or PD_EAGAIN when none is waiting. */
int pd_sched_prefill_pop_ended(struct pd_sched_prefill *s, struct pd_sched_end *e);

/* bootstrap: requests whose Transfer has not come (eager: computing or computed ones too);
 * waiting: paired ones not computed yet; inflight: paired and computed, sending. */
void pd_sched_prefill_counts(const struct pd_sched_prefill *s, struct pd_prefill_counts *c);
/* Recounts every page's holders (live requests + cache) against the allocator, and the queues
 * against the states. PD_EINTERNAL with a message. O(pool + requests), for tests. */
int pd_sched_prefill_check(const struct pd_sched_prefill *s);

#endif
