/*
 * http_server.h — the HTTP/1.1 front every pdserve daemon and the router share: h2o (libuv
 * build) on the caller's uv_loop_t, a route table, a request body limit, an optional API key,
 * JSON responses and Server-Sent-Events streams fed later from the loop thread (tokens reach
 * the loop from the compute thread through the daemon's own queue + uv_async_t), detection of
 * clients that went away, and a graceful shutdown.
 *
 * Threading: every function here runs on the loop thread only (DESIGN.md §2a). Nothing blocks.
 *
 * A pd_http_req lives from the handler call until the daemon finishes it (pd_http_respond*,
 * pd_http_sse_end, pd_http_stream_end) — or, when the client disconnects first and the daemon
 * registered pd_http_req_on_gone, until that callback returns (the daemon must not touch it after).
 * Without an on_gone callback a gone request stays valid and its calls return PD_ECANCELED until
 * the daemon finishes it. Bodies over the limit get 413 with an OpenAI error JSON before the body
 * is read (h2o refuses by Content-Length, or as soon as a chunked body passes the limit). A request
 * line and headers over max_header_bytes get 431 (past h2o's own bound, H2O_MAX_REQLEN, about
 * 408 KiB, or past 100 header fields, h2o itself answers a plain-text 400 and closes). A client
 * address with max_requests_per_client requests of PD_HTTP_PER_CLIENT routes in flight gets 429
 * with Retry-After for the next one; a request stops counting the moment it ends in any way
 * (answered, stream ended, client gone, shutdown cut). A client
 * that disconnects is noticed while its request waits for an answer (any method, with or without a
 * body) and while it streams, not only at the next write.
 *
 * TLS: with a context in the config every connection is HTTP/1.1 over TLS and all of the above
 * holds the same. A failed handshake (a plain HTTP client, a client that does not trust the
 * certificate) closes the connection and is logged at warning with the peer's address; a peer
 * that closes before finishing one (a TCP health probe) only at debug.
 *
 * Streams: pd_http_stream_* send raw bytes with any status and content type (a proxy passes an
 * already framed SSE body through byte for byte); pd_http_sse_* frame events on top of them.
 * Whatever the client has not read yet is the request's backlog, held in our memory: past
 * max_stream_backlog the client counts as gone. A producer that can wait (the router reading
 * from decode) keeps it small instead: it stops producing while pd_http_stream_backlog is high
 * and resumes from pd_http_stream_on_drain.
 */
#ifndef PD_HTTP_SERVER_H
#define PD_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct pd_api_error;
struct pd_http_server;
struct pd_http_req;
struct ssl_ctx_st; /* OpenSSL's SSL_CTX (common/base/tls.h makes one) */

#define PD_HTTP_DEFAULT_MAX_BODY (8u << 20) /* bytes */

#define PD_HTTP_DEFAULT_MAX_HEADER (64u << 10) /* bytes: request line + headers */
/* The flag every binary sets max_requests_per_client with; the 429 names it. */
#define PD_HTTP_PER_CLIENT_FLAG "--max-concurrent-requests-per-client"

typedef void (*pd_http_handler_fn)(struct pd_http_req *req, void *ud);
/* The client disconnected (or the shutdown deadline passed) before the response finished. */
typedef void (*pd_http_gone_fn)(struct pd_http_req *req, void *user);
typedef void (*pd_http_closed_fn)(struct pd_http_server *s, void *ud);
/* A stream's backlog fell to the level given to pd_http_stream_on_drain. */
typedef void (*pd_http_drain_fn)(struct pd_http_req *req, void *user);

struct pd_http_server_config {
    const char *host;           /* "127.0.0.1", "0.0.0.0", "::"; NULL = "127.0.0.1" */
    int port;                   /* 0 = ephemeral: see pd_http_server_port */
    size_t max_body_bytes;      /* 0 = PD_HTTP_DEFAULT_MAX_BODY */
    const char *api_key;        /* NULL or "": no check; else "Authorization: Bearer <key>" */
    size_t max_stream_backlog;  /* bytes queued for a slow stream client before it counts as gone;
                                   0 = 16 MiB */
    struct ssl_ctx_st *ssl_ctx; /* NULL: plain HTTP; else HTTPS (HTTP/1.1 over TLS) with this
                                   context; the server keeps a reference of its own */

    /* Limits beyond the body's. */
    size_t max_header_bytes; /* request line + headers; 0 = PD_HTTP_DEFAULT_MAX_HEADER */
    /* PD_HTTP_PER_CLIENT requests in flight per client IP address (the TCP peer: behind a proxy,
     * the proxy's); 0 = unlimited */
    int max_requests_per_client;
};

/* Route flags. */
enum {
    PD_HTTP_PUBLIC = 1, /* no API key needed (health probes, metrics) */

    PD_HTTP_PER_CLIENT = 2, /* counts against max_requests_per_client (generation) */
};

int pd_http_server_new(uv_loop_t *loop, const struct pd_http_server_config *c,
                       struct pd_http_server **out);
/* Exact path match (the query string is not part of it). Register before listening. */
int pd_http_server_route(struct pd_http_server *s, const char *method, const char *path,
                         unsigned flags, pd_http_handler_fn fn, void *ud);
/* Binds and listens; PD_EIO with the address in the message when that fails. From this call
 * on (even when it failed) the server holds loop handles: release them with
 * pd_http_server_shutdown, then free. */
int pd_http_server_listen(struct pd_http_server *s);
/* The bound port (the real one when the config said 0). */
int pd_http_server_port(const struct pd_http_server *s);
/* Requests the daemon has not finished yet. */
size_t pd_http_server_inflight(const struct pd_http_server *s);

struct pd_http_server_stats {
    size_t inflight;            /* requests the daemon has not finished */
    size_t stream_backlog;      /* bytes queued for streaming clients, all requests, now */
    size_t stream_backlog_peak; /* the largest backlog one request has reached; bytes */
    uint64_t slow_clients_cut;  /* streams dropped for passing max_stream_backlog */
    size_t connections;         /* client connections open now */
};
void pd_http_server_stats(const struct pd_http_server *s, struct pd_http_server_stats *out);

/* Stops accepting, lets in-flight requests finish (new responses say Connection: close, idle
 * keep-alive connections are closed); at timeout_ms every request still open gets on_gone and
 * its connection is cut. cb runs on the loop once every handle is closed; then call
 * pd_http_server_free. Call once. */
void pd_http_server_shutdown(struct pd_http_server *s, uint64_t timeout_ms, pd_http_closed_fn cb,
                             void *ud);
/* After the closed callback, or when pd_http_server_listen was never called. NULL is fine. */
void pd_http_server_free(struct pd_http_server *s);

/* ---- one request ---- */

const char *pd_http_req_method(const struct pd_http_req *r);
const char *pd_http_req_path(const struct pd_http_req *r);  /* without the query */
const char *pd_http_req_query(const struct pd_http_req *r); /* after '?', "" when none */
/* The body (copied; valid while r is). *len bytes, NUL-terminated for convenience. */
const char *pd_http_req_body(const struct pd_http_req *r, size_t *len);
/* A request header by lowercase name; NULL when absent. Valid until r is finished. */
const char *pd_http_req_header(const struct pd_http_req *r, const char *name, size_t *len);
/* true once the client is known to be gone. */
bool pd_http_req_gone(const struct pd_http_req *r);
void pd_http_req_on_gone(struct pd_http_req *r, pd_http_gone_fn fn, void *user);
/* Adds a response header (before the response starts). */
int pd_http_req_add_header(struct pd_http_req *r, const char *name, const char *value);

/* Finish r with one body. content_type NULL = "application/json". */
int pd_http_respond(struct pd_http_req *r, int status, const char *content_type, const char *body,
                    size_t len);
int pd_http_respond_json(struct pd_http_req *r, int status, const char *json);
/* {"error": {...}} with e->status. */
int pd_http_respond_error(struct pd_http_req *r, const struct pd_api_error *e);

/* A streamed response (chunked): status, content_type (NULL = "application/octet-stream") and
 * Cache-Control: no-cache go out at once. PD_ECANCELED when the client is gone. */
int pd_http_stream_start(struct pd_http_req *r, int status, const char *content_type);
/* Queues len bytes as they are (copied); written as soon as the previous write completed.
 * PD_ECANCELED when the client is gone, or when this send took the backlog past
 * max_stream_backlog: then the client was dropped and its on_gone ran inside this call. */
int pd_http_stream_send(struct pd_http_req *r, const void *data, size_t len);
/* Ends the stream after what is queued and finishes r (r is invalid after). */
int pd_http_stream_end(struct pd_http_req *r);
/* Bytes queued for r's client and not yet written (0 when not streaming). */
size_t pd_http_stream_backlog(const struct pd_http_req *r);
/* Backpressure: fn runs once, from the loop, when r's backlog has fallen to below_bytes or
 * less after a write completed. PD_EAGAIN: armed. PD_OK: the backlog is that low already, fn
 * is not armed. PD_ECANCELED: the client is gone (on_gone runs instead). A second call
 * replaces the first registration. */
int pd_http_stream_on_drain(struct pd_http_req *r, size_t below_bytes, pd_http_drain_fn fn,
                            void *user);

/* pd_http_stream_start(r, 200, "text/event-stream"). */
int pd_http_sse_start(struct pd_http_req *r);
/* Queues one event "data: <data>\n\n" (a multi-line data gets one "data:" per line); written
 * as soon as the previous write completed. PD_ECANCELED when the client is gone. */
int pd_http_sse_send(struct pd_http_req *r, const char *data, size_t len);
/* Queues "data: [DONE]\n\n" and finishes r (r is invalid after). */
int pd_http_sse_end(struct pd_http_req *r);
/* A mid-stream failure: "data: {"error":{...}}\n\n", then [DONE]; finishes r. */
int pd_http_sse_fail(struct pd_http_req *r, const struct pd_api_error *e);

#endif
