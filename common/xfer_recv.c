/*
 * xfer_recv.c — the receiver's side: notices and data arriving as active messages, and the
 * device pool's receive ring (host-staged messages copied to the GPU in batches).
 */
#include "common/xfer_internal.h"

/* ---- the receive ring (device pool): see struct recv_slot ---- */

/* The slot a message of len bytes for room r goes into, or NULL when the ring is full. */
static struct recv_slot *recv_slot_take(pd_xfer_t *x, const struct room *r, size_t len) {
    if (x->rcount > 0) {
        struct recv_slot *s = &x->rslots[(x->rhead + x->rcount - 1) % x->n_rslots];
        const struct recv_span *last = s->n_spans ? &s->spans[s->n_spans - 1] : NULL;
        bool merges = last && last->room == r->id && last->serial == r->serial;
        if (!s->sealed && s->used + len <= x->rslot_bytes && (merges || s->n_spans < RECV_SPANS))
            return s;
        s->sealed = true;
    }
    if (x->rcount == x->n_rslots)
        return NULL;
    struct recv_slot *s = &x->rslots[(x->rhead + x->rcount) % x->n_rslots];
    x->rcount++;
    s->used = 0;
    s->n_spans = 0;
    s->sealed = false;
    s->failed = false;
    return s;
}

/* Enqueues the coalesced copy and records its slot's event after it. A failure marks the slot
 * failed (its rooms fail when it is polled) after waiting for the stream, so that nothing of an
 * earlier copy lands after those rooms end. */
static void recv_flush(pd_xfer_t *x) {
    struct recv_slot *s = x->rpend.slot;
    if (!s)
        return;
    int rc = pd_devmem_copy_async(x->dm, x->rpend.dst, x->rpend.src, x->rpend.len);
    if (rc == PD_OK)
        rc = pd_devmem_event_record(x->dm, s->ev);
    if (rc == PD_OK)
        pd__xfer_wake_after_copies(x); /* the slot's bytes count for their rooms then */
    if (rc) {
        pd_warn("xfer: receiving pages: %s; failing the rooms of the slot", pd_error_msg());
        s->failed = true;
        (void)pd_devmem_sync(x->dm);
    }
    x->rpend.slot = NULL;
    x->rpend.len = 0;
}

/* Copies a message into the ring and adds its host→device copy to dst to the pending one (see
 * struct recv_slot); it counts for the room once the copy is done. PD_EAGAIN: the ring is full
 * (nothing done). */
static int recv_copy(pd_xfer_t *x, struct room *r, char *dst, const void *data, size_t len) {
    struct recv_slot *s = recv_slot_take(x, r, len);
    if (!s)
        return PD_EAGAIN;
    char *buf = s->buf + s->used;
    memcpy(buf, data, len);
    if (x->rpend.slot == s && x->rpend.src + x->rpend.len == buf &&
        x->rpend.dst + x->rpend.len == dst) {
        x->rpend.len += len; /* the run goes on */
    } else {
        recv_flush(x);
        x->rpend.slot = s;
        x->rpend.dst = dst;
        x->rpend.src = buf;
        x->rpend.len = len;
    }
    s->used += len;
    struct recv_span *last = s->n_spans ? &s->spans[s->n_spans - 1] : NULL;
    if (last && last->room == r->id && last->serial == r->serial)
        last->bytes += len;
    else
        s->spans[s->n_spans++] = (struct recv_span){r->id, r->serial, len};
    r->recv_copying += len;
    x->recv_copying += len;
    if (x->rpend.len >= RECV_COPY_MAX)
        recv_flush(x);
    return PD_OK;
}

/* Slots whose copies are done count their bytes for their rooms and are reused, oldest first.
 * wait: the ring is full and a message cannot be kept — wait until the oldest slot is done
 * (bounded: one slot's copies) and free just that one. Returns true when a slot was freed. */
bool pd__xfer_recv_complete(pd_xfer_t *x, bool wait) {
    bool freed = false;
    recv_flush(x); /* the events must cover every copy of their slots */
    while (x->rcount > 0) {
        struct recv_slot *s = &x->rslots[x->rhead];
        int q = pd_devmem_event_query(x->dm, s->ev);
        for (int spins = 0; q == 0 && wait; spins++) {
            if (spins == 1000 && pd_devmem_sync(x->dm) != PD_OK) { /* then block, not spin */
                q = -1;
                break;
            }
            q = pd_devmem_event_query(x->dm, s->ev);
        }
        if (q == 0)
            break;
        if (q < 0)
            pd_warn("xfer: receiving pages: %s; failing the rooms of %d spans", pd_error_msg(),
                    s->n_spans);
        if (s->failed)
            q = -1;
        for (int i = 0; i < s->n_spans; i++) {
            const struct recv_span *sp = &s->spans[i];
            x->recv_copying -= sp->bytes;
            struct room *r = pd__xfer_room_find(x, sp->room);
            if (!r || r->serial != sp->serial)
                continue; /* cannot be: a room with copies in flight does not end */
            r->recv_copying -= sp->bytes;
            if (r->state != ROOM_ENDED) {
                r->data_bytes += q > 0 ? sp->bytes : 0;
                x->recv_staged_bytes += q > 0 ? sp->bytes : 0;
                if (q < 0)
                    pd__xfer_room_end(x, r, PD_EINTERNAL);
                else
                    pd__xfer_room_try_complete(x, r);
            } else if (r->end_deferred && r->recv_copying == 0) {
                pd__xfer_room_end_queue(
                    x, r); /* every copy into its pages is done: they may go back */
            }
        }
        s->used = 0;
        s->n_spans = 0;
        s->sealed = false;
        x->rhead = (x->rhead + 1) % x->n_rslots;
        x->rcount--;
        freed = true;
        if (wait)
            break;
    }
    return freed;
}

/* Messages kept while the ring was full go in as it frees up; those of rooms that ended meanwhile
 * are dropped (their pages may be someone else's). */
static bool recv_drain_held(pd_xfer_t *x) {
    bool changed = false;
    while (x->n_held) {
        struct recv_held *h = &x->held[x->held_head];
        struct room *r = pd__xfer_room_find(x, h->room);
        int rc = PD_OK;
        if (!r || r->serial != h->serial || r->state == ROOM_ENDED)
            x->dropped_writes++;
        else if ((rc = recv_copy(x, r, h->dst, h->data, h->len)) == PD_EAGAIN)
            break;
        if (rc) {
            pd_warn("xfer: room %" PRIu64 ": %s; failing the room", r->id, pd_error_msg());
            pd__xfer_room_end(x, r, rc);
        }
        ucp_am_data_release(x->worker, h->data);
        x->held_head = (x->held_head + 1) % RECV_HELD;
        x->n_held--;
        changed = true;
    }
    return changed;
}

bool pd__xfer_run_recv(pd_xfer_t *x) {
    bool changed = pd__xfer_recv_complete(x, false);
    return recv_drain_held(x) || changed;
}

/* A validated data message for room r into dst (device). Kept (UCS_INPROGRESS) when the ring is
 * full and UCX lets us keep it; else, when the ring is full, waits for its oldest slot. */
static ucs_status_t recv_data(pd_xfer_t *x, struct room *r, char *dst, void *data, size_t len,
                              const ucp_am_recv_param_t *param) {
    if (len > x->rslot_bytes) { /* never from our sender: its messages are one eager fragment */
        x->dropped_writes++;
        pd_warn("xfer: room %" PRIu64 ": a page-data message of %zu bytes, more than a receive "
                "slot of %zu; failing the room",
                r->id, len, x->rslot_bytes);
        pd__xfer_room_end(x, r, PD_ERANGE);
        return UCS_OK;
    }
    /* kept messages go first: a message that overtook them could starve them */
    int rc = x->n_held ? PD_EAGAIN : recv_copy(x, r, dst, data, len);
    if (rc == PD_EAGAIN && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) &&
        x->n_held < RECV_HELD) {
        x->held[(x->held_head + x->n_held) % RECV_HELD] =
            (struct recv_held){r->id, r->serial, dst, data, len};
        x->n_held++;
        x->recv_held_msgs++;
        return UCS_INPROGRESS; /* released by recv_drain_held */
    }
    if (rc == PD_EAGAIN) {
        /* The eager data is gone after this callback: wait for the oldest slot (its copies were
         * enqueued before, so this is bounded by one slot of copies), then take it. */
        while ((rc = recv_copy(x, r, dst, data, len)) == PD_EAGAIN) {
            x->recv_waits++;
            pd__xfer_recv_complete(x, true);
            if (r->state == ROOM_ENDED) { /* a failed copy ended it meanwhile */
                x->dropped_writes++;
                return UCS_OK;
            }
        }
    }
    if (rc) {
        pd_warn("xfer: room %" PRIu64 ": %s; failing the room", r->id, pd_error_msg());
        pd__xfer_room_end(x, r, rc);
    }
    return UCS_OK;
}

ucs_status_t pd__xfer_on_notice_am(void *arg, const void *header, size_t header_length, void *data,
                                   size_t length, const ucp_am_recv_param_t *param) {
    pd_xfer_t *x = arg;
    (void)header;
    (void)header_length;
    x->progress++;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        pd_warn("xfer: dropped a %zu-byte rendezvous room notice (notices are small)", length);
        return UCS_OK;
    }
    struct pd_xfer_notice n;
    uint64_t sender;
    if (pd_xfer_notice_decode(data, length, &n, &sender)) {
        pd_warn("xfer: dropped a room notice: %s", pd_error_msg());
        return UCS_OK;
    }
    struct room *r = pd__xfer_room_find(x, n.room);
    if (!r || r->role != ROOM_RECEIVER || r->state == ROOM_ENDED || r->has_notice) {
        pd_debug("xfer: room %" PRIu64 ": notice for a room not live here, ignored", n.room);
        return UCS_OK;
    }
    if (r->peer->remote_id != sender) {
        pd_warn("xfer: room %" PRIu64 ": notice from %016" PRIx64 ", expected %016" PRIx64
                ", ignored",
                n.room, sender, r->peer->remote_id);
        return UCS_OK;
    }
    r->notice = n;
    r->has_notice = true;
    r->notice_status = n.status;
    pd__xfer_room_try_complete(x, r);
    return UCS_OK;
}

bool pd_xfer_data_fits(const uint32_t *dst, uint32_t n_dst, int n_shards, uint64_t pb,
                       uint32_t shard, uint32_t index, uint64_t off, size_t length) {
    if (length == 0 || pb == 0)
        return false;
    uint64_t first = index + off / pb; /* room positions written: first .. last */
    uint64_t last = index + (off + length - 1) / pb;
    bool ok = shard < (uint32_t)n_shards && index < n_dst && off < (uint64_t)n_dst * pb &&
              length <= (uint64_t)n_dst * pb && last < n_dst;
    for (uint64_t k = first; ok && k <= last; k++)
        ok = dst[k] == dst[index] + (k - index);
    return ok;
}

/* Page data: accepted only for a live receiving room of the peer that sends it, and only into
 * that room's pages at the position the sender was given them; anything else is dropped. Never
 * answers (no reply message can meet a dead endpoint). A message is part of one shard's run: its
 * offset counts bytes of that shard's pages from the run's first (a shard's pages of a run are
 * contiguous, a logical page's shards are not), so it never straddles shards. */
ucs_status_t pd__xfer_on_data_am(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param) {
    pd_xfer_t *x = arg;
    x->progress++;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || header_length != DATA_HDR_LEN ||
        length == 0) {
        x->dropped_writes++;
        pd_warn("xfer: dropped a malformed page-data message (%zu + %zu bytes%s)", header_length,
                length, (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? ", rendezvous" : "");
        return UCS_OK;
    }
    const uint8_t *h = header;
    uint64_t sender = pd__xfer_get_u64(h), room = pd__xfer_get_u64(h + 8),
             off = pd__xfer_get_u64(h + 24);
    uint32_t index = pd__xfer_get_u32(h + 16), shard = pd__xfer_get_u32(h + 20);
    struct room *r = pd__xfer_room_find(x, room);
    if (!r || r->role != ROOM_RECEIVER || r->state == ROOM_ENDED) {
        x->dropped_writes++; /* late: the room ended, its pages may be someone else's now */
        pd_debug("xfer: room %" PRIu64 ": %zu bytes of pages for a room not live here, dropped",
                 room, length);
        return UCS_OK;
    }
    if (r->peer->remote_id != sender) {
        x->dropped_writes++;
        pd_warn("xfer: room %" PRIu64 ": pages from %016" PRIx64 ", expected %016" PRIx64
                ", dropped",
                room, sender, r->peer->remote_id);
        return UCS_OK;
    }
    const uint64_t pb = x->shard_page_bytes;
    if (!pd_xfer_data_fits(r->dst, r->n_dst, x->n_shards, pb, shard, index, off, length)) {
        x->dropped_writes++;
        pd_warn("xfer: room %" PRIu64 ": %zu bytes of shard %u at page position %u + %" PRIu64
                " do not fit the room's %u pages of %d shards; failing the room",
                room, length, shard, index, off, r->n_dst, x->n_shards);
        pd__xfer_room_end(x, r, PD_ERANGE);
        return UCS_OK;
    }
    char *dst = (char *)x->pool_bases[shard] + (size_t)r->dst[index] * pb + off;
    if (x->dm)
        return recv_data(x, r, dst, data, length, param); /* counted once on the device */
    memcpy(dst, data, length);
    r->data_bytes += length;
    pd__xfer_room_try_complete(x, r);
    return UCS_OK;
}

/* The receive ring of a device pool: as many slots as the send ring, each at least one page and
 * one largest message, with the events and the kept-message queue: nothing per message later. */
static int recv_ring_new(pd_xfer_t *x, struct pd_devmem *dm, size_t page_bytes) {
    size_t want = x->cfg.stage_slot_bytes ? x->cfg.stage_slot_bytes : (size_t)4 << 20;
    want = want < page_bytes ? page_bytes : want;
    x->rslot_bytes = want < AM_MSG_MAX + 1 ? AM_MSG_MAX + 1 : want;
    x->n_rslots = x->cfg.stage_slots > 0 ? x->cfg.stage_slots : 4;
    x->rslots = pd_calloc((size_t)x->n_rslots, sizeof(*x->rslots));
    x->held = pd_malloc(RECV_HELD * sizeof(*x->held));
    int rc = PD_OK;
    if (!x->rslots || !x->held) {
        rc = pd_error_wrap(PD_ENOMEM, "the receive ring");
        goto fail;
    }
    for (int i = 0; i < x->n_rslots; i++)
        if ((rc = pd_devmem_event_new(dm, &x->rslots[i].ev)) != PD_OK)
            goto fail;
    if ((rc = pd_devmem_host_alloc(dm, x->rslot_bytes * (size_t)x->n_rslots, &x->rring)) != PD_OK)
        goto fail;
    for (int i = 0; i < x->n_rslots; i++)
        x->rslots[i].buf = (char *)x->rring + x->rslot_bytes * (size_t)i;
    x->dm = dm;
    return PD_OK;
fail:
    x->dm = dm;
    pd__xfer_recv_ring_free(x);
    x->dm = NULL;
    return rc;
}

/* After the worker is gone or before it saw the ring; the devmem is still there. */
void pd__xfer_recv_ring_free(pd_xfer_t *x) {
    for (int i = 0; x->rslots && i < x->n_rslots; i++)
        pd_devmem_event_free(x->dm, x->rslots[i].ev);
    if (x->rring)
        pd_devmem_host_free(x->dm, x->rring);
    pd_free(x->rslots);
    pd_free(x->held);
    x->rslots = NULL;
    x->held = NULL;
    x->rring = NULL;
    x->n_rslots = x->rcount = x->rhead = 0;
    x->n_held = 0;
}

int pd_xfer_register_device_pool(pd_xfer_t *x, void *base, size_t page_bytes, uint32_t n_pages,
                                 struct pd_devmem *dm, bool ucx_direct) {
    return pd_xfer_register_device_pool_shards(x, &base, 1, page_bytes, n_pages, dm, ucx_direct);
}

int pd_xfer_register_device_pool_shards(pd_xfer_t *x, void *const *bases, int n_shards,
                                        size_t shard_page_bytes, uint32_t n_pages,
                                        struct pd_devmem *dm, bool ucx_direct) {
    PD_ASSERT(!x->n_memh && !x->dm);
    int rc = pd__xfer_pool_check(bases, n_shards, shard_page_bytes, n_pages);
    if (rc)
        return rc;
    if (!dm)
        return pd_errorf(PD_EINVAL, "registering the GPU KV pool: no device");
    const size_t page_bytes = shard_page_bytes * (size_t)n_shards; /* one logical page */
    if ((rc = recv_ring_new(x, dm, page_bytes)) != PD_OK)
        return rc;
    if (ucx_direct) {
        if (!x->cuda_memory)
            return pd_errorf(PD_EUNSUPPORTED, "registering the GPU KV pool with UCX: this UCX "
                                              "does not support CUDA memory");
        rc = pd__xfer_map_regions(x, bases, n_shards, shard_page_bytes * n_pages, true,
                                  "the GPU KV pool");
        if (rc) {
            pd__xfer_recv_ring_free(x);
            return rc;
        }
    } else {
        /* the ring: enough slots that copies and sends overlap; a slot holds at least a logical
         * page (every shard of it) */
        size_t want = x->cfg.stage_slot_bytes ? x->cfg.stage_slot_bytes : (size_t)4 << 20;
        x->dm = dm; /* the ring's copies and memory are the device's */
        if ((rc = pd__xfer_ring_new(
                 x, want < page_bytes ? page_bytes : want / page_bytes * page_bytes)) != PD_OK)
            goto fail_ring;
        if ((rc = pd__xfer_map_regions(x, &x->ring, 1, x->slot_bytes * (size_t)x->n_slots, false,
                                       "the staging ring")) != PD_OK)
            goto fail_ring;
        x->staged = true;
    }
    x->dm = dm;
    pd__xfer_pool_take(x, bases, n_shards, shard_page_bytes, n_pages);
    for (int k = 0; k < n_shards; k++) {
        if (pd_devmem_ipc_export(dm, bases[k], x->ipc_handle[k], &x->ipc_len[k]) != PD_OK) {
            pd_info("xfer: the GPU KV pool%s is not exported for same-node copies: %s",
                    n_shards > 1 ? " (a shard of it)" : "", pd_error_msg());
            memset(x->ipc_len, 0, sizeof(x->ipc_len)); /* all shards or none */
            break;
        }
    }
    if (x->staged)
        pd_info("xfer: GPU KV pool (%s): %u pages of %d x %zu bytes, staged through a pinned "
                "ring of %d x %zu bytes",
                pd_devmem_name(dm), n_pages, n_shards, shard_page_bytes, x->n_slots, x->slot_bytes);
    else
        pd_info("xfer: GPU KV pool (%s) registered with UCX: %u pages of %d x %zu bytes",
                pd_devmem_name(dm), n_pages, n_shards, shard_page_bytes);
    return PD_OK;

fail_ring:
    pd__xfer_ring_free(x); /* x->dm is dm */
    pd__xfer_recv_ring_free(x);
    x->dm = NULL;
    return rc;
}
