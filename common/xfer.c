/*
 * xfer.c — the UCX transfer engine behind xfer.h; its rooms, send path, receive path and
 * notice format are xfer_rooms.c, xfer_send.c, xfer_recv.c and xfer_notice.c (xfer_internal.h).
 *
 * Owns: the ucp context and worker, the pool's memory handle and packed rkey, one endpoint per
 * peer, the room table, the ops UCX holds, and three libuv handles (a uv_poll_t on the worker's
 * event fd, a uv_timer_t that keeps progress going while requests are outstanding, a uv_idle_t
 * for "run again on the next loop iteration").
 *
 * Invariants: UCX callbacks never call the user and never post new operations — they only change
 * state and queue work; xfer_run() (from the poll, the timer or the idle handle) posts and calls
 * the user, so user callbacks may re-enter the engine freely. Every UCX request of ours carries an
 * op (not a room) as user_data: the op names its room by id and serial and owns the bytes UCX may
 * still read, so a room can end and be freed while UCX still holds requests of it. That matters
 * because UCX 1.13 does not always complete a request of a force-closed endpoint (seen: a room's
 * flush or notice on posix shared memory after the peer was SIGKILLed): a room that waited for
 * it would never end. A room of a failed peer ends only once the peer's endpoint is
 * force-closed. Any failed request on a peer force-closes that peer: after an unknown failure,
 * what landed where is unknown, and the closed endpoint is the only safe fence.
 *
 * Never a zero-delay uv timer re-armed from its own callback: libuv before 1.45 runs such a timer
 * again inside the same uv__run_timers() pass without updating the loop time, so an engine whose
 * ucp_worker_arm() keeps answering BUSY (as 1.13 does for a while after a shared-memory peer dies)
 * would starve the whole loop — signals and gRPC included. "Again soon" is the idle handle.
 */
#include "common/xfer_internal.h"

/* ---- status translation: the one place ucs_status_t is interpreted ---- */

int pd__ucs_error(ucs_status_t s, const char *doing) {
    int code;
    switch (s) {
    case UCS_OK: return PD_OK;
    case UCS_INPROGRESS: code = PD_EAGAIN; break;
    case UCS_ERR_NO_MEMORY: code = PD_ENOMEM; break;
    case UCS_ERR_INVALID_PARAM: code = PD_EINVAL; break;
    case UCS_ERR_UNSUPPORTED: code = PD_EUNSUPPORTED; break;
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_ELEM: code = PD_ENOENT; break;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT: code = PD_ETIMEDOUT; break;
    case UCS_ERR_CANCELED: code = PD_ECANCELED; break;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED: code = PD_EPEER; break;
    default: code = PD_EIO; break;
    }
    return pd_errorf(code, "%s: UCX: %s", doing, ucs_status_string(s));
}

/* ---- ops: what UCX holds ---- */

struct op *pd__xfer_op_new(pd_xfer_t *x, struct room *r, enum op_kind kind) {
    struct op *op = x->free_ops;
    if (op)
        x->free_ops = op->next;
    else if (!(op = pd_malloc(sizeof(*op))))
        return NULL;
    op->x = x;
    op->room = r->id;
    op->serial = r->serial;
    op->kind = kind;
    op->slot = -1;
    op->prev = NULL;
    op->next = x->ops;
    if (x->ops)
        x->ops->prev = op;
    x->ops = op;
    return op;
}

void pd__xfer_op_free(struct op *op) {
    pd_xfer_t *x = op->x;
    if (op->prev)
        op->prev->next = op->next;
    else
        x->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->next = x->free_ops;
    x->free_ops = op;
}

/* The op was posted and UCX returned a request: account it to its room until it completes. */
void pd__xfer_op_held(pd_xfer_t *x, struct room *r) {
    r->pending++;
    x->outstanding++;
}

/* A completed op's room, or NULL when that room has ended and is gone. */
static struct room *op_done(struct op *op) {
    pd_xfer_t *x = op->x;
    struct room *r = pd__xfer_room_find(x, op->room);
    if (r && r->serial != op->serial)
        r = NULL;
    if (r) {
        r->pending--;
        x->outstanding--;
    }
    x->progress++;
    pd__xfer_op_free(op);
    return r;
}

/* ---- UCX callbacks: state changes only ---- */

void pd__xfer_peer_mark_failed(struct pd_xfer_peer *p, int status) {
    if (!p->failed) {
        p->failed = true;
        p->fail_status = status;
        p->x->peer_failed_flag = true;
    }
}

static void peer_start_close(struct pd_xfer_peer *p, int status);

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st) {
    struct pd_xfer_peer *p = arg;
    int rc = pd__ucs_error(st, "endpoint to peer");
    pd_warn("xfer: peer %016" PRIx64 " endpoint failed: %s", p->remote_id, pd_error_msg());
    (void)ep;
    (void)rc;
    pd__xfer_peer_mark_failed(p, PD_EPEER);
    /* Close now, not after this progress round: on a put lane, UCX 1.13's software RMA would
     * otherwise go on handling puts already buffered from the dead peer. on_peer_failed is still
     * reported from xfer_run. */
    peer_start_close(p, PD_EPEER);
}

void pd__xfer_on_data_sent(void *req, ucs_status_t st, void *user_data) {
    struct op *op = user_data;
    pd_xfer_t *x = op->x;
    if (op->slot >= 0 && x->slots[op->slot].gen == op->slot_gen &&
        --x->slots[op->slot].pending == 0 && x->slots[op->slot].state == SLOT_SENDING)
        x->slots[op->slot].state = SLOT_FREE;
    struct room *r = op_done(op);
    if (st != UCS_OK && r && !r->peer->failed) { /* one line per peer, not one per message */
        pd__ucs_error(st, "sending the room's pages");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        pd__xfer_peer_mark_failed(r->peer, PD_EPEER);
    }
    ucp_request_free(req);
}

void pd__xfer_on_flush_done(void *req, ucs_status_t st, void *user_data) {
    struct room *r = op_done(user_data);
    if (!r) {
        /* its room ended with its peer */
    } else if (st == UCS_OK && r->state == ROOM_FLUSHING) {
        pd_xfer_t *x = r->peer->x;
        r->flushed = true;
        r->qnext = x->flushed_head;
        x->flushed_head = r;
    } else if (st != UCS_OK) {
        pd__ucs_error(st, "flushing the room's puts");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        pd__xfer_peer_mark_failed(r->peer, PD_EPEER);
    }
    ucp_request_free(req);
}

void pd__xfer_on_notice_sent(void *req, ucs_status_t st, void *user_data) {
    struct room *r = op_done(user_data);
    if (!r) {
        /* its room ended with its peer */
    } else if (st == UCS_OK && r->state == ROOM_NOTIFYING) {
        pd__xfer_room_end(r->peer->x, r, r->notice.status);
    } else if (st != UCS_OK) {
        pd__ucs_error(st, "sending the room's notice");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        pd__xfer_peer_mark_failed(r->peer, PD_EPEER);
    }
    ucp_request_free(req);
}

static void on_ep_closed(void *req, ucs_status_t st, void *user_data) {
    struct pd_xfer_peer *p = user_data;
    p->x->outstanding--;
    p->x->progress++;
    p->close_pending = false;
    p->state = PEER_CLOSED;
    (void)st; /* a forced close reports nothing we can act on */
    ucp_request_free(req);
}

/* A receiving room that heard its notice ends once every byte the notice announces is in. */
void pd__xfer_room_try_complete(pd_xfer_t *x, struct room *r) {
    if (!r->has_notice || r->state == ROOM_ENDED)
        return;
    if (r->data_bytes == r->notice.data_bytes) {
        pd__xfer_room_end(x, r, r->notice_status);
    } else if (r->data_bytes > r->notice.data_bytes) {
        pd_warn("xfer: room %" PRIu64 ": %" PRIu64
                " bytes of pages arrived, the notice says %" PRIu64,
                r->id, r->data_bytes, r->notice.data_bytes);
        pd__xfer_room_end(x, r, PD_EFORMAT);
    }
}

/* ---- the run step: progress, post deferred work, call the user ---- */

static void xfer_run(pd_xfer_t *x);

static void arm_timer(pd_xfer_t *x, bool again);

static void on_timer(uv_timer_t *t) {
    xfer_run(t->data);
}

static void on_idle(uv_idle_t *h) {
    pd_xfer_t *x = h->data;
    uv_idle_stop(h);
    x->idle_armed = false;
    xfer_run(x);
}

static void on_poll(uv_poll_t *h, int status, int events) {
    (void)status;
    (void)events;
    xfer_run(h->data);
}

/* pd_devmem_notify's call, on the devmem's own thread once the copies before it are done: the
 * worker's event fd wakes the loop (ucp_worker_signal may be called from any thread), which
 * polls the copies' events now rather than at arm_timer's next 1 ms tick. */
static void on_copies_done(void *arg) {
    (void)ucp_worker_signal(((pd_xfer_t *)arg)->worker);
}

void pd__xfer_wake_after_copies(pd_xfer_t *x) {
    if (pd_devmem_notify(x->dm, on_copies_done, x) != PD_OK)
        pd_debug("xfer: %s; the copies' events are polled every 1 ms", pd_error_msg());
}

void pd__xfer_kick(pd_xfer_t *x) {
    if (x->in_run || x->handles_closing || x->idle_armed)
        return;
    uv_idle_start(&x->idle, on_idle);
    x->idle_armed = true;
}

static void peer_start_close(struct pd_xfer_peer *p, int status) {
    if (p->state != PEER_UP)
        return;
    p->state = PEER_CLOSING;
    p->close_status = status;
    pd_info("xfer: peer %016" PRIx64 ": force-closing endpoint (%u rooms): %s", p->remote_id,
            p->n_rooms, pd_status_str(status));
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = on_ep_closed,
        .user_data = p,
    };
    ucs_status_ptr_t req = ucp_ep_close_nbx(p->ep, &prm);
    p->ep = NULL;
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        p->state = PEER_CLOSED;
    } else {
        p->close_pending = true;
        p->x->outstanding++;
    }
}

static void peer_free(pd_xfer_t *x, struct pd_xfer_peer *p) {
    if (p->prev)
        p->prev->next = p->next;
    else
        x->peers = p->next;
    if (p->next)
        p->next->prev = p->prev;
    x->n_peers--;
    for (int k = 0; k < PD_XFER_SHARDS_MAX; k++)
        if (p->rkey[k])
            ucp_rkey_destroy(p->rkey[k]);
    pd_free(p);
}

/* Handles failed and closed peers. Returns true when anything changed. */
static bool run_peers(pd_xfer_t *x) {
    bool changed = false;
    struct pd_xfer_peer *next;
    for (struct pd_xfer_peer *p = x->peers; p; p = next) {
        next = p->next;
        if (p->failed && !p->fail_reported) {
            p->fail_reported = true;
            changed = true;
            if (x->cb.on_peer_failed)
                x->cb.on_peer_failed(x->cb.ctx, p, p->user, p->fail_status);
            peer_start_close(p, p->fail_status);
        }
        if (p->state != PEER_CLOSED)
            continue;
        /* copies into its pool must be over before its rooms end (their pages get reused) */
        if (p->ipc_base[0]) {
            if (pd_devmem_sync(x->dm) != PD_OK)
                pd_warn("xfer: peer %016" PRIx64 ": %s", p->remote_id, pd_error_msg());
            for (int k = 0; k < x->n_shards; k++) {
                pd_devmem_ipc_close(x->dm, p->ipc_base[k]);
                p->ipc_base[k] = NULL;
            }
        }
        /* its endpoint is closed: UCX reads no slot of it any more */
        for (int i = 0; i < x->n_slots; i++)
            if (x->slots[i].peer == p && x->slots[i].state == SLOT_SENDING) {
                x->slots[i].state = SLOT_FREE;
                x->slots[i].pending = 0;
                x->slots[i].gen++;
            }
        pd__xfer_calls_peer_closed(x, p);
        /* The endpoint is gone: no write of ours or theirs through it can still land. Requests
         * UCX still holds for its rooms are orphaned (their ops name rooms by id). */
        for (struct room *r = p->rooms; r; r = r->pnext)
            if (r->state != ROOM_ENDED) {
                pd__xfer_room_end(x, r, p->close_status);
                changed = true;
            }
        if (p->n_rooms == 0) {
            changed = true;
            void *user = p->user;
            peer_free(x, p);
            if (x->cb.on_peer_closed)
                x->cb.on_peer_closed(x->cb.ctx, p, user);
        }
    }
    return changed;
}

static void run_deadlines(pd_xfer_t *x) {
    uint64_t now = uv_now(x->loop);
    for (struct pd_xfer_peer *p = x->peers; p; p = p->next) {
        if (p->state != PEER_UP)
            continue;
        for (struct room *r = p->rooms; r; r = r->pnext) {
            if (r->state == ROOM_ABORTING && now >= r->abort_deadline_ms) {
                pd_warn("xfer: room %" PRIu64 ": no abort acknowledgement from peer %016" PRIx64
                        " in %d ms; force-closing it",
                        r->id, p->remote_id, x->cfg.abort_timeout_ms);
                peer_start_close(p, PD_ETIMEDOUT);
                break;
            }
        }
    }
}

static bool any_aborting(const pd_xfer_t *x) {
    for (struct pd_xfer_peer *p = x->peers; p; p = p->next)
        for (struct room *r = p->rooms; r; r = r->pnext)
            if (r->state == ROOM_ABORTING)
                return true;
    return false;
}

static void close_handles(pd_xfer_t *x);

static void xfer_run(pd_xfer_t *x) {
    if (x->in_run || x->handles_closing)
        return;
    x->in_run = true;
    unsigned progressed = 0;
    for (int round = 0; round < 64; round++) {
        /* Bounded: a worker that always has something to do must not starve the loop. */
        for (int i = 0; i < 256; i++) {
            unsigned n = ucp_worker_progress(x->worker);
            progressed += n;
            if (!n || x->peer_failed_flag) /* handle a failure before anything else arrives */
                break;
        }
        x->peer_failed_flag = false;
        bool changed = false;
        while (x->flushed_head) {
            struct room *r = x->flushed_head;
            x->flushed_head = r->qnext;
            r->flushed = false;
            if (r->state == ROOM_FLUSHING && !r->peer->failed && r->peer->state == PEER_UP)
                pd__xfer_post_notice(x, r);
            changed = true;
        }
        if (x->slots) /* staged pool, or peers whose runs are regrouped */
            changed |= pd__xfer_run_stage(x);
        if (x->n_ipc)
            changed |= pd__xfer_run_ipc(x);
        if (x->rcount || x->n_held)
            changed |= pd__xfer_run_recv(x);
        run_deadlines(x);
        changed |= run_peers(x);
        if (x->ctl_head || x->calls)
            changed |= pd__xfer_run_calls(x);
        /* The end queue: call the user, free the room (UCX holds ops, not rooms). */
        while (x->end_head) {
            struct room *r = x->end_head;
            x->end_head = r->qnext;
            if (!x->end_head)
                x->end_tail = &x->end_head;
            changed = true;
            uint64_t id = r->id;
            void *user = r->user;
            int status = r->status;
            struct pd_xfer_notice n = r->notice;
            bool has_notice = r->has_notice;
            pd__xfer_room_unlink_and_free(x, r);
            if (x->cb.on_room_end)
                x->cb.on_room_end(x->cb.ctx, id, user, status, has_notice ? &n : NULL);
        }
        if (!changed)
            break;
    }
    /* While data streams, run again on the next loop iteration rather than arm the event fd and
     * sleep: an armed shared-memory worker makes the peer signal the next message it queues (a
     * syscall on each side, and a wake-up), and a sender whose FIFO is full has no event to
     * wait for at all, only the 1 ms timer. So poll for POLL_AFTER_PROGRESS_US after the last
     * progress, SEND_POLL_AFTER_PROGRESS_US while UCX holds our sends, yielding the CPU on empty
     * rounds: on a machine where the peer shares our core (two processes, busy machine) it gets
     * to drain or refill the FIFO at once instead of at the end of our time slice. A stream's
     * messages come microseconds apart; past that gap the burst is over (a chunk's pages are
     * in, the next chunk is still computing), and a receiver that kept polling for the next one
     * would take a core from that computing (2 ms of polling after each burst cost the decode
     * daemon 1.4 ms of CPU a request, on the cores the prefill's forward pass needs). Then arm;
     * BUSY means events arrived meanwhile: go round again. A spinning engine (bench) never
     * sleeps while it has rooms. */
    uint64_t now_us = uv_hrtime() / 1000;
    if (progressed > 0)
        x->last_progress_us = now_us;
    uint64_t since = now_us - x->last_progress_us;
    bool polling = progressed == 0 && x->n_peers > 0 &&
                   (since < POLL_AFTER_PROGRESS_US ||
                    (x->outstanding > 0 && since < SEND_POLL_AFTER_PROGRESS_US) ||
                    (x->cfg.spin && x->n_rooms > 0));
    if (polling)
        sched_yield();
    bool again = progressed > 0 || polling;
    ucs_status_t st = again ? UCS_OK : ucp_worker_arm(x->worker);
    x->in_run = false;
    if (x->freeing && x->n_peers == 0 && !x->end_head && !pd__xfer_calls_waiting(x)) {
        close_handles(x);
        return;
    }
    arm_timer(x, again || (st == UCS_ERR_BUSY && progressed > 0));
    if (st == UCS_ERR_BUSY && progressed == 0 && !x->timer_armed) {
        /* UCX says busy but had nothing to progress (1.13 does this for a while after a
         * shared-memory peer died): poll gently instead of spinning. */
        uv_timer_start(&x->timer, on_timer, 1, 0);
        x->timer_armed = true;
    }
}

/* again: run on the next loop iteration (the worker had more). Else a 1 ms timer while UCX holds
 * requests or rooms have unflushed puts, 50 ms while a receiver abort waits for its deadline,
 * nothing when idle (the event fd wakes us). */
static void arm_timer(pd_xfer_t *x, bool again) {
    bool busy = x->outstanding > 0 || x->n_unflushed > 0 || x->end_head || x->flushed_head ||
                x->n_jobs > 0 || x->n_ipc > 0 || x->rcount > 0 || x->n_held > 0 ||
                x->n_ctl_sending > 0 || x->ctl_head;
    for (int i = 0; !busy && i < x->n_slots; i++)
        busy = x->slots[i].state == SLOT_COPYING;
    for (struct pd_xfer_peer *p = x->peers; !busy && p; p = p->next)
        busy = p->state != PEER_UP || (p->failed && !p->fail_reported);
    if (again || (busy && x->cfg.spin)) {
        pd__xfer_kick(x);
    } else if (busy) {
        uv_timer_start(&x->timer, on_timer, 1, 0);
        x->timer_armed = true;
        return;
    } else if (any_aborting(x)) {
        uv_timer_start(&x->timer, on_timer, 50, 0);
        x->timer_armed = true;
        return;
    } else if (x->calls) {
        /* their deadlines, and progress meanwhile: UCX checks its endpoints' keepalive only
         * inside ucp_worker_progress, and a call into a peer that died (a shared-memory FIFO
         * nobody reads any more) must fail when its endpoint does, not at the deadline */
        uint64_t now = uv_now(x->loop), d = pd__xfer_calls_next_deadline(x);
        if (d != UINT64_MAX) {
            uint64_t wait = d > now ? d - now : 1;
            uv_timer_start(&x->timer, on_timer, wait < CALL_POLL_MS ? wait : CALL_POLL_MS, 0);
            x->timer_armed = true;
            return;
        }
    }
    if (x->timer_armed) {
        uv_timer_stop(&x->timer);
        x->timer_armed = false;
    }
}

/* ---- engine life ---- */

/* Checks --disaggregation-ib-device against libibverbs and builds UCX_NET_DEVICES from it. */
static int check_ib_devices(pd_xfer_t *x, const char *want, char *net, size_t net_cap) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    char present[256] = "";
    size_t used = 0;
    for (int i = 0; list && i < n; i++)
        used +=
            (size_t)snprintf(present + used, used < sizeof(present) ? sizeof(present) - used : 0,
                             "%s%s", i ? ", " : "", ibv_get_device_name(list[i]));
    if (!want || !*want) {
        x->rdma = n > 0;
        net[0] = '\0';
        if (list)
            ibv_free_device_list(list);
        return PD_OK;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", want);
    size_t off = 0;
    net[0] = '\0';
    int rc = PD_OK;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (int i = 0; list && i < n; i++)
            found |= strcmp(ibv_get_device_name(list[i]), tok) == 0;
        if (!found) {
            rc = pd_errorf(PD_ENOENT,
                           "--disaggregation-ib-device: no RDMA device '%s'; devices present: %s",
                           tok, n > 0 ? present : "none");
            break;
        }
        off += (size_t)snprintf(net + off, off < net_cap ? net_cap - off : 0, "%s%s:1",
                                off ? "," : "", tok);
    }
    if (list)
        ibv_free_device_list(list);
    x->rdma = rc == PD_OK;
    return rc;
}

/* Whether UCX_TLS (NULL: unset) may let UCX pick transport tl: unset, "all", an exclusion list
 * ("^...") that does not name it, or a list that names it. */
static bool tls_may_pick(const char *tls, const char *tl) {
    if (!tls || !*tls)
        return true;
    bool negated = tls[0] == '^';
    bool named = false, all = false;
    const size_t n = strlen(tl);
    for (const char *t = tls + negated; *t;) {
        size_t len = strcspn(t, ",");
        size_t name_len = strcspn(t, ",:"); /* "tcp:aux" names tcp */
        named |= name_len == n && !strncmp(t, tl, n);
        all |= name_len == 3 && !strncmp(t, "all", 3);
        t += len + (t[len] == ',');
    }
    return negated ? !named : named || all;
}

/* Sets UCX's `name` (UCX_<name> in the environment) to value unless the environment sets it.
 * key: the name ucp_config_modify knows it by, when that differs (a transport's own field goes
 * without the transport's prefix: "TX_SEG_SIZE" for UCX_TCP_TX_SEG_SIZE); else NULL. */
static int config_set(ucp_config_t *c, const char *name, const char *key, const char *value) {
    char env[64];
    snprintf(env, sizeof(env), "UCX_%s", name);
    if (getenv(env))
        return PD_OK; /* the operator's environment wins */
    ucs_status_t st = ucp_config_modify(c, key ? key : name, value);
    if (st != UCS_OK)
        return pd__ucs_error(st, "setting UCX configuration");
    return PD_OK;
}

int pd_xfer_new(uv_loop_t *loop, const struct pd_xfer_config *cfg,
                const struct pd_xfer_callbacks *cb, pd_xfer_t **out) {
    int rc;
    ucs_status_t st;
    *out = NULL;
    pd_xfer_t *x = pd_calloc(1, sizeof(*x));
    if (!x)
        return pd_error_wrap(PD_ENOMEM, "creating the transfer engine");
    x->loop = loop;
    x->cb = *cb;
    if (cfg)
        x->cfg = *cfg;
    if (x->cfg.abort_timeout_ms <= 0)
        x->cfg.abort_timeout_ms = 5000;
    if (x->cfg.keepalive_ms <= 0)
        x->cfg.keepalive_ms = 1000;
    if (x->cfg.max_put_bytes == 0)
        x->cfg.max_put_bytes = (size_t)8 << 20;
    x->end_tail = &x->end_head;
    x->ctl_tail = &x->ctl_head;
    x->efd = -1;
    if (getrandom(&x->id, sizeof(x->id), 0) != (ssize_t)sizeof(x->id)) {
        rc = pd_errorf(PD_EIO, "drawing the transfer engine id");
        goto fail_alloc;
    }
    x->n_buckets = 64;
    x->buckets = pd_calloc(x->n_buckets, sizeof(*x->buckets));
    if (!x->buckets) {
        rc = pd_error_wrap(PD_ENOMEM, "creating the room table");
        goto fail_alloc;
    }

    char net[256];
    rc = check_ib_devices(x, x->cfg.ib_devices, net, sizeof(net));
    if (rc)
        goto fail_buckets;

    ucp_config_t *ucfg;
    st = ucp_config_read(NULL, NULL, &ucfg);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "reading UCX configuration");
        goto fail_buckets;
    }
    char ka[32];
    snprintf(ka, sizeof(ka), "%dms", x->cfg.keepalive_ms);
    const char *tls = getenv("UCX_TLS");
    /* UCX warns of a setting no transport took: tcp's only where UCX_TLS may pick tcp */
    if ((rc = config_set(ucfg, "KEEPALIVE_INTERVAL", NULL, ka)) ||
        (rc = config_set(ucfg, "MM_SEG_SIZE", NULL, PD_XFER_MM_SEG_SIZE)) ||
        (tls_may_pick(tls, "tcp") &&
         (rc = config_set(ucfg, "TCP_TX_SEG_SIZE", "TX_SEG_SIZE", PD_XFER_TCP_SEG_SIZE))) ||
        (net[0] && (rc = config_set(ucfg, "NET_DEVICES", NULL, net)))) {
        ucp_config_release(ucfg);
        goto fail_buckets;
    }
    snprintf(x->tls, sizeof(x->tls), "%s", tls ? tls : "all");
    const char *nd = getenv("UCX_NET_DEVICES");
    snprintf(x->net_devices, sizeof(x->net_devices), "%s", nd ? nd : net[0] ? net : "all");
    if (!x->rdma)
        pd_warn("xfer: no RDMA device present; KV pages go over shared memory/TCP "
                "(UCX_TLS=%s)",
                x->tls);

    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    st = ucp_init(&params, ucfg, &x->ctx);
    ucp_config_release(ucfg);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "initializing UCX");
        goto fail_buckets;
    }
    ucp_context_attr_t cattr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    st = ucp_context_query(x->ctx, &cattr);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "querying the UCX context");
        goto fail_ctx;
    }
    x->cuda_memory = (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "creating the UCX worker");
        goto fail_ctx;
    }
    static const struct {
        uint16_t id;
        ucp_am_recv_callback_t cb;
        const char *doing;
    } handlers[] = {
        {PD_XFER_AM_NOTICE, pd__xfer_on_notice_am, "registering the room notice handler"},
        {PD_XFER_AM_DATA, pd__xfer_on_data_am, "registering the page data handler"},
        {PD_XFER_AM_CALL, pd__xfer_on_call_am, "registering the call handler"},
        {PD_XFER_AM_ANSWER, pd__xfer_on_answer_am, "registering the call answer handler"},
    };
    for (size_t k = 0; k < PD_ARRAY_LEN(handlers); k++) {
        ucp_am_handler_param_t ap = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG,
            .id = handlers[k].id,
            .cb = handlers[k].cb,
            .arg = x,
        };
        st = ucp_worker_set_am_recv_handler(x->worker, &ap);
        if (st != UCS_OK) {
            rc = pd__ucs_error(st, handlers[k].doing);
            goto fail_worker;
        }
    }
    ucp_address_t *addr;
    st = ucp_worker_get_address(x->worker, &addr, &x->worker_addr_len);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "getting the UCX worker address");
        goto fail_worker;
    }
    x->worker_addr = pd_malloc(x->worker_addr_len);
    if (!x->worker_addr) {
        ucp_worker_release_address(x->worker, addr);
        rc = pd_error_wrap(PD_ENOMEM, "copying the UCX worker address");
        goto fail_worker;
    }
    memcpy(x->worker_addr, addr, x->worker_addr_len);
    ucp_worker_release_address(x->worker, addr);
    st = ucp_worker_get_efd(x->worker, &x->efd);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "getting the UCX worker event fd");
        goto fail_addr;
    }
    int urc = uv_poll_init(loop, &x->poll, x->efd);
    if (urc) {
        rc = pd_errorf(pd_status_from_errno(-urc), "watching the UCX event fd: %s",
                       uv_strerror(urc));
        goto fail_addr;
    }
    x->poll.data = x;
    uv_timer_init(loop, &x->timer);
    x->timer.data = x;
    uv_idle_init(loop, &x->idle);
    x->idle.data = x;
    x->handles_open = 3;
    uv_poll_start(&x->poll, UV_READABLE, on_poll);
    ucp_worker_arm(x->worker);
    pd_info("xfer: engine %016" PRIx64 " up: UCX %s, UCX_TLS=%s, net devices %s, CUDA memory %s",
            x->id, ucp_get_version_string(), x->tls, x->net_devices,
            x->cuda_memory ? "yes" : "no (host-only UCX: GPU pages need CUDA IPC or staging)");
    *out = x;
    return PD_OK;

fail_addr:
    pd_free(x->worker_addr);
fail_worker:
    ucp_worker_destroy(x->worker);
fail_ctx:
    ucp_cleanup(x->ctx);
fail_buckets:
    pd_free(x->buckets);
fail_alloc:
    pd_free(x);
    return rc;
}

static void on_handle_closed(uv_handle_t *h) {
    pd_xfer_t *x = h->data;
    if (--x->handles_open > 0)
        return;
    for (int k = 0; k < x->n_memh; k++) {
        ucp_rkey_buffer_release(x->rkey_buf[k]);
        ucp_mem_unmap(x->ctx, x->memh[k]);
    }
    for (size_t k = 0; k < x->n_held; k++) /* UCX's: back before the worker goes */
        ucp_am_data_release(x->worker, x->held[(x->held_head + k) % RECV_HELD].data);
    ucp_worker_destroy(x->worker); /* no callback can come after this */
    pd__xfer_calls_free(x);
    pd__xfer_recv_ring_free(x);
    pd__xfer_ring_free(x); /* x->dm outlives the engine (xfer.h) */
    if (x->regroup_dt)
        ucp_dt_destroy(x->regroup_dt);
    for (size_t k = 0; k < x->n_ipc; k++)
        pd_devmem_event_free(x->dm, x->ipc_waits[(x->ipc_head + k) % x->ipc_cap].ev);
    for (size_t k = 0; k < x->n_free_evs; k++)
        pd_devmem_event_free(x->dm, x->free_evs[k]);
    pd_free(x->ipc_waits);
    pd_free(x->free_evs);
    ucp_cleanup(x->ctx);
    for (struct op *op = x->ops, *next; op; op = next) {
        next = op->next;
        pd_free(op);
    }
    for (struct op *op = x->free_ops, *next; op; op = next) {
        next = op->next;
        pd_free(op);
    }
    pd_free(x->worker_addr);
    pd_free(x->buckets);
    pd_free(x);
}

static void close_handles(pd_xfer_t *x) {
    if (x->handles_closing)
        return;
    x->handles_closing = true;
    /* every pd_devmem_notify call still pending comes now: each signals the worker, which is
     * destroyed once the handles closed */
    if (x->dm)
        (void)pd_devmem_sync(x->dm);
    uv_poll_stop(&x->poll);
    uv_timer_stop(&x->timer);
    uv_idle_stop(&x->idle);
    uv_close((uv_handle_t *)&x->poll, on_handle_closed);
    uv_close((uv_handle_t *)&x->timer, on_handle_closed);
    uv_close((uv_handle_t *)&x->idle, on_handle_closed);
}

void pd_xfer_free(pd_xfer_t *x) {
    if (!x || x->freeing)
        return;
    x->freeing = true;
    for (struct pd_xfer_peer *p = x->peers; p; p = p->next)
        peer_start_close(p, PD_ECANCELED);
    if (x->in_run)
        return; /* xfer_run finishes the job */
    xfer_run(x);
}

uint64_t pd_xfer_id(const pd_xfer_t *x) {
    return x->id;
}

void pd_xfer_get_info(const pd_xfer_t *x, struct pd_xfer_info *out) {
    out->transports = x->tls;
    out->net_devices = x->net_devices;
    out->cuda_memory = x->cuda_memory;
    out->rdma = x->rdma;
    out->live_rooms = x->n_rooms;
    out->live_peers = x->n_peers;
    out->outstanding = x->outstanding > 0 ? (uint32_t)x->outstanding : 0;
    out->progress = x->progress;
    out->pool_pages = x->n_pages;
    out->page_bytes = x->page_bytes;
    out->n_shards = x->n_shards;
    out->shard_page_bytes = x->shard_page_bytes;
    out->dropped_writes = x->dropped_writes;
    out->staged = x->staged;
    out->staged_bytes = x->staged_bytes;
    out->ipc_bytes = x->ipc_bytes;
    out->recv_staged_bytes = x->recv_staged_bytes;
    out->recv_copying_bytes = x->recv_copying;
    out->recv_held = x->recv_held_msgs;
    out->recv_waits = x->recv_waits;
}

/* A pool's shape, checked before anything is mapped. */
int pd__xfer_pool_check(void *const *bases, int n_shards, size_t shard_page_bytes,
                        uint32_t n_pages) {
    if (n_shards < 1 || n_shards > PD_XFER_SHARDS_MAX)
        return pd_errorf(PD_EINVAL, "registering the KV pool: %d shards, not 1 .. %d", n_shards,
                         PD_XFER_SHARDS_MAX);
    if (!bases || shard_page_bytes == 0 || n_pages == 0)
        return pd_errorf(PD_EINVAL, "registering the KV pool: empty pool");
    if (shard_page_bytes > SIZE_MAX / n_pages / (size_t)n_shards)
        return pd_errorf(PD_EINVAL,
                         "registering the KV pool: %d shards of %u pages of %zu bytes overflow",
                         n_shards, n_pages, shard_page_bytes);
    for (int k = 0; k < n_shards; k++)
        if (!bases[k])
            return pd_errorf(PD_EINVAL, "registering the KV pool: shard %d has no memory", k);
    return PD_OK;
}

void pd__xfer_pool_take(pd_xfer_t *x, void *const *bases, int n_shards, size_t shard_page_bytes,
                        uint32_t n_pages) {
    x->n_shards = n_shards;
    for (int k = 0; k < n_shards; k++)
        x->pool_bases[k] = bases[k];
    x->shard_page_bytes = shard_page_bytes;
    x->page_bytes = shard_page_bytes * (size_t)n_shards;
    x->n_pages = n_pages;
}

/* Maps regions [bases[k], bases[k] + bytes) for k < n into memh[k] (CUDA memory when cuda) and
 * packs their rkeys; all or none. `what` names the memory in errors. */
int pd__xfer_map_regions(pd_xfer_t *x, void *const *bases, int n, size_t bytes, bool cuda,
                         const char *what) {
    int k, rc = PD_OK;
    char doing[128];
    for (k = 0; k < n; k++) {
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            .address = bases[k],
            .length = bytes,
        };
        if (cuda) {
            mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
            mp.memory_type = UCS_MEMORY_TYPE_CUDA;
        }
        ucs_status_t st = ucp_mem_map(x->ctx, &mp, &x->memh[k]);
        if (st != UCS_OK) {
            if (n > 1)
                snprintf(doing, sizeof(doing), "registering %s (shard %d of %d) with UCX", what, k,
                         n);
            else
                snprintf(doing, sizeof(doing), "registering %s with UCX", what);
            rc = pd__ucs_error(st, doing);
            break;
        }
        st = ucp_rkey_pack(x->ctx, x->memh[k], &x->rkey_buf[k], &x->rkey_len[k]);
        if (st != UCS_OK) {
            snprintf(doing, sizeof(doing), "packing the rkey of %s", what);
            rc = pd__ucs_error(st, doing);
            ucp_mem_unmap(x->ctx, x->memh[k]);
            break;
        }
    }
    if (rc) {
        while (k-- > 0) {
            ucp_rkey_buffer_release(x->rkey_buf[k]);
            ucp_mem_unmap(x->ctx, x->memh[k]);
        }
        memset(x->memh, 0, sizeof(x->memh));
        memset(x->rkey_buf, 0, sizeof(x->rkey_buf));
        memset(x->rkey_len, 0, sizeof(x->rkey_len));
        return rc;
    }
    x->n_memh = n;
    return PD_OK;
}

int pd_xfer_register_pool(pd_xfer_t *x, void *base, size_t page_bytes, uint32_t n_pages) {
    return pd_xfer_register_pool_shards(x, &base, 1, page_bytes, n_pages);
}

int pd_xfer_register_pool_shards(pd_xfer_t *x, void *const *bases, int n_shards,
                                 size_t shard_page_bytes, uint32_t n_pages) {
    PD_ASSERT(!x->n_memh && !x->dm);
    int rc = pd__xfer_pool_check(bases, n_shards, shard_page_bytes, n_pages);
    if (rc)
        return rc;
    rc = pd__xfer_map_regions(x, bases, n_shards, shard_page_bytes * n_pages, false, "the KV pool");
    if (rc)
        return rc;
    pd__xfer_pool_take(x, bases, n_shards, shard_page_bytes, n_pages);
    if (n_shards == 1)
        pd_info("xfer: KV pool registered: %u pages of %zu bytes at %p", n_pages, shard_page_bytes,
                bases[0]);
    else
        pd_info("xfer: KV pool registered: %u pages of %d shards x %zu bytes (shard 0 at %p)",
                n_pages, n_shards, shard_page_bytes, bases[0]);
    return PD_OK;
}

void pd_xfer_local_ipc(const pd_xfer_t *x, const void **handle, size_t *len) {
    *handle = x->ipc_len[0] ? x->ipc_handle[0] : NULL;
    *len = x->ipc_len[0];
}

void pd_xfer_local_address(const pd_xfer_t *x, const void **addr, size_t *len) {
    *addr = x->worker_addr;
    *len = x->worker_addr_len;
}

void pd_xfer_local_rkey(const pd_xfer_t *x, const void **rkey, size_t *len, uint64_t *base) {
    *rkey = x->n_memh ? x->rkey_buf[0] : NULL;
    *len = x->n_memh ? x->rkey_len[0] : 0;
    *base = (uint64_t)(uintptr_t)x->pool_bases[0];
}

void pd_xfer_local_peer_info(const pd_xfer_t *x, struct pd_xfer_peer_info *out) {
    memset(out, 0, sizeof(*out));
    out->remote_id = x->id;
    out->worker_addr = x->worker_addr;
    out->worker_addr_len = x->worker_addr_len;
    if (!x->n_memh)
        return;
    out->page_bytes = x->page_bytes;
    out->n_pages = x->n_pages;
    out->n_shards = x->n_shards;
    out->shard_page_bytes = x->shard_page_bytes;
    out->am_only = x->staged; /* the rkeys below are the ring's: no put may use them */
    out->heads = x->heads;
    for (int k = 0; k < x->n_shards; k++) {
        int m = x->staged ? 0 : k; /* a staged pool hands out the ring's rkey for every shard */
        out->shards[k] = (struct pd_xfer_shard){
            .rkey = x->rkey_buf[m],
            .rkey_len = x->rkey_len[m],
            .base = (uint64_t)(uintptr_t)x->pool_bases[k],
            .ipc_handle = x->ipc_len[k] ? x->ipc_handle[k] : NULL,
            .ipc_handle_len = x->ipc_len[k],
        };
    }
    out->rkey = out->shards[0].rkey;
    out->rkey_len = out->shards[0].rkey_len;
    out->base = out->shards[0].base;
    out->ipc_handle = out->shards[0].ipc_handle;
    out->ipc_handle_len = out->shards[0].ipc_handle_len;
}

/* Page data per message: the configured size, else one eager fragment of the lane (eager_max)
 * less room for UCX's and our headers (a larger message would be fragmented and reassembled by
 * UCX: one more copy), 64-byte aligned. */
size_t pd__xfer_am_chunk(const pd_xfer_t *x, size_t eager_max) {
    size_t chunk = x->cfg.am_chunk_bytes;
    if (eager_max > AM_MSG_MAX)
        eager_max = AM_MSG_MAX;
    if (chunk == 0)
        chunk = eager_max > AM_CHUNK_MIN + 128 ? (eager_max - 128) & ~(size_t)63 : AM_CHUNK_MIN;
    if (chunk > ((AM_MSG_MAX - 128) & ~(size_t)63))
        chunk = (AM_MSG_MAX - 128) & ~(size_t)63; /* a configured one, too */
    return chunk;
}

/* The lanes UCX picked for ep, out of ucp_ep_print_info (1.13 has no endpoint transport query):
 * their transports joined by '+' ("rc_mlx5/mlx5_0:1", "posix/memory+cma/memory"), the largest
 * active message that goes eager in one fragment, and whether a lane has hardware RMA. Returns
 * the length written to names (0: UCX printed nothing we could read). */
size_t pd__xfer_ep_lanes(ucp_ep_h ep, char *names, size_t cap, size_t *eager_max_out,
                         bool *hw_rma_out) {
    *eager_max_out = 0;
    *hw_rma_out = false;
    if (cap)
        names[0] = '\0';
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return 0;
    ucp_ep_print_info(ep, f);
    fclose(f);
    size_t used = 0, eager_max = 0;
    bool hw_rma = false;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        /* "#    am_send: 0..<egr/short>..93..<egr/bcopy>..65600..<rndv>..(inf)": the largest
         * message that still goes eager in one fragment */
        char *am = strstr(line, "am_send:");
        for (char *e = am ? strstr(am, "<egr/") : NULL; e; e = strstr(e + 1, "<egr/")) {
            char *dots = strstr(e, ">..");
            if (dots && dots[3] >= '0' && dots[3] <= '9')
                eager_max = strtoull(dots + 3, NULL, 10);
        }
        /* "#                 lane[0]:  0:tcp/lo.0 md[0]    -> md[0]/tcp/sysdev[255] am am_bw#0" */
        char *lane = strstr(line, "lane[");
        char *colon = lane ? strstr(lane, "]:") : NULL;
        char *tl = colon ? strchr(colon + 2, ':') : NULL;
        if (!tl)
            continue;
        tl++;
        size_t n = strcspn(tl, " ");
        if (n > 2 && tl[n - 2] == '.') /* drop the ".0" path index */
            n -= 2;
        char *arrow = strstr(tl, "->");
        hw_rma |= arrow && (strstr(arrow, " rma") != NULL);
        if (used + n + 2 < cap)
            used +=
                (size_t)snprintf(names + used, cap - used, "%s%.*s", used ? "+" : "", (int)n, tl);
    }
    free(buf); /* open_memstream's buffer comes from the C library */
    *eager_max_out = eager_max;
    *hw_rma_out = hw_rma;
    return used;
}

/* Names the peer's lanes ("rc_mlx5/mlx5_0:1") and decides how pages travel to a receiver: puts
 * where a lane has hardware RMA, else active messages ("tcp/lo (am)"), since UCX would only
 * emulate the puts. */
static void peer_find_transport(struct pd_xfer_peer *p) {
    snprintf(p->transport, sizeof(p->transport), "unknown");
    p->am_data = p->rkey[0] && p->x->cfg.data_path != PD_XFER_DATA_PUT; /* unless RMA lane */
    size_t eager_max;
    bool hw_rma;
    char names[sizeof(p->transport)];
    size_t used = pd__xfer_ep_lanes(p->ep, names, sizeof(names), &eager_max, &hw_rma);
    if (used)
        memcpy(p->transport, names, used + 1);
    /* Page data per message: the configured size, else one eager fragment of the lane less room
     * for UCX's and our headers (a larger message would be fragmented and reassembled by UCX:
     * one more copy). */
    p->am_chunk = pd__xfer_am_chunk(p->x, eager_max);
    if (!p->rkey[0])
        return;
    enum pd_xfer_data_path dp = p->x->cfg.data_path;
    p->am_data = dp == PD_XFER_DATA_AM || (dp == PD_XFER_DATA_AUTO && !(used && hw_rma));
    if (p->x->staged || p->am_only || p->regroup) /* pages through a pinned ring */
        p->am_data = true;
    if (p->ipc_base[0]) /* device copies into the peer's mapped pool; UCX carries the notice */
        p->am_data = false;
    if (p->ipc_base[0])
        snprintf(p->transport + used, sizeof(p->transport) - used,
                 " (notice only; GPU pages by CUDA IPC device copies)");
    else if (!p->am_data)
        snprintf(p->transport + used, sizeof(p->transport) - used, " (put)");
    else
        snprintf(p->transport + used, sizeof(p->transport) - used, " (am of %zu bytes%s)",
                 p->am_chunk,
                 p->regroup     ? "; kv heads regrouped for the peer's tensor parallelism"
                 : p->x->staged ? "; GPU pages staged through pinned host memory"
                 : p->am_only   ? "; the peer stages its GPU pages through pinned host memory"
                 : hw_rma       ? ""
                                : "; UCX has only sw-rma here");
}

/* The remote pool's shards as info describes them (one shard: the single-pool fields). */
static int peer_info_shards(const struct pd_xfer_peer_info *info, struct pd_xfer_shard *sh, int *n,
                            uint64_t *shard_page_bytes) {
    if (info->n_shards <= 1) {
        sh[0] = (struct pd_xfer_shard){.rkey = info->rkey,
                                       .rkey_len = info->rkey_len,
                                       .base = info->base,
                                       .ipc_handle = info->ipc_handle,
                                       .ipc_handle_len = info->ipc_handle_len};
        *n = 1;
    } else if (info->n_shards > PD_XFER_SHARDS_MAX) {
        return pd_errorf(PD_EINVAL, "connecting peer %016" PRIx64 ": %d pool shards, at most %d",
                         info->remote_id, info->n_shards, PD_XFER_SHARDS_MAX);
    } else {
        memcpy(sh, info->shards, (size_t)info->n_shards * sizeof(*sh));
        *n = info->n_shards;
    }
    *shard_page_bytes =
        info->shard_page_bytes ? info->shard_page_bytes : info->page_bytes / (uint64_t)*n;
    if (!sh[0].rkey_len)
        return PD_OK; /* not a receiver: no pool */
    if (*shard_page_bytes * (uint64_t)*n != info->page_bytes)
        return pd_errorf(PD_EINVAL,
                         "connecting peer %016" PRIx64 ": its pages of %" PRIu64
                         " bytes are not %d shards of %" PRIu64 " bytes",
                         info->remote_id, info->page_bytes, *n, *shard_page_bytes);
    for (int k = 1; k < *n; k++)
        if (!sh[k].rkey_len)
            return pd_errorf(PD_EINVAL, "connecting peer %016" PRIx64 ": shard %d has no rkey",
                             info->remote_id, k);
    return PD_OK;
}

int pd_xfer_peer_connect(pd_xfer_t *x, const struct pd_xfer_peer_info *info, void *peer_user,
                         pd_xfer_peer_t **out) {
    int rc;
    *out = NULL;
    if (x->freeing)
        return pd_errorf(PD_ECANCELED, "connecting a peer: the engine is shutting down");
    struct pd_xfer_shard sh[PD_XFER_SHARDS_MAX];
    int ns = 0;
    uint64_t spb = 0;
    if ((rc = peer_info_shards(info, sh, &ns, &spb)) != PD_OK)
        return rc;
    const bool receiver = sh[0].rkey_len != 0;
    if (receiver && !x->n_memh)
        return pd_errorf(PD_EINVAL, "connecting a receiver peer before registering our pool");
    if (receiver && info->am_only && x->cfg.data_path == PD_XFER_DATA_PUT)
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its KV pool is GPU memory staged "
                         "through host memory, which takes pages only as active messages, but "
                         "this engine is configured to send them as puts",
                         info->remote_id);
    struct pd_xfer_peer *p = pd_calloc(1, sizeof(*p));
    if (!p)
        return pd_error_wrap(PD_ENOMEM, "connecting peer %016" PRIx64, info->remote_id);
    p->x = x;
    /* shard k to shard k, or (another split of the kv heads) regrouped through the ring */
    if (receiver && (rc = pd__xfer_peer_regroup(x, info, ns, spb, p)) != PD_OK)
        goto fail_alloc;
    p->am_only = receiver && info->am_only;
    p->user = peer_user;
    p->remote_id = info->remote_id;
    for (int k = 0; k < ns; k++)
        p->base[k] = sh[k].base;
    p->page_bytes = info->page_bytes;
    p->n_pages = info->n_pages;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = info->worker_addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = p},
    };
    ucs_status_t st = ucp_ep_create(x->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "connecting to the peer's UCX worker");
        goto fail_alloc;
    }
    for (int k = 0; receiver && k < ns; k++) {
        st = ucp_ep_rkey_unpack(p->ep, sh[k].rkey, &p->rkey[k]);
        if (st != UCS_OK) {
            char doing[96];
            snprintf(doing, sizeof(doing), "unpacking the rkey of the peer's KV pool shard %d", k);
            rc = pd__ucs_error(st, doing);
            goto fail_rkeys;
        }
    }
    bool ipc_all = receiver && x->dm && !x->cfg.disable_ipc && !p->regroup;
    for (int k = 0; k < ns; k++)
        ipc_all &= sh[k].ipc_handle_len != 0;
    for (int k = 0; ipc_all && k < ns; k++) {
        if (pd_devmem_ipc_open(x->dm, sh[k].ipc_handle, sh[k].ipc_handle_len, &p->ipc_base[k]) !=
            PD_OK) {
            pd_info("xfer: peer %016" PRIx64 ": no CUDA IPC (%s); pages go over UCX",
                    info->remote_id, pd_error_msg());
            for (int j = 0; j < k; j++) /* all shards or none */
                pd_devmem_ipc_close(x->dm, p->ipc_base[j]);
            memset(p->ipc_base, 0, sizeof(p->ipc_base));
            break;
        }
    }
    peer_find_transport(p);
    p->next = x->peers;
    if (x->peers)
        x->peers->prev = p;
    x->peers = p;
    x->n_peers++;
    if (ns > 1 || p->regroup)
        pd_info("xfer: peer %016" PRIx64 " connected (receiver, %d shards%s): data lane %s",
                p->remote_id, ns, p->regroup ? ", kv heads split otherwise than ours" : "",
                p->transport);
    else
        pd_info("xfer: peer %016" PRIx64 " connected (%s): data lane %s", p->remote_id,
                receiver ? "receiver" : "sender", p->transport);
    *out = p;
    return PD_OK;

fail_rkeys:
    for (int k = 0; k < ns; k++)
        if (p->rkey[k])
            ucp_rkey_destroy(p->rkey[k]);
    {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t req = ucp_ep_close_nbx(p->ep, &prm);
        if (req && !UCS_PTR_IS_ERR(req))
            ucp_request_free(req); /* completes inside UCX; nothing of ours refers to it */
    }
fail_alloc:
    pd_free(p);
    return rc;
}

void pd_xfer_peer_close(pd_xfer_peer_t *p, int status) {
    if (!p)
        return;
    peer_start_close(p, status);
    pd__xfer_kick(p->x);
}

const char *pd_xfer_peer_transport(const pd_xfer_peer_t *p) {
    return p->transport;
}
uint64_t pd_xfer_peer_remote_id(const pd_xfer_peer_t *p) {
    return p->remote_id;
}
