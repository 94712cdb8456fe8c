/*
 * bootstrap.c — Pair/Transfer/Abort/Health over gRPC core with protobuf-c bodies (bootstrap.h).
 *
 * Owns: the server's table of paired decodes (decode_id → engine peer) and the client's pairing
 * state, its queue of rooms waiting for the pair, and the context of each RPC in flight.
 * Invariants: the server changes nothing before a call's key has been checked; every request
 * body comes from the network and is parsed, never trusted (protobuf-c unpack, then range checks
 * in the engine). The client frees itself only when its last RPC has called back.
 * Not here: page allocation, request scheduling — the daemons own those.
 */
#include "common/bootstrap.h"

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

/* ---- layout and key ---- */

int pd_bootstrap_layout_check(const struct pd_bootstrap_layout *p,
                              const struct pd_bootstrap_layout *d) {
#define PD_CHECK_U(field)                                                                          \
    if (p->field != d->field)                                                                      \
        return pd_errorf(PD_EMISMATCH,                                                             \
                         "layout mismatch: " #field ": prefill %" PRIu64 ", decode %" PRIu64,      \
                         (uint64_t)p->field, (uint64_t)d->field);
#define PD_CHECK_S(field)                                                                          \
    if (strcmp(p->field, d->field) != 0)                                                           \
        return pd_errorf(PD_EMISMATCH, "layout mismatch: " #field ": prefill '%s', decode '%s'",   \
                         p->field, d->field);
    /* first: a tp mismatch also shows in the model fingerprint (kv heads per rank), kv_heads
     * and page bytes, and the cause is the one to name */
    if (p->tp_size != d->tp_size)
        return pd_errorf(PD_EMISMATCH,
                         "layout mismatch: tp_size: prefill %" PRIu32 ", decode %" PRIu32
                         " (both must run the same --tp-size: rank r's KV pool shard is written "
                         "into rank r's)",
                         p->tp_size, d->tp_size);
    PD_CHECK_S(model)
    PD_CHECK_U(tp_rank)
    PD_CHECK_U(layers)
    PD_CHECK_U(kv_heads)
    PD_CHECK_U(head_dim)
    PD_CHECK_U(page_size)
    if (strcmp(p->dtype, d->dtype) != 0)
        return pd_errorf(PD_EMISMATCH,
                         "layout mismatch: dtype: prefill '%s', decode '%s' (both must run the "
                         "same --kv-cache-dtype: pages move between the pools as they are)",
                         p->dtype, d->dtype);
    PD_CHECK_U(page_bytes)
#undef PD_CHECK_U
#undef PD_CHECK_S
    return PD_OK;
}

static void layout_to_pb(const struct pd_bootstrap_layout *l, Pdserve__V1__Layout *pb) {
    pdserve__v1__layout__init(pb);
    pb->model = (char *)l->model;
    pb->layers = l->layers;
    pb->kv_heads = l->kv_heads;
    pb->head_dim = l->head_dim;
    pb->page_size = l->page_size;
    pb->dtype = (char *)l->dtype;
    pb->tp_rank = l->tp_rank;
    pb->tp_size = l->tp_size;
    pb->page_bytes = l->page_bytes;
}

static void layout_from_pb(const Pdserve__V1__Layout *pb, struct pd_bootstrap_layout *l) {
    memset(l, 0, sizeof(*l));
    if (!pb)
        return;
    snprintf(l->model, sizeof(l->model), "%s", pb->model ? pb->model : "");
    l->layers = pb->layers;
    l->kv_heads = pb->kv_heads;
    l->head_dim = pb->head_dim;
    l->page_size = pb->page_size;
    snprintf(l->dtype, sizeof(l->dtype), "%s", pb->dtype ? pb->dtype : "");
    l->tp_rank = pb->tp_rank;
    l->tp_size = pb->tp_size;
    l->page_bytes = pb->page_bytes;
}

struct pd_flag *pd_flag_cluster_key(struct pd_flagset *fs, const char **path) {
    return pd_flag_string(fs, "--cluster-key", path, "FILE",
                          "file holding the shared secret every bootstrap call carries (default: "
                          "env PDSERVE_CLUSTER_KEY)");
}

int pd_cluster_key_load(const char *path, uint8_t key[PD_CLUSTER_KEY_MAX], size_t *len) {
    *len = 0;
    if (!path || !*path) {
        const char *env = getenv("PDSERVE_CLUSTER_KEY");
        if (!env || !*env) {
            pd_warn("bootstrap: no cluster key (--cluster-key or PDSERVE_CLUSTER_KEY): the "
                    "bootstrap port trusts anyone who can reach it");
            return PD_OK;
        }
        size_t n = strlen(env);
        if (n > PD_CLUSTER_KEY_MAX)
            return pd_errorf(PD_ERANGE, "PDSERVE_CLUSTER_KEY: %zu bytes, at most %d", n,
                             PD_CLUSTER_KEY_MAX);
        memcpy(key, env, n);
        *len = n;
        return PD_OK;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return pd_errorf(pd_status_from_errno(errno), "--cluster-key %s: %s", path,
                         strerror(errno));
    size_t n = fread(key, 1, PD_CLUSTER_KEY_MAX, f);
    int extra = fgetc(f);
    fclose(f);
    while (n > 0 && (key[n - 1] == '\n' || key[n - 1] == '\r'))
        n--;
    if (extra != EOF)
        return pd_errorf(PD_ERANGE, "--cluster-key %s: longer than %d bytes", path,
                         PD_CLUSTER_KEY_MAX);
    if (n == 0)
        return pd_errorf(PD_EINVAL, "--cluster-key %s: empty", path);
    *len = n;
    return PD_OK;
}

/* Constant time in the key's content: a refusal says nothing about how much was right. */
static bool key_ok(const uint8_t *want, size_t want_len, ProtobufCBinaryData got) {
    if (got.len != want_len)
        return false;
    unsigned diff = 0;
    for (size_t i = 0; i < want_len; i++)
        diff |= want[i] ^ got.data[i];
    return diff == 0;
}

/* ---- server ---- */

struct spair {
    struct spair *next;
    char decode_id[128];
    uint64_t engine_id;
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
    uint8_t *reply; /* last reply body, owned until the next call */
};

static struct spair *pair_find(pd_bootstrap_server_t *s, const char *decode_id) {
    for (struct spair *p = s->pairs; p; p = p->next)
        if (strcmp(p->decode_id, decode_id) == 0)
            return p;
    return NULL;
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
    if (key_ok(s->key, s->cfg.key_len, key))
        return false;
    pd_warn("bootstrap: %s from %s refused: %s cluster key", what, peer,
            key.len ? "wrong" : "missing");
    answer_code(a, PD_GRPC_PERMISSION_DENIED, "%s: %s cluster key", what,
                key.len ? "wrong" : "missing");
    return true;
}

/* The decode's pool as PairRequest describes it: shard 0 in the original fields, shards 1 .. S-1
 * in the repeated ones (bootstrap.proto). Refuses (INVALID_ARGUMENT, true) a request whose shard
 * lists disagree; the shard count and sizes are the engine's to check against ours. */
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
    layout_from_pb(rq->layout, &dl);
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
    if (old && old->engine_id != rq->engine_id) {
        /* The decode restarted: the old engine's rooms are dead; a new endpoint replaces it. */
        pd_info("bootstrap: decode %s re-paired with a new engine; closing the old endpoint",
                rq->decode_id);
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
        p->next = s->pairs;
        s->pairs = p;
        old = p;
        pd_info("bootstrap: paired with decode %s (%u pages) from %s, data lane %s", rq->decode_id,
                rq->kv_pages, peer, pd_xfer_peer_transport(p->peer));
    }
    Pdserve__V1__PairReply rp = PDSERVE__V1__PAIR_REPLY__INIT;
    Pdserve__V1__Layout lpb;
    layout_to_pb(&s->cfg.layout, &lpb);
    const void *addr;
    size_t addr_len;
    pd_xfer_local_address(s->x, &addr, &addr_len);
    rp.prefill_id = s->prefill_id;
    rp.ucx_worker_address.data = (uint8_t *)addr;
    rp.ucx_worker_address.len = addr_len;
    rp.layout = &lpb;
    rp.data_transport = (char *)pd_xfer_peer_transport(old->peer);
    rp.engine_id = pd_xfer_id(s->x);
    answer_message(s, a, &rp.base);
out:
    pdserve__v1__pair_request__free_unpacked(rq, NULL);
}

static void serve_transfer(pd_bootstrap_server_t *s, const char *peer, const uint8_t *body,
                           size_t n, struct pd_grpc_answer *a) {
    Pdserve__V1__TransferRequest *rq = pdserve__v1__transfer_request__unpack(NULL, n, body);
    if (!rq) {
        pd_warn("bootstrap: Transfer from %s: malformed request (%zu bytes)", peer, n);
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Transfer: malformed TransferRequest (%zu bytes)",
                    n);
        return;
    }
    if (refuse_key(s, "Transfer", peer, rq->cluster_key, a))
        goto out;
    struct spair *p = pair_find(s, rq->decode_id);
    if (!p) {
        answer_code(a, PD_GRPC_FAILED_PRECONDITION,
                    "Transfer room %" PRIu64 ": decode '%s' has "
                    "not paired",
                    rq->room, rq->decode_id);
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
        s->cb.on_room(s->cb.ctx, rq->room, rq->decode_id, (uint32_t)rq->n_dst_pages,
                      rq->prompt_len);
    Pdserve__V1__TransferReply rp = PDSERVE__V1__TRANSFER_REPLY__INIT;
    answer_message(s, a, &rp.base);
out:
    pdserve__v1__transfer_request__free_unpacked(rq, NULL);
}

static void serve_abort(pd_bootstrap_server_t *s, const char *peer, const uint8_t *body, size_t n,
                        struct pd_grpc_answer *a) {
    Pdserve__V1__AbortRequest *rq = pdserve__v1__abort_request__unpack(NULL, n, body);
    if (!rq) {
        pd_warn("bootstrap: Abort from %s: malformed request (%zu bytes)", peer, n);
        answer_code(a, PD_GRPC_INVALID_ARGUMENT, "Abort: malformed AbortRequest (%zu bytes)", n);
        return;
    }
    if (refuse_key(s, "Abort", peer, rq->cluster_key, a))
        goto out;
    bool found = pd_xfer_room_live(s->x, rq->room);
    char why[160];
    snprintf(why, sizeof(why), "aborted by decode %s: %s", rq->decode_id,
             rq->reason[0] ? rq->reason : "no reason given");
    if (found)
        pd_xfer_room_abort(s->x, rq->room, PD_ECANCELED, why);
    pd_info("bootstrap: room %" PRIu64 ": %s (%s)", rq->room, why, found ? "live" : "not live");
    if (s->cb.on_abort)
        s->cb.on_abort(s->cb.ctx, rq->room, found, rq->reason);
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
        serve_transfer(s, peer, req, len, a);
    else if (strcmp(method, PD_BOOTSTRAP_METHOD_ABORT) == 0)
        serve_abort(s, peer, req, len, a);
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
    s->cfg = *cfg;
    if (cb)
        s->cb = *cb;
    memcpy(s->key, cfg->key, cfg->key_len);
    s->cfg.key = s->key;
    snprintf(s->prefill_id, sizeof(s->prefill_id), "%s",
             cfg->prefill_id ? cfg->prefill_id : "prefill");
    s->cfg.prefill_id = s->prefill_id;
    int rc = pd_grpc_server_new(b, cfg->addr, serve, s, &s->srv);
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

void pd_bootstrap_server_peer_closed(pd_bootstrap_server_t *s, pd_xfer_peer_t *peer) {
    for (struct spair *p = s->pairs; p; p = p->next) {
        if (p->peer == peer) {
            pd_info("bootstrap: decode %s unpaired (endpoint closed)", p->decode_id);
            pair_remove(s, p);
            return;
        }
    }
}

/* ---- client ---- */

struct croom {
    struct croom *next;
    pd_bootstrap_client_t *c;
    uint64_t room;
    void *user;
    uint32_t *pages;
    uint32_t n;
    uint32_t prompt_len;
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

static int client_call(pd_bootstrap_client_t *c, const char *method, const ProtobufCMessage *msg,
                       pd_grpc_reply_fn fn, void *ctx) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = pd_malloc(n ? n : 1);
    if (!buf)
        return pd_error_wrap(PD_ENOMEM, "packing %s", method);
    protobuf_c_message_pack(msg, buf);
    int rc = pd_grpc_call(c->ch, method, buf, n, c->cfg.deadline_ms, fn, ctx);
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
    rq.cluster_key.data = c->key;
    rq.cluster_key.len = c->cfg.key_len;
    rq.room = room;
    rq.decode_id = c->decode_id;
    rq.reason = (char *)reason;
    if (client_call(c, PD_BOOTSTRAP_METHOD_ABORT, &rq.base, on_abort_reply, ac)) {
        pd_warn("bootstrap: room %" PRIu64 ": %s", room, pd_error_msg());
        pd_free(ac);
    }
}

static void on_transfer_reply(void *ctx, int status, const uint8_t *reply, size_t len) {
    struct croom *r = ctx;
    pd_bootstrap_client_t *c = r->c;
    (void)reply;
    (void)len;
    croom_unlink(&c->inflight, r);
    if (!c->freeing && pd_xfer_room_live(c->x, r->room)) {
        if (status == PD_OK) {
            if (r->abort_pending)
                send_abort(c, r->room, r->reason);
        } else if (status == PD_ETIMEDOUT || status == PD_EPEER || status == PD_ECANCELED ||
                   status == PD_EINTERNAL || status == PD_EIO) {
            /* The prefill may have taken the room anyway: its writes may still land. */
            pd_warn("bootstrap: room %" PRIu64 ": %s; aborting it", r->room, pd_error_msg());
            pd_xfer_room_abort(c->x, r->room, status, pd_error_msg());
            send_abort(c, r->room, "Transfer failed on decode's side");
        } else {
            /* A definite refusal: the prefill never took the room, nothing can land. */
            pd_warn("bootstrap: room %" PRIu64 ": refused: %s", r->room, pd_error_msg());
            pd_xfer_room_release(c->x, r->room, status);
        }
    }
    croom_free(r);
    c->calls--;
    client_maybe_done(c);
}

static void send_transfer(pd_bootstrap_client_t *c, struct croom *r) {
    int rc = pd_xfer_room_expect(c->x, c->peer, r->room, r->pages, r->n, r->user);
    if (rc) {
        if (c->cb.on_room_rejected)
            c->cb.on_room_rejected(c->cb.ctx, r->room, r->user, rc, pd_error_msg());
        croom_free(r);
        return;
    }
    Pdserve__V1__TransferRequest rq = PDSERVE__V1__TRANSFER_REQUEST__INIT;
    rq.cluster_key.data = c->key;
    rq.cluster_key.len = c->cfg.key_len;
    rq.room = r->room;
    rq.decode_id = c->decode_id;
    rq.dst_pages = r->pages;
    rq.n_dst_pages = r->n;
    rq.prompt_len = r->prompt_len;
    rc = client_call(c, PD_BOOTSTRAP_METHOD_TRANSFER, &rq.base, on_transfer_reply, r);
    if (rc) {
        pd_xfer_room_release(c->x, r->room, rc); /* never sent: nothing can land */
        croom_free(r);
        return;
    }
    r->transfer_inflight = true;
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
        layout_from_pb(rp->layout, &pl);
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
    layout_to_pb(&c->cfg.layout, &lpb);
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
    rq.layout = &lpb;
    rq.engine_id = me.remote_id;
    int rc = client_call(c, PD_BOOTSTRAP_METHOD_PAIR, &rq.base, on_pair_reply, c);
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
    int rc = pd_grpc_channel_new(b, cfg->target, &c->ch);
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

bool pd_bootstrap_client_paired(const pd_bootstrap_client_t *c) {
    return c->state == PAIRED;
}

int pd_bootstrap_client_transfer(pd_bootstrap_client_t *c, uint64_t room, const uint32_t *dst_pages,
                                 uint32_t n, uint32_t prompt_len, void *room_user) {
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

int pd_bootstrap_client_raw(pd_bootstrap_client_t *c, const char *method, const uint8_t *body,
                            size_t len, pd_grpc_reply_fn fn, void *ctx) {
    struct raw_ctx *r = pd_malloc(sizeof(*r));
    if (!r)
        return pd_error_wrap(PD_ENOMEM, "calling %s", method);
    r->c = c;
    r->fn = fn;
    r->ctx = ctx;
    int rc = pd_grpc_call(c->ch, method, body, len, c->cfg.deadline_ms, on_raw_reply, r);
    if (rc) {
        pd_free(r);
        return rc;
    }
    c->calls++;
    return PD_OK;
}

int pd_bootstrap_encode_transfer(const uint8_t *key, size_t key_len, uint64_t room,
                                 const char *decode_id, const uint32_t *pages, uint32_t n,
                                 uint8_t **out, size_t *len) {
    Pdserve__V1__TransferRequest rq = PDSERVE__V1__TRANSFER_REQUEST__INIT;
    rq.cluster_key.data = (uint8_t *)key;
    rq.cluster_key.len = key_len;
    rq.room = room;
    rq.decode_id = (char *)decode_id;
    rq.dst_pages = (uint32_t *)pages;
    rq.n_dst_pages = n;
    *len = protobuf_c_message_get_packed_size(&rq.base);
    *out = pd_malloc(*len ? *len : 1);
    if (!*out)
        return pd_error_wrap(PD_ENOMEM, "encoding a TransferRequest");
    protobuf_c_message_pack(&rq.base, *out);
    return PD_OK;
}

int pd_bootstrap_encode_health(const uint8_t *key, size_t key_len, uint8_t **out, size_t *len) {
    Pdserve__V1__HealthRequest rq = PDSERVE__V1__HEALTH_REQUEST__INIT;
    rq.cluster_key.data = (uint8_t *)key;
    rq.cluster_key.len = key_len;
    *len = protobuf_c_message_get_packed_size(&rq.base);
    *out = pd_malloc(*len ? *len : 1);
    if (!*out)
        return pd_error_wrap(PD_ENOMEM, "encoding a HealthRequest");
    protobuf_c_message_pack(&rq.base, *out);
    return PD_OK;
}

int pd_bootstrap_client_health(pd_bootstrap_client_t *c, pd_grpc_reply_fn fn, void *ctx) {
    uint8_t *body;
    size_t len;
    int rc = pd_bootstrap_encode_health(c->key, c->cfg.key_len, &body, &len);
    if (rc)
        return rc;
    rc = pd_bootstrap_client_raw(c, PD_BOOTSTRAP_METHOD_HEALTH, body, len, fn, ctx);
    pd_free(body);
    return rc;
}
