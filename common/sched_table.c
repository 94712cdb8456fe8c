/*
 * sched_table.c — the request table of the schedulers (sched_table.h): slot pool, room map and
 * per-state FIFOs, and the steps of a request's life that are the same in every scheduler.
 */
#include "common/sched_table.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

int pd__slot_pool_init(struct pd__slot_pool *p, int32_t cap) {
    p->prev = pd_calloc((size_t)cap, sizeof(int32_t));
    p->next = pd_calloc((size_t)cap, sizeof(int32_t));
    p->free = pd_calloc((size_t)cap, sizeof(int32_t));
    if (!p->prev || !p->next || !p->free) {
        pd__slot_pool_free(p);
        return PD_ENOMEM;
    }
    for (int32_t i = 0; i < cap; i++)
        p->free[i] = cap - 1 - i; /* slot 0 first */
    p->n_free = cap;
    return PD_OK;
}

void pd__slot_pool_free(struct pd__slot_pool *p) {
    pd_free(p->prev);
    pd_free(p->next);
    pd_free(p->free);
    p->prev = p->next = p->free = NULL;
    p->n_free = 0;
}

static bool is_queued(const struct pd__sched_table *t, int state) {
    return (t->queued >> state) & 1u;
}

int pd__sched_table_init(struct pd__sched_table *t, int32_t cap, uint32_t queued, int ended) {
    PD_ASSERT(ended > 0 && ended < PD__SCHED_N_STATES && !(queued & 1u) && (queued >> ended) & 1u &&
              queued < (1u << PD__SCHED_N_STATES));
    *t = (struct pd__sched_table){.cap = cap, .queued = queued, .ended = ended};
    for (int s = 0; s < PD__SCHED_N_STATES; s++)
        pd__slot_list_init(&t->q[s]);
    if (pd__slot_pool_init(&t->slots, cap) != PD_OK)
        return PD_ENOMEM;
    if (pd_room_map_init(&t->rooms, cap) != PD_OK) {
        pd__slot_pool_free(&t->slots);
        return PD_ENOMEM;
    }
    return PD_OK;
}

void pd__sched_table_free(struct pd__sched_table *t) {
    pd_room_map_free(&t->rooms);
    pd__slot_pool_free(&t->slots);
}

int pd__sched_table_vacant(const struct pd__sched_table *t, uint64_t room) {
    if (pd_room_map_get(&t->rooms, room) >= 0)
        return pd_errorf(PD_EINVAL, "room %llu already has a live request",
                         (unsigned long long)room);
    return PD_OK;
}

int pd__sched_table_add(struct pd__sched_table *t, uint64_t room, int32_t n_pages, int32_t **pages,
                        int32_t *slot) {
    if (t->slots.n_free == 0)
        return pd_errorf(PD_EFULL, "room %llu: %d requests queued already",
                         (unsigned long long)room, (int)t->cap);
    *pages = pd_malloc((size_t)n_pages * sizeof(int32_t));
    if (!*pages)
        return pd_error_wrap(PD_ENOMEM, "room %llu: page list", (unsigned long long)room);
    *slot = pd__slot_pool_take(&t->slots);
    int rc = pd_room_map_put(&t->rooms, room, *slot);
    PD_ASSERT(rc == PD_OK); /* vacant checked; the map is as large as the slot array */
    return PD_OK;
}

int pd__sched_table_find(const struct pd__sched_table *t, uint64_t room, int32_t *slot) {
    *slot = pd_room_map_get(&t->rooms, room);
    if (*slot < 0)
        return pd_errorf(PD_ENOENT, "room %llu: no live request", (unsigned long long)room);
    return PD_OK;
}

void pd__sched_table_move(struct pd__sched_table *t, int32_t slot, uint8_t *state, int to) {
    if (is_queued(t, *state))
        pd__slot_list_remove(&t->q[*state], &t->slots, slot);
    *state = (uint8_t)to;
    if (is_queued(t, to))
        pd__slot_list_push(&t->q[to], &t->slots, slot);
}

void pd__sched_table_recycle(struct pd__sched_table *t, int32_t slot) {
    pd__slot_list_remove(&t->q[t->ended], &t->slots, slot);
    pd__slot_pool_put(&t->slots, slot);
}

bool pd__sched_table_agrees(const struct pd__sched_table *t, const int32_t *per_state) {
    for (int s = 1; s < PD__SCHED_N_STATES; s++)
        if (is_queued(t, s) && per_state[s] != t->q[s].n)
            return false;
    return per_state[0] == t->slots.n_free &&
           t->rooms.n == t->cap - per_state[0] - per_state[t->ended];
}
