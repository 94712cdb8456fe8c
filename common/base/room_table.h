/*
 * room_table.h — the one room → slot table of the daemon (its request table), the compute
 * thread (its request registry) and the schedulers (their request slots): a room map
 * (room_map.h) over a fixed number of slots and the stack of the free ones. Sized at creation;
 * taking and giving back a slot never allocates. Slot 0 is taken first.
 *
 * A slot is taken with its room (pd_room_table_take) and given back in one step
 * (pd_room_table_release), or in two: the room forgotten first (pd_room_table_unmap: a
 * scheduler's ended request keeps its slot until its end is popped, while a retry with the same
 * room may already arrive) and the slot later (pd_room_table_put).
 */
#ifndef PD_ROOM_TABLE_H
#define PD_ROOM_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/base/room_map.h"

struct pd_room_table {
    struct pd_room_map map; /* live rooms → their slots */
    int32_t *free;          /* [cap] stack of free slots, the top taken first */
    int32_t n_free, cap;
};

/* cap slots, all free. PD_OK, PD_EINVAL (cap <= 0), PD_ENOMEM; free is safe after a failure and
 * on a zeroed table. */
int pd_room_table_init(struct pd_room_table *t, int32_t cap);
void pd_room_table_free(struct pd_room_table *t);

/* room's slot, or -1. */
static inline int32_t pd_room_table_get(const struct pd_room_table *t, uint64_t room) {
    return pd_room_map_get(&t->map, room);
}

static inline bool pd_room_table_full(const struct pd_room_table *t) {
    return t->n_free == 0;
}

/* A free slot mapped to room. PD_OK; PD_EINVAL when room is live already; PD_EFULL when no slot
 * is free (no message set: the caller says whose table it is). */
int pd_room_table_take(struct pd_room_table *t, uint64_t room, int32_t *slot);
/* room forgotten (it must be live); its slot stays taken until pd_room_table_put. */
void pd_room_table_unmap(struct pd_room_table *t, uint64_t room);
/* slot (taken, its room unmapped) free again. */
void pd_room_table_put(struct pd_room_table *t, int32_t slot);
/* Both: room forgotten, its slot free. */
void pd_room_table_release(struct pd_room_table *t, uint64_t room, int32_t slot);

#endif
