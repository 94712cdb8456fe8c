/*
 * sched_common.h — what the schedulers share beyond their request table: how a request's end is
 * reported, their configuration checks, SGLang's new_token_ratio, and check()'s page recount.
 *
 * A request ends exactly once; its end waits in the scheduler's ended queue until the daemon pops
 * it (answers the client, logs "room=... end=timeout"), and only then is its slot reused. Its room
 * is unmapped at the end itself, so a retry with the same room may arrive before the pop.
 * The request table their queues are made of (slots, room map, per-state FIFOs) is
 * sched_table.h.
 *
 * Also the pieces of SGLang's PrefillAdder that the prefill and the colocated schedulers share
 * (pd__chunk_len, pd__prefix_admit, pd__prefix_commit): how much of a prompt fits the step's
 * token budget, and taking a prompt's pages with its prefix-cache hit.
 */
#ifndef PD_SCHED_COMMON_H
#define PD_SCHED_COMMON_H

#include <stdbool.h>
#include <stdint.h>

struct pd_page_alloc;
struct pd_radix_cache;
struct pd_radix_node;

enum pd_sched_end_reason {
    PD_END_DONE = 0,      /* prefill: KV transferred; decode: generation finished */
    PD_END_ABORTED = 1,   /* user or peer abort */
    PD_END_TIMEOUT = 2,   /* --bootstrap-timeout (prefill) or --waiting-timeout (decode) */
    PD_END_FAILED = 3,    /* the KV transfer failed */
    PD_END_RETRACTED = 4, /* decode: pages taken back; the daemon recomputes it locally */
};

static inline const char *pd_sched_end_reason_str(int r) {
    switch (r) {
    case PD_END_DONE: return "done";
    case PD_END_ABORTED: return "aborted";
    case PD_END_TIMEOUT: return "timeout";
    case PD_END_FAILED: return "failed";
    case PD_END_RETRACTED: return "retracted";
    default: return "unknown";
    }
}

struct pd_sched_end {
    uint64_t room;
    int reason;            /* enum pd_sched_end_reason */
    int32_t cached_tokens; /* prefill: prompt tokens served from the prefix cache */
    int32_t n_output;      /* decode: tokens generated before the end */
};

/* ---- configuration checks of pd_sched_*_new ---- */

/* A step's prompt-token budget (prefill and colocated): max_prefill_tokens, lowered to
 * chunked_prefill_size when that is > 0; either <= 0 means no cap from it. PD_EINVAL when the
 * budget is smaller than a page: a chunk is cut at page boundaries. */
int pd__prefill_budget(int32_t page_size, int32_t chunked_prefill_size, int32_t max_prefill_tokens,
                       int32_t *budget);

/* The decode and colocated schedulers' sizes and new_token_ratio settings; PD_EINVAL with a
 * message naming the scheduler (who) unless the sizes are positive, 0 <= min <= init <= 1,
 * decay >= 0 and retract_decode_steps >= 0. */
int pd__check_decode_config(const char *who, int32_t page_size, int32_t max_running,
                            int32_t max_queued, double init_ratio, double min_ratio,
                            double ratio_decay, int32_t retract_decode_steps);

/* The pages that hold the KV of `tokens` positions. */
static inline int32_t pd__pages_for(int64_t tokens, int32_t page_size) {
    return (int32_t)((tokens + page_size - 1) / page_size);
}

/* A generating request's page list (decode and colocated): *cap_pages for prompt + output but
 * the last token (never fed back, so its KV is never written). PD_EINVAL for lengths <= 0,
 * PD_ERANGE when that is more than the pool holds. */
int pd__generation_pages(const struct pd_page_alloc *pa, int32_t page_size, uint64_t room,
                         int32_t prompt_len, int32_t max_new_tokens, int32_t *cap_pages);

/* ---- SGLang's new_token_ratio (decode and colocated schedulers) ---- */

/* One step's decay towards min. */
static inline double pd__ratio_decay(double ratio, double min, double decay) {
    return ratio - decay > min ? ratio - decay : min;
}

/* After a retraction: (tokens decoded + retract_decode_steps per request) / max_new_tokens over
 * the requests still running, within [min, 1]; init when none runs. */
static inline double pd__ratio_after_retract(int64_t decoded, int64_t max_new, int32_t n_running,
                                             int32_t retract_decode_steps, double init,
                                             double min) {
    double est =
        max_new ? (double)(decoded + (int64_t)retract_decode_steps * n_running) / (double)max_new
                : init;
    if (est > 1.0)
        est = 1.0;
    return est < min ? min : est;
}

/* A running request's page list pages[0..*n_pages) grows a page at a time (decode and
 * colocated): takes pages next to its last one until they cover KV position pos. PD_OK once
 * covered; PD_EAGAIN when the pool has no free page first (the caller makes one free: cache
 * eviction, a retraction, and calls again). Never past cap_pages (asserted: sized at add). */
int pd__cover_position(struct pd_page_alloc *pa, int32_t page_size, int32_t pos, int32_t *pages,
                       int32_t *n_pages, int32_t cap_pages);

/* SGLang's retraction order: a running request with n_out tokens generated and a prompt of
 * prompt_len loses less than the one with b_out, b_prompt when it generated fewer tokens, or as
 * many with a longer prompt (freeing most). */
static inline bool pd__retract_first(int32_t n_out, int32_t prompt_len, int32_t b_out,
                                     int32_t b_prompt) {
    return n_out < b_out || (n_out == b_out && prompt_len > b_prompt);
}

/* SGLang's values: init 0.7, min 0.1, (0.7 - 0.1) / 600 decay per step, 20 retract steps. */
void pd__ratio_defaults(double *init_ratio, double *min_ratio, double *ratio_decay,
                        int32_t *retract_decode_steps);

/* ---- pd_sched_*_check: every page's holders recounted ---- */

/* The allocator's (and the prefix cache's, rc may be NULL) own checks, then *holders: a zeroed
 * [pool pages] array for the caller to count its live requests' references into (pd__holders_add).
 * PD_OK, their error, or PD_ENOMEM. */
int pd__holders_new(struct pd_page_alloc *pa, struct pd_radix_cache *rc, int32_t **holders);

static inline void pd__holders_add(int32_t *holders, const int32_t *pages, int32_t n_pages) {
    for (int32_t p = 0; p < n_pages; p++)
        holders[pages[p]]++;
}

/* Every page's reference count equals its request holders plus the cache's reference, and the
 * cache holds as many pages as are marked cached. PD_OK or PD_EINTERNAL naming the first page
 * that disagrees. The caller frees holders. */
int pd__holders_check(struct pd_page_alloc *pa, struct pd_radix_cache *rc, int32_t *holders);

/* ---- PrefillAdder pieces ---- */

/* Tokens of a prompt's `rest` to run with `rem` budget left: all of it, a page-aligned cut, or 0
 * (does not fit). *stop: nothing may follow in this batch (after a cut, or a prompt over the cap
 * running alone because chunking is off and it could never fit otherwise). */
int32_t pd__chunk_len(int32_t page_size, bool unchunked, int32_t rest, int32_t rem,
                      bool batch_empty, bool *stop);

/* Admission of a prompt tokens[0..n_tokens) whose KV needs pages[0..n_pages): the prefix-cache
 * hit (whole pages, the last token always computed: its logits give the first output token),
 * the first chunk's length, and the uncached pages. */
struct pd__prefix_admit {
    /* in */
    const int32_t *tokens;
    int32_t n_tokens, n_pages;
    int32_t *pages;     /* [n_pages] filled on success: cached prefix (referenced), then new */
    int32_t rem;        /* budget left in the step */
    bool batch_empty;   /* nothing in the step yet */
    int32_t reserve;    /* pages that must still be free after taking (output reservation) */
    bool cache_limited; /* the prefix-cache hit covers at most cache_max tokens: a request with
                           input logprobs needs the logits of the positions after them */
    int32_t cache_max;
    /* out */
    int32_t len;                /* first chunk */
    bool stop;                  /* nothing may follow in this batch */
    int32_t cached_pages;       /* pages[0..cached_pages) came from the cache */
    struct pd_radix_node *node; /* locked; the caller unlocks it when the request ends */
};

/* Takes the pages (evicting unlocked cache entries when short) and locks the cache hit. false:
 * it does not fit the budget or the pool, nothing is held. rc may be NULL (no cache). */
bool pd__prefix_admit(struct pd_page_alloc *pa, struct pd_radix_cache *rc, int32_t page_size,
                      bool unchunked, struct pd__prefix_admit *a);

/* A chunk ran: tokens[0..done_tokens) are in pages. Their whole pages enter the cache and the
 * request's lock moves from *node to the deepest cached node. */
void pd__prefix_commit(struct pd_radix_cache *rc, const int32_t *tokens, int32_t done_tokens,
                       int32_t page_size, const int32_t *pages, struct pd_radix_node **node);

#endif
