/*
 * room_table.c — room → slot over a fixed slot count (room_table.h).
 */
#include "common/base/room_table.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

int pd_room_table_init(struct pd_room_table *t, int32_t cap) {
    *t = (struct pd_room_table){0};
    if (cap <= 0)
        return PD_EINVAL;
    int rc = pd_room_map_init(&t->map, cap);
    if (rc)
        return rc;
    if (!(t->free = pd_calloc((size_t)cap, sizeof(int32_t)))) {
        pd_room_map_free(&t->map);
        return PD_ENOMEM;
    }
    for (int32_t i = 0; i < cap; i++)
        t->free[i] = cap - 1 - i;
    t->n_free = t->cap = cap;
    return PD_OK;
}

void pd_room_table_free(struct pd_room_table *t) {
    pd_room_map_free(&t->map);
    pd_free(t->free);
    *t = (struct pd_room_table){0};
}

int pd_room_table_take(struct pd_room_table *t, uint64_t room, int32_t *slot) {
    if (pd_room_map_get(&t->map, room) >= 0)
        return PD_EINVAL;
    if (t->n_free == 0)
        return PD_EFULL;
    *slot = t->free[--t->n_free];
    int rc = pd_room_map_put(&t->map, room, *slot);
    PD_ASSERT(rc == PD_OK); /* the map holds as many rooms as there are slots */
    return PD_OK;
}

void pd_room_table_unmap(struct pd_room_table *t, uint64_t room) {
    int rc = pd_room_map_del(&t->map, room);
    PD_ASSERT(rc == PD_OK);
}

void pd_room_table_put(struct pd_room_table *t, int32_t slot) {
    PD_ASSERT(slot >= 0 && slot < t->cap && t->n_free < t->cap);
    t->free[t->n_free++] = slot;
}

void pd_room_table_release(struct pd_room_table *t, uint64_t room, int32_t slot) {
    pd_room_table_unmap(t, room);
    pd_room_table_put(t, slot);
}
