/*
 * sched_common.c — the slot pool both schedulers build their request queues on (sched_common.h).
 */
#include "common/sched_common.h"
#include "common/alloc.h"
#include "common/status.h"

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
