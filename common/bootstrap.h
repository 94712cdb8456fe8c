/*
 * bootstrap.h — the control plane between a decode and a prefill daemon (DESIGN.md §1, §3):
 * the prefill serves Pair/Transfer/Abort/Health on its bootstrap port, the decode calls it, and
 * both wire what they learn into their transfer engines (common/xfer.h).
 *
 * Server (prefill). Every call's cluster key is checked first (wrong or missing →
 * PERMISSION_DENIED, a log line, no state change); requests are parsed with protobuf-c
 * (malformed → INVALID_ARGUMENT); Pair checks the layout (FAILED_PRECONDITION naming the field)
 * and connects an endpoint to the decode's pool; Transfer adds the room to the engine, which
 * checks every destination page (OUT_OF_RANGE / INVALID_ARGUMENT) and that the room id is new
 * (ALREADY_EXISTS); Abort aborts the room in the engine (its failed notice follows over UCX).
 *
 * Client (decode). Pairs on first use (queueing rooms meanwhile) and connects back to the
 * prefill's worker so that a dead prefill fails the rooms; a room enters the engine before its
 * Transfer is sent, so a notice can never arrive for an unknown room. A room that never reached
 * the engine ends through on_room_rejected; every other ending comes from the engine's
 * on_room_end. Every RPC carries a deadline.
 */
#ifndef PD_BOOTSTRAP_H
#define PD_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grpc_bridge.h"
#include "common/xfer.h"

struct pd_flagset;
struct pd_flag;

#define PD_CLUSTER_KEY_MAX 256 /* bytes */
#define PD_BOOTSTRAP_DEADLINE_MS 5000

/* What both KV pools must agree on (bootstrap.proto Layout). */
struct pd_bootstrap_layout {
    char model[128]; /* fingerprint: model name + config hash */
    uint32_t layers;
    uint32_t kv_heads; /* per tp rank */
    uint32_t head_dim;
    uint32_t page_size; /* tokens */
    char dtype[16];
    uint32_t tp_rank;
    uint32_t tp_size;
    uint64_t page_bytes; /* one page, all layers, K and V */
};

/* Compares two layouts; PD_EMISMATCH naming the first differing field ("kv_heads: prefill 2,
 * decode 4"). */
int pd_bootstrap_layout_check(const struct pd_bootstrap_layout *prefill,
                              const struct pd_bootstrap_layout *decode);

/* --cluster-key FILE; the key is the file's content without a trailing newline. Without the
 * flag the environment variable PDSERVE_CLUSTER_KEY is used; neither → empty key (a warning at
 * start: the bootstrap port then trusts anyone who can reach it). */
struct pd_flag *pd_flag_cluster_key(struct pd_flagset *fs, const char **path);
int pd_cluster_key_load(const char *path, uint8_t key[PD_CLUSTER_KEY_MAX], size_t *len);

typedef struct pd_bootstrap_server pd_bootstrap_server_t;
typedef struct pd_bootstrap_client pd_bootstrap_client_t;

struct pd_bootstrap_server_config {
    const char *addr; /* "127.0.0.1:8998" */
    const uint8_t *key;
    size_t key_len;
    struct pd_bootstrap_layout layout;
    const char *prefill_id; /* for logs and Health */
};

struct pd_bootstrap_server_callbacks {
    void *ctx;
    /* A room's destination is known (Transfer accepted; the room is in the engine). */
    void (*on_room)(void *ctx, uint64_t room, const char *decode_id, uint32_t n_pages,
                    uint32_t prompt_len);
    /* Decode asked to abort the room; found: it was in the engine. May be NULL. */
    void (*on_abort)(void *ctx, uint64_t room, bool found, const char *reason);
};

/* The server uses x for pairing; x must outlive it. */
int pd_bootstrap_server_new(pd_grpc_bridge_t *b, pd_xfer_t *x,
                            const struct pd_bootstrap_server_config *cfg,
                            const struct pd_bootstrap_server_callbacks *cb,
                            pd_bootstrap_server_t **out);
/* Stops serving and closes every decode's endpoint. Accepts NULL. */
void pd_bootstrap_server_free(pd_bootstrap_server_t *s);
/* The engine reported the peer closed (forward xfer's on_peer_closed here): forget the pair. */
void pd_bootstrap_server_peer_closed(pd_bootstrap_server_t *s, pd_xfer_peer_t *p);

struct pd_bootstrap_client_config {
    const char *target; /* "127.0.0.1:8998" */
    const uint8_t *key;
    size_t key_len;
    struct pd_bootstrap_layout layout;
    const char *decode_id;
    int deadline_ms; /* per RPC; 0 = PD_BOOTSTRAP_DEADLINE_MS */
};

struct pd_bootstrap_client_callbacks {
    void *ctx;
    /* The room never entered the engine (pairing failed, or the engine refused it). */
    void (*on_room_rejected)(void *ctx, uint64_t room, void *room_user, int status,
                             const char *msg);
    /* Pair answered: status PD_OK, or why not (also reported per room through on_room_rejected).
     * May be NULL. */
    void (*on_paired)(void *ctx, int status, const char *msg);
};

/* x must have its pool registered; x must outlive the client. */
int pd_bootstrap_client_new(pd_grpc_bridge_t *b, pd_xfer_t *x,
                            const struct pd_bootstrap_client_config *cfg,
                            const struct pd_bootstrap_client_callbacks *cb,
                            pd_bootstrap_client_t **out);
/* Calls in flight are cancelled; the prefill endpoint is closed. Accepts NULL. */
void pd_bootstrap_client_free(pd_bootstrap_client_t *c);
/* The engine reported the peer closed (forward xfer's on_peer_closed here). */
void pd_bootstrap_client_peer_closed(pd_bootstrap_client_t *c, pd_xfer_peer_t *p);

/* Reserves the room with the prefill: its KV goes into dst_pages (decode pool indices, prompt
 * order; copied). The ending arrives via the engine's on_room_end or on_room_rejected. */
int pd_bootstrap_client_transfer(pd_bootstrap_client_t *c, uint64_t room, const uint32_t *dst_pages,
                                 uint32_t n, uint32_t prompt_len, void *room_user);
/* Aborts on both sides: the engine marks the room aborting, the prefill is told; the room ends
 * once no write can land (the prefill's flushed failed notice, its "not found", or the abort
 * timeout force-closing the endpoint). */
int pd_bootstrap_client_abort(pd_bootstrap_client_t *c, uint64_t room, const char *reason);
bool pd_bootstrap_client_paired(const pd_bootstrap_client_t *c);

/* One raw call with an arbitrary body (tests: garbage bytes, wrong keys). */
int pd_bootstrap_client_raw(pd_bootstrap_client_t *c, const char *method, const uint8_t *body,
                            size_t len, pd_grpc_reply_fn fn, void *ctx);

/* Health(): fn gets the HealthReply bytes or the failure. */
int pd_bootstrap_client_health(pd_bootstrap_client_t *c, pd_grpc_reply_fn fn, void *ctx);

/* Helpers that encode requests for tests and tools; caller frees *out with pd_free. */
int pd_bootstrap_encode_transfer(const uint8_t *key, size_t key_len, uint64_t room,
                                 const char *decode_id, const uint32_t *pages, uint32_t n,
                                 uint8_t **out, size_t *len);
int pd_bootstrap_encode_health(const uint8_t *key, size_t key_len, uint8_t **out, size_t *len);

#define PD_BOOTSTRAP_METHOD_PAIR "/pdserve.v1.Bootstrap/Pair"
#define PD_BOOTSTRAP_METHOD_TRANSFER "/pdserve.v1.Bootstrap/Transfer"
#define PD_BOOTSTRAP_METHOD_ABORT "/pdserve.v1.Bootstrap/Abort"
#define PD_BOOTSTRAP_METHOD_HEALTH "/pdserve.v1.Bootstrap/Health"

#endif
