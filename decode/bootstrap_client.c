/*
 * bootstrap_client.c — the decode's side of the bootstrap protocol (common/bootstrap.h): its
 * pairing state with one prefill, the queue of rooms waiting for the pair, and the context of
 * each RPC in flight. The client frees itself only when its last RPC has called back.
 */
#include "decode/bootstrap_client.h"
#include "common/bootstrap_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/alloc.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "pdserve/v1/bootstrap.pb-c.h"

/* ---- client ---- */

struct croom {
    struct croom *next;
    pd_bootstrap_client_t *c;
    uint64_t room;
    void *user;
    uint32_t *pages;
    uint32_t n;
    uint32_t held_pages;
    uint32_t prompt_len;
    pd_xfer_peer_t *peer; /* the pairing its Transfer went out under */
    bool over_ucx;        /* ... as a call on that pairing's endpoint */
    bool transfer_inflight;
    bool abort_pending;
    char reason[128];
};

enum pair_state { UNPAIRED, PAIRING, PAIRED };

struct pd_bootstrap_client {
    pd_grpc_channel_t *ch;
    pd_xfer_t *x;
    struct pd_bootstrap_client_config cfg;
    struct pd_bootstrap_client_callbacks cb;
    uint8_t key[PD_CLUSTER_KEY_MAX];
    char decode_id[128];
    char target[128];
    enum pair_state state;
    bool skips_held_pages;  /* the paired prefill honours TransferRequest.held_pages */
    bool ucx_calls;         /* ... serves Transfer and Abort over the pair's endpoints */
    uint64_t pair_conn;     /* the gRPC connection known to reach that prefill (over_ucx) */
    uint64_t pair_id;       /* PairReply.pair_id: every Transfer and Abort carries it */
    pd_xfer_peer_t *peer;   /* to the prefill: liveness, and the notices' expected sender */
    struct croom *waiting;  /* rooms queued until the pair is up */
    struct croom *inflight; /* rooms whose Transfer has not answered */
    int calls;
    bool freeing;
};

static void client_maybe_done(pd_bootstrap_client_t *c) {
    if (!c->freeing || c->calls > 0)
        return;
    pd_free(c);
}

static void croom_free(struct croom *r) {
    pd_free(r->pages);
    pd_free(r);
}

static void croom_unlink(struct croom **head, struct croom *r) {
    for (struct croom **pp = head; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            return;
        }
    }
}

/* What a Transfer or Abort goes as: a call of ucx_method over the pair's endpoint, without the
 * key (common/bootstrap.h), when the paired prefill serves them and our gRPC channel still holds
 * the connection known to reach that very prefill (pair_conn: the one Pair went over, or the one
 * a later Transfer over gRPC found our pairing on); else 0 (a gRPC call). A prefill that died
 * closed that connection at once, while UCX may take a keepalive interval to fail its endpoint
 * (a shared-memory one stays writable): a Transfer sent there would be lost, and a prefill
 * restarted on the same address meanwhile would get the requests but not their Transfers. A new
 * connection may reach such a restarted prefill, so it proves nothing until a Transfer over it
 * is answered: over gRPC the Transfer reaches whoever serves the address now, which answers
 * NOT_FOUND if it is not our pair (then we pair again), or takes it (then that connection
 * reaches our pair, and Transfers go over UCX again). */
static uint32_t over_ucx(const pd_bootstrap_client_t *c, uint32_t ucx_method) {
    if (!c->ucx_calls || c->state != PAIRED || !c->peer)
        return 0;
    uint64_t conn = pd_grpc_channel_connection(c->ch);
    return conn && conn == c->pair_conn ? ucx_method : 0;
}

/* ucx_method 0: method over gRPC; else that call over the pair's endpoint (over_ucx). */
static int client_call(pd_bootstrap_client_t *c, const char *method, uint32_t ucx_method,
                       const ProtobufCMessage *msg, pd_grpc_reply_fn fn, void *ctx) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = pd_malloc(n ? n : 1);
    if (!buf)
        return pd_error_wrap(PD_ENOMEM, "packing %s", method);
    protobuf_c_message_pack(msg, buf);
    int rc = ucx_method ? pd_xfer_call(c->peer, ucx_method, buf, n, c->cfg.deadline_ms, fn, ctx)
                        : pd_grpc_call(c->ch, method, buf, n, c->cfg.deadline_ms, fn, ctx);
    pd_free(buf);
    if (rc == PD_OK)
        c->calls++;
    return rc;
}

static void send_abort(pd_bootstrap_client_t *c, uint64_t room, const char *reason);

struct abort_ctx {
    pd_bootstrap_client_t *c;
    uint64_t room;
};

static void on_abort_reply(void *ctx, int status, const uint8_t *reply, size_t len) {
    struct abort_ctx *ac = ctx;
    pd_bootstrap_client_t *c = ac->c;
    if (!c->freeing) {
        if (status != PD_OK) {
            /* The engine's abort timeout bounds the wait: it force-closes the endpoint. */
            pd_warn("bootstrap: room %" PRIu64 ": %s", ac->room, pd_error_msg());
        } else {
            Pdserve__V1__AbortReply *rp = pdserve__v1__abort_reply__unpack(NULL, len, reply);
            if (rp && !rp->found && pd_xfer_room_live(c->x, ac->room)) {
                /* The prefill has no such room: nothing of it is in flight any more. */
                pd_xfer_room_release(c->x, ac->room, PD_ECANCELED);
            }
            if (rp)
                pdserve__v1__abort_reply__free_unpacked(rp, NULL);
        }
    }
    pd_free(ac);
    c->calls--; /* last: callbacks above may free the client, which must wait for us */
    client_maybe_done(c);
}

static void send_abort(pd_bootstrap_client_t *c, uint64_t room, const char *reason) {
    struct abort_ctx *ac = pd_malloc(sizeof(*ac));
    if (!ac) {
        pd_warn("bootstrap: room %" PRIu64 ": no memory for the Abort call; the abort timeout "
                "will close the endpoint",
                room);
        return;
    }
    ac->c = c;
    ac->room = room;
    Pdserve__V1__AbortRequest rq = PDSERVE__V1__ABORT_REQUEST__INIT;
    uint32_t ucx = over_ucx(c, PD_BOOTSTRAP_CALL_ABORT);
    if (!ucx) {
        rq.cluster_key.data = c->key;
        rq.cluster_key.len = c->cfg.key_len;
    }
    rq.room = room;
    rq.decode_id = c->decode_id;
    rq.reason = (char *)reason;
    rq.pair_id = c->pair_id;
    if (client_call(c, PD_BOOTSTRAP_METHOD_ABORT, ucx, &rq.base, on_abort_reply, ac)) {
        pd_warn("bootstrap: room %" PRIu64 ": %s", room, pd_error_msg());
        pd_free(ac);
    }
}

/* The prefill answered that it does not know our pairing (NOT_FOUND): it closed its endpoint
 * to us (it saw the link fail, or a newer Pair of ours replaced it) while ours stayed open.
 * Every room sent through ours is lost, so close it; the next room pairs again. */
static void forget_pairing(pd_bootstrap_client_t *c) {
    if (c->state != PAIRED || !c->peer)
        return;
    pd_warn("bootstrap: prefill %s no longer knows our pairing; closing our endpoint and "
            "pairing again",
            c->target);
    pd_xfer_peer_t *p = c->peer;
    c->peer = NULL; /* its on_peer_closed finds nothing to undo */
    c->state = UNPAIRED;
    pd_xfer_peer_close(p, PD_EPEER);
}

static void on_transfer_reply(void *ctx, int status, const uint8_t *reply, size_t len) {
    struct croom *r = ctx;
    pd_bootstrap_client_t *c = r->c;
    (void)reply;
    (void)len;
    croom_unlink(&c->inflight, r);
    if (!c->freeing && pd_xfer_room_live(c->x, r->room)) {
        if (status == PD_OK) {
            /* taken over gRPC: the connection the answer came on reaches our pair. Vouch for
             * the one up now: that one, unless it ended in the moment since (then the next
             * Transfer over UCX is lost, times out, and we pair again) */
            if (!r->over_ucx && c->peer && c->peer == r->peer)
                c->pair_conn = pd_grpc_channel_connection(c->ch);
            if (r->abort_pending)
                send_abort(c, r->room, r->reason);
        } else if (status == PD_ETIMEDOUT || status == PD_EPEER || status == PD_ECANCELED ||
                   status == PD_EINTERNAL || status == PD_EIO) {
            /* The prefill may have taken the room anyway: its writes may still land, even
             * through an endpoint we closed (CUDA IPC copies go straight into our pool), so the
             * pages wait for its "failed" notice, sent after them, or for the abort timeout. */
            if (status == PD_ETIMEDOUT && r->over_ucx && c->peer && c->peer == r->peer) {
                /* No answer on the pair's endpoint: the prefill behind it may be gone (restarted
                 * on the same address before UCX noticed), or only slow. Calls go over gRPC
                 * until one is answered there (over_ucx): a restarted prefill answers NOT_FOUND,
                 * and we pair again. */
                c->pair_conn = 0;
            }
            pd_warn("bootstrap: room %" PRIu64 ": %s; aborting it", r->room, pd_error_msg());
            pd_xfer_room_abort(c->x, r->room, status, pd_error_msg());
            send_abort(c, r->room, "Transfer failed on decode's side");
        } else {
            /* A definite refusal: the prefill never took the room, nothing can land. */
            pd_warn("bootstrap: room %" PRIu64 ": refused: %s", r->room, pd_error_msg());
            pd_xfer_room_release(c->x, r->room, status);
            /* a stale reply (a Transfer sent under an older pairing) changes nothing */
            if (status == PD_ENOENT && c->peer && c->peer == r->peer)
                forget_pairing(c);
        }
    }
    croom_free(r);
    c->calls--;
    client_maybe_done(c);
}

static void send_transfer(pd_bootstrap_client_t *c, struct croom *r) {
    int rc = PD_OK;
    if (r->held_pages && !c->skips_held_pages)
        rc = pd_errorf(PD_EMISMATCH,
                       "room %" PRIu64 ": decode holds the first %u prompt pages, and prefill %s "
                       "predates decode prefix reuse (it would send them again): upgrade it, or "
                       "run this decode with --disable-prefix-cache",
                       r->room, r->held_pages, c->target);
    if (!rc)
        rc = pd_xfer_room_expect(c->x, c->peer, r->room, r->pages, r->n, r->user);
    if (rc) {
        if (c->cb.on_room_rejected)
            c->cb.on_room_rejected(c->cb.ctx, r->room, r->user, rc, pd_error_msg());
        croom_free(r);
        return;
    }
    Pdserve__V1__TransferRequest rq = PDSERVE__V1__TRANSFER_REQUEST__INIT;
    uint32_t ucx = over_ucx(c, PD_BOOTSTRAP_CALL_TRANSFER);
    if (!ucx) {
        rq.cluster_key.data = c->key;
        rq.cluster_key.len = c->cfg.key_len;
    }
    rq.room = r->room;
    rq.decode_id = c->decode_id;
    rq.dst_pages = r->pages;
    rq.n_dst_pages = r->n;
    rq.prompt_len = r->prompt_len;
    rq.held_pages = r->held_pages;
    rq.pair_id = c->pair_id;
    rc = client_call(c, PD_BOOTSTRAP_METHOD_TRANSFER, ucx, &rq.base, on_transfer_reply, r);
    if (rc) {
        pd_xfer_room_release(c->x, r->room, rc); /* never sent: nothing can land */
        croom_free(r);
        return;
    }
    r->transfer_inflight = true;
    r->over_ucx = ucx != 0;
    r->peer = c->peer;
    r->next = c->inflight;
    c->inflight = r;
}

static void fail_waiting(pd_bootstrap_client_t *c, int status, const char *msg) {
    while (c->waiting) {
        struct croom *r = c->waiting;
        c->waiting = r->next;
        if (c->cb.on_room_rejected)
            c->cb.on_room_rejected(c->cb.ctx, r->room, r->user, status, msg);
        croom_free(r);
    }
}

static void on_pair_reply(void *ctx, int status, const uint8_t *reply, size_t len) {
    pd_bootstrap_client_t *c = ctx;
    if (c->freeing)
        goto out;
    char msg[512];
    Pdserve__V1__PairReply *rp = NULL;
    if (status == PD_OK) {
        rp = pdserve__v1__pair_reply__unpack(NULL, len, reply);
        if (!rp || !rp->ucx_worker_address.len || !rp->engine_id)
            status = pd_errorf(PD_EFORMAT, "Pair with %s: malformed PairReply", c->target);
    }
    if (status == PD_OK) {
        struct pd_bootstrap_layout pl;
        pd__bootstrap_layout_from_pb(rp->layout, &pl);
        status = pd_bootstrap_layout_check(&pl, &c->cfg.layout);
    }
    if (status == PD_OK) {
        struct pd_xfer_peer_info pi = {
            .remote_id = rp->engine_id,
            .worker_addr = rp->ucx_worker_address.data,
            .worker_addr_len = rp->ucx_worker_address.len,
        };
        status = pd_xfer_peer_connect(c->x, &pi, c, &c->peer);
    }
    snprintf(msg, sizeof(msg), "%s", status == PD_OK ? "" : pd_error_msg());
    if (status == PD_OK) {
        c->state = PAIRED;
        c->skips_held_pages = rp->skips_held_pages;
        c->ucx_calls = rp->serves_ucx_calls;
        c->pair_conn = pd_grpc_channel_connection(c->ch);
        c->pair_id = rp->pair_id;
        pd_info("bootstrap: paired with prefill %s at %s, data lane %s", rp->prefill_id, c->target,
                rp->data_transport);
    } else {
        c->state = UNPAIRED; /* the next room tries again */
        pd_warn("bootstrap: pairing with %s failed: %s", c->target, msg);
    }
    if (rp)
        pdserve__v1__pair_reply__free_unpacked(rp, NULL);
    if (c->cb.on_paired)
        c->cb.on_paired(c->cb.ctx, status, msg);
    if (status != PD_OK) {
        fail_waiting(c, status, msg);
        goto out;
    }
    struct croom *w = c->waiting;
    c->waiting = NULL;
    /* in arrival order */
    struct croom *rev = NULL;
    while (w) {
        struct croom *next = w->next;
        w->next = rev;
        rev = w;
        w = next;
    }
    while (rev) {
        struct croom *next = rev->next;
        if (c->freeing) { /* a callback closed us: the rest never leaves */
            croom_free(rev);
        } else {
            send_transfer(c, rev);
        }
        rev = next;
    }
out:
    c->calls--; /* last: callbacks above may free the client, which must wait for us */
    client_maybe_done(c);
}

static int start_pair(pd_bootstrap_client_t *c) {
    struct pd_xfer_peer_info me;
    pd_xfer_local_peer_info(c->x, &me);
    if (!me.rkey_len || me.n_shards < 1)
        return pd_errorf(PD_EINVAL, "pairing: the KV pool is not registered");
    Pdserve__V1__PairRequest rq = PDSERVE__V1__PAIR_REQUEST__INIT;
    Pdserve__V1__Layout lpb;
    pd__bootstrap_layout_to_pb(&c->cfg.layout, &lpb);
    rq.cluster_key.data = c->key;
    rq.cluster_key.len = c->cfg.key_len;
    rq.decode_id = c->decode_id;
    rq.ucx_worker_address.data = (uint8_t *)me.worker_addr;
    rq.ucx_worker_address.len = me.worker_addr_len;
    /* shard 0 in the original fields, so a one-shard pool's request is what it always was */
    rq.kv_rkey.data = (uint8_t *)me.shards[0].rkey;
    rq.kv_rkey.len = me.shards[0].rkey_len;
    rq.kv_base = me.shards[0].base;
    rq.kv_ipc_handle.data = (uint8_t *)me.shards[0].ipc_handle;
    rq.kv_ipc_handle.len = me.shards[0].ipc_handle_len;
    ProtobufCBinaryData rkeys[PD_XFER_SHARDS_MAX], ipcs[PD_XFER_SHARDS_MAX];
    uint64_t bases[PD_XFER_SHARDS_MAX];
    size_t more = (size_t)me.n_shards - 1;
    for (size_t k = 0; k < more; k++) {
        const struct pd_xfer_shard *sh = &me.shards[k + 1];
        rkeys[k] = (ProtobufCBinaryData){.data = (uint8_t *)sh->rkey, .len = sh->rkey_len};
        bases[k] = sh->base;
        ipcs[k] =
            (ProtobufCBinaryData){.data = (uint8_t *)sh->ipc_handle, .len = sh->ipc_handle_len};
    }
    if (more) {
        rq.n_kv_shard_rkeys = rq.n_kv_shard_bases = more;
        rq.kv_shard_rkeys = rkeys;
        rq.kv_shard_bases = bases;
        if (rq.kv_ipc_handle.len) { /* the engine exports every shard or none */
            rq.n_kv_shard_ipc_handles = more;
            rq.kv_shard_ipc_handles = ipcs;
        }
        rq.kv_shard_page_bytes = me.shard_page_bytes;
    }
    rq.kv_pages = me.n_pages;
    rq.kv_am_only = me.am_only;
    if (me.heads.rows_per_page) { /* how our shards split the kv heads (bootstrap.proto) */
        rq.kv_rows_per_page = me.heads.rows_per_page;
        rq.kv_head_bytes = me.heads.head_bytes;
        rq.kv_shard_head_count = me.heads.count;
        rq.n_kv_shard_head_starts = (size_t)me.n_shards;
        rq.kv_shard_head_starts = me.heads.start;
    }
    rq.layout = &lpb;
    rq.engine_id = me.remote_id;
    int rc = client_call(c, PD_BOOTSTRAP_METHOD_PAIR, 0, &rq.base, on_pair_reply, c);
    if (rc == PD_OK)
        c->state = PAIRING;
    return rc;
}

int pd_bootstrap_client_new(pd_grpc_bridge_t *b, pd_xfer_t *x,
                            const struct pd_bootstrap_client_config *cfg,
                            const struct pd_bootstrap_client_callbacks *cb,
                            pd_bootstrap_client_t **out) {
    *out = NULL;
    if (cfg->key_len > PD_CLUSTER_KEY_MAX)
        return pd_errorf(PD_ERANGE, "bootstrap client: cluster key over %d bytes",
                         PD_CLUSTER_KEY_MAX);
    pd_bootstrap_client_t *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return pd_error_wrap(PD_ENOMEM, "creating the bootstrap client");
    c->x = x;
    c->cfg = *cfg;
    if (cb)
        c->cb = *cb;
    if (c->cfg.deadline_ms <= 0)
        c->cfg.deadline_ms = PD_BOOTSTRAP_DEADLINE_MS;
    memcpy(c->key, cfg->key, cfg->key_len);
    c->cfg.key = c->key;
    snprintf(c->decode_id, sizeof(c->decode_id), "%s", cfg->decode_id ? cfg->decode_id : "decode");
    snprintf(c->target, sizeof(c->target), "%s", cfg->target);
    int rc = pd_grpc_channel_new(b, cfg->target, cfg->tls, &c->ch);
    c->cfg.tls = NULL; /* gRPC copied what it needs */
    if (rc) {
        pd_free(c);
        return rc;
    }
    *out = c;
    return PD_OK;
}

void pd_bootstrap_client_free(pd_bootstrap_client_t *c) {
    if (!c || c->freeing)
        return;
    c->freeing = true;
    fail_waiting(c, PD_ECANCELED, "bootstrap client closing");
    if (c->peer)
        pd_xfer_peer_close(c->peer, PD_ECANCELED);
    pd_grpc_channel_free(c->ch);
    client_maybe_done(c);
}

void pd_bootstrap_client_peer_closed(pd_bootstrap_client_t *c, pd_xfer_peer_t *p) {
    if (c->peer != p)
        return;
    c->peer = NULL;
    c->state = UNPAIRED; /* the next room pairs again */
    pd_info("bootstrap: prefill %s unpaired (endpoint closed)", c->target);
}

uint64_t pd_bootstrap_client_pair_id(const pd_bootstrap_client_t *c) {
    return c->state == PAIRED ? c->pair_id : 0;
}

bool pd_bootstrap_client_paired(const pd_bootstrap_client_t *c) {
    return c->state == PAIRED;
}

int pd_bootstrap_client_transfer(pd_bootstrap_client_t *c, uint64_t room, const uint32_t *dst_pages,
                                 uint32_t n, uint32_t held_pages, uint32_t prompt_len,
                                 void *room_user) {
    if (c->freeing)
        return pd_errorf(PD_ECANCELED, "room %" PRIu64 ": bootstrap client closing", room);
    if (pd_xfer_room_live(c->x, room))
        return pd_errorf(PD_EINVAL, "room %" PRIu64 " is already live", room);
    for (struct croom *w = c->waiting; w; w = w->next)
        if (w->room == room)
            return pd_errorf(PD_EINVAL, "room %" PRIu64 " is already live", room);
    struct croom *r = pd_calloc(1, sizeof(*r));
    uint32_t *pages = pd_malloc((size_t)(n ? n : 1) * sizeof(*pages));
    if (!r || !pages) {
        pd_free(r);
        pd_free(pages);
        return pd_error_wrap(PD_ENOMEM, "room %" PRIu64, room);
    }
    memcpy(pages, dst_pages, (size_t)n * sizeof(*pages));
    r->c = c;
    r->room = room;
    r->user = room_user;
    r->pages = pages;
    r->n = n;
    r->held_pages = held_pages;
    r->prompt_len = prompt_len;
    if (c->state == PAIRED) {
        send_transfer(c, r);
        return PD_OK;
    }
    r->next = c->waiting;
    c->waiting = r;
    if (c->state == UNPAIRED) {
        int rc = start_pair(c);
        if (rc) {
            c->waiting = r->next;
            croom_free(r);
            return rc;
        }
    }
    return PD_OK;
}

int pd_bootstrap_client_abort(pd_bootstrap_client_t *c, uint64_t room, const char *reason) {
    for (struct croom **pp = &c->waiting; *pp; pp = &(*pp)->next) {
        struct croom *r = *pp;
        if (r->room == room) { /* never left this process */
            *pp = r->next;
            if (c->cb.on_room_rejected)
                c->cb.on_room_rejected(c->cb.ctx, room, r->user, PD_ECANCELED,
                                       reason ? reason : "aborted");
            croom_free(r);
            return PD_OK;
        }
    }
    int rc = pd_xfer_room_abort(c->x, room, PD_ECANCELED, reason);
    if (rc)
        return rc;
    for (struct croom *r = c->inflight; r; r = r->next) {
        if (r->room == room) { /* Abort must not overtake Transfer: send it after the reply */
            r->abort_pending = true;
            snprintf(r->reason, sizeof(r->reason), "%s", reason ? reason : "");
            return PD_OK;
        }
    }
    send_abort(c, room, reason ? reason : "");
    return PD_OK;
}

struct raw_ctx {
    pd_bootstrap_client_t *c;
    pd_grpc_reply_fn fn;
    void *ctx;
};

static void on_raw_reply(void *ctx, int status, const uint8_t *reply, size_t len) {
    struct raw_ctx *rc = ctx;
    pd_bootstrap_client_t *c = rc->c;
    rc->fn(rc->ctx, status, reply, len);
    pd_free(rc);
    c->calls--;
    client_maybe_done(c);
}

int pd_bootstrap_client_raw(pd_bootstrap_client_t *c, const char *method, uint32_t ucx_method,
                            const uint8_t *body, size_t len, pd_grpc_reply_fn fn, void *ctx) {
    if (ucx_method && (c->state != PAIRED || !c->peer))
        return pd_errorf(PD_EAGAIN, "calling %s over UCX: not paired", method);
    struct raw_ctx *r = pd_malloc(sizeof(*r));
    if (!r)
        return pd_error_wrap(PD_ENOMEM, "calling %s", method);
    r->c = c;
    r->fn = fn;
    r->ctx = ctx;
    int rc = ucx_method
                 ? pd_xfer_call(c->peer, ucx_method, body, len, c->cfg.deadline_ms, on_raw_reply, r)
                 : pd_grpc_call(c->ch, method, body, len, c->cfg.deadline_ms, on_raw_reply, r);
    if (rc) {
        pd_free(r);
        return rc;
    }
    c->calls++;
    return PD_OK;
}

int pd_bootstrap_client_health(pd_bootstrap_client_t *c, pd_grpc_reply_fn fn, void *ctx) {
    uint8_t *body;
    size_t len;
    int rc = pd_bootstrap_encode_health(c->key, c->cfg.key_len, &body, &len);
    if (rc)
        return rc;
    rc = pd_bootstrap_client_raw(c, PD_BOOTSTRAP_METHOD_HEALTH, 0, body, len, fn, ctx);
    pd_free(body);
    return rc;
}
