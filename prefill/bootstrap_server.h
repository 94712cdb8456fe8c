/*
 * bootstrap_server.h — the prefill's bootstrap server (prefill/bootstrap_server.c): serves
 * Pair/Transfer/Abort/Health on --disaggregation-bootstrap-port (the protocol: common/bootstrap.h).
 */
#ifndef PD_BOOTSTRAP_SERVER_H
#define PD_BOOTSTRAP_SERVER_H

#include "common/bootstrap.h"

typedef struct pd_bootstrap_server pd_bootstrap_server_t;

struct pd_bootstrap_server_config {
    const char *addr; /* "127.0.0.1:8998" */
    const uint8_t *key;
    size_t key_len;
    struct pd_bootstrap_layout layout;
    const char *prefill_id;        /* for logs and Health */
    const struct pd_grpc_tls *tls; /* NULL: plaintext; else TLS (the PEM text is copied) */
};

struct pd_bootstrap_server_callbacks {
    void *ctx;
    /* A room's destination is known (Transfer accepted; the room is in the engine): n_pages
     * destinations for the prompt's pages after the first held_pages, which decode holds. */
    void (*on_room)(void *ctx, uint64_t room, const char *decode_id, uint32_t n_pages,
                    uint32_t held_pages, uint32_t prompt_len);
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
/* A call over a pair's UCX endpoint (forward xfer's on_call here): Transfer or Abort, served as
 * the gRPC method is and answered on that endpoint; a Transfer must come from the endpoint of
 * the pair it names (else NOT_FOUND, as for a decode that has not paired). */
void pd_bootstrap_server_call(pd_bootstrap_server_t *s, pd_xfer_peer_t *peer,
                              const struct pd_xfer_ctl *call);
/* The engine reported the peer closed (forward xfer's on_peer_closed here): forget the pair. */
void pd_bootstrap_server_peer_closed(pd_bootstrap_server_t *s, pd_xfer_peer_t *p);

#endif
