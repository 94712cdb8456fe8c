/*
 * sched_table.c — the request table of the schedulers (sched_table.h): slot pool, room map and
 * per-state FIFOs, and the steps of a request's life that are the same in every scheduler: add,
 * move, drop and end, pop, the retraction victim and the new_token_ratio step.
 */
#include "common/sched_table.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/sched_common.h"
#include "common/base/status.h"

#include <string.h>

int pd__slot_pool_init(struct pd__slot_pool *p, int32_t cap) {
    p->prev = pd_calloc((size_t)cap, sizeof(int32_t));
    p->next = pd_calloc((size_t)cap, sizeof(int32_t));
    if (!p->prev || !p->next) {
        pd__slot_pool_free(p);
        return PD_ENOMEM;
    }
    return PD_OK;
}

void pd__slot_pool_free(struct pd__slot_pool *p) {
    pd_free(p->prev);
    pd_free(p->next);
    p->prev = p->next = NULL;
}

static bool is_queued(const struct pd__sched_table *t, int state) {
    return (t->queued >> state) & 1u;
}

int pd__sched_table_init(struct pd__sched_table *t, int32_t cap, uint32_t queued, int ended,
                         size_t req_size, struct pd_page_alloc *pa, struct pd_radix_cache *rc) {
    PD_ASSERT(ended > 0 && ended < PD__SCHED_N_STATES && !(queued & 1u) && (queued >> ended) & 1u &&
              queued < (1u << PD__SCHED_N_STATES) && req_size >= sizeof(struct pd__sched_req));
    *t = (struct pd__sched_table){.cap = cap,
                                  .req_size = req_size,
                                  .pa = pa,
                                  .rc = rc,
                                  .aside = -1,
                                  .queued = queued,
                                  .ended = ended};
    for (int s = 0; s < PD__SCHED_N_STATES; s++)
        pd__slot_list_init(&t->q[s]);
    if (pd__slot_pool_init(&t->slots, cap) != PD_OK)
        return PD_ENOMEM;
    if (pd_room_table_init(&t->rooms, cap) != PD_OK)
        goto fail_rooms;
    if (!(t->reqs = pd_calloc((size_t)cap, req_size)))
        goto fail_reqs;
    return PD_OK;

fail_reqs:
    pd_room_table_free(&t->rooms);
fail_rooms:
    pd__slot_pool_free(&t->slots);
    return PD_ENOMEM;
}

void pd__sched_table_free(struct pd__sched_table *t) {
    for (int32_t i = 0; t->reqs && i < t->cap; i++) {
        struct pd__sched_req *r = pd__sched_table_req(t, i);
        r->in_batch = false;
        if (r->state != 0 && r->state != t->ended)
            pd__sched_table_end(t, i, PD_END_ABORTED);
        pd_free(r->pages);
        r->pages = NULL;
    }
    pd_free(t->reqs);
    t->reqs = NULL;
    pd_room_table_free(&t->rooms);
    pd__slot_pool_free(&t->slots);
}

int pd__sched_table_vacant(const struct pd__sched_table *t, uint64_t room) {
    if (pd_room_table_get(&t->rooms, room) >= 0)
        return pd_errorf(PD_EINVAL, "room %llu already has a live request",
                         (unsigned long long)room);
    return PD_OK;
}

int pd__sched_table_add(struct pd__sched_table *t, uint64_t room, int32_t cap_pages,
                        int32_t *slot) {
    if (pd_room_table_full(&t->rooms))
        return pd_errorf(PD_EFULL, "room %llu: %d requests queued already",
                         (unsigned long long)room, (int)t->cap);
    int32_t *pages = pd_malloc((size_t)cap_pages * sizeof(int32_t));
    if (!pages)
        return pd_error_wrap(PD_ENOMEM, "room %llu: page list", (unsigned long long)room);
    int rc = pd_room_table_take(&t->rooms, room, slot);
    PD_ASSERT(rc == PD_OK); /* vacant checked, a slot free */
    struct pd__sched_req *r = pd__sched_table_req(t, *slot);
    memset(r, 0, t->req_size);
    r->room = room;
    r->pages = pages;
    r->cap_pages = cap_pages;
    r->cache_max = -1;
    r->pending_end = -1;
    return PD_OK;
}

int pd__sched_table_find(const struct pd__sched_table *t, uint64_t room, int32_t *slot) {
    *slot = pd_room_table_get(&t->rooms, room);
    if (*slot < 0)
        return pd_errorf(PD_ENOENT, "room %llu: no live request", (unsigned long long)room);
    return PD_OK;
}

int pd__sched_table_limit_cache(struct pd__sched_table *t, uint64_t room, int32_t max_tokens) {
    int32_t slot;
    int rc = pd__sched_table_find(t, room, &slot);
    if (rc)
        return rc;
    pd__sched_table_req(t, slot)->cache_max = max_tokens < 0 ? 0 : max_tokens;
    return PD_OK;
}

void pd__sched_table_move(struct pd__sched_table *t, int32_t slot, int to, double now_s) {
    struct pd__sched_req *r = pd__sched_table_req(t, slot);
    if (t->aside == slot)
        t->aside = -1;
    r->t_queue = now_s;
    if (is_queued(t, r->state))
        pd__slot_list_remove(&t->q[r->state], &t->slots, slot);
    r->state = (uint8_t)to;
    if (is_queued(t, to))
        pd__slot_list_push(&t->q[to], &t->slots, slot);
}

void pd__sched_table_drop(struct pd__sched_table *t, struct pd__sched_req *r) {
    if (r->admitted)
        pd_page_alloc_put(t->pa, r->pages, r->n_pages);
    if (t->rc)
        pd_radix_cache_unlock(t->rc, r->node);
    r->node = NULL;
    r->admitted = false;
    r->n_pages = 0;
    r->done_tokens = 0;
}

void pd__sched_table_end(struct pd__sched_table *t, int32_t slot, int reason) {
    struct pd__sched_req *r = pd__sched_table_req(t, slot);
    PD_ASSERT(!r->in_batch && r->state != t->ended && r->state != 0);
    pd__sched_table_drop(t, r);
    pd_room_table_unmap(&t->rooms, r->room);
    r->end_reason = (int8_t)reason;
    pd__sched_table_move(t, slot, t->ended, r->t_queue);
}

void pd__sched_table_recycle(struct pd__sched_table *t, int32_t slot) {
    pd__slot_list_remove(&t->q[t->ended], &t->slots, slot);
    pd_room_table_put(&t->rooms, slot);
}

int pd__sched_table_pop_ended(struct pd__sched_table *t, struct pd_sched_end *e) {
    int32_t slot = pd__sched_table_oldest_ended(t);
    if (slot < 0)
        return PD_EAGAIN;
    struct pd__sched_req *r = pd__sched_table_req(t, slot);
    *e = (struct pd_sched_end){.room = r->room,
                               .reason = r->end_reason,
                               .cached_tokens = r->cached_tokens,
                               .n_output = r->n_out};
    pd_free(r->pages);
    memset(r, 0, t->req_size); /* state free */
    pd__sched_table_recycle(t, slot);
    return PD_OK;
}

int32_t pd__sched_table_pick_victim(const struct pd__sched_table *t, int running) {
    int32_t best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) /* unpinned first, pinned if need be */
        for (int32_t i = t->q[running].head; i >= 0; i = t->slots.next[i]) {
            const struct pd__sched_req *r = pd__sched_table_req(t, i),
                                       *b = pd__sched_table_req(t, best >= 0 ? best : i);
            if (r->pinned && pass == 0)
                continue;
            if (best < 0 || pd__retract_first(r->n_out, r->prompt_len, b->n_out, b->prompt_len))
                best = i;
        }
    return best;
}

void pd__sched_table_ratio_step(const struct pd__sched_table *t, int running, bool retracted,
                                struct pd__token_ratio *ratio) {
    if (!retracted) {
        ratio->value = pd__ratio_decay(ratio->value, ratio->min, ratio->decay);
        return;
    }
    int64_t decoded = 0, max_new = 0;
    for (int32_t i = t->q[running].head; i >= 0; i = t->slots.next[i]) {
        decoded += pd__sched_table_req(t, i)->n_out;
        max_new += pd__sched_table_req(t, i)->max_new;
    }
    ratio->value = pd__ratio_after_retract(decoded, max_new, t->q[running].n,
                                           ratio->retract_decode_steps, ratio->init, ratio->min);
}

int pd__sched_table_recount(const struct pd__sched_table *t, int32_t *holders, int32_t *per_state) {
    for (int32_t i = 0; i < t->cap; i++) {
        const struct pd__sched_req *r = pd__sched_table_req(t, i);
        per_state[r->state]++;
        if (r->state != 0 && r->state != t->ended && pd_room_table_get(&t->rooms, r->room) != i)
            return pd_errorf(PD_EINTERNAL, "room %llu: not mapped to its slot",
                             (unsigned long long)r->room);
        if (r->admitted)
            pd__holders_add(holders, r->pages, r->n_pages);
    }
    return PD_OK;
}

bool pd__sched_table_agrees(const struct pd__sched_table *t, const int32_t *per_state) {
    for (int s = 1; s < PD__SCHED_N_STATES; s++)
        if (is_queued(t, s) && per_state[s] != t->q[s].n)
            return false;
    return per_state[0] == t->rooms.n_free &&
           t->rooms.map.n == t->cap - per_state[0] - per_state[t->ended];
}
