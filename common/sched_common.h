/*
 * sched_common.h — what both schedulers share: how a request's end is reported, and the
 * intrusive FIFO of request slots their queues are made of.
 *
 * A request ends exactly once; its end waits in the scheduler's ended queue until the daemon pops
 * it (answers the client, logs "room=... end=timeout"), and only then is its slot reused. Its room
 * is unmapped at the end itself, so a retry with the same room may arrive before the pop.
 * Slot lists hold indices into the scheduler's slot array, each slot in at most one list; they
 * never allocate. pd__slot_pool_init/free are in sched_common.c.
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

struct pd__slot_list {
    int32_t head, tail, n;
};

/* The request slots of one scheduler: the links of its lists (each slot in at most one list)
 * and a stack of the free ones. Allocated at creation; taking, returning and linking a slot
 * never allocates. */
struct pd__slot_pool {
    int32_t *prev, *next; /* [cap] list links, -1 at the ends */
    int32_t *free;        /* [cap] stack of free slots, the top taken first */
    int32_t n_free;
};

/* cap slots, all free, slot 0 taken first. PD_OK, or PD_ENOMEM with nothing held. */
int pd__slot_pool_init(struct pd__slot_pool *p, int32_t cap);
/* Releases the arrays; safe on a zeroed or already freed pool. */
void pd__slot_pool_free(struct pd__slot_pool *p);

/* A free slot; the caller checked n_free > 0. */
static inline int32_t pd__slot_pool_take(struct pd__slot_pool *p) {
    return p->free[--p->n_free];
}

static inline void pd__slot_pool_put(struct pd__slot_pool *p, int32_t s) {
    p->free[p->n_free++] = s;
}

static inline void pd__slot_list_init(struct pd__slot_list *l) {
    l->head = l->tail = -1;
    l->n = 0;
}

static inline void pd__slot_list_push(struct pd__slot_list *l, struct pd__slot_pool *p, int32_t s) {
    int32_t *prev = p->prev, *next = p->next;
    prev[s] = l->tail;
    next[s] = -1;
    if (l->tail >= 0)
        next[l->tail] = s;
    else
        l->head = s;
    l->tail = s;
    l->n++;
}

/* At the head: a request that goes back to the front of its queue (colocated retraction). */
static inline void pd__slot_list_push_front(struct pd__slot_list *l, struct pd__slot_pool *p,
                                            int32_t s) {
    int32_t *prev = p->prev, *next = p->next;
    next[s] = l->head;
    prev[s] = -1;
    if (l->head >= 0)
        prev[l->head] = s;
    else
        l->tail = s;
    l->head = s;
    l->n++;
}

static inline void pd__slot_list_remove(struct pd__slot_list *l, struct pd__slot_pool *p,
                                        int32_t s) {
    int32_t *prev = p->prev, *next = p->next;
    if (prev[s] >= 0)
        next[prev[s]] = next[s];
    else
        l->head = next[s];
    if (next[s] >= 0)
        prev[next[s]] = prev[s];
    else
        l->tail = prev[s];
    prev[s] = next[s] = -1;
    l->n--;
}

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
