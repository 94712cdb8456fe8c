/*
 * http_server.c — h2o 2.2 (libuv build) under the pd_http_* interface.
 *
 * Ownership: the server owns one record per connection (our uv_tcp_t, released in its close
 * callback, which h2o triggers through h2o_socket_close) and one pd_http_req per request. A
 * pd_http_req has two owners: h2o's request (hreq, until we send the final bytes or h2o disposes
 * it — seen through a destructor chunk in the request's pool and the generator's stop) and the
 * daemon (until it finishes the request or its on_gone returns). The record is freed when both
 * have let go and no callback of ours is on the stack.
 *
 * Streaming follows h2o's rule that h2o_send may be called again only after proceed: events
 * queue in `pending` while `sending` is on the wire, and the buffers swap at proceed.
 *
 * h2o 2.2's HTTP/1 code stops reading a connection while a request is handled, so a client
 * that disconnects would only be noticed at the next write. We read the socket ourselves while
 * the daemon works (before and during its answer), and EOF/reset means gone: one event-driven
 * watch, no polling. That read appends to the socket's input buffer and may grow (move) it, so
 * first every string of the request that still points into that buffer (for a request without
 * a body: method, path, authority, headers — h2o copies them itself only when a body follows)
 * is copied into the request's pool, and the body is copied out. A reset seen by that read
 * leaves the stream unwritable for libuv, which h2o does not expect (see conn_send_done). h2o's own
 * error responses (413 for a too large body, 400 for broken framing) are rewritten into OpenAI
 * error JSON by a filter on the host's fallback path, the only path such early errors go through.
 *
 * TLS: each accepted connection runs h2o's server handshake (h2o_socket_ssl_handshake) under the
 * context's handshake timeout, then h2o's HTTP/1 on the TLS socket; we start the handshake
 * ourselves rather than through the accept context so that a failed one is logged with its peer.
 * Over TLS, h2o's socket reads decrypt into the same input buffer and its writes encrypt into a
 * buffer of its own before the one uv_write, so the read watch and the refused-write repair work
 * unchanged, with two differences handled where they arise: a TLS record may decrypt to nothing
 * (on_watch_read) and closing a TLS socket would write (pd_http_server_new: quiet shutdown).
 * Our own limits (431 for too many header bytes, 429 per client address) are checked in on_req
 * before the route's handler runs.
 */
#include "common/base/http_server.h"

#include "common/base/alloc.h"
#include "common/api.h"
#include "common/base/ct.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <arpa/inet.h>
#include <h2o.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

enum srv_state { SRV_INIT, SRV_LISTENING, SRV_DRAINING, SRV_DISPOSING, SRV_CLOSED };

struct route {
    char *method;
    char *path;
    unsigned flags;
    pd_http_handler_fn fn;
    void *ud;
};

struct conn {
    uv_tcp_t tcp; /* first: h2o's close callback gets this handle */
    struct pd_http_server *srv;
    h2o_socket_t *sock;
    h2o_timeout_entry_t dead_write;  /* in ctx.zero_timeout: see conn_send_done */
    h2o_timeout_entry_t handshake;   /* TLS: in ctx.handshake_timeout until the handshake ends */
    char peer[INET6_ADDRSTRLEN + 8]; /* TLS: "ADDR:PORT", for the handshake's log lines */
    struct conn *prev, *next;
};

struct buf {
    char *p;
    size_t len, cap;
};

/* A chunk in h2o's request pool whose destructor tells us h2o let the request go. */
struct req_link {
    struct pd_http_req *rec;
};

struct pd_http_req {
    struct pd_http_server *srv;
    h2o_req_t *hreq; /* NULL once h2o is done with the request (or we sent the final bytes) */
    h2o_generator_t gen;
    struct req_link *link;
    struct conn *conn;
    struct pd_http_req *prev, *next;
    char method[16];
    char *path; /* heap: path '\0' query '\0' */
    const char *query;
    char *body; /* heap, NUL-terminated */
    size_t body_len;

    pd_http_gone_fn on_gone;
    void *gone_ud;
    pd_http_drain_fn on_drain; /* armed by pd_http_stream_on_drain */
    void *drain_ud;
    size_t drain_below; /* bytes */

    bool started;   /* h2o_start_response called */
    bool streaming; /* pd_http_stream_start (SSE or raw) */
    bool in_flight; /* an IN_PROGRESS h2o_send awaits proceed */
    bool finishing; /* the final bytes are queued */
    bool watching;  /* our read watch is on the socket */
    bool gone;
    bool user_done; /* the daemon let go */
    int in_call;    /* our frames on the stack that use this record */
    struct buf pending, sending;

    bool per_client;        /* counts against max_requests_per_client while not user_done/gone */
    unsigned char peer[16]; /* per_client: the client's IP address (IPv4 as ::ffff:a.b.c.d) */
};

struct pd_http_server {
    uv_loop_t *loop;
    h2o_globalconf_t globalconf;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx; /* without ssl_ctx: TLS handshakes are ours (on_accept) */
    SSL_CTX *ssl_ctx;            /* NULL: plain HTTP; one reference of ours */
    bool ctx_inited;
    uv_tcp_t listener;
    uv_timer_t timer; /* shutdown deadline, then the deferred final close */
    enum srv_state state;
    char *host;
    int port;
    size_t max_body;
    size_t max_header;  /* bytes */
    int max_per_client; /* 0: unlimited */
    size_t max_backlog;
    size_t backlog_peak; /* bytes */
    uint64_t n_slow_cut;
    char *api_key;
    struct route *routes;
    size_t n_routes, cap_routes;
    struct pd_http_req *reqs;
    size_t n_reqs;
    struct conn *conns;
    size_t n_conns;
    pd_http_closed_fn closed_cb;
    void *closed_ud;
};

struct main_handler {
    h2o_handler_t super;
    struct pd_http_server *srv;
};

struct error_filter {
    h2o_filter_t super;
    struct pd_http_server *srv;
};

struct error_ostream {
    h2o_ostream_t super;
    h2o_iovec_t json;
    bool sent;
};

static void req_finish_h2o(struct pd_http_req *r);
static void req_handle_gone(struct pd_http_req *r);
static void srv_check_drained(struct pd_http_server *s);

static const char *status_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 400 ? "OK" : "Error";
    }
}

/* ---------------------------------------------------------------- request records */

static int buf_append(struct buf *b, const char *p, size_t n) {
    if (pd_array_grow((void **)&b->p, &b->cap, b->len + n, 1) != PD_OK)
        return PD_ENOMEM;
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return PD_OK;
}

static void conn_cut_if_idle(struct conn *c);

static void req_maybe_free(struct pd_http_req *r) {
    if (r->hreq || !r->user_done || r->in_call)
        return;
    struct pd_http_server *s = r->srv;
    if (r->link)
        r->link->rec = NULL;
    if (r->prev)
        r->prev->next = r->next;
    else
        s->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    s->n_reqs--;
    struct conn *c = r->conn;
    pd_free(r->pending.p);
    pd_free(r->sending.p);
    pd_free(r->path);
    pd_free(r->body);
    pd_free(r);
    if (s->state == SRV_DRAINING && c)
        conn_cut_if_idle(c);
}

/* h2o no longer knows the request: forget every h2o pointer. */
static void req_detach_h2o(struct pd_http_req *r) {
    if (r->link)
        r->link->rec = NULL;
    r->link = NULL;
    r->hreq = NULL;
    r->in_flight = false;
    r->watching = false;
}

static void on_link_dispose(void *p) {
    struct req_link *link = p;
    struct pd_http_req *r = link->rec;
    if (!r)
        return;
    r->in_call++;
    req_detach_h2o(r);
    req_handle_gone(r);
    r->in_call--;
    req_maybe_free(r);
}

static void gen_stop(h2o_generator_t *g, h2o_req_t *hreq) {
    struct pd_http_req *r = container_of(g, struct pd_http_req, gen);
    (void)hreq;
    r->in_call++;
    req_detach_h2o(r);
    req_handle_gone(r);
    r->in_call--;
    req_maybe_free(r);
}

static void watch_stop(struct pd_http_req *r) {
    if (r->watching && r->conn && r->conn->sock)
        h2o_socket_read_stop(r->conn->sock);
    r->watching = false;
}

/* A read that fails (our watch seeing a client's reset: ECONNRESET) makes libuv mark the stream
 * unwritable, and from then on uv_write fails at once without ever calling back. h2o 2.2 ignores
 * uv_write's result and waits for that callback: the connection would never close, and a
 * draining server never finish (a router hung at SIGTERM after a client reset a stream, under
 * load, when no write was in flight at the reset). So around each h2o_send of ours: if the stream
 * was already unwritable and h2o started a write, that write was refused, and it is completed
 * here with an error from the next loop iteration, as libuv would have done; h2o then closes the
 * connection. Over TLS, h2o's own completion would also drop the encrypted copy of what it wrote;
 * calling the callback directly leaves that copy to be freed with the socket, which the callback
 * closes (HTTP/1 closes a connection whose write failed). A write the callback starts on the
 * still unwritable stream is refused in turn and completed the same way, one iteration later. */
static bool conn_unwritable(const struct conn *c) {
    return c && !uv_is_writable((const uv_stream_t *)&c->tcp);
}

static void conn_send_done(struct conn *c, bool was_unwritable);

static void on_dead_write(h2o_timeout_entry_t *e) {
    struct conn *c = container_of(e, struct conn, dead_write);
    if (!c->sock || uv_is_closing((uv_handle_t *)&c->tcp) || !c->sock->_cb.write)
        return;
    h2o_socket_cb cb = c->sock->_cb.write;
    c->sock->_cb.write = NULL;
    pd_debug("http: completing a write refused on a reset connection");
    cb(c->sock, h2o_socket_error_io);
    conn_send_done(c, true);
}

static void conn_send_done(struct conn *c, bool was_unwritable) {
    if (!was_unwritable || !c->sock || uv_is_closing((uv_handle_t *)&c->tcp) ||
        !c->sock->_cb.write || h2o_timeout_is_linked(&c->dead_write))
        return;
    h2o_timeout_link(c->srv->loop, &c->srv->ctx.zero_timeout, &c->dead_write);
}

/* Sends what is queued: the final bytes (copied into h2o's pool, which outlives the write) when
 * finishing, else the pending events as one IN_PROGRESS write. */
static void req_flush(struct pd_http_req *r) {
    if (!r->hreq || r->in_flight || !r->started)
        return;
    h2o_req_t *hreq = r->hreq;
    if (r->finishing) {
        h2o_iovec_t v = h2o_iovec_init(NULL, 0);
        if (r->pending.len) {
            v.base = h2o_mem_alloc_pool(&hreq->pool, r->pending.len);
            memcpy(v.base, r->pending.p, r->pending.len);
            v.len = r->pending.len;
            r->pending.len = 0;
        }
        watch_stop(r);
        req_detach_h2o(r);
        struct conn *c = r->conn;
        bool dead = conn_unwritable(c);
        r->in_call++;
        h2o_send(hreq, v.len ? &v : NULL, v.len ? 1 : 0, H2O_SEND_STATE_FINAL);
        r->in_call--;
        if (c)
            conn_send_done(c, dead);
        return;
    }
    if (!r->pending.len)
        return;
    struct buf t = r->sending;
    r->sending = r->pending;
    r->pending = t;
    r->pending.len = 0;
    h2o_iovec_t v = h2o_iovec_init(r->sending.p, r->sending.len);
    r->in_flight = true;
    struct conn *c = r->conn;
    bool dead = conn_unwritable(c);
    r->in_call++;
    h2o_send(hreq, &v, 1, H2O_SEND_STATE_IN_PROGRESS);
    r->in_call--;
    if (c)
        conn_send_done(c, dead);
}

static size_t req_backlog(const struct pd_http_req *r) {
    return r->pending.len + r->sending.len;
}

static void gen_proceed(h2o_generator_t *g, h2o_req_t *hreq) {
    struct pd_http_req *r = container_of(g, struct pd_http_req, gen);
    (void)hreq;
    r->in_flight = false;
    r->sending.len = 0;
    r->in_call++;
    req_flush(r);
    if (r->on_drain && !r->user_done && !r->gone && req_backlog(r) <= r->drain_below) {
        pd_http_drain_fn fn = r->on_drain;
        r->on_drain = NULL;
        fn(r, r->drain_ud); /* may send, end or re-arm */
    }
    r->in_call--;
    req_maybe_free(r);
}

/* Ends h2o's side of a request the daemon will not complete normally. */
static void req_finish_h2o(struct pd_http_req *r) {
    if (!r->hreq)
        return;
    watch_stop(r);
    r->hreq->http1_is_persistent = 0;
    if (!r->started) {
        h2o_req_t *hreq = r->hreq;
        req_detach_h2o(r);
        struct conn *c = r->conn;
        bool dead = conn_unwritable(c);
        r->in_call++;
        h2o_send_error_generic(hreq, 499, status_reason(499), "client closed request",
                               H2O_SEND_ERROR_HTTP1_CLOSE_CONNECTION);
        r->in_call--;
        if (c)
            conn_send_done(c, dead);
        return;
    }
    r->finishing = true;
    r->pending.len = 0;
    req_flush(r); /* or at proceed */
}

/* Once per request: the client is gone (or the shutdown deadline passed). */
static void req_handle_gone(struct pd_http_req *r) {
    if (r->gone)
        return;
    r->gone = true;
    r->in_call++;
    if (!r->user_done && r->on_gone) {
        r->on_gone(r, r->gone_ud);
        r->user_done = true;
    }
    req_finish_h2o(r);
    r->in_call--;
}

static void on_watch_read(h2o_socket_t *sock, const char *err) {
    /* nothing new to read (over TLS, a record that decrypts to no data: the close_notify a client
     * sends before its FIN): keep watching, or the FIN that follows would go unseen */
    if (!err && sock->bytes_read == 0)
        return;
    /* h2o's HTTP/1 connection object (sock->data) begins with its h2o_conn_t */
    h2o_conn_t *hconn = sock->data;
    struct pd_http_server *s = container_of(hconn->ctx, struct pd_http_server, ctx);
    h2o_socket_read_stop(sock);
    for (struct pd_http_req *r = s->reqs; r; r = r->next) {
        if (!r->watching || !r->conn || r->conn->sock != sock)
            continue;
        r->watching = false;
        if (err) {
            pd_debug("http: %s %s: client disconnected (%s)", r->method, r->path, err);
            r->in_call++;
            req_handle_gone(r);
            r->in_call--;
            req_maybe_free(r);
        }
        /* bytes (a pipelined request) stay in sock->input for h2o; we stop watching */
        break;
    }
}

/* ---------------------------------------------------------------- responses */

static int req_check_open(struct pd_http_req *r, bool want_stream) {
    PD_ASSERT(!r->user_done);
    if (r->gone || !r->hreq)
        return pd_errorf(PD_ECANCELED, "%s %s: the client is gone", r->method, r->path);
    if (want_stream != r->streaming)
        return pd_errorf(PD_EINVAL, "%s %s: %s", r->method, r->path,
                         want_stream ? "the stream was not started"
                                     : "the response already started");
    return PD_OK;
}

/* h2o keeps the value's pointer until the headers are sent, so it is copied into the request's
 * pool: a caller's string (the router passes its upstream call's, freed when that call ends) may
 * be gone by then. */
static void add_content_type(h2o_req_t *hreq, const char *ct) {
    h2o_iovec_t v = h2o_strdup(&hreq->pool, ct, strlen(ct));
    h2o_set_header(&hreq->pool, &hreq->res.headers, H2O_TOKEN_CONTENT_TYPE, v.base, v.len, 1);
}

int pd_http_req_add_header(struct pd_http_req *r, const char *name, const char *value) {
    if (!r->hreq || r->started)
        return pd_errorf(PD_EINVAL, "header %s: the response already started", name);
    h2o_req_t *hreq = r->hreq;
    size_t nl = strlen(name), vl = strlen(value);
    char *n = h2o_mem_alloc_pool(&hreq->pool, nl + 1);
    char *v = h2o_mem_alloc_pool(&hreq->pool, vl + 1);
    memcpy(n, name, nl + 1);
    memcpy(v, value, vl + 1);
    h2o_strtolower(n, nl);
    h2o_add_header_by_str(&hreq->pool, &hreq->res.headers, n, nl, 1, NULL, v, vl);
    return PD_OK;
}

/* Finishing a request the client left: the daemon lets go, nothing is sent. */
static int req_release_gone(struct pd_http_req *r) {
    r->user_done = true;
    req_maybe_free(r);
    return pd_errorf(PD_ECANCELED, "the client is gone");
}

int pd_http_respond(struct pd_http_req *r, int status, const char *content_type, const char *body,
                    size_t len) {
    PD_ASSERT(!r->user_done && !r->started);
    if (r->gone || !r->hreq)
        return req_release_gone(r);
    watch_stop(r);
    h2o_req_t *hreq = r->hreq;
    hreq->res.status = status;
    hreq->res.reason = status_reason(status);
    hreq->res.content_length = len;
    add_content_type(hreq, content_type ? content_type : "application/json");
    h2o_iovec_t v = h2o_iovec_init(h2o_mem_alloc_pool(&hreq->pool, len ? len : 1), len);
    if (len)
        memcpy(v.base, body, len);
    static h2o_generator_t oneshot = {NULL, NULL};
    r->started = true;
    r->user_done = true;
    req_detach_h2o(r);
    struct conn *c = r->conn;
    bool dead = conn_unwritable(c);
    r->in_call++;
    h2o_start_response(hreq, &oneshot);
    if (h2o_memis(hreq->input.method.base, hreq->input.method.len, H2O_STRLIT("HEAD")))
        h2o_send(hreq, NULL, 0, H2O_SEND_STATE_FINAL);
    else
        h2o_send(hreq, &v, 1, H2O_SEND_STATE_FINAL);
    r->in_call--;
    if (c)
        conn_send_done(c, dead);
    req_maybe_free(r);
    return PD_OK;
}

int pd_http_respond_json(struct pd_http_req *r, int status, const char *json) {
    return pd_http_respond(r, status, "application/json", json, strlen(json));
}

int pd_http_respond_error(struct pd_http_req *r, const struct pd_api_error *e) {
    char *json = NULL;
    int rc = pd_api_error_render(e, &json);
    if (rc) {
        static const char fallback[] = "{\"error\":{\"message\":\"out of memory\","
                                       "\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        return pd_http_respond(r, 500, NULL, fallback, sizeof(fallback) - 1);
    }
    rc = pd_http_respond(r, e->status ? e->status : 500, NULL, json, strlen(json));
    pd_free(json);
    return rc;
}

int pd_http_stream_start(struct pd_http_req *r, int status, const char *content_type) {
    PD_ASSERT(!r->user_done && !r->started);
    if (r->gone || !r->hreq)
        return pd_errorf(PD_ECANCELED, "%s %s: the client is gone", r->method, r->path);
    h2o_req_t *hreq = r->hreq;
    hreq->res.status = status;
    hreq->res.reason = status_reason(status);
    hreq->res.content_length = SIZE_MAX; /* chunked */
    add_content_type(hreq, content_type ? content_type : "application/octet-stream");
    h2o_set_header(&hreq->pool, &hreq->res.headers, H2O_TOKEN_CACHE_CONTROL, H2O_STRLIT("no-cache"),
                   1);
    r->gen.proceed = gen_proceed;
    r->gen.stop = gen_stop;
    r->started = true;
    r->streaming = true;
    struct conn *c = r->conn;
    bool dead = conn_unwritable(c);
    r->in_call++;
    h2o_start_response(hreq, &r->gen);
    /* an empty write puts the headers on the wire now */
    r->in_flight = true;
    h2o_send(hreq, NULL, 0, H2O_SEND_STATE_IN_PROGRESS);
    r->in_call--;
    if (c)
        conn_send_done(c, dead);
    return PD_OK;
}

int pd_http_sse_start(struct pd_http_req *r) {
    return pd_http_stream_start(r, 200, "text/event-stream");
}

/* After bytes were queued: drop a client that let too much pile up, else write. */
static int stream_queued(struct pd_http_req *r) {
    size_t backlog = req_backlog(r);
    if (backlog > r->srv->backlog_peak)
        r->srv->backlog_peak = backlog;
    if (backlog > r->srv->max_backlog) {
        pd_warn("http: %s %s: client reads too slowly (%zu bytes queued); dropping it", r->method,
                r->path, backlog);
        r->srv->n_slow_cut++;
        r->in_call++;
        req_handle_gone(r);
        r->in_call--;
        req_maybe_free(r);
        return pd_errorf(PD_ECANCELED, "the client is too slow");
    }
    r->in_call++;
    req_flush(r);
    r->in_call--;
    return PD_OK;
}

int pd_http_stream_send(struct pd_http_req *r, const void *data, size_t len) {
    int rc = req_check_open(r, true);
    if (rc)
        return rc;
    if (len && buf_append(&r->pending, data, len))
        return pd_errorf(PD_ENOMEM, "queuing %zu stream bytes", len);
    return stream_queued(r);
}

int pd_http_stream_end(struct pd_http_req *r) {
    PD_ASSERT(!r->user_done && r->streaming);
    if (r->gone || !r->hreq)
        return req_release_gone(r);
    r->user_done = true;
    r->finishing = true;
    r->on_drain = NULL;
    r->in_call++;
    req_flush(r);
    r->in_call--;
    req_maybe_free(r);
    return PD_OK;
}

size_t pd_http_stream_backlog(const struct pd_http_req *r) {
    return r->streaming ? req_backlog(r) : 0;
}

int pd_http_stream_on_drain(struct pd_http_req *r, size_t below_bytes, pd_http_drain_fn fn,
                            void *user) {
    PD_ASSERT(!r->user_done && r->streaming);
    if (r->gone || !r->hreq)
        return PD_ECANCELED;
    if (req_backlog(r) <= below_bytes) {
        r->on_drain = NULL;
        return PD_OK;
    }
    r->on_drain = fn;
    r->drain_ud = user;
    r->drain_below = below_bytes;
    return PD_EAGAIN; /* a write is queued or in flight: its completion checks again */
}

static int sse_queue(struct pd_http_req *r, const char *data, size_t len) {
    const char *p = data, *end = data + len;
    do {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (buf_append(&r->pending, "data: ", 6) || buf_append(&r->pending, p, (size_t)(le - p)) ||
            buf_append(&r->pending, "\n", 1))
            return pd_errorf(PD_ENOMEM, "queuing a stream event");
        p = nl ? nl + 1 : end;
    } while (p < end);
    if (buf_append(&r->pending, "\n", 1))
        return pd_errorf(PD_ENOMEM, "queuing a stream event");
    return PD_OK;
}

int pd_http_sse_send(struct pd_http_req *r, const char *data, size_t len) {
    int rc = req_check_open(r, true);
    if (rc)
        return rc;
    if ((rc = sse_queue(r, data, len)))
        return rc;
    return stream_queued(r);
}

int pd_http_sse_end(struct pd_http_req *r) {
    PD_ASSERT(!r->user_done && r->streaming);
    if (r->gone || !r->hreq)
        return req_release_gone(r);
    int rc = sse_queue(r, "[DONE]", 6);
    int rc_end = pd_http_stream_end(r);
    return rc ? rc : rc_end;
}

int pd_http_sse_fail(struct pd_http_req *r, const struct pd_api_error *e) {
    PD_ASSERT(!r->user_done && r->streaming);
    if (r->gone || !r->hreq)
        return req_release_gone(r);
    char *json = NULL;
    if (pd_api_error_render(e, &json) == PD_OK) {
        sse_queue(r, json, strlen(json));
        pd_free(json);
    }
    return pd_http_sse_end(r);
}

/* ---------------------------------------------------------------- accessors */

const char *pd_http_req_method(const struct pd_http_req *r) {
    return r->method;
}

const char *pd_http_req_path(const struct pd_http_req *r) {
    return r->path;
}

const char *pd_http_req_query(const struct pd_http_req *r) {
    return r->query;
}

const char *pd_http_req_body(const struct pd_http_req *r, size_t *len) {
    if (len)
        *len = r->body_len;
    return r->body;
}

const char *pd_http_req_header(const struct pd_http_req *r, const char *name, size_t *len) {
    if (!r->hreq)
        return NULL;
    ssize_t i = h2o_find_header_by_str(&r->hreq->headers, name, strlen(name), -1);
    if (i < 0)
        return NULL;
    if (len)
        *len = r->hreq->headers.entries[i].value.len;
    return r->hreq->headers.entries[i].value.base;
}

bool pd_http_req_gone(const struct pd_http_req *r) {
    return r->gone;
}

void pd_http_req_on_gone(struct pd_http_req *r, pd_http_gone_fn fn, void *user) {
    r->on_gone = fn;
    r->gone_ud = user;
}

size_t pd_http_server_inflight(const struct pd_http_server *s) {
    size_t n = 0;
    for (const struct pd_http_req *r = s->reqs; r; r = r->next)
        n += !r->user_done;
    return n;
}

void pd_http_server_stats(const struct pd_http_server *s, struct pd_http_server_stats *out) {
    *out = (struct pd_http_server_stats){.stream_backlog_peak = s->backlog_peak,
                                         .slow_clients_cut = s->n_slow_cut,
                                         .connections = s->n_conns};
    for (const struct pd_http_req *r = s->reqs; r; r = r->next) {
        out->inflight += !r->user_done;
        out->stream_backlog += req_backlog(r);
    }
}

/* ---------------------------------------------------------------- dispatch */

static void rebase_iov(h2o_mem_pool_t *pool, const char *lo, const char *hi, h2o_iovec_t *v) {
    if (v->base && v->base >= lo && v->base < hi)
        *v = h2o_strdup(pool, v->base, v->len);
}

/* Copies into the request's pool every string of hreq that still points into the socket's
 * input buffer (see the top comment), so that our read watch may grow that buffer. */
static void rebase_request(h2o_req_t *hreq, const h2o_buffer_t *in) {
    const char *lo = in->bytes, *hi = in->bytes + in->size;
    h2o_mem_pool_t *pool = &hreq->pool;
    rebase_iov(pool, lo, hi, &hreq->input.authority);
    rebase_iov(pool, lo, hi, &hreq->input.method);
    rebase_iov(pool, lo, hi, &hreq->input.path);
    rebase_iov(pool, lo, hi, &hreq->authority);
    rebase_iov(pool, lo, hi, &hreq->method);
    rebase_iov(pool, lo, hi, &hreq->path);
    rebase_iov(pool, lo, hi, &hreq->path_normalized);
    rebase_iov(pool, lo, hi, &hreq->upgrade);
    for (size_t i = 0; i < hreq->headers.size; i++) {
        h2o_header_t *h = &hreq->headers.entries[i];
        if (!h2o_iovec_is_token(h->name))
            rebase_iov(pool, lo, hi, h->name); /* the name's iovec itself lives in the pool */
        if (h->orig_name && h->orig_name >= lo && h->orig_name < hi)
            h->orig_name = h2o_strdup(pool, h->orig_name, h->name->len).base;
        rebase_iov(pool, lo, hi, &h->value);
    }
    /* hreq->entity may dangle after a move: h2o is done with it and ours is r->body */
}

static bool auth_ok(struct pd_http_server *s, h2o_req_t *hreq) {
    ssize_t i = h2o_find_header(&hreq->headers, H2O_TOKEN_AUTHORIZATION, -1);
    if (i < 0)
        return false;
    h2o_iovec_t v = hreq->headers.entries[i].value;
    if (v.len < 7 || strncasecmp(v.base, "Bearer ", 7) != 0)
        return false;
    return pd_ct_equal(v.base + 7, v.len - 7, s->api_key, strlen(s->api_key));
}

static void respond_status(struct pd_http_req *r, int status, const char *code,
                           const char *message) {
    struct pd_api_error e;
    pd_api_error_set(&e, status, "invalid_request_error", NULL, code, "%s", message);
    pd_http_respond_error(r, &e);
}

/* ---------------------------------------------------------------- limits */

/* The request line and headers as they came on the wire (HTTP/1: h2o keeps Host apart). */
static size_t header_bytes(const h2o_req_t *hreq) {
    size_t n = hreq->method.len + 1 + hreq->path.len + sizeof(" HTTP/1.1\r\n") - 1;
    n += sizeof("host: \r\n") - 1 + hreq->authority.len;
    for (size_t i = 0; i < hreq->headers.size; i++)
        n += hreq->headers.entries[i].name->len + 2 + hreq->headers.entries[i].value.len + 2;
    return n + 2;
}

/* The client's address into r->peer (IPv4 as IPv4-mapped IPv6); false when unknown. */
static bool peer_of(h2o_req_t *hreq, struct pd_http_req *r) {
    struct sockaddr_storage sa;
    if (!hreq->conn->callbacks->get_peername ||
        !hreq->conn->callbacks->get_peername(hreq->conn, (struct sockaddr *)&sa))
        return false;
    if (sa.ss_family == AF_INET) {
        memset(r->peer, 0, 10);
        r->peer[10] = r->peer[11] = 0xff;
        memcpy(r->peer + 12, &((struct sockaddr_in *)&sa)->sin_addr, 4);
        return true;
    }
    if (sa.ss_family == AF_INET6) {
        memcpy(r->peer, &((struct sockaddr_in6 *)&sa)->sin6_addr, 16);
        return true;
    }
    return false;
}

/* max_requests_per_client: admits r (it counts from now on while open) or answers 429. The
 * count is a walk over the open requests, only when the limit is set. */
static bool client_admit(struct pd_http_server *s, struct pd_http_req *r, h2o_req_t *hreq) {
    if (!peer_of(hreq, r))
        return true; /* not a TCP peer (nothing to key on) */
    int open = 0;
    for (const struct pd_http_req *o = s->reqs; o; o = o->next)
        open += o->per_client && !o->user_done && !o->gone && memcmp(o->peer, r->peer, 16) == 0;
    if (open < s->max_per_client) {
        r->per_client = true;
        return true;
    }
    char addr[INET6_ADDRSTRLEN] = "?";
    static const unsigned char v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    bool is_v4 = memcmp(r->peer, v4, 12) == 0;
    inet_ntop(is_v4 ? AF_INET : AF_INET6, is_v4 ? r->peer + 12 : r->peer, addr, sizeof(addr));
    pd_debug("http: %s %s from %s: 429, %d requests in flight", r->method, r->path, addr, open);
    struct pd_api_error e;
    pd_api_error_set(&e, 429, "rate_limit_error", NULL, "rate_limit_exceeded",
                     "Too many concurrent requests from %s: %d in flight, the limit is %d per "
                     "client address (" PD_HTTP_PER_CLIENT_FLAG "). Retry once one has finished.",
                     addr, open, s->max_per_client);
    pd_http_req_add_header(r, "retry-after", "1");
    pd_http_respond_error(r, &e);
    return false;
}

static int on_req(h2o_handler_t *self, h2o_req_t *hreq) {
    struct pd_http_server *s = ((struct main_handler *)self)->srv;
    struct pd_http_req *r = pd_calloc(1, sizeof(*r));
    size_t plen = hreq->path.len;
    if (!r || !(r->path = pd_malloc(plen + 2)) ||
        !(r->body = pd_malloc(hreq->entity.base ? hreq->entity.len + 1 : 1))) {
        if (r) {
            pd_free(r->path);
            pd_free(r);
        }
        h2o_send_error_503(hreq, "Service Unavailable", "out of memory",
                           H2O_SEND_ERROR_HTTP1_CLOSE_CONNECTION);
        return 0;
    }
    r->srv = s;
    r->hreq = hreq;
    snprintf(r->method, sizeof(r->method), "%.*s", (int)hreq->method.len, hreq->method.base);
    memcpy(r->path, hreq->path.base, plen);
    r->path[plen] = '\0';
    r->path[plen + 1] = '\0';
    char *q = memchr(r->path, '?', plen);
    if (q) {
        *q = '\0';
        r->query = q + 1;
    } else {
        r->query = r->path + plen + 1;
    }
    if (hreq->entity.base) {
        memcpy(r->body, hreq->entity.base, hreq->entity.len);
        r->body_len = hreq->entity.len;
    }
    r->body[r->body_len] = '\0';
    r->link = h2o_mem_alloc_shared(&hreq->pool, sizeof(*r->link), on_link_dispose);
    r->link->rec = r;
    h2o_socket_t *sock =
        hreq->conn->callbacks->get_socket ? hreq->conn->callbacks->get_socket(hreq->conn) : NULL;
    for (struct conn *c = s->conns; sock && c; c = c->next)
        if (c->sock == sock)
            r->conn = c;
    r->next = s->reqs;
    if (s->reqs)
        s->reqs->prev = r;
    s->reqs = r;
    s->n_reqs++;

    r->in_call++;
    const struct route *rt = NULL;
    bool path_known = false;
    for (size_t i = 0; i < s->n_routes; i++) {
        if (strcmp(s->routes[i].path, r->path) != 0)
            continue;
        path_known = true;
        if (strcmp(s->routes[i].method, r->method) == 0) {
            rt = &s->routes[i];
            break;
        }
    }
    size_t hbytes = header_bytes(hreq);
    if (hbytes > s->max_header) {
        struct pd_api_error e;
        pd_api_error_set(&e, 431, "invalid_request_error", NULL, "request_header_fields_too_large",
                         "Request header fields too large: the request line and headers are %zu "
                         "bytes, more than the limit of %zu bytes.",
                         hbytes, s->max_header);
        pd_http_respond_error(r, &e);
    } else if (!rt) {
        char msg[300];
        if (path_known)
            snprintf(msg, sizeof(msg), "%s is not allowed on %.200s", r->method, r->path);
        else
            snprintf(msg, sizeof(msg), "%.200s: no such endpoint", r->path);
        respond_status(r, path_known ? 405 : 404, path_known ? "method_not_allowed" : "not_found",
                       msg);
    } else if (s->api_key && !(rt->flags & PD_HTTP_PUBLIC) && !auth_ok(s, hreq)) {
        respond_status(r, 401, "invalid_api_key",
                       "Incorrect or missing API key: send 'Authorization: Bearer <key>'.");
    } else if ((rt->flags & PD_HTTP_PER_CLIENT) && s->max_per_client > 0 &&
               !client_admit(s, r, hreq)) {
        /* answered 429 */
    } else {
        rt->fn(r, rt->ud);
        /* still open: watch the socket for the client leaving (see the top comment) */
        /* (HTTP/1 only: an HTTP/2 socket carries other streams and h2o keeps reading it) */
        if (r->hreq && !r->user_done && !r->gone && hreq->version < 0x200 && r->conn &&
            r->conn->sock) {
            rebase_request(hreq, r->conn->sock->input);
            r->watching = true;
            h2o_socket_read_start(r->conn->sock, on_watch_read);
        }
    }
    r->in_call--;
    req_maybe_free(r);
    return 0;
}

/* h2o's own early errors (413 body too large, 400 broken framing) as OpenAI error JSON. */
static void error_ostream_send(h2o_ostream_t *self, h2o_req_t *hreq, h2o_iovec_t *bufs,
                               size_t bufcnt, h2o_send_state_t state) {
    struct error_ostream *o = (struct error_ostream *)self;
    (void)bufs;
    (void)bufcnt;
    if (o->sent) {
        h2o_ostream_send_next(self, hreq, NULL, 0, state);
        return;
    }
    o->sent = true;
    h2o_ostream_send_next(self, hreq, &o->json, 1, state);
}

static void error_filter_setup(h2o_filter_t *self, h2o_req_t *hreq, h2o_ostream_t **slot) {
    struct pd_http_server *s = ((struct error_filter *)self)->srv;
    if (hreq->res.status >= 400) {
        struct pd_api_error e;
        /* (h2o keeps Content-Length out of hreq->headers: the body's size is not known here) */
        if (hreq->res.status == 413)
            pd_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                             "The request body is larger than the limit of %zu bytes.",
                             s->max_body);
        else
            pd_api_error_set(&e, hreq->res.status, "invalid_request_error", NULL, NULL,
                             "Malformed HTTP request (%s).",
                             hreq->res.reason ? hreq->res.reason : "error");
        char *json = NULL;
        if (pd_api_error_render(&e, &json) == PD_OK) {
            struct error_ostream *o =
                (struct error_ostream *)h2o_add_ostream(hreq, sizeof(*o), slot);
            o->json = h2o_strdup(&hreq->pool, json, strlen(json));
            o->sent = false;
            o->super.do_send = error_ostream_send;
            pd_free(json);
            hreq->res.content_length = o->json.len;
            add_content_type(hreq, "application/json");
            slot = &o->super.next;
        }
    }
    h2o_setup_next_ostream(hreq, slot);
}

/* ---------------------------------------------------------------- connections */

static void on_conn_closed(uv_handle_t *h) {
    struct conn *c = (struct conn *)h;
    struct pd_http_server *s = c->srv;
    for (struct pd_http_req *r = s->reqs; r; r = r->next)
        if (r->conn == c) {
            r->conn = NULL;
            r->watching = false;
        }
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (h2o_timeout_is_linked(&c->dead_write))
        h2o_timeout_unlink(&c->dead_write);
    if (h2o_timeout_is_linked(&c->handshake))
        h2o_timeout_unlink(&c->handshake);
    s->n_conns--;
    pd_free(c);
    srv_check_drained(s);
}

/* "ADDR:PORT" of the connection's peer, "?:0" when unknown (read at accept: a peer that has
 * closed has no address any more). */
static void conn_peer(struct conn *c, char *buf, size_t n) {
    struct sockaddr_storage sa;
    int len = sizeof(sa);
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0) {
        if (sa.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
            uv_ip6_name(a, host, sizeof(host));
            port = ntohs(a->sin6_port);
        } else {
            struct sockaddr_in *a = (struct sockaddr_in *)&sa;
            uv_ip4_name(a, host, sizeof(host));
            port = ntohs(a->sin_port);
        }
    }
    snprintf(buf, n, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

static void on_handshake_timeout(h2o_timeout_entry_t *e) {
    struct conn *c = container_of(e, struct conn, handshake);
    pd_debug("http: TLS handshake with %s timed out", c->peer);
    h2o_socket_close(c->sock);
}

static void on_handshake(h2o_socket_t *sock, const char *err) {
    struct conn *c = sock->data;
    struct pd_http_server *s = c->srv;
    if (h2o_timeout_is_linked(&c->handshake))
        h2o_timeout_unlink(&c->handshake);
    if (!err) {
        /* without an ssl_ctx in the accept context, h2o's HTTP/1 takes the TLS socket as it is */
        h2o_accept(&s->accept_ctx, sock);
        return;
    }
    if (err == h2o_socket_error_io) { /* the peer left before finishing (a TCP probe) */
        pd_debug("http: TLS handshake with %s: the peer closed the connection", c->peer);
    } else {
        /* OpenSSL's reason is still queued from the failed SSL_accept */
        unsigned long e = ERR_peek_error();
        const char *why = e ? ERR_reason_error_string(e) : NULL;
        pd_warn("http: TLS handshake with %s failed: %s%s", c->peer, why ? why : err,
                e && ERR_GET_REASON(e) == SSL_R_HTTP_REQUEST
                    ? " (a plain HTTP request on this HTTPS port)"
                    : "");
    }
    ERR_clear_error();
    h2o_socket_close(sock);
}

static void on_accept(uv_stream_t *listener, int status) {
    struct pd_http_server *s = container_of((uv_tcp_t *)listener, struct pd_http_server, listener);
    if (status != 0 || s->state != SRV_LISTENING)
        return;
    struct conn *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return;
    uv_tcp_init(s->loop, &c->tcp);
    c->srv = s;
    c->dead_write.cb = on_dead_write;
    c->handshake.cb = on_handshake_timeout;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_closed);
    if (!s->ssl_ctx) {
        h2o_accept(&s->accept_ctx, c->sock);
        return;
    }
    conn_peer(c, c->peer, sizeof(c->peer));
    c->sock->data = c; /* until on_handshake hands the socket to h2o's HTTP/1 */
    h2o_timeout_link(s->loop, &s->ctx.handshake_timeout, &c->handshake);
    h2o_socket_ssl_handshake(c->sock, s->ssl_ctx, NULL, on_handshake);
}

/* EOF for h2o's reader: an idle keep-alive connection closes itself, cleanly. */
static void conn_cut(struct conn *c, int how) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        shutdown(fd, how);
}

static void conn_cut_if_idle(struct conn *c) {
    for (struct pd_http_req *r = c->srv->reqs; r; r = r->next)
        if (r->conn == c && !r->user_done)
            return;
    conn_cut(c, SHUT_RD);
}

/* ---------------------------------------------------------------- server */

int pd_http_server_new(uv_loop_t *loop, const struct pd_http_server_config *c,
                       struct pd_http_server **out) {
    *out = NULL;
    struct pd_http_server *s = pd_calloc(1, sizeof(*s));
    if (!s)
        return PD_ENOMEM;
    s->loop = loop;
    s->port = c->port;
    s->max_body = c->max_body_bytes ? c->max_body_bytes : PD_HTTP_DEFAULT_MAX_BODY;
    s->max_header = c->max_header_bytes ? c->max_header_bytes : PD_HTTP_DEFAULT_MAX_HEADER;
    s->max_per_client = c->max_requests_per_client;
    s->max_backlog = c->max_stream_backlog ? c->max_stream_backlog : (16u << 20);
    if (!(s->host = pd_strdup(c->host ? c->host : "127.0.0.1")))
        goto fail;
    if (c->api_key && c->api_key[0] && !(s->api_key = pd_strdup(c->api_key)))
        goto fail;
    if (c->ssl_ctx) {
        SSL_CTX_up_ref(c->ssl_ctx);
        s->ssl_ctx = c->ssl_ctx;
        /* Closing a TLS socket, h2o 2.2 writes a close_notify and waits for that write's
         * completion before it lets the socket go. On a connection libuv has marked unwritable (a
         * reset seen by a read) that write is refused and never completes: the connection would
         * never close, nor a draining server finish. Without the alert h2o closes at once, as
         * without TLS; HTTP/1.1 responses are framed, so a client still tells a cut answer. */
        SSL_CTX_set_quiet_shutdown(s->ssl_ctx, 1);
    }

    h2o_config_init(&s->globalconf);
    s->globalconf.max_request_entity_size = s->max_body;
    s->globalconf.server_name = h2o_iovec_init(H2O_STRLIT("pdserve"));
    s->globalconf.http1.upgrade_to_http2 = 0; /* HTTP/1.1 only: the read watch assumes it */
    h2o_hostconf_t *host =
        h2o_config_register_host(&s->globalconf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    struct main_handler *h = (struct main_handler *)h2o_create_handler(path, sizeof(*h));
    h->super.on_req = on_req;
    h->srv = s;
    struct error_filter *f =
        (struct error_filter *)h2o_create_filter(&host->fallback_path, sizeof(*f));
    f->super.on_setup_ostream = error_filter_setup;
    f->srv = s;
    *out = s;
    return PD_OK;
fail:
    pd_free(s->host);
    pd_free(s);
    return pd_errorf(PD_ENOMEM, "creating the HTTP server");
}

int pd_http_server_route(struct pd_http_server *s, const char *method, const char *path,
                         unsigned flags, pd_http_handler_fn fn, void *ud) {
    PD_ASSERT(s->state == SRV_INIT);
    if (pd_array_grow((void **)&s->routes, &s->cap_routes, s->n_routes + 1, sizeof(*s->routes)))
        return PD_ENOMEM;
    struct route *r = &s->routes[s->n_routes];
    r->method = pd_strdup(method);
    r->path = pd_strdup(path);
    if (!r->method || !r->path) {
        pd_free(r->method);
        pd_free(r->path);
        return PD_ENOMEM;
    }
    r->flags = flags;
    r->fn = fn;
    r->ud = ud;
    s->n_routes++;
    return PD_OK;
}

int pd_http_server_listen(struct pd_http_server *s) {
    PD_ASSERT(s->state == SRV_INIT);
    struct sockaddr_storage addr;
    int rc = strchr(s->host, ':') ? uv_ip6_addr(s->host, s->port, (struct sockaddr_in6 *)&addr)
                                  : uv_ip4_addr(s->host, s->port, (struct sockaddr_in *)&addr);
    if (rc)
        return pd_errorf(PD_EINVAL, "HTTP listen address %s:%d: %s", s->host, s->port,
                         uv_strerror(rc));
    h2o_context_init(&s->ctx, s->loop, &s->globalconf);
    s->ctx_inited = true;
    s->accept_ctx.ctx = &s->ctx;
    s->accept_ctx.hosts = s->globalconf.hosts;
    uv_timer_init(s->loop, &s->timer);
    uv_tcp_init(s->loop, &s->listener);
    s->state = SRV_LISTENING; /* from here on only shutdown releases the handles */
    if ((rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0)) ||
        (rc = uv_listen((uv_stream_t *)&s->listener, 511, on_accept)))
        return pd_errorf(PD_EIO, "HTTP listen on %s:%d: %s", s->host, s->port, uv_strerror(rc));
    struct sockaddr_storage bound;
    int len = sizeof(bound);
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &len) == 0)
        s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    pd_info("http: listening on %s:%d%s", s->host, s->port, s->ssl_ctx ? " (TLS)" : "");
    return PD_OK;
}

int pd_http_server_port(const struct pd_http_server *s) {
    return s->port;
}

static void on_timer_closed(uv_handle_t *h) {
    struct pd_http_server *s = container_of((uv_timer_t *)h, struct pd_http_server, timer);
    s->state = SRV_CLOSED;
    pd_info("http: closed");
    if (s->closed_cb)
        s->closed_cb(s, s->closed_ud);
}

/* A loop iteration after h2o_context_dispose, whose handles' close callbacks have run by now. */
static void on_final(uv_timer_t *t) {
    uv_close((uv_handle_t *)t, on_timer_closed);
}

static void srv_check_drained(struct pd_http_server *s) {
    if (s->state != SRV_DRAINING || s->n_conns > 0)
        return;
    s->state = SRV_DISPOSING;
    uv_timer_stop(&s->timer);
    /* h2o_context_request_shutdown armed HTTP/2's one-second GOAWAY resend; when the last
     * connection closes sooner, dispose would assert on that linked entry */
    if (h2o_timeout_is_linked(&s->ctx.http2._graceful_shutdown_timeout))
        h2o_timeout_unlink(&s->ctx.http2._graceful_shutdown_timeout);
    h2o_context_dispose(&s->ctx);
    s->ctx_inited = false;
    uv_timer_start(&s->timer, on_final, 0, 0);
}

static void on_deadline(uv_timer_t *t) {
    struct pd_http_server *s = container_of(t, struct pd_http_server, timer);
    pd_warn("http: shutdown timeout: cutting %zu open requests, %zu connections",
            pd_http_server_inflight(s), s->n_conns);
    for (struct pd_http_req *r = s->reqs, *next; r; r = next) {
        next = r->next;
        r->in_call++;
        req_handle_gone(r);
        r->in_call--;
        next = r->next; /* r itself may go now; read its successor first */
        req_maybe_free(r);
    }
    for (struct conn *c = s->conns; c; c = c->next)
        conn_cut(c, SHUT_RDWR);
}

void pd_http_server_shutdown(struct pd_http_server *s, uint64_t timeout_ms, pd_http_closed_fn cb,
                             void *ud) {
    PD_ASSERT(s->state == SRV_LISTENING);
    s->closed_cb = cb;
    s->closed_ud = ud;
    s->state = SRV_DRAINING;
    pd_info("http: shutting down: %zu open requests, waiting up to %llu ms",
            pd_http_server_inflight(s), (unsigned long long)timeout_ms);
    uv_close((uv_handle_t *)&s->listener, NULL);
    h2o_context_request_shutdown(&s->ctx);
    for (struct conn *c = s->conns; c; c = c->next)
        conn_cut_if_idle(c);
    uv_timer_start(&s->timer, on_deadline, timeout_ms, 0);
    srv_check_drained(s);
}

void pd_http_server_free(struct pd_http_server *s) {
    if (!s)
        return;
    PD_ASSERT(s->state == SRV_INIT || s->state == SRV_CLOSED);
    PD_ASSERT(s->reqs == NULL || s->state == SRV_INIT);
    h2o_config_dispose(&s->globalconf);
    for (size_t i = 0; i < s->n_routes; i++) {
        pd_free(s->routes[i].method);
        pd_free(s->routes[i].path);
    }
    pd_free(s->routes);
    pd_free(s->api_key);
    pd_free(s->host);
    SSL_CTX_free(s->ssl_ctx);
    pd_free(s);
}
