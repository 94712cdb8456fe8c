/*
 * sched_table.h — the request table the prefill, decode and colocated schedulers are built on:
 * fixed request slots, the room → slot map of live requests, one intrusive FIFO per queued
 * state, and what a request goes through the same way in every scheduler: entering with its
 * page list, being found by room, moving between queues, ending (pages and cache lock back, the
 * room unmapped), its end popped and its slot given back, retraction's victim, and SGLang's
 * new_token_ratio step.
 *
 * Every scheduler's request starts with struct pd__sched_req (its first member); the table
 * allocates the cap requests of req_size bytes and reaches the header of each. States are the
 * scheduler's own small numbers; 0 is always "free". The scheduler names at init which states
 * keep their requests in a FIFO (q[state]) and which one is "ended"; the others (a running step,
 * the half-done prefill) it tracks itself. A slot is in at most one FIFO; the lists hold slot
 * indices and never allocate, and nothing here allocates after pd__sched_table_add's page list
 * (owned by the request until its end is popped).
 */
#ifndef PD_SCHED_TABLE_H
#define PD_SCHED_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/room_table.h"

struct pd_page_alloc;
struct pd_radix_cache;
struct pd_radix_node;
struct pd_sched_end;

/* What every scheduler's request holds; the first member of each scheduler's request struct.
 * Fields a scheduler does not use stay zero (prefill: max_new, n_out; decode: tokens, node,
 * cached_tokens, cache_max, done_tokens, chunk_end). */
struct pd__sched_req {
    uint64_t room;
    const int32_t *tokens; /* borrowed until the end is popped: the prompt (colocated: then
                              the outputs the caller writes) */
    int32_t *pages;        /* [cap_pages] owned, from add until the end is popped */
    int32_t n_pages;       /* pages[0..n_pages) held while admitted (prefill: the prompt's,
                              fixed at add) */
    int32_t cap_pages;
    struct pd_radix_node *node; /* locked prefix-cache node while admitted, or NULL */
    int32_t prompt_len;         /* tokens */
    int32_t max_new;            /* output tokens it may generate */
    int32_t n_out;              /* output tokens so far */
    int32_t cached_tokens;      /* prompt tokens the prefix cache served (the first admission's) */
    int32_t cache_max;          /* prefix-cache hit limit in tokens; -1 none (input logprobs) */
    int32_t done_tokens;        /* prefilled: in the pages, cached or computed */
    int32_t chunk_end;          /* done_tokens after the outstanding step */
    double t_queue;             /* when it entered its current state */
    uint8_t state;
    bool admitted;      /* holds pages[0..n_pages) (one reference each) and the lock on node */
    bool in_batch;      /* in the outstanding step: it ends only at its batch_done */
    bool no_cache;      /* decode: its KV is not to be cached at its end (a step that failed) */
    bool pinned;        /* retracted only when no unpinned running request is left (decode: a
                           prompt with images, which it cannot recompute) */
    int8_t pending_end; /* end reason to apply at batch_done, -1 none */
    int8_t end_reason;
};

struct pd__slot_list {
    int32_t head, tail, n;
};

/* The links of one scheduler's lists (each slot in at most one list); which slots are free is
 * the table's room table. Allocated at creation; linking a slot never allocates. */
struct pd__slot_pool {
    int32_t *prev, *next; /* [cap] list links, -1 at the ends */
};

/* cap slots' links. PD_OK, or PD_ENOMEM with nothing held. */
int pd__slot_pool_init(struct pd__slot_pool *p, int32_t cap);
/* Releases the arrays; safe on a zeroed or already freed pool. */
void pd__slot_pool_free(struct pd__slot_pool *p);

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

#define PD__SCHED_N_STATES 8 /* states a scheduler may have, free included */

struct pd__sched_table {
    int32_t cap; /* slots: live + unpopped ended requests (--max-queued-requests) */
    void *reqs;  /* [cap] requests of req_size bytes, each starting with struct pd__sched_req */
    size_t req_size;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc; /* NULL: no prefix cache */
    int32_t aside;             /* the slot kept outside the FIFOs (half-done prefill), -1 */
    struct pd__slot_pool slots;
    struct pd_room_table rooms; /* free slots; live (not free, not ended) rooms → slots */
    struct pd__slot_list q[PD__SCHED_N_STATES]; /* by state; used for the states in `queued` */
    uint32_t queued;                            /* bit s: state s keeps its requests in q[s] */
    int ended;                                  /* the state of an ended, unpopped request */
};

/* cap slots, all free, and cap zeroed requests of req_size bytes (>= the header); queued: a bit
 * per state with a FIFO (ended's included), never bit 0. pa and rc (NULL: no cache) outlive the
 * table. PD_OK or PD_ENOMEM; pd__sched_table_free is safe after a failure and on a zeroed
 * table. */
int pd__sched_table_init(struct pd__sched_table *t, int32_t cap, uint32_t queued, int ended,
                         size_t req_size, struct pd_page_alloc *pa, struct pd_radix_cache *rc);
/* Ends every live request (aborted: pages and locks back), frees every page list, the requests
 * and the table. */
void pd__sched_table_free(struct pd__sched_table *t);

/* The request in slot. */
static inline struct pd__sched_req *pd__sched_table_req(const struct pd__sched_table *t,
                                                        int32_t slot) {
    return (struct pd__sched_req *)((char *)t->reqs + (size_t)slot * t->req_size);
}

/* The first checks of an add: PD_EINVAL when the room already has a live request. */
int pd__sched_table_vacant(const struct pd__sched_table *t, uint64_t room);
/* A new live request: PD_EFULL when every slot is taken, else a slot mapped to room whose
 * request has room, its page list (cap_pages of them, PD_ENOMEM if it cannot be had), no
 * pending end and no cache limit. Its state is still free: the scheduler fills in the rest,
 * then moves it into its first state. */
int pd__sched_table_add(struct pd__sched_table *t, uint64_t room, int32_t cap_pages, int32_t *slot);
/* The live request of room: PD_OK, or PD_ENOENT with a message. */
int pd__sched_table_find(const struct pd__sched_table *t, uint64_t room, int32_t *slot);

/* The room's prefix-cache hit covers at most max_tokens (< 0: none). PD_OK or PD_ENOENT. */
int pd__sched_table_limit_cache(struct pd__sched_table *t, uint64_t room, int32_t max_tokens);

/* slot from its state to state to, entered at now_s: out of the old FIFO, at the tail of the
 * new one (each when that state has one); no longer the aside slot. */
void pd__sched_table_move(struct pd__sched_table *t, int32_t slot, int to, double now_s);

/* Its pages and its cache lock go back (nothing when not admitted); it holds nothing after. */
void pd__sched_table_drop(struct pd__sched_table *t, struct pd__sched_req *r);
/* The one way a request ends: dropped, out of the room map (the room can come again), the
 * reason recorded, into the ended FIFO until popped. Not while in the outstanding step. */
void pd__sched_table_end(struct pd__sched_table *t, int32_t slot, int reason);

/* The oldest ended request, -1 when none. */
static inline int32_t pd__sched_table_oldest_ended(const struct pd__sched_table *t) {
    return t->q[t->ended].head;
}
/* Its end was popped and what it owned freed: out of the ended FIFO, the slot free again. */
void pd__sched_table_recycle(struct pd__sched_table *t, int32_t slot);
/* Pops the oldest end into *e, frees its page list and recycles its slot: PD_OK, or PD_EAGAIN
 * when none is waiting. */
int pd__sched_table_pop_ended(struct pd__sched_table *t, struct pd_sched_end *e);

/* The request in state running that loses least if retracted (pd__retract_first), -1 when none
 * runs (decode and colocated). */
int32_t pd__sched_table_pick_victim(const struct pd__sched_table *t, int running);

/* SGLang's new_token_ratio (decode and colocated): one step's decay, or after a retraction the
 * estimate over the requests in state running. */
struct pd__token_ratio {
    double value, init, min, decay;
    int32_t retract_decode_steps;
};
static inline struct pd__token_ratio pd__token_ratio_make(double init, double min, double decay,
                                                          int32_t retract_decode_steps) {
    return (struct pd__token_ratio){.value = init,
                                    .init = init,
                                    .min = min,
                                    .decay = decay,
                                    .retract_decode_steps = retract_decode_steps};
}
void pd__sched_table_ratio_step(const struct pd__sched_table *t, int running, bool retracted,
                                struct pd__token_ratio *ratio);

/* check(): counts each slot's state into per_state[PD__SCHED_N_STATES] and each admitted
 * request's pages into holders (pd__holders_new); PD_EINTERNAL when a live request is not
 * mapped to its slot. */
int pd__sched_table_recount(const struct pd__sched_table *t, int32_t *holders, int32_t *per_state);

/* check(): per_state[s] requests are in state s (s < PD__SCHED_N_STATES). True when every
 * FIFO, the free stack and the room map agree with those counts. */
bool pd__sched_table_agrees(const struct pd__sched_table *t, const int32_t *per_state);

#endif
