/*
 * room_map.c — linear-probing hash of 64-bit room ids. Rooms are drawn uniformly by the router,
 * but a test or a hostile client may pick sequential ones, so the id is mixed (splitmix64
 * finalizer) before probing. Deletion shifts later entries of the cluster back instead of leaving
 * tombstones.
 */
#include "common/base/room_map.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

static uint32_t home(const struct pd_room_map *m, uint64_t room) {
    uint64_t z = room + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31)) & m->mask;
}

int pd_room_map_init(struct pd_room_map *m, int32_t max_entries) {
    *m = (struct pd_room_map){0};
    if (max_entries <= 0 || max_entries > (1 << 28))
        return pd_errorf(PD_EINVAL, "room map for %d requests", (int)max_entries);
    uint32_t cap = 4;
    while (cap < 2u * (uint32_t)max_entries)
        cap *= 2;
    m->rooms = pd_calloc(cap, sizeof(uint64_t));
    m->slots = pd_malloc((size_t)cap * sizeof(int32_t));
    if (!m->rooms || !m->slots) {
        pd_free(m->rooms);
        pd_free(m->slots);
        *m = (struct pd_room_map){0};
        return pd_error_wrap(PD_ENOMEM, "room map for %d requests", (int)max_entries);
    }
    for (uint32_t i = 0; i < cap; i++)
        m->slots[i] = -1;
    m->mask = cap - 1;
    m->max_entries = max_entries;
    return PD_OK;
}

void pd_room_map_free(struct pd_room_map *m) {
    pd_free(m->rooms);
    pd_free(m->slots);
    *m = (struct pd_room_map){0};
}

int pd_room_map_put(struct pd_room_map *m, uint64_t room, int32_t slot) {
    uint32_t i = home(m, room);
    for (; m->slots[i] >= 0; i = (i + 1) & m->mask)
        if (m->rooms[i] == room)
            return pd_errorf(PD_EINVAL, "room %llu already has a live request",
                             (unsigned long long)room);
    if (m->n >= m->max_entries)
        return pd_errorf(PD_EFULL, "room map full (%d requests)", (int)m->max_entries);
    m->rooms[i] = room;
    m->slots[i] = slot;
    m->n++;
    return PD_OK;
}

int32_t pd_room_map_get(const struct pd_room_map *m, uint64_t room) {
    if (!m->slots)
        return -1;
    for (uint32_t i = home(m, room); m->slots[i] >= 0; i = (i + 1) & m->mask)
        if (m->rooms[i] == room)
            return m->slots[i];
    return -1;
}

int pd_room_map_del(struct pd_room_map *m, uint64_t room) {
    uint32_t i = home(m, room);
    while (m->slots[i] >= 0 && m->rooms[i] != room)
        i = (i + 1) & m->mask;
    if (m->slots[i] < 0)
        return PD_ENOENT;
    /* backward shift: move each later entry of the cluster into the hole if its home allows */
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & m->mask; m->slots[j] >= 0; j = (j + 1) & m->mask) {
        uint32_t h = home(m, m->rooms[j]);
        /* j may fill the hole when h is not cyclically in (hole, j] */
        if (((j - h) & m->mask) >= ((j - hole) & m->mask)) {
            m->rooms[hole] = m->rooms[j];
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole] = -1;
    m->n--;
    return PD_OK;
}
