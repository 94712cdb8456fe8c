/*
 * xfer_rooms.c — the transfer engine's rooms: the table (open addressing by room id), a room's
 * end, and the room calls of xfer.h (add, expect, release, abort, live).
 */
#include "common/xfer_internal.h"

/* ---- room table ---- */

static size_t room_hash(uint64_t id, size_t n_buckets) {
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (size_t)id & (n_buckets - 1);
}

struct room *pd__xfer_room_find(const pd_xfer_t *x, uint64_t id) {
    for (struct room *r = x->buckets[room_hash(id, x->n_buckets)]; r; r = r->hnext)
        if (r->id == id)
            return r;
    return NULL;
}

static int room_table_grow(pd_xfer_t *x) {
    size_t nb = x->n_buckets * 2;
    struct room **b = pd_calloc(nb, sizeof(*b));
    if (!b)
        return pd_error_wrap(PD_ENOMEM, "growing the room table to %zu buckets", nb);
    for (size_t i = 0; i < x->n_buckets; i++) {
        struct room *r = x->buckets[i];
        while (r) {
            struct room *next = r->hnext;
            size_t h = room_hash(r->id, nb);
            r->hnext = b[h];
            b[h] = r;
            r = next;
        }
    }
    pd_free(x->buckets);
    x->buckets = b;
    x->n_buckets = nb;
    return PD_OK;
}

static int room_new(pd_xfer_t *x, struct pd_xfer_peer *p, uint64_t id, enum room_role role,
                    void *user, struct room **out) {
    if (pd__xfer_room_find(x, id))
        return pd_errorf(PD_EINVAL, "room %" PRIu64 " is already live", id);
    if (p->state != PEER_UP || p->failed)
        return pd_errorf(PD_EPEER, "room %" PRIu64 ": peer %016" PRIx64 " has failed", id,
                         p->remote_id);
    if (x->n_rooms + 1 > 2 * x->n_buckets) {
        int rc = room_table_grow(x);
        if (rc)
            return rc;
    }
    struct room *r = pd_calloc(1, sizeof(*r));
    if (!r)
        return pd_error_wrap(PD_ENOMEM, "room %" PRIu64, id);
    r->id = id;
    r->serial = ++x->next_serial;
    r->peer = p;
    r->user = user;
    r->role = role;
    r->state = ROOM_LIVE;
    size_t h = room_hash(id, x->n_buckets);
    r->hnext = x->buckets[h];
    x->buckets[h] = r;
    r->pnext = p->rooms;
    if (p->rooms)
        p->rooms->pprev = r;
    p->rooms = r;
    p->n_rooms++;
    x->n_rooms++;
    *out = r;
    return PD_OK;
}

void pd__xfer_room_end_queue(pd_xfer_t *x, struct room *r) {
    r->end_deferred = false;
    r->qnext = NULL;
    *x->end_tail = r;
    x->end_tail = &r->qnext;
}

/* Ends a room: no data for it is accepted any more, and it moves to the end queue (xfer_run
 * calls on_room_end and frees it) — for a receiver with host→device copies of its data still in
 * flight, only once they are done (pd__xfer_recv_complete), since on_room_end hands its pages back.
 */
void pd__xfer_room_end(pd_xfer_t *x, struct room *r, int status) {
    if (r->state == ROOM_ENDED)
        return;
    if (r->unflushed) {
        r->unflushed = false;
        x->n_unflushed--;
    }
    r->state = ROOM_ENDED;
    r->status = status;
    if (r->recv_copying) {
        r->end_deferred = true;
        return;
    }
    pd__xfer_room_end_queue(x, r);
}

void pd__xfer_room_unlink_and_free(pd_xfer_t *x, struct room *r) {
    struct room **pp = &x->buckets[room_hash(r->id, x->n_buckets)];
    while (*pp != r)
        pp = &(*pp)->hnext;
    *pp = r->hnext;
    struct pd_xfer_peer *p = r->peer;
    if (r->pprev)
        r->pprev->pnext = r->pnext;
    else
        p->rooms = r->pnext;
    if (r->pnext)
        r->pnext->pprev = r->pprev;
    p->n_rooms--;
    x->n_rooms--;
    x->outstanding -= r->pending; /* orphaned ops: UCX may complete them late, or never */
    pd_free(r->dst);
    pd_free(r);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Validates a room's page list against a pool of pool_pages and copies it. */
static int copy_pages(uint64_t room, const uint32_t *pages, uint32_t n, uint32_t pool_pages,
                      const char *whose, uint32_t **out) {
    for (uint32_t i = 0; i < n; i++)
        if (pages[i] >= pool_pages)
            return pd_errorf(PD_ERANGE,
                             "room %" PRIu64 ": destination page %u (entry %u) outside %s pool of "
                             "%u pages",
                             room, pages[i], i, whose, pool_pages);
    uint32_t *dst = pd_malloc((size_t)(n ? n : 1) * sizeof(*dst));
    uint32_t *sorted = pd_malloc((size_t)(n ? n : 1) * sizeof(*sorted));
    if (!dst || !sorted) {
        pd_free(dst);
        pd_free(sorted);
        return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": copying %u destination pages", room, n);
    }
    memcpy(dst, pages, (size_t)n * sizeof(*dst));
    memcpy(sorted, pages, (size_t)n * sizeof(*dst));
    qsort(sorted, n, sizeof(*sorted), cmp_u32);
    for (uint32_t i = 1; i < n; i++) {
        if (sorted[i] == sorted[i - 1]) {
            int rc = pd_errorf(PD_EINVAL, "room %" PRIu64 ": destination page %u listed twice",
                               room, sorted[i]);
            pd_free(dst);
            pd_free(sorted);
            return rc;
        }
    }
    pd_free(sorted);
    *out = dst;
    return PD_OK;
}

/* A new live room of `role` whose destination pages are dst_pages (checked against a pool of
 * pool_pages, `whose` naming it in errors). */
static int room_open(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, enum room_role role,
                     const uint32_t *dst_pages, uint32_t n, uint32_t pool_pages, const char *whose,
                     void *room_user) {
    uint32_t *dst = NULL;
    int rc = copy_pages(room, dst_pages, n, pool_pages, whose, &dst);
    if (rc)
        return rc;
    struct room *r = NULL;
    rc = room_new(x, p, room, role, room_user, &r);
    if (rc) {
        pd_free(dst);
        return rc;
    }
    r->dst = dst;
    r->n_dst = n;
    return PD_OK;
}

int pd_xfer_room_add(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, const uint32_t *dst_pages,
                     uint32_t n, void *room_user) {
    if (!p)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": no peer", room);
    if (!p->rkey[0])
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": peer has no KV pool to write to", room);
    return room_open(x, p, room, ROOM_SENDER, dst_pages, n, p->n_pages, "the peer's", room_user);
}

int pd__xfer_room_get(const pd_xfer_t *x, uint64_t room, struct room **out) {
    struct room *r = pd__xfer_room_find(x, room);
    if (!r || r->state == ROOM_ENDED)
        return pd_errorf(PD_ENOENT, "room %" PRIu64 " is not live", room);
    *out = r;
    return PD_OK;
}

int pd_xfer_room_expect(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, const uint32_t *dst_pages,
                        uint32_t n, void *room_user) {
    if (!p)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": no peer", room);
    return room_open(x, p, room, ROOM_RECEIVER, dst_pages, n, x->n_pages, "our", room_user);
}

int pd_xfer_room_release(pd_xfer_t *x, uint64_t room, int status) {
    struct room *r = NULL;
    int rc = pd__xfer_room_get(x, room, &r);
    if (rc)
        return rc;
    if (r->role != ROOM_RECEIVER)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": only a receiving room is released", room);
    pd__xfer_room_end(x, r, status);
    pd__xfer_kick(x);
    return PD_OK;
}

int pd_xfer_room_abort(pd_xfer_t *x, uint64_t room, int status, const char *why) {
    struct room *r = NULL;
    int rc = pd__xfer_room_get(x, room, &r);
    if (rc)
        return rc;
    if (status == PD_OK)
        status = PD_ECANCELED;
    if (r->role == ROOM_RECEIVER) {
        if (r->state == ROOM_LIVE) {
            r->state = ROOM_ABORTING;
            r->status = status;
            r->abort_deadline_ms = uv_now(x->loop) + (uint64_t)x->cfg.abort_timeout_ms;
            pd_info("xfer: room %" PRIu64 ": aborting (%s); waiting for the sender's flush", room,
                    why ? why : pd_status_str(status));
        }
        pd__xfer_kick(x);
        return PD_OK;
    }
    struct pd_xfer_notice n = {.room = room, .status = status, .first_token = -1};
    snprintf(n.error, sizeof(n.error), "%s", why ? why : pd_status_str(status));
    switch (r->state) {
    case ROOM_LIVE:
        if (r->peer->failed || r->peer->state != PEER_UP)
            break; /* the peer's close ends it */
        pd__xfer_set_notice(r, &n);
        if (r->ipc_posted) { /* copies into the peer's pages cannot be recalled: wait them out */
            r->finish_wait = true;
            if (pd__xfer_ipc_wait_push(x, r) != PD_OK)
                pd__xfer_peer_mark_failed(r->peer, PD_ENOMEM);
            break;
        }
        r->staged_drop = true; /* runs still queued or copying are not sent */
        r->finish_wait = false;
        pd__xfer_post_flush(x, r);
        break;
    case ROOM_FLUSHING: pd__xfer_set_notice(r, &n); break; /* the notice is not out yet: swap it */
    default: break;                                        /* the notice is out; it stands */
    }
    pd_info("xfer: room %" PRIu64 ": aborted (%s)", room, n.error);
    pd__xfer_kick(x);
    return PD_OK;
}

/* every room has its peer from room_new on, so a live room is one with a peer */
pd_xfer_peer_t *pd_xfer_room_peer(const pd_xfer_t *x, uint64_t room) {
    const struct room *r = pd__xfer_room_find(x, room);
    return r && r->state != ROOM_ENDED ? r->peer : NULL;
}

bool pd_xfer_room_live(const pd_xfer_t *x, uint64_t room) {
    return pd_xfer_room_peer(x, room) != NULL;
}
