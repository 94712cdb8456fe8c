/*
 * room_map.h — bootstrap room id → request slot, the index both schedulers use to find a live
 * request from an event (transfer done, abort) in O(1). Fixed capacity chosen at creation (the
 * schedulers bound their live requests), so inserting never allocates: nothing on a step path
 * calls malloc. Open addressing with linear probing and backward-shift deletion, so there are no
 * tombstones and lookups stay short however long the daemon runs. A room maps to at most one slot.
 */
#ifndef PD_ROOM_MAP_H
#define PD_ROOM_MAP_H

#include <stdint.h>

struct pd_room_map {
    uint64_t *rooms; /* [cap] */
    int32_t *slots;  /* [cap], -1 = empty */
    uint32_t mask;   /* cap - 1, cap a power of two >= 2 * max_entries */
    int32_t n;
    int32_t max_entries;
};

/* PD_EINVAL (max_entries <= 0 or too large), PD_ENOMEM. */
int pd_room_map_init(struct pd_room_map *m, int32_t max_entries);
void pd_room_map_free(struct pd_room_map *m);
/* PD_OK; PD_EINVAL when the room is already mapped; PD_EFULL at max_entries. */
int pd_room_map_put(struct pd_room_map *m, uint64_t room, int32_t slot);
/* The slot, or -1. */
int32_t pd_room_map_get(const struct pd_room_map *m, uint64_t room);
/* PD_OK or PD_ENOENT. */
int pd_room_map_del(struct pd_room_map *m, uint64_t room);

#endif
