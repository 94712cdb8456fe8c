/*
 * grpc_bridge.h — gRPC core (C API) moved onto a libuv loop (DESIGN.md §2a).
 *
 * The bridge owns one completion queue and the one thread that waits on it. That thread does
 * nothing but move finished events (tag, ok) into a queue and wake the loop with a uv_async_t;
 * every tag's function then runs on the loop thread. On top of it: a unary client call and a
 * unary server whose handlers run synchronously on the loop, both exchanging raw bytes (callers
 * serialize with protobuf-c). Every client call has a deadline.
 *
 * TLS (pd_grpc_tls): a server with a certificate refuses connections that do not complete a
 * TLS handshake; gRPC's own log lines (a failed handshake among them) reach pdserve's log as
 * "grpc: ..." lines, its errors at warning.
 *
 * Foreign codes: grpc_call_error and grpc_status_code are translated here and nowhere else.
 * Lifetime: servers are freed before the bridge; pd_grpc_bridge_free waits (on the loop) for
 * every call to finish, then stops the thread and releases the handle in its close callback.
 */
#ifndef PD_GRPC_BRIDGE_H
#define PD_GRPC_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

typedef struct pd_grpc_bridge pd_grpc_bridge_t;
typedef struct pd_grpc_server pd_grpc_server_t;
typedef struct pd_grpc_channel pd_grpc_channel_t;

/* gRPC status codes we produce or look at (values as in grpc/status.h). */
enum pd_grpc_code {
    PD_GRPC_OK = 0,
    PD_GRPC_CANCELLED = 1,
    PD_GRPC_UNKNOWN = 2,
    PD_GRPC_INVALID_ARGUMENT = 3,
    PD_GRPC_DEADLINE_EXCEEDED = 4,
    PD_GRPC_NOT_FOUND = 5,
    PD_GRPC_ALREADY_EXISTS = 6,
    PD_GRPC_PERMISSION_DENIED = 7,
    PD_GRPC_RESOURCE_EXHAUSTED = 8,
    PD_GRPC_FAILED_PRECONDITION = 9,
    PD_GRPC_ABORTED = 10,
    PD_GRPC_OUT_OF_RANGE = 11,
    PD_GRPC_UNIMPLEMENTED = 12,
    PD_GRPC_INTERNAL = 13,
    PD_GRPC_UNAVAILABLE = 14,
};

/* PD_E* → the gRPC status a server answers with. */
enum pd_grpc_code pd_grpc_code_from_status(int status);
/* A gRPC status a client got → PD_E*, with "doing: <code name>: details" as the message. */
int pd_grpc_status_to_pd(int code, const char *details, const char *doing);
const char *pd_grpc_code_name(int code);

int pd_grpc_bridge_new(uv_loop_t *loop, pd_grpc_bridge_t **out);
/* Frees once every channel and server on it is gone; run the loop afterwards. Accepts NULL. */
void pd_grpc_bridge_free(pd_grpc_bridge_t *b);

/* ---- server ---- */

/* What a handler answers: code PD_GRPC_OK with reply bytes (may be empty), or an error code and
 * a message. reply is copied after the handler returns; the handler owns its buffer. */
struct pd_grpc_answer {
    enum pd_grpc_code code;
    char message[512];
    const uint8_t *reply;
    size_t reply_len;
};

/* Runs on the loop thread. method is "/pdserve.v1.Bootstrap/Pair"; peer is "ipv4:127.0.0.1:…". */
typedef void (*pd_grpc_handler_fn)(void *ctx, const char *method, const char *peer,
                                   const uint8_t *req, size_t req_len, struct pd_grpc_answer *ans);

/* TLS of a server or a channel: PEM text (not file names), copied by gRPC. */
struct pd_grpc_tls {
    const char *cert_chain;  /* server: its certificate chain; client: NULL (no client cert) */
    const char *private_key; /* server: the chain's key */
    const char *root_certs;  /* client: the CAs the server's certificate must chain to; NULL =
                                gRPC's default roots */
};

/* Listens on "host:port" (SO_REUSEPORT off, so a busy port fails here); tls NULL = plaintext,
 * else TLS with tls->cert_chain and tls->private_key (no client certificate asked for). */
int pd_grpc_server_new(pd_grpc_bridge_t *b, const char *addr, const struct pd_grpc_tls *tls,
                       pd_grpc_handler_fn fn, void *ctx, pd_grpc_server_t **out);
/* Cancels calls in flight, shuts down; memory goes when gRPC confirms. The handler is never
 * called after this returns, so its ctx may be freed right away. Accepts NULL. */
void pd_grpc_server_free(pd_grpc_server_t *s);

/* ---- client ---- */

/* tls NULL = plaintext; else TLS, the server's certificate checked against tls->root_certs and
 * the target's host name (or address). */
int pd_grpc_channel_new(pd_grpc_bridge_t *b, const char *target, const struct pd_grpc_tls *tls,
                        pd_grpc_channel_t **out);
void pd_grpc_channel_free(pd_grpc_channel_t *c); /* calls in flight are cancelled */
/* Which connection to its server the channel holds now: 0 when it holds none (not gRPC's READY),
 * else a number that stays the same while that connection lasts and changes once it has ended.
 * Never blocks, starts nothing. A server process that died closed its connections: the channel
 * holds none as soon as gRPC has read that (idle past gRPC's client idle timeout, 30 min, also
 * ends one). gRPC connects a channel for a call, and reconnects it unasked only after a call
 * failed; every call looks first and a failed call counts as an end, so a connection that ended
 * and was replaced between two looks still gets a new number. */
uint64_t pd_grpc_channel_connection(pd_grpc_channel_t *c);

/* status: PD_OK, or the translated failure (pd_error_msg() holds the message during the call).
 * reply is valid during the callback only. */
typedef void (*pd_grpc_reply_fn)(void *ctx, int status, const uint8_t *reply, size_t reply_len);

/* Starts a unary call; fn runs exactly once on the loop thread (also when the channel is freed
 * meanwhile: status PD_ECANCELED). */
int pd_grpc_call(pd_grpc_channel_t *c, const char *method, const uint8_t *req, size_t req_len,
                 int deadline_ms, pd_grpc_reply_fn fn, void *ctx);

#endif
