/*
 * bootstrap_client.h — the decode's bootstrap client of one prefill (decode/bootstrap_client.c):
 * pairs, sends each room's Transfer and Abort (the protocol: common/bootstrap.h).
 */
#ifndef PD_BOOTSTRAP_CLIENT_H
#define PD_BOOTSTRAP_CLIENT_H

#include "common/bootstrap.h"

typedef struct pd_bootstrap_client pd_bootstrap_client_t;

struct pd_bootstrap_client_config {
    const char *target; /* "127.0.0.1:8998" */
    const uint8_t *key;
    size_t key_len;
    struct pd_bootstrap_layout layout;
    const char *decode_id;
    int deadline_ms;               /* per RPC; 0 = PD_BOOTSTRAP_DEADLINE_MS */
    const struct pd_grpc_tls *tls; /* NULL: plaintext; else TLS (root_certs; copied) */
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
 * order; copied), the destinations of the prompt's pages after the first held_pages, which
 * decode already holds (its prefix cache; 0: none). A prefill that does not skip held pages
 * (it predates them) rejects such a room with PD_EMISMATCH through on_room_rejected. The ending
 * arrives via the engine's on_room_end or on_room_rejected. */
int pd_bootstrap_client_transfer(pd_bootstrap_client_t *c, uint64_t room, const uint32_t *dst_pages,
                                 uint32_t n, uint32_t held_pages, uint32_t prompt_len,
                                 void *room_user);
/* Aborts on both sides: the engine marks the room aborting, the prefill is told; the room ends
 * once no write can land (the prefill's flushed failed notice, its "not found", or the abort
 * timeout force-closing the endpoint). */
int pd_bootstrap_client_abort(pd_bootstrap_client_t *c, uint64_t room, const char *reason);
bool pd_bootstrap_client_paired(const pd_bootstrap_client_t *c);

/* The pairing's id (PairReply.pair_id) while paired, else 0. */
uint64_t pd_bootstrap_client_pair_id(const pd_bootstrap_client_t *c);

/* One raw call with an arbitrary body (tests: garbage bytes, wrong keys, stale pair ids): over
 * gRPC, or with ucx_method (PD_BOOTSTRAP_CALL_*) as a call on the pair's endpoint. */
int pd_bootstrap_client_raw(pd_bootstrap_client_t *c, const char *method, uint32_t ucx_method,
                            const uint8_t *body, size_t len, pd_grpc_reply_fn fn, void *ctx);

/* Health(): fn gets the HealthReply bytes or the failure. */
int pd_bootstrap_client_health(pd_bootstrap_client_t *c, pd_grpc_reply_fn fn, void *ctx);

#endif
