/*
 * xfer_send.c — the sender's side of a room: each run of pages posted as RDMA puts, as active
 * messages through the staging ring, or as CUDA IPC copies, then the flush and the notice.
 */
#include "common/xfer_internal.h"

void pd__xfer_post_notice(pd_xfer_t *x, struct room *r) {
    r->state = ROOM_NOTIFYING;
    struct op *op = pd__xfer_op_new(x, r, OP_NOTICE);
    if (!op) {
        pd_warn("xfer: room %" PRIu64 ": no memory for the notice; failing the peer", r->id);
        pd__xfer_peer_mark_failed(r->peer, PD_ENOMEM);
        return;
    }
    r->notice.data_bytes = r->peer->am_data ? r->data_bytes : 0;
    size_t len = pd_xfer_notice_encode(&r->notice, x->id, op->buf, sizeof(op->buf));
    PD_ASSERT(len > 0);
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = pd__xfer_on_notice_sent,
        .user_data = op,
    };
    ucs_status_ptr_t req =
        ucp_am_send_nbx(r->peer->ep, PD_XFER_AM_NOTICE, NULL, 0, op->buf, len, &prm);
    if (req == NULL) {
        pd__xfer_op_free(op);
        pd__xfer_room_end(x, r, r->notice.status);
    } else if (UCS_PTR_IS_ERR(req)) {
        pd__xfer_op_free(op);
        pd__ucs_error(UCS_PTR_STATUS(req), "posting the room's notice");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        pd__xfer_peer_mark_failed(r->peer, PD_EPEER);
    } else {
        pd__xfer_op_held(x, r);
    }
}

void pd__xfer_post_flush(pd_xfer_t *x, struct room *r) {
    r->state = ROOM_FLUSHING;
    if (r->unflushed) {
        r->unflushed = false;
        x->n_unflushed--;
    }
    struct op *op = pd__xfer_op_new(x, r, OP_FLUSH);
    if (!op) {
        pd_warn("xfer: room %" PRIu64 ": no memory for the flush; failing the peer", r->id);
        pd__xfer_peer_mark_failed(r->peer, PD_ENOMEM);
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = pd__xfer_on_flush_done,
        .user_data = op,
    };
    ucs_status_ptr_t req = ucp_ep_flush_nbx(r->peer->ep, &prm);
    if (req == NULL) {
        pd__xfer_op_free(op);
        pd__xfer_post_notice(x, r);
    } else if (UCS_PTR_IS_ERR(req)) {
        pd__xfer_op_free(op);
        pd__ucs_error(UCS_PTR_STATUS(req), "flushing the room's puts");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        pd__xfer_peer_mark_failed(r->peer, PD_EPEER);
    } else {
        pd__xfer_op_held(x, r);
    }
}

static int send_run_am(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t shard,
                       const char *src, size_t bytes, int slot);

/* A sending room of a staged job, or NULL when it ended, its peer failed or it was aborted. */
static struct room *stage_room(pd_xfer_t *x, const struct stage_job *j) {
    struct room *r = pd__xfer_room_find(x, j->room);
    if (!r || r->serial != j->serial || r->state == ROOM_ENDED || r->staged_drop ||
        r->peer->failed || r->peer->state != PEER_UP)
        return NULL;
    return r;
}

/* A run of a room is done with the ring (posted or dropped): a finished room flushes after its
 * last one. */
static void stage_job_done(pd_xfer_t *x, const struct stage_job *j) {
    struct room *r = pd__xfer_room_find(x, j->room);
    if (!r || r->serial != j->serial || !r->staged_jobs)
        return;
    if (--r->staged_jobs == 0 && r->finish_wait && r->state == ROOM_LIVE) {
        r->finish_wait = false;
        pd__xfer_post_flush(x, r);
    }
}

int pd__xfer_ring_new(pd_xfer_t *x, size_t slot_bytes) {
    int rc;
    x->slot_bytes = slot_bytes;
    x->n_slots = x->cfg.stage_slots > 0 ? x->cfg.stage_slots : 4;
    x->jobs_cap = 1024;
    x->jobs_head = x->n_jobs = 0;
    x->slots = pd_calloc((size_t)x->n_slots, sizeof(*x->slots));
    x->jobs = pd_malloc(x->jobs_cap * sizeof(*x->jobs));
    if (!x->slots || !x->jobs) {
        rc = pd_error_wrap(PD_ENOMEM, "the staging ring");
        goto fail;
    }
    for (int i = 0; i < x->n_slots; i++)
        if ((rc = pd_devmem_event_new(x->dm, &x->slots[i].ev)) != PD_OK)
            goto fail;
    if ((rc = pd_devmem_host_alloc(x->dm, x->slot_bytes * (size_t)x->n_slots, &x->ring)) != PD_OK)
        goto fail;
    for (int i = 0; i < x->n_slots; i++)
        x->slots[i].buf = (char *)x->ring + x->slot_bytes * (size_t)i;
    return PD_OK;
fail:
    pd__xfer_ring_free(x);
    return rc;
}

void pd__xfer_ring_free(pd_xfer_t *x) {
    for (int i = 0; x->slots && i < x->n_slots; i++)
        pd_devmem_event_free(x->dm, x->slots[i].ev);
    if (x->ring)
        pd_devmem_host_free(x->dm, x->ring);
    pd_free(x->slots);
    pd_free(x->jobs);
    x->slots = NULL;
    x->jobs = NULL;
    x->ring = NULL;
    x->n_slots = 0;
}

/* How a run of n pages for peer p lies in a slot: parts shards of part bytes, one after another
 * (our shards, or the peer's when its runs are regrouped). */
static void slot_parts(const pd_xfer_t *x, const struct pd_xfer_peer *p, uint32_t n, int *parts,
                       size_t *part) {
    *parts = p->regroup ? p->n_shards : x->n_shards;
    *part = (size_t)n * (p->regroup ? (size_t)p->shard_page_bytes : x->shard_page_bytes);
}

/* Enqueues the copies of job j into slot buf: each of our shards' part of the run (one copy
 * each), or, for a peer that splits the kv heads otherwise, the run regrouped into its shards'
 * layout: one 2-D copy per planned piece, n * rows_per_page rows of the piece's heads. */
static int stage_copy(pd_xfer_t *x, const struct pd_xfer_peer *p, const struct stage_job *j,
                      char *buf) {
    struct pd_devmem *dm = x->dm;
    const size_t spb = x->shard_page_bytes;
    int parts, rc = PD_OK;
    size_t part;
    slot_parts(x, p, j->n, &parts, &part);
    if (!p->regroup) {
        for (int k = 0; k < parts && !rc; k++)
            rc = pd_devmem_copy_async(dm, buf + (size_t)k * part,
                                      (const char *)x->pool_bases[k] + (size_t)j->src_page * spb,
                                      part);
        return rc;
    }
    const size_t rows = (size_t)j->n * x->heads.rows_per_page;
    const size_t src_pitch = (size_t)x->heads.count * x->heads.head_bytes;
    for (int c = 0; c < p->n_copies && !rc; c++) {
        const struct regroup_copy *cp = &p->copies[c];
        rc = pd_devmem_copy2d_async(dm, buf + (size_t)cp->dst * part + cp->dst_off, p->dst_pitch,
                                    (const char *)x->pool_bases[cp->src] +
                                        (size_t)j->src_page * spb + cp->src_off,
                                    src_pitch, cp->width, rows);
    }
    return rc;
}

/* The ring's step: copied slots are posted, free slots take the next queued runs. */
bool pd__xfer_run_stage(pd_xfer_t *x) {
    bool changed = false, copying = false;
    for (int i = 0; i < x->n_slots; i++) {
        struct stage_slot *sl = &x->slots[i];
        if (sl->state != SLOT_COPYING)
            continue;
        int q = pd_devmem_event_query(x->dm, sl->ev);
        if (q == 0)
            continue;
        changed = true;
        struct room *r = stage_room(x, &sl->job);
        sl->state = SLOT_FREE;
        if (q < 0) {
            pd_warn("xfer: room %" PRIu64 ": %s", sl->job.room, pd_error_msg());
            if (r)
                pd__xfer_peer_mark_failed(r->peer, PD_EINTERNAL);
        } else if (r) {
            sl->state = SLOT_SENDING;
            sl->peer = r->peer;
            /* the slot holds the run shard after shard (see stage_copy) */
            int parts, rc = PD_OK;
            size_t part;
            slot_parts(x, r->peer, sl->job.n, &parts, &part);
            for (int k = 0; k < parts && !rc; k++)
                rc = send_run_am(x, r, sl->job.index, (uint32_t)k, sl->buf + (size_t)k * part, part,
                                 i);
            if (rc) {
                pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
                pd__xfer_peer_mark_failed(r->peer, rc == PD_ENOMEM ? PD_ENOMEM : PD_EPEER);
            }
            x->staged_bytes += part * (size_t)parts;
            if (sl->pending == 0) /* UCX took every message inline */
                sl->state = SLOT_FREE;
        }
        stage_job_done(x, &sl->job);
    }
    for (int i = 0; i < x->n_slots && x->n_jobs; i++) {
        struct stage_slot *sl = &x->slots[i];
        if (sl->state != SLOT_FREE)
            continue;
        while (x->n_jobs && sl->state == SLOT_FREE) {
            struct stage_job j = x->jobs[x->jobs_head];
            x->jobs_head = (x->jobs_head + 1) % x->jobs_cap;
            x->n_jobs--;
            changed = true;
            struct room *r = stage_room(x, &j);
            if (!r) {
                stage_job_done(x, &j);
                continue;
            }
            int rc = stage_copy(x, r->peer, &j, sl->buf);
            if (!rc)
                rc = pd_devmem_event_record(x->dm, sl->ev);
            if (rc) {
                pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
                pd__xfer_peer_mark_failed(r->peer, PD_EINTERNAL);
                stage_job_done(x, &j);
                continue;
            }
            sl->job = j;
            sl->gen++;
            sl->pending = 0;
            sl->state = SLOT_COPYING;
            copying = true;
        }
    }
    if (copying) /* the copied slots are posted then */
        pd__xfer_wake_after_copies(x);
    return changed;
}

/* Records an event after the room's copies (everything enqueued so far) and queues the room:
 * its flush and notice go once the event completed. */
int pd__xfer_ipc_wait_push(pd_xfer_t *x, struct room *r) {
    if (r->ipc_waiting)
        return PD_OK; /* the event queued earlier covers every copy of the room */
    if (x->n_ipc == x->ipc_cap) {
        size_t cap = x->ipc_cap ? x->ipc_cap * 2 : 64;
        struct ipc_wait *w = pd_malloc(cap * sizeof(*w));
        if (!w)
            return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": waiting for copies", r->id);
        for (size_t k = 0; k < x->n_ipc; k++)
            w[k] = x->ipc_waits[(x->ipc_head + k) % x->ipc_cap];
        pd_free(x->ipc_waits);
        x->ipc_waits = w;
        x->ipc_cap = cap;
        x->ipc_head = 0;
    }
    struct pd_devmem_event *ev = NULL;
    int rc;
    if (x->n_free_evs)
        ev = x->free_evs[--x->n_free_evs];
    else if ((rc = pd_devmem_event_new(x->dm, &ev)) != PD_OK)
        return rc;
    if ((rc = pd_devmem_event_record(x->dm, ev)) != PD_OK) {
        pd_devmem_event_free(x->dm, ev);
        return rc;
    }
    pd__xfer_wake_after_copies(x); /* the room's flush and notice go then */
    x->ipc_waits[(x->ipc_head + x->n_ipc) % x->ipc_cap] =
        (struct ipc_wait){.room = r->id, .serial = r->serial, .ev = ev};
    x->n_ipc++;
    r->ipc_waiting = true;
    return PD_OK;
}

static void ipc_event_release(pd_xfer_t *x, struct pd_devmem_event *ev) {
    if (x->n_free_evs == x->free_evs_cap) {
        size_t cap = x->free_evs_cap ? x->free_evs_cap * 2 : 64;
        struct pd_devmem_event **f = pd_realloc(x->free_evs, cap * sizeof(*f));
        if (!f) {
            pd_devmem_event_free(x->dm, ev);
            return;
        }
        x->free_evs = f;
        x->free_evs_cap = cap;
    }
    x->free_evs[x->n_free_evs++] = ev;
}

/* Rooms whose copies are done post their flush + notice; one stream, so in queue order. */
bool pd__xfer_run_ipc(pd_xfer_t *x) {
    bool changed = false;
    while (x->n_ipc) {
        struct ipc_wait w = x->ipc_waits[x->ipc_head];
        int q = pd_devmem_event_query(x->dm, w.ev);
        if (q == 0)
            break;
        x->ipc_head = (x->ipc_head + 1) % x->ipc_cap;
        x->n_ipc--;
        ipc_event_release(x, w.ev);
        changed = true;
        struct room *r = pd__xfer_room_find(x, w.room);
        if (!r || r->serial != w.serial || r->state == ROOM_ENDED)
            continue;
        r->ipc_waiting = false;
        if (q < 0) {
            pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
            pd__xfer_peer_mark_failed(r->peer, PD_EINTERNAL);
        } else if (r->finish_wait && r->state == ROOM_LIVE && !r->peer->failed &&
                   r->peer->state == PEER_UP) {
            r->finish_wait = false;
            pd__xfer_post_flush(x, r);
        }
    }
    return changed;
}

/* Staged: the run waits for a ring slot (pd__xfer_run_stage copies and posts it). */
static int stage_queue(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t src_page,
                       uint32_t n) {
    if (x->n_jobs == x->jobs_cap) {
        size_t cap = x->jobs_cap * 2;
        struct stage_job *jobs = pd_malloc(cap * sizeof(*jobs));
        if (!jobs)
            return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": queueing pages", r->id);
        for (size_t k = 0; k < x->n_jobs; k++)
            jobs[k] = x->jobs[(x->jobs_head + k) % x->jobs_cap];
        pd_free(x->jobs);
        x->jobs = jobs;
        x->jobs_cap = cap;
        x->jobs_head = 0;
    }
    x->jobs[(x->jobs_head + x->n_jobs) % x->jobs_cap] = (struct stage_job){
        .room = r->id, .serial = r->serial, .index = index, .src_page = src_page, .n = n};
    x->n_jobs++;
    r->staged_jobs++;
    return PD_OK;
}

/* One shard of a run as one put (hardware RMA lane): completion is observed through the room's
 * flush. */
static int send_run_put(pd_xfer_t *x, struct room *r, uint32_t shard, const char *src,
                        uint32_t dst_page, size_t bytes) {
    struct pd_xfer_peer *p = r->peer;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMH,
        .memh = x->memh[shard],
    };
    uint64_t raddr = p->base[shard] + (uint64_t)dst_page * x->shard_page_bytes;
    ucs_status_ptr_t req = ucp_put_nbx(p->ep, src, bytes, raddr, p->rkey[shard], &prm);
    if (UCS_PTR_IS_ERR(req))
        return pd__ucs_error(UCS_PTR_STATUS(req), "posting a put");
    if (req)
        ucp_request_free(req);
    return PD_OK;
}

/* One shard of a run as eager active messages of at most am_chunk_bytes, each naming the room,
 * the run's position in the room's page list, the shard and the byte offset from the run's
 * start in that shard: the receiver checks and copies. */
static int send_run_am(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t shard,
                       const char *src, size_t bytes, int slot) {
    const size_t chunk = r->peer->am_chunk;
    /* the staged pool's ring is mapped (memh[0]); a ring made for regrouping is not */
    ucp_mem_h memh = slot < 0 ? x->memh[shard] : x->staged ? x->memh[0] : NULL;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t len = bytes - off < chunk ? bytes - off : chunk;
        struct op *op = pd__xfer_op_new(x, r, OP_DATA);
        if (!op)
            return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": sending pages", r->id);
        if (slot >= 0) {
            op->slot = slot;
            op->slot_gen = x->slots[slot].gen;
        }
        pd__xfer_put_u64(op->buf, x->id);
        pd__xfer_put_u64(op->buf + 8, r->id);
        pd__xfer_put_u32(op->buf + 16, index);
        pd__xfer_put_u32(op->buf + 20, shard);
        pd__xfer_put_u64(op->buf + 24, off);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_FLAGS | (memh ? UCP_OP_ATTR_FIELD_MEMH : 0),
            .flags = UCP_AM_SEND_FLAG_EAGER,
            .cb.send = pd__xfer_on_data_sent,
            .user_data = op,
            .memh = memh,
        };
        ucs_status_ptr_t req = ucp_am_send_nbx(r->peer->ep, PD_XFER_AM_DATA, op->buf, DATA_HDR_LEN,
                                               src + off, len, &prm);
        if (UCS_PTR_IS_ERR(req)) {
            pd__xfer_op_free(op);
            return pd__ucs_error(UCS_PTR_STATUS(req), "sending pages as active messages");
        }
        if (req) {
            pd__xfer_op_held(x, r);
            if (slot >= 0)
                x->slots[slot].pending++;
        } else {
            pd__xfer_op_free(op);
        }
        r->data_bytes += len;
    }
    return PD_OK;
}

/* A run for a peer that splits the kv heads otherwise, from a host pool: every one of its shards'
 * part as eager active messages (as send_run_am), each packed by UCX straight from our shards in
 * the peer's layout through the regroup datatype, so no byte is copied twice on our side. The
 * shards' messages of the same rows go one after another: where our rows hold several of its
 * shards' heads (1 -> 2), the second gathers from rows the first just brought into the cache
 * (measured: the gather alone 9 -> 13 GB/s here, shard after shard vs interleaved). */
static int send_run_regroup(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t src_page,
                            uint32_t len) {
    struct pd_xfer_peer *p = r->peer;
    const size_t chunk = p->am_chunk, part = (size_t)len * p->shard_page_bytes;
    for (size_t off = 0; off < part; off += chunk) {
        const size_t n = part - off < chunk ? part - off : chunk;
        for (int j = 0; j < p->n_shards; j++) {
            struct op *op = pd__xfer_op_new(x, r, OP_DATA);
            if (!op)
                return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": sending pages", r->id);
            pd__xfer_put_u64(op->buf, x->id);
            pd__xfer_put_u64(op->buf + 8, r->id);
            pd__xfer_put_u32(op->buf + 16, index);
            pd__xfer_put_u32(op->buf + 20, (uint32_t)j);
            pd__xfer_put_u64(op->buf + 24, off);
            pd__xfer_regroup_msg(x, p, (uint32_t)j, src_page, off, n, &op->rg);
            ucp_request_param_t prm = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE,
                .flags = UCP_AM_SEND_FLAG_EAGER,
                .cb.send = pd__xfer_on_data_sent,
                .user_data = op,
                .datatype = x->regroup_dt,
            };
            ucs_status_ptr_t req =
                ucp_am_send_nbx(p->ep, PD_XFER_AM_DATA, op->buf, DATA_HDR_LEN, &op->rg, 1, &prm);
            if (UCS_PTR_IS_ERR(req)) {
                pd__xfer_op_free(op);
                return pd__ucs_error(UCS_PTR_STATUS(req), "sending regrouped pages");
            }
            if (req)
                pd__xfer_op_held(x, r);
            else
                pd__xfer_op_free(op);
            r->data_bytes += n;
        }
    }
    return PD_OK;
}

/* One run of len pages, src_page.. → dst_page.. at room position index, every shard of it. */
static int send_run(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t src_page,
                    uint32_t dst_page, uint32_t len) {
    struct pd_xfer_peer *p = r->peer;
    const size_t spb = x->shard_page_bytes, part = (size_t)len * spb;
    if (p->regroup && !x->dm)
        return send_run_regroup(x, r, index, src_page, len);
    if (p->regroup || (x->staged && !p->ipc_base[0]))
        return stage_queue(x, r, index, src_page, len);
    int rc = PD_OK;
    for (int k = 0; k < x->n_shards && !rc; k++) {
        const char *src = (const char *)x->pool_bases[k] + (size_t)src_page * spb;
        if (p->ipc_base[0]) {
            rc = pd_devmem_copy_async(x->dm, (char *)p->ipc_base[k] + (size_t)dst_page * spb, src,
                                      part);
            r->ipc_posted = true;
            x->ipc_bytes += rc ? 0 : part;
        } else if (p->am_data) {
            rc = send_run_am(x, r, index, (uint32_t)k, src, part, -1);
        } else {
            rc = send_run_put(x, r, (uint32_t)k, src, dst_page, part);
        }
    }
    return rc;
}

int pd_xfer_room_send(pd_xfer_t *x, uint64_t room, uint32_t first, const uint32_t *src_pages,
                      uint32_t n) {
    struct room *r = NULL;
    int rc = pd__xfer_room_get(x, room, &r);
    if (rc)
        return rc;
    if (r->role != ROOM_SENDER || r->state != ROOM_LIVE)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": not a sending room open for pages", room);
    if ((uint64_t)first + n > r->n_dst)
        return pd_errorf(PD_ERANGE, "room %" PRIu64 ": pages [%u, %u) beyond its %u destinations",
                         room, first, first + n, r->n_dst);
    for (uint32_t i = 0; i < n; i++)
        if (src_pages[i] >= x->n_pages)
            return pd_errorf(PD_ERANGE, "room %" PRIu64 ": source page %u outside our pool of %u",
                             room, src_pages[i], x->n_pages);
    struct pd_xfer_peer *p = r->peer;
    if (p->failed || p->state != PEER_UP)
        return pd_errorf(PD_EPEER, "room %" PRIu64 ": peer has failed", room);
    const uint32_t *dst = r->dst + first;
    /* Very long runs are split: puts of a few MiB (each shard's) pipeline better on the
     * transports measured; staged runs are at most one ring slot (every shard of them, in the
     * peer's layout when regrouped: its pages may be larger than ours under replication). */
    const bool to_ring = (p->regroup && x->dm) || (x->staged && !p->ipc_base[0]);
    size_t max_bytes = p->ipc_base[0] ? SIZE_MAX : to_ring ? x->slot_bytes : x->cfg.max_put_bytes;
    size_t unit = p->regroup ? (size_t)p->page_bytes
                  : to_ring  ? x->page_bytes
                             : x->shard_page_bytes;
    size_t fit = max_bytes / unit;
    uint32_t max_len = fit == 0 ? 1 : fit > UINT32_MAX ? UINT32_MAX : (uint32_t)fit;
    for (uint32_t i = 0; i < n;) {
        uint32_t len = 1;
        while (i + len < n && len < max_len && src_pages[i + len] == src_pages[i] + len &&
               dst[i + len] == dst[i] + len)
            len++;
        rc = send_run(x, r, first + i, src_pages[i], dst[i], len);
        if (rc) {
            pd_warn("xfer: room %" PRIu64 ": %s", room, pd_error_msg());
            pd__xfer_peer_mark_failed(p, rc == PD_ENOMEM ? PD_ENOMEM : PD_EPEER);
            pd__xfer_kick(x);
            return rc;
        }
        i += len;
    }
    if (!r->unflushed && n) {
        r->unflushed = true;
        x->n_unflushed++;
    }
    pd__xfer_kick(x);
    return PD_OK;
}

void pd__xfer_set_notice(struct room *r, const struct pd_xfer_notice *n) {
    r->notice = *n;
    r->notice.room = r->id;
    r->notice.error[PD_XFER_ERROR_TEXT_MAX] = '\0';
}

int pd_xfer_room_finish(pd_xfer_t *x, uint64_t room, const struct pd_xfer_notice *n) {
    struct room *r = NULL;
    int rc = pd__xfer_room_get(x, room, &r);
    if (rc)
        return rc;
    if (r->role != ROOM_SENDER || r->state != ROOM_LIVE || r->finish_wait)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": already finishing", room);
    if (r->peer->failed || r->peer->state != PEER_UP)
        return pd_errorf(PD_EPEER, "room %" PRIu64 ": peer has failed", room);
    pd__xfer_set_notice(r, n);
    if (r->ipc_posted) { /* the notice follows the data: once the device copies are done */
        r->finish_wait = true;
        if ((rc = pd__xfer_ipc_wait_push(x, r)) != PD_OK) {
            pd__xfer_peer_mark_failed(r->peer, rc);
            pd__xfer_kick(x);
            return rc;
        }
    } else if (r->staged_jobs) { /* ... once the ring posted every run */
        r->finish_wait = true;
    } else {
        pd__xfer_post_flush(x, r);
    }
    pd__xfer_kick(x);
    return PD_OK;
}
