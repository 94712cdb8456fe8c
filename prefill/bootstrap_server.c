/*
 * bootstrap_server.c — the prefill's side of the bootstrap protocol (common/bootstrap.h):
 * Pair/Transfer/Abort/Health over gRPC core with protobuf-c bodies. Owns the table of paired
 * decodes (decode_id → transfer engine peer). The server changes nothing before a call's key has
 * been checked; every body is parsed, never trusted.
 */
#include "prefill/bootstrap_server.h"
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
#include "common/base/rng.h"
#include "common/base/status.h"
#include "pdserve/v1/bootstrap.pb-c.h"

/* ---- server ---- */

/* Rooms an Abort named before their Transfer came (found false): remembered so that a Transfer
 * that comes after all (one delayed past its deadline, over either transport) is refused. The
 * decode freed their pages on that answer; taking the room would write into pages that other
 * requests own by then. Room ids are random 64-bit numbers, so the last so many suffice. */
#define ABORTED_ROOMS 1024

struct spair {
    struct spair *next;
    char decode_id[128];
    uint64_t engine_id;
    uint64_t pair_id; /* PairReply.pair_id: its calls must carry it */
    pd_xfer_peer_t *peer;
};

struct pd_bootstrap_server {
    pd_grpc_server_t *srv;
    pd_xfer_t *x;
    struct pd_bootstrap_server_config cfg;
    struct pd_bootstrap_server_callbacks cb;
    uint8_t key[PD_CLUSTER_KEY_MAX];
    char prefill_id[128];
    struct spair *pairs;
    uint64_t pair_seq; /* the next pair id is a splitmix64 step of it (seeded by the engine id) */
    uint64_t aborted[ABORTED_ROOMS]; /* a ring; n_aborted valid */
    uint32_t n_aborted, next_aborted;
    uint8_t *reply; /* last reply body, owned until the next call */
};

static struct spair *pair_find(pd_bootstrap_server_t *s, const char *decode_id) {
    for (struct spair *p = s->pairs; p; p = p->next)
        if (strcmp(p->decode_id, decode_id) == 0)
            return p;
    return NULL;
}

/* The decode a live room's pages go to (peer: the room's, pd_xfer_room_peer), or NULL when that
 * pairing is gone (its decode paired again: the room dies with the old endpoint). */
static const char *peer_decode(pd_bootstrap_server_t *s, const pd_xfer_peer_t *peer) {
    for (struct spair *p = s->pairs; peer && p; p = p->next)
        if (p->peer == peer)
            return p->decode_id;
    return NULL;
}

static void aborted_add(pd_bootstrap_server_t *s, uint64_t room) {
    s->aborted[s->next_aborted] = room;
    s->next_aborted = (s->next_aborted + 1) % ABORTED_ROOMS;
    if (s->n_aborted < ABORTED_ROOMS)
        s->n_aborted++;
}

static bool aborted_before(const pd_bootstrap_server_t *s, uint64_t room) {
    for (uint32_t i = 0; i < s->n_aborted; i++)
        if (s->aborted[i] == room)
            return true;
    return false;
}

static void pair_remove(pd_bootstrap_server_t *s, struct spair *dead) {
    for (struct spair **pp = &s->pairs; *pp; pp = &(*pp)->next) {
        if (*pp == dead) {
            *pp = dead->next;
            pd_free(dead);
            return;
        }
    }
}

static void answer_status(struct pd_grpc_answer *a, int status, const char *msg) {
    a->code = pd_grpc_code_from_status(status);
    snprintf(a->message, sizeof(a->message), "%s", msg);
}

static void answer_code(struct pd_grpc_answer *a, enum pd_grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void answer_code(struct pd_grpc_answer *a, enum pd_grpc_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    a->code = code;
    vsnprintf(a->message, sizeof(a->message), fmt, ap);
    va_end(ap);
}

/* Packs msg into s->reply (kept until the next call) and points the answer at it. */
static void answer_message(pd_bootstrap_server_t *s, struct pd_grpc_answer *a,
                           const ProtobufCMessage *msg) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    pd_free(s->reply);
    s->reply = pd_malloc(n ? n : 1);
    if (!s->reply) {
        answer_code(a, PD_GRPC_RESOURCE_EXHAUSTED, "out of memory packing the reply");
        return;
    }
    protobuf_c_message_pack(msg, s->reply);
    a->code = PD_GRPC_OK;
    a->reply = s->reply;
    a->reply_len = n;
}

static bool refuse_key(pd_bootstrap_server_t *s, const char *what, const char *peer,
                       ProtobufCBinaryData key, struct pd_grpc_answer *a) {
    if (pd__bootstrap_key_ok(s->key, s->cfg.key_len, key))
        return false;
    pd_warn("bootstrap: %s from %s refused: %s cluster key", what, peer,
            key.len ? "wrong" : "missing");
    answer_code(a, PD_GRPC_PERMISSION_DENIED, "%s: %s cluster key", what,
                key.len ? "wrong" : "missing");
    return true;
}

/* The decode's pool as PairRequest describes it: shard 0 in the original fields, shards 1 .. S-1
 * in the repeated ones (bootstrap.proto), and how its shards split the kv heads. Refuses
 * (INVALID_ARGUMENT, true) a request whose shard lists disagree; the shard count, sizes and head
 * ranges are the engine's to check against ours. */
static bool pair_peer_info(const Pdserve__V1__PairRequest *rq, const struct pd_bootstrap_layout *dl,
                           struct pd_xfer_peer_info *pi, struct pd_grpc_answer *a) {
    size_t more = rq->n_kv_shard_rkeys;
    if (rq->n_kv_shard_bases != more ||
        (rq->n_kv_shard_ipc_handles != 0 &&
         (rq->n_kv_shard_ipc_handles != more || !rq->kv_ipc_handle.len))) {
        answer_code(a, PD_GRPC_INVALID_ARGUMENT,
                    "Pair: KV pool shards disagree: %zu rkeys, %zu bases, %zu IPC handles past "
                    "shard 0",
                    more, rq->n_kv_shard_bases, rq->n_kv_shard_ipc_handles);
        return true;
    }
    if (more + 1 > PD_XFER_SHARDS_MAX) {
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Pair: KV pool of %zu shards, at most %d",
                    more + 1, PD_XFER_SHARDS_MAX);
        return true;
    }
    if (rq->kv_rows_per_page && rq->n_kv_shard_head_starts != more + 1) {
        answer_code(a, PD_GRPC_INVALID_ARGUMENT,
                    "Pair: KV pool of %zu shards with %zu kv head starts", more + 1,
                    rq->n_kv_shard_head_starts);
        return true;
    }
    *pi = (struct pd_xfer_peer_info){
        .remote_id = rq->engine_id,
        .worker_addr = rq->ucx_worker_address.data,
        .worker_addr_len = rq->ucx_worker_address.len,
        .rkey = rq->kv_rkey.data,
        .rkey_len = rq->kv_rkey.len,
        .base = rq->kv_base,
        .page_bytes = dl->page_bytes,
        .n_pages = rq->kv_pages,
        .ipc_handle = rq->kv_ipc_handle.data,
        .ipc_handle_len = rq->kv_ipc_handle.len,
        .n_shards = (int)more + 1,
        .shard_page_bytes = rq->kv_shard_page_bytes,
        .am_only = rq->kv_am_only,
    };
    pi->shards[0] = (struct pd_xfer_shard){.rkey = pi->rkey,
                                           .rkey_len = pi->rkey_len,
                                           .base = pi->base,
                                           .ipc_handle = pi->ipc_handle,
                                           .ipc_handle_len = pi->ipc_handle_len};
    if (rq->kv_rows_per_page) { /* else not described: the engine accepts our split only */
        pi->heads = (struct pd_xfer_heads){.rows_per_page = rq->kv_rows_per_page,
                                           .head_bytes = rq->kv_head_bytes,
                                           .total = dl->kv_heads_total,
                                           .count = rq->kv_shard_head_count};
        for (size_t k = 0; k <= more; k++)
            pi->heads.start[k] = rq->kv_shard_head_starts[k];
    }
    for (size_t k = 0; k < more; k++) {
        bool ipc = rq->n_kv_shard_ipc_handles != 0;
        pi->shards[k + 1] = (struct pd_xfer_shard){
            .rkey = rq->kv_shard_rkeys[k].data,
            .rkey_len = rq->kv_shard_rkeys[k].len,
            .base = rq->kv_shard_bases[k],
            .ipc_handle = ipc ? rq->kv_shard_ipc_handles[k].data : NULL,
            .ipc_handle_len = ipc ? rq->kv_shard_ipc_handles[k].len : 0,
        };
    }
    return false;
}

static void serve_pair(pd_bootstrap_server_t *s, const char *peer, const uint8_t *body, size_t n,
                       struct pd_grpc_answer *a) {
    Pdserve__V1__PairRequest *rq = pdserve__v1__pair_request__unpack(NULL, n, body);
    if (!rq) {
        pd_warn("bootstrap: Pair from %s: malformed request (%zu bytes)", peer, n);
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Pair: malformed PairRequest (%zu bytes)", n);
        return;
    }
    if (refuse_key(s, "Pair", peer, rq->cluster_key, a))
        goto out;
    struct pd_bootstrap_layout dl;
    pd__bootstrap_layout_from_pb(rq->layout, &dl);
    if (pd_bootstrap_layout_check(&s->cfg.layout, &dl)) {
        pd_warn("bootstrap: Pair from %s (decode %s) refused: %s", peer, rq->decode_id,
                pd_error_msg());
        answer_status(a, PD_EMISMATCH, pd_error_msg());
        goto out;
    }
    if (!rq->decode_id[0] || strlen(rq->decode_id) >= sizeof(((struct spair *)0)->decode_id) ||
        !rq->ucx_worker_address.len || !rq->kv_rkey.len || !rq->kv_pages || !rq->engine_id) {
        answer_code(a, PD_GRPC_INVALID_ARGUMENT,
                    "Pair: decode_id, ucx_worker_address, kv_rkey, kv_pages and engine_id are "
                    "required");
        goto out;
    }
    struct pd_xfer_peer_info pi;
    if (pair_peer_info(rq, &dl, &pi, a))
        goto out;
    struct spair *old = pair_find(s, rq->decode_id);
    if (old) {
        /* A decode pairs only while it holds no endpoint to us: it restarted (a new engine), or
         * it closed its endpoint (a peer that went quiet, a link that went down; the close may
         * never have reached us), or its earlier Pair's answer never reached it. Either way the
         * endpoint we hold is stale and its rooms are dead on the decode's side: writing into
         * its pages through it would be writing to a decode that no longer waits for them. */
        pd_info("bootstrap: decode %s paired again (%s); closing the old endpoint", rq->decode_id,
                old->engine_id != rq->engine_id ? "a new engine" : "it closed its endpoint");
        pd_xfer_peer_close(old->peer, PD_EPEER);
        pair_remove(s, old);
        old = NULL;
    }
    if (!old) {
        struct spair *p = pd_calloc(1, sizeof(*p));
        if (!p) {
            answer_code(a, PD_GRPC_RESOURCE_EXHAUSTED, "Pair: out of memory");
            goto out;
        }
        int rc = pd_xfer_peer_connect(s->x, &pi, p, &p->peer);
        if (rc) {
            pd_warn("bootstrap: Pair from decode %s: %s", rq->decode_id, pd_error_msg());
            answer_status(a, rc == PD_EMISMATCH ? rc : PD_EINVAL, pd_error_msg());
            pd_free(p);
            goto out;
        }
        snprintf(p->decode_id, sizeof(p->decode_id), "%s", rq->decode_id);
        p->engine_id = rq->engine_id;
        while (!(p->pair_id = pd_splitmix64(&s->pair_seq))) {
        }
        p->next = s->pairs;
        s->pairs = p;
        old = p;
        pd_info("bootstrap: paired with decode %s (%u pages) from %s, data lane %s", rq->decode_id,
                rq->kv_pages, peer, pd_xfer_peer_transport(p->peer));
    }
    Pdserve__V1__PairReply rp = PDSERVE__V1__PAIR_REPLY__INIT;
    Pdserve__V1__Layout lpb;
    pd__bootstrap_layout_to_pb(&s->cfg.layout, &lpb);
    const void *addr;
    size_t addr_len;
    pd_xfer_local_address(s->x, &addr, &addr_len);
    rp.prefill_id = s->prefill_id;
    rp.ucx_worker_address.data = (uint8_t *)addr;
    rp.ucx_worker_address.len = addr_len;
    rp.layout = &lpb;
    rp.data_transport = (char *)pd_xfer_peer_transport(old->peer);
    rp.engine_id = pd_xfer_id(s->x);
    rp.skips_held_pages = true; /* TransferRequest.held_pages: never sent again (role.c) */
    rp.serves_ucx_calls = true; /* pd_bootstrap_server_call */
    rp.pair_id = old->pair_id;
    answer_message(s, a, &rp.base);
out:
    pdserve__v1__pair_request__free_unpacked(rq, NULL);
}

/* The pairing a Transfer or Abort of decode_id names, or NULL when it names none of ours (then
 * the decode pairs again when told NOT_FOUND). via: the endpoint a call over UCX came in on (NULL:
 * a gRPC call). Such a call carries no key: it came from the engine of a pair that proved the key
 * at Pair, so it must come from that pair's endpoint, under that very pairing: UCX tells us the
 * sending engine, not which of its endpoints sent, and a call sent before the decode paired again
 * may arrive after. A call with a pair id (every decode since v0.7) must name this pairing; one
 * without is an older decode's, taken as before (a rolling upgrade pairs old decodes with new
 * prefills). */
static struct spair *pair_of_call(pd_bootstrap_server_t *s, pd_xfer_peer_t *via,
                                  const char *decode_id, uint64_t pair_id) {
    struct spair *p = pair_find(s, decode_id);
    if (p && via && p->peer != via)
        return NULL;
    if (p && pair_id && p->pair_id != pair_id)
        return NULL;
    return p;
}

/* NOT_FOUND, and no other answer uses it: the decode reads it as "pair again" (it closed its
 * endpoint to us, or this prefill is a restarted one on the same address). */
static void refuse_unpaired(struct pd_grpc_answer *a, const char *method, uint64_t room,
                            const char *decode_id) {
    pd_warn("bootstrap: %s room %" PRIu64 " from decode %s refused: not paired", method, room,
            decode_id);
    answer_code(a, PD_GRPC_NOT_FOUND,
                "%s room %" PRIu64 ": decode '%s' has not paired with this prefill", method, room,
                decode_id);
}

/* via: as pair_of_call's. */
static void serve_transfer(pd_bootstrap_server_t *s, const char *peer, pd_xfer_peer_t *via,
                           const uint8_t *body, size_t n, struct pd_grpc_answer *a) {
    Pdserve__V1__TransferRequest *rq = pdserve__v1__transfer_request__unpack(NULL, n, body);
    if (!rq) {
        pd_warn("bootstrap: Transfer from %s: malformed request (%zu bytes)", peer, n);
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Transfer: malformed TransferRequest (%zu bytes)",
                    n);
        return;
    }
    if (!via && refuse_key(s, "Transfer", peer, rq->cluster_key, a))
        goto out;
    struct spair *p = pair_of_call(s, via, rq->decode_id, rq->pair_id);
    if (!p) {
        refuse_unpaired(a, "Transfer", rq->room, rq->decode_id);
        goto out;
    }
    if (aborted_before(s, rq->room)) {
        pd_warn("bootstrap: Transfer room %" PRIu64 " from decode %s refused: aborted before it "
                "came",
                rq->room, rq->decode_id);
        /* a definite refusal, as for a live room: the decode releases the pages if it still
         * waits (it does not: it aborted the room) */
        answer_code(a, PD_GRPC_ALREADY_EXISTS,
                    "Transfer room %" PRIu64 ": the decode aborted this room before its Transfer "
                    "came",
                    rq->room);
        goto out;
    }
    if (pd_xfer_room_live(s->x, rq->room)) {
        pd_warn("bootstrap: Transfer room %" PRIu64 " from decode %s refused: room already live",
                rq->room, rq->decode_id);
        answer_code(a, PD_GRPC_ALREADY_EXISTS, "Transfer: room %" PRIu64 " is already live",
                    rq->room);
        goto out;
    }
    if (rq->n_dst_pages > UINT32_MAX) {
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Transfer: too many pages");
        goto out;
    }
    /* the last prompt token's page always comes from here: its logits are the first token's */
    uint32_t ps = s->cfg.layout.page_size;
    if (rq->held_pages && (!rq->n_dst_pages || !ps || rq->prompt_len == 0 ||
                           (uint64_t)rq->held_pages * ps >= rq->prompt_len)) {
        answer_code(a, PD_GRPC_INVALID_ARGUMENT,
                    "Transfer room %" PRIu64 ": held_pages %u covers the whole prompt of %u "
                    "tokens (the last token's page must be sent)",
                    rq->room, rq->held_pages, rq->prompt_len);
        goto out;
    }
    int rc =
        pd_xfer_room_add(s->x, p->peer, rq->room, rq->dst_pages, (uint32_t)rq->n_dst_pages, NULL);
    if (rc) {
        pd_warn("bootstrap: Transfer room %" PRIu64 " from decode %s refused: %s", rq->room,
                rq->decode_id, pd_error_msg());
        answer_status(a, rc, pd_error_msg());
        goto out;
    }
    pd_debug("bootstrap: room %" PRIu64 ": %zu destination pages from decode %s", rq->room,
             rq->n_dst_pages, rq->decode_id);
    if (s->cb.on_room)
        s->cb.on_room(s->cb.ctx, rq->room, rq->decode_id, (uint32_t)rq->n_dst_pages, rq->held_pages,
                      rq->prompt_len);
    Pdserve__V1__TransferReply rp = PDSERVE__V1__TRANSFER_REPLY__INIT;
    answer_message(s, a, &rp.base);
out:
    pdserve__v1__transfer_request__free_unpacked(rq, NULL);
}

static void serve_abort(pd_bootstrap_server_t *s, const char *peer, pd_xfer_peer_t *via,
                        const uint8_t *body, size_t n, struct pd_grpc_answer *a) {
    Pdserve__V1__AbortRequest *rq = pdserve__v1__abort_request__unpack(NULL, n, body);
    if (!rq) {
        pd_warn("bootstrap: Abort from %s: malformed request (%zu bytes)", peer, n);
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Abort: malformed AbortRequest (%zu bytes)", n);
        return;
    }
    if (!via && refuse_key(s, "Abort", peer, rq->cluster_key, a))
        goto out;
    if (via && !pair_of_call(s, via, rq->decode_id, rq->pair_id)) { /* as serve_transfer's */
        refuse_unpaired(a, "Abort", rq->room, rq->decode_id);
        goto out;
    }
    pd_xfer_peer_t *room_peer = pd_xfer_room_peer(s->x, rq->room);
    bool found = room_peer != NULL;
    const char *owner = peer_decode(s, room_peer);
    if (owner && strcmp(owner, rq->decode_id) != 0) {
        /* another decode's room (room ids are the router's, one decode each): not this caller's
         * to end. Answered as unknown, so a caller that holds such a room frees its own pages */
        pd_warn("bootstrap: Abort room %" PRIu64 " from decode %s refused: the room is decode "
                "%s's",
                rq->room, rq->decode_id, owner);
        found = false;
    } else {
        char why[160];
        snprintf(why, sizeof(why), "aborted by decode %s: %s", rq->decode_id,
                 rq->reason[0] ? rq->reason : "no reason given");
        if (found)
            pd_xfer_room_abort(s->x, rq->room, PD_ECANCELED, why);
        else
            aborted_add(s, rq->room);
        pd_info("bootstrap: room %" PRIu64 ": %s (%s)", rq->room, why, found ? "live" : "not live");
        if (s->cb.on_abort)
            s->cb.on_abort(s->cb.ctx, rq->room, found, rq->reason);
    }
    Pdserve__V1__AbortReply rp = PDSERVE__V1__ABORT_REPLY__INIT;
    rp.found = found;
    answer_message(s, a, &rp.base);
out:
    pdserve__v1__abort_request__free_unpacked(rq, NULL);
}

static void serve_health(pd_bootstrap_server_t *s, const char *peer, const uint8_t *body, size_t n,
                         struct pd_grpc_answer *a) {
    Pdserve__V1__HealthRequest *rq = pdserve__v1__health_request__unpack(NULL, n, body);
    if (!rq) {
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Health: malformed HealthRequest (%zu bytes)", n);
        return;
    }
    if (!refuse_key(s, "Health", peer, rq->cluster_key, a)) {
        struct pd_xfer_info info;
        pd_xfer_get_info(s->x, &info);
        Pdserve__V1__HealthReply rp = PDSERVE__V1__HEALTH_REPLY__INIT;
        rp.prefill_id = s->prefill_id;
        rp.live_rooms = info.live_rooms;
        answer_message(s, a, &rp.base);
    }
    pdserve__v1__health_request__free_unpacked(rq, NULL);
}

static void serve(void *ctx, const char *method, const char *peer, const uint8_t *req, size_t len,
                  struct pd_grpc_answer *a) {
    pd_bootstrap_server_t *s = ctx;
    if (strcmp(method, PD_BOOTSTRAP_METHOD_PAIR) == 0)
        serve_pair(s, peer, req, len, a);
    else if (strcmp(method, PD_BOOTSTRAP_METHOD_TRANSFER) == 0)
        serve_transfer(s, peer, NULL, req, len, a);
    else if (strcmp(method, PD_BOOTSTRAP_METHOD_ABORT) == 0)
        serve_abort(s, peer, NULL, req, len, a);
    else if (strcmp(method, PD_BOOTSTRAP_METHOD_HEALTH) == 0)
        serve_health(s, peer, req, len, a);
    else
        answer_code(a, PD_GRPC_UNIMPLEMENTED, "no method %s", method);
}

int pd_bootstrap_server_new(pd_grpc_bridge_t *b, pd_xfer_t *x,
                            const struct pd_bootstrap_server_config *cfg,
                            const struct pd_bootstrap_server_callbacks *cb,
                            pd_bootstrap_server_t **out) {
    *out = NULL;
    if (cfg->key_len > PD_CLUSTER_KEY_MAX)
        return pd_errorf(PD_ERANGE, "bootstrap server: cluster key over %d bytes",
                         PD_CLUSTER_KEY_MAX);
    pd_bootstrap_server_t *s = pd_calloc(1, sizeof(*s));
    if (!s)
        return pd_error_wrap(PD_ENOMEM, "creating the bootstrap server");
    s->x = x;
    s->pair_seq = pd_xfer_id(x); /* random: another run's pair ids are others */
    s->cfg = *cfg;
    if (cb)
        s->cb = *cb;
    memcpy(s->key, cfg->key, cfg->key_len);
    s->cfg.key = s->key;
    snprintf(s->prefill_id, sizeof(s->prefill_id), "%s",
             cfg->prefill_id ? cfg->prefill_id : "prefill");
    s->cfg.prefill_id = s->prefill_id;
    s->cfg.tls = NULL; /* gRPC copied what it needs */
    int rc = pd_grpc_server_new(b, cfg->addr, cfg->tls, serve, s, &s->srv);
    if (rc) {
        pd_free(s);
        return pd_error_wrap(rc, "bootstrap server");
    }
    *out = s;
    return PD_OK;
}

void pd_bootstrap_server_free(pd_bootstrap_server_t *s) {
    if (!s)
        return;
    pd_grpc_server_free(s->srv);
    while (s->pairs) {
        struct spair *p = s->pairs;
        s->pairs = p->next;
        pd_xfer_peer_close(p->peer, PD_ECANCELED);
        pd_free(p);
    }
    pd_free(s->reply);
    pd_free(s);
}

void pd_bootstrap_server_call(pd_bootstrap_server_t *s, pd_xfer_peer_t *peer,
                              const struct pd_xfer_ctl *call) {
    char from[64];
    snprintf(from, sizeof(from), "decode engine %016" PRIx64 " (UCX)",
             pd_xfer_peer_remote_id(peer));
    struct pd_grpc_answer a = {.code = PD_GRPC_OK};
    const char *what = "call";
    if (call->method == PD_BOOTSTRAP_CALL_TRANSFER) {
        what = "Transfer";
        serve_transfer(s, from, peer, call->body, call->len, &a);
    } else if (call->method == PD_BOOTSTRAP_CALL_ABORT) {
        what = "Abort";
        serve_abort(s, from, peer, call->body, call->len, &a);
    } else {
        answer_code(&a, PD_GRPC_UNIMPLEMENTED, "no call %u", call->method);
    }
    int status = a.code == PD_GRPC_OK ? PD_OK : pd_grpc_status_to_pd(a.code, a.message, what);
    if (pd_xfer_answer(peer, call->call_id, status, status ? pd_error_msg() : NULL, a.reply,
                       a.reply_len))
        pd_warn("bootstrap: answering %s from %s: %s", what, from, pd_error_msg());
}

void pd_bootstrap_server_peer_closed(pd_bootstrap_server_t *s, pd_xfer_peer_t *peer) {
    for (struct spair *p = s->pairs; p; p = p->next) {
        if (p->peer == peer) {
            pd_info("bootstrap: decode %s unpaired (endpoint closed)", p->decode_id);
            pair_remove(s, p);
            return;
        }
    }
}
