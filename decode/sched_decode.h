/*
 * sched_decode.h — the decode daemon's scheduling policy (DESIGN.md §2): prealloc → transfer →
 * running, continuous batching, and retraction when the pool runs dry. Pure: time and events in,
 * plain structs out; no I/O, threads, locks, clocks, and no allocation after pd_sched_decode_add
 * (each request's page list is sized for its whole life there), so a step never calls malloc.
 *
 * Admission (prealloc → transfer) is FIFO, at most max_running_requests requests in transfer +
 * running, and only when the prompt's pages fit with a reservation for the output of every
 * admitted request: new_token_ratio × (tokens they may still generate), as SGLang. The ratio
 * decays every step towards its minimum and jumps back up after a retraction (SGLang's estimate
 * from decoded vs maximum tokens plus retract_decode_steps per request).
 * Token accounting: the first output token comes from prefill; decode step k of a request feeds
 * its latest token, writes that token's KV at position prompt_len + n_output - 1, and produces
 * the next. A request takes a page when that position crosses into a new one; when none is
 * free the running request that loses least (fewest tokens generated, then the longest prompt,
 * which frees most) is retracted: its pages go back and it ends PD_END_RETRACTED so the daemon
 * recomputes it locally. Pages a prefill may still write (transfer queue) are reused only after
 * the daemon has force-closed that endpoint and called pd_sched_decode_release.
 *
 * With a prefix cache (decode-side prefix reuse, DESIGN.md §2) admission takes the prompt's
 * longest cached prefix in whole pages, never its last token's page, as the request's first
 * pages (pd_decode_admit.held_pages): the daemon asks its prefill only for the pages after them.
 * A request that ends done leaves prompt + output in the cache for the conversation's next turn;
 * unlocked entries are evicted, least recently used first, before an admission waits or a
 * running request is retracted for a page.
 */
#ifndef PD_SCHED_DECODE_H
#define PD_SCHED_DECODE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sched_common.h"

struct pd_page_alloc;
struct pd_radix_cache;
struct pd_sched_decode;

struct pd_sched_decode_config {
    int32_t page_size;
    int32_t max_running_requests; /* transfer + running, and so the batch */
    int32_t max_queued_requests;  /* live + unpopped ended requests; beyond: PD_EFULL */
    double waiting_timeout_s;     /* in transfer longer than this: timed out */
    double init_new_token_ratio;  /* SGLang: 0.7 */
    double min_new_token_ratio;   /* SGLang: 0.1 */
    double new_token_ratio_decay; /* per step; SGLang: (0.7 - 0.1) / 600 */
    int32_t retract_decode_steps; /* SGLang: 20 */
};

/* SGLang's values for the ratio and retraction; sizes and timeout left as given. */
void pd_sched_decode_config_defaults(struct pd_sched_decode_config *cfg);

struct pd_decode_admit {
    uint64_t room;
    const int32_t *pages; /* [n_pages] the prompt's pages: [0, held_pages) already hold the KV
                             of their tokens (the prefix cache's), the rest are its destination:
                             send Transfer(room, pages + held_pages, held_pages) */
    int32_t n_pages;
    int32_t held_pages;
};

struct pd_decode_entry {
    uint64_t room;
    int32_t pos;          /* KV position written this step */
    const int32_t *pages; /* [n_pages] the request's page table, covers pos */
    int32_t n_pages;
    int32_t slot_; /* internal */
};

struct pd_decode_step {
    /* all arrays scheduler-owned, valid until the next step */
    struct pd_decode_admit *admitted; /* prealloc → transfer this step */
    int32_t n_admitted;
    uint64_t *quiesce; /* timed out in transfer: force-close the endpoint, then release */
    int32_t n_quiesce;
    struct pd_decode_entry *batch; /* one token each */
    int32_t n_batch;
    int32_t n_retracted; /* their ends (PD_END_RETRACTED) are queued */
    double new_token_ratio;
};

struct pd_decode_counts {
    int32_t prealloc, transfer, running, draining, ended_unpopped;
};

/* pa (and rc, the prefix cache over pa's pages; NULL or disabled: no reuse) outlive the
 * scheduler. PD_EINVAL, PD_ENOMEM. */
int pd_sched_decode_new(const struct pd_sched_decode_config *cfg, struct pd_page_alloc *pa,
                        struct pd_radix_cache *rc, struct pd_sched_decode **out);
/* Ends whatever is live (pages back) and frees the scheduler. */
void pd_sched_decode_free(struct pd_sched_decode *s);

/* Enters prealloc. max_new_tokens >= 1 counts the first token prefill produces. tokens (borrowed
 * until the end is popped: the prompt, then the outputs the caller writes after it) are what the
 * prefix cache matches and keeps; NULL: this request neither uses nor fills the cache.
 * PD_EINVAL (room live, bad lengths), PD_ERANGE (prompt + output larger than the pool),
 * PD_EFULL (max_queued_requests), PD_ENOMEM. */
int pd_sched_decode_add(struct pd_sched_decode *s, uint64_t room, const int32_t *tokens,
                        int32_t prompt_len, int32_t max_new_tokens, double now_s);
/* The cache hit of room's admission covers at most max_tokens prompt tokens (a prompt computed
 * here whose input logprobs need the positions after them). PD_ENOENT. */
int pd_sched_decode_limit_cache(struct pd_sched_decode *s, uint64_t room, int32_t max_tokens);
/* room is retracted only when no unpinned running request is left (a prompt with images: the
 * decode cannot recompute it). PD_ENOENT. */
int pd_sched_decode_pin(struct pd_sched_decode *s, uint64_t room);
/* room's KV must not enter the cache at its end (a step that wrote it failed). PD_ENOENT. */
int pd_sched_decode_forget(struct pd_sched_decode *s, uint64_t room);
/* The room's done notice: status PD_OK → running (or done at once when max_new_tokens is 1);
 * an error → draining: the daemon force-closes the endpoint, then calls release.
 * PD_ENOENT, PD_EINVAL (not in transfer). */
int pd_sched_decode_transfer_done(struct pd_sched_decode *s, uint64_t room, int status,
                                  double now_s);
/* Timeouts, admissions, page growth and retractions, then this step's batch. The previous batch
 * must have been given back (PD_EINVAL otherwise). */
int pd_sched_decode_step(struct pd_sched_decode *s, double now_s, struct pd_decode_step *st);
/* The batch ran: stopped[i] (EOS, stop string) or max_new_tokens ends batch[i] done. */
int pd_sched_decode_batch_done(struct pd_sched_decode *s, const struct pd_decode_step *st,
                               const bool *stopped, double now_s);
/* Abort at any point; *quiesce when the prefill may still write its pages (transfer queue):
 * the request drains until release. In the running step it ends at batch_done. */
int pd_sched_decode_abort(struct pd_sched_decode *s, uint64_t room, bool *quiesce);
/* The room was given up (timed out waiting for its KV, or aborted) and drains: whatever its
 * transfer brings now, it ends with the reason it was given up for, at release. */
bool pd_sched_decode_given_up(const struct pd_sched_decode *s, uint64_t room);
/* No write can land any more: a draining request ends, its pages go back. */
int pd_sched_decode_release(struct pd_sched_decode *s, uint64_t room);
/* Oldest end: PD_OK, or PD_EAGAIN when none. */
int pd_sched_decode_pop_ended(struct pd_sched_decode *s, struct pd_sched_end *e);

void pd_sched_decode_counts(const struct pd_sched_decode *s, struct pd_decode_counts *c);
/* Recounts page holders and queues; PD_EINTERNAL with a message. For tests. */
int pd_sched_decode_check(const struct pd_sched_decode *s);

#endif
