/*
 * front.h — pdserve-router's HTTP server side, on h2o (libuv build): accepts clients, hands each
 * whole request (method, path, body, Authorization) to the router, and carries its answer back,
 * either whole (respond) or as a stream (stream_start / stream_send / stream_end).
 *
 * Ownership: a pd_front_req is shared by the front (until h2o is done with the client's request)
 * and the router (until it calls respond or stream_end exactly once, its "finish"); it is freed
 * when both have let go. When the client goes away before the finish, on_gone runs once and
 * every later send is a no-op, but the router still finishes. Stream data is copied; while h2o is
 * writing one piece the next ones accumulate (no backpressure towards the upstream).
 * Kept small on purpose: when common/http_server lands this file is what it replaces.
 */
#ifndef PD_ROUTER_FRONT_H
#define PD_ROUTER_FRONT_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

struct pd_front;
struct pd_front_req;

typedef void (*pd_front_request_cb)(void *ud, struct pd_front_req *r);

/* Listens on host:port (port 0: ephemeral; pd_front_port tells which). Bodies over
 * max_body_bytes are refused by h2o with 413. */
int pd_front_new(uv_loop_t *loop, const char *host, int port, size_t max_body_bytes,
                 pd_front_request_cb on_request, void *ud, struct pd_front **out);
int pd_front_port(const struct pd_front *f);
/* Stops accepting new connections (shutdown); existing requests go on. */
void pd_front_stop_listening(struct pd_front *f);

/* The request, valid until the finish. */
const char *pd_front_req_method(const struct pd_front_req *r); /* NUL-terminated copy */
const char *pd_front_req_path(const struct pd_front_req *r);   /* without the query */
const char *pd_front_req_body(const struct pd_front_req *r, size_t *len);
/* The Authorization header's value, or NULL. */
const char *pd_front_req_authorization(const struct pd_front_req *r);
bool pd_front_req_client_gone(const struct pd_front_req *r);
void pd_front_req_on_gone(struct pd_front_req *r, void (*cb)(void *ud), void *ud);

/* Whole answer (copied). Finishes. */
void pd_front_respond(struct pd_front_req *r, int status, const char *content_type,
                      const char *body, size_t len);
void pd_front_stream_start(struct pd_front_req *r, int status, const char *content_type);
void pd_front_stream_send(struct pd_front_req *r, const char *data, size_t len);
/* Flushes what is queued and ends the response. Finishes. */
void pd_front_stream_end(struct pd_front_req *r);

#endif
