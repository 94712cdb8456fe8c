/*
 * sched_table.h — the request table the prefill, decode and colocated schedulers are built on:
 * fixed request slots, the room → slot map of live requests, and one intrusive FIFO per queued
 * state. What a request goes through the same way in every scheduler lives here: entering with
 * its page list, being found by room, moving between queues, leaving the map when it ends, and
 * giving its slot back once its end is popped.
 *
 * States are the scheduler's own small numbers; 0 is always "free". The scheduler names at init
 * which states keep their requests in a FIFO (q[state]) and which one is "ended"; the others (a
 * running step, the half-done prefill) it tracks itself. The state byte stays in the scheduler's
 * request struct and is passed by pointer, so the policy code reads it directly. A slot is in at
 * most one FIFO; the lists hold slot indices and never allocate, and nothing here allocates after
 * pd__sched_table_add's page list (the page list's owner is the scheduler's request).
 */
#ifndef PD_SCHED_TABLE_H
#define PD_SCHED_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/base/room_map.h"

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

#define PD__SCHED_N_STATES 8 /* states a scheduler may have, free included */

struct pd__sched_table {
    int32_t cap; /* slots: live + unpopped ended requests (--max-queued-requests) */
    struct pd__slot_pool slots;
    struct pd_room_map rooms;                   /* live (not free, not ended): room → slot */
    struct pd__slot_list q[PD__SCHED_N_STATES]; /* by state; used for the states in `queued` */
    uint32_t queued;                            /* bit s: state s keeps its requests in q[s] */
    int ended;                                  /* the state of an ended, unpopped request */
};

/* cap slots, all free; queued: a bit per state with a FIFO (ended's included), never bit 0.
 * PD_OK or PD_ENOMEM; pd__sched_table_free is safe after a failure and on a zeroed table. */
int pd__sched_table_init(struct pd__sched_table *t, int32_t cap, uint32_t queued, int ended);
void pd__sched_table_free(struct pd__sched_table *t);

/* The first checks of an add: PD_EINVAL when the room already has a live request. */
int pd__sched_table_vacant(const struct pd__sched_table *t, uint64_t room);
/* A new live request: PD_EFULL when every slot is taken, else its page list
 * (*pages: n_pages int32_t, PD_ENOMEM if it cannot be had) and a slot mapped to room. The slot's
 * state is still free: the scheduler fills its request, then moves it into its first queue. */
int pd__sched_table_add(struct pd__sched_table *t, uint64_t room, int32_t n_pages, int32_t **pages,
                        int32_t *slot);
/* The live request of room: PD_OK, or PD_ENOENT with a message. */
int pd__sched_table_find(const struct pd__sched_table *t, uint64_t room, int32_t *slot);

/* slot from *state to state to: out of the old FIFO, at the tail of the new one (each when that
 * state has one), and *state = to. */
void pd__sched_table_move(struct pd__sched_table *t, int32_t slot, uint8_t *state, int to);

/* The oldest ended request, -1 when none. */
static inline int32_t pd__sched_table_oldest_ended(const struct pd__sched_table *t) {
    return t->q[t->ended].head;
}
/* Its end was popped and what it owned freed: out of the ended FIFO, the slot free again. */
void pd__sched_table_recycle(struct pd__sched_table *t, int32_t slot);

/* check(): per_state[s] requests are in state s (s < PD__SCHED_N_STATES). True when every
 * FIFO, the free stack and the room map agree with those counts. */
bool pd__sched_table_agrees(const struct pd__sched_table *t, const int32_t *per_state);

#endif
