/*
 * front.c — the router's h2o server (see front.h).
 *
 * Lifetimes: a pd_front_req starts with two references, one for h2o (dropped when the h2o
 * request's memory pool is disposed: a shared object linked to that pool has a destructor) and
 * one for the router (dropped at its finish). Nothing touches the h2o request after the pool's
 * disposal or after h2o stopped the generator (client gone). A stream has at most one h2o_send in
 * flight; data arriving meanwhile waits in `pending` and goes out on proceed. Buffers handed to
 * h2o are freed only with the request, since h2o may still be writing the final one.
 * Accepted sockets are malloc'd (struct conn) and released by h2o's close callback.
 * h2o 2.2 does not read from an HTTP/1 connection while a request on it is being handled, so a
 * client that leaves before the answer starts would go unnoticed until the upstream answers; a
 * 200 ms timer therefore peeks (MSG_PEEK) at the sockets of requests still waiting for their
 * answer and treats EOF as "client gone". The answer is still handed to h2o afterwards, which
 * fails to write it and closes the connection: that is how h2o releases it.
 */
#include "router/front.h"

#include "common/alloc.h"
#include "common/log.h"
#include "common/status.h"

#include <errno.h>
#include <h2o.h>
#include <netdb.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>

/* An accepted connection; `tcp` first: h2o's close callback gets &tcp. */
struct conn {
    uv_tcp_t tcp;
    h2o_socket_t *sock;
    struct pd_front *f;
    struct conn *prev, *next;
};

struct pd_front {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t peek_timer;
    struct conn *conns;           /* open connections */
    struct pd_front_req *waiting; /* requests whose answer has not started */
    bool listening;
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    pd_front_request_cb on_request;
    void *ud;
    int port;
};

struct front_handler {
    h2o_handler_t super;
    struct pd_front *f;
};

struct bytes {
    char *p;
    size_t len, cap;
};

struct pd_front_req {
    h2o_generator_t gen;
    struct pd_front *f;
    struct pd_front_req *wprev, *wnext; /* in f->waiting while `in_waiting` */
    bool in_waiting;
    h2o_req_t *req; /* NULL once h2o disposed it */
    int refs;
    bool finished;   /* the router's finish happened */
    bool gone;       /* client left before the finish */
    bool stopped;    /* h2o stopped the generator: no more h2o_send */
    bool sending;    /* an h2o_send is in flight */
    bool end_queued; /* finish requested for the stream */
    char *method, *path, *auth, *body;
    size_t body_len;
    struct bytes pending;   /* waiting for proceed */
    struct bytes *inflight; /* given to h2o; freed with the request */
    size_t n_inflight;
    void (*gone_cb)(void *ud);
    void *gone_ud;
};

struct dispose_hook {
    struct pd_front_req *r;
};

static void waiting_remove(struct pd_front_req *r) {
    if (!r->in_waiting)
        return;
    r->in_waiting = false;
    if (r->wprev)
        r->wprev->wnext = r->wnext;
    else
        r->f->waiting = r->wnext;
    if (r->wnext)
        r->wnext->wprev = r->wprev;
    r->wprev = r->wnext = NULL;
}

static void req_release(struct pd_front_req *r) {
    if (--r->refs > 0)
        return;
    for (size_t i = 0; i < r->n_inflight; i++)
        pd_free(r->inflight[i].p);
    pd_free(r->inflight);
    pd_free(r->pending.p);
    pd_free(r->method);
    pd_free(r->path);
    pd_free(r->auth);
    pd_free(r->body);
    pd_free(r);
}

static void mark_gone(struct pd_front_req *r) {
    if (r->finished || r->gone)
        return;
    r->gone = true;
    if (r->gone_cb)
        r->gone_cb(r->gone_ud);
}

static void on_req_disposed(void *p) {
    struct pd_front_req *r = ((struct dispose_hook *)p)->r;
    r->req = NULL;
    waiting_remove(r);
    mark_gone(r);
    req_release(r);
}

static const char *reason_phrase(int status) {
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
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 400 ? "OK" : "Error";
    }
}

/* Also after the client left: h2o must see the answer fail to release the connection. */
static bool can_send(const struct pd_front_req *r) {
    return r->req && !r->stopped;
}

static void set_head(struct pd_front_req *r, int status, const char *content_type) {
    h2o_req_t *req = r->req;
    req->res.status = status;
    req->res.reason = reason_phrase(status);
    if (content_type && *content_type)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                       strlen(content_type));
}

void pd_front_respond(struct pd_front_req *r, int status, const char *content_type,
                      const char *body, size_t len) {
    PD_ASSERT(!r->finished);
    waiting_remove(r);
    if (can_send(r)) {
        set_head(r, status, content_type);
        r->req->res.content_length = len;
        r->finished = true;
        h2o_send_inline(r->req, body, len);
    }
    r->finished = true;
    req_release(r);
}

static void flush(struct pd_front_req *r) {
    if (r->sending || !can_send(r))
        return;
    if (r->pending.len == 0 && !r->end_queued)
        return;
    struct bytes *grown = pd_realloc(r->inflight, sizeof(*grown) * (r->n_inflight + 1));
    if (!grown) {
        pd_error("router: out of memory streaming a response; closing it");
        r->pending.len = 0;
        r->end_queued = true;
    } else {
        r->inflight = grown;
        r->inflight[r->n_inflight++] = r->pending;
        memset(&r->pending, 0, sizeof(r->pending));
    }
    struct bytes *b = grown ? &r->inflight[r->n_inflight - 1] : NULL;
    h2o_iovec_t iov = h2o_iovec_init(b ? b->p : NULL, b ? b->len : 0);
    r->sending = true;
    h2o_send(r->req, &iov, iov.len ? 1 : 0,
             r->end_queued ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void on_proceed(h2o_generator_t *gen, h2o_req_t *req) {
    struct pd_front_req *r = (struct pd_front_req *)gen;
    r->sending = false;
    /* what h2o has written can go (the final piece stays until the request is freed) */
    for (size_t i = 0; i < r->n_inflight; i++)
        pd_free(r->inflight[i].p);
    r->n_inflight = 0;
    flush(r);
}

static void on_stop(h2o_generator_t *gen, h2o_req_t *req) {
    struct pd_front_req *r = (struct pd_front_req *)gen;
    r->stopped = true;
    mark_gone(r);
}

void pd_front_stream_start(struct pd_front_req *r, int status, const char *content_type) {
    PD_ASSERT(!r->finished);
    waiting_remove(r);
    if (!can_send(r))
        return;
    set_head(r, status, content_type);
    h2o_add_header(&r->req->pool, &r->req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-cache"));
    r->gen.proceed = on_proceed;
    r->gen.stop = on_stop;
    h2o_start_response(r->req, &r->gen);
}

void pd_front_stream_send(struct pd_front_req *r, const char *data, size_t len) {
    PD_ASSERT(!r->finished);
    if (!can_send(r) || len == 0)
        return;
    if (pd_array_grow((void **)&r->pending.p, &r->pending.cap, r->pending.len + len, 1)) {
        pd_error("router: out of memory streaming a response; dropping %zu bytes", len);
        return;
    }
    memcpy(r->pending.p + r->pending.len, data, len);
    r->pending.len += len;
    flush(r);
}

void pd_front_stream_end(struct pd_front_req *r) {
    PD_ASSERT(!r->finished);
    waiting_remove(r);
    r->end_queued = true;
    r->finished = true;
    flush(r);
    req_release(r);
}

const char *pd_front_req_method(const struct pd_front_req *r) {
    return r->method;
}
const char *pd_front_req_path(const struct pd_front_req *r) {
    return r->path;
}
const char *pd_front_req_body(const struct pd_front_req *r, size_t *len) {
    *len = r->body_len;
    return r->body;
}
const char *pd_front_req_authorization(const struct pd_front_req *r) {
    return r->auth;
}
bool pd_front_req_client_gone(const struct pd_front_req *r) {
    return r->gone;
}
void pd_front_req_on_gone(struct pd_front_req *r, void (*cb)(void *ud), void *ud) {
    r->gone_cb = cb;
    r->gone_ud = ud;
}

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
    struct pd_front *f = ((struct front_handler *)self)->f;
    struct pd_front_req *r = pd_calloc(1, sizeof(*r));
    if (!r)
        goto fail;
    r->method = pd_strndup(req->method.base, req->method.len);
    r->path = pd_strndup(req->path_normalized.base, req->path_normalized.len);
    r->body_len = req->entity.base ? req->entity.len : 0;
    r->body = pd_malloc(r->body_len + 1);
    ssize_t ai = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    if (ai >= 0)
        r->auth =
            pd_strndup(req->headers.entries[ai].value.base, req->headers.entries[ai].value.len);
    if (!r->method || !r->path || !r->body || (ai >= 0 && !r->auth))
        goto fail_req;
    if (r->body_len)
        memcpy(r->body, req->entity.base, r->body_len);
    r->body[r->body_len] = '\0';
    struct dispose_hook *hook = h2o_mem_alloc_shared(&req->pool, sizeof(*hook), on_req_disposed);
    hook->r = r;
    r->req = req;
    r->f = f;
    r->refs = 2; /* h2o's (the hook) and the router's */
    r->in_waiting = true;
    r->wnext = f->waiting;
    if (f->waiting)
        f->waiting->wprev = r;
    f->waiting = r;
    f->on_request(f->ud, r);
    return 0;

fail_req:
    pd_free(r->method);
    pd_free(r->path);
    pd_free(r->body);
    pd_free(r->auth);
    pd_free(r);
fail:
    h2o_send_error_503(req, "Service Unavailable", "out of memory", 0);
    return 0;
}

static void on_conn_closed(uv_handle_t *h) {
    struct conn *c = (struct conn *)h;
    if (c->f) {
        if (c->prev)
            c->prev->next = c->next;
        else
            c->f->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
    }
    pd_free(c);
}

/* EOF (or a hard error) on the socket of a request still waiting: its client is gone. */
static bool peer_closed(struct pd_front *f, h2o_req_t *req) {
    if (!req->conn->callbacks->get_socket)
        return false;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    for (struct conn *c = f->conns; c; c = c->next) {
        if (c->sock != sock)
            continue;
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
            return false;
        char b;
        ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

static void on_peek_timer(uv_timer_t *t) {
    struct pd_front *f = t->data;
    for (struct pd_front_req *r = f->waiting, *next; r; r = next) {
        next = r->wnext;
        if (r->req && !r->gone && peer_closed(f, r->req)) {
            waiting_remove(r);
            mark_gone(r); /* may finish r (router) but h2o's reference keeps it alive */
        }
    }
}

static void on_accept(uv_stream_t *listener, int status) {
    struct pd_front *f = listener->data;
    if (status != 0)
        return;
    struct conn *c = pd_calloc(1, sizeof(*c)); /* freed by on_conn_closed, via h2o */
    if (!c)
        return;
    uv_tcp_init(f->loop, &c->tcp);
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->f = f;
    c->next = f->conns;
    if (f->conns)
        f->conns->prev = c;
    f->conns = c;
    c->sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_closed);
    h2o_accept(&f->accept_ctx, c->sock);
}

int pd_front_new(uv_loop_t *loop, const char *host, int port, size_t max_body_bytes,
                 pd_front_request_cb on_request, void *ud, struct pd_front **out) {
    struct pd_front *f = pd_calloc(1, sizeof(*f));
    if (!f)
        return pd_errorf(PD_ENOMEM, "HTTP server");
    f->loop = loop;
    f->on_request = on_request;
    f->ud = ud;
    h2o_config_init(&f->config);
    f->config.max_request_entity_size = max_body_bytes;
    f->config.server_name = h2o_iovec_init(H2O_STRLIT("pdserve-router"));
    h2o_hostconf_t *hc =
        h2o_config_register_host(&f->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *pc = h2o_config_register_path(hc, "/", 0);
    struct front_handler *h = (struct front_handler *)h2o_create_handler(pc, sizeof(*h));
    h->super.on_req = on_req;
    h->f = f;
    h2o_context_init(&f->ctx, loop, &f->config);
    f->accept_ctx.ctx = &f->ctx;
    f->accept_ctx.hosts = f->config.hosts;

    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port_s[8];
    snprintf(port_s, sizeof(port_s), "%d", port);
    int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai != 0) {
        *out = f; /* leak-free: the caller's pd_front lives for the process */
        return pd_errorf(PD_EINVAL, "listen address %s: %s", host, gai_strerror(gai));
    }
    uv_tcp_init(loop, &f->listener);
    f->listener.data = f;
    int rc = uv_tcp_bind(&f->listener, ai->ai_addr, 0);
    freeaddrinfo(ai);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&f->listener, 1024, on_accept);
    if (rc != 0) {
        *out = f;
        return pd_errorf(PD_EIO, "listening on %s:%d: %s", host, port, uv_strerror(rc));
    }
    f->listening = true;
    uv_timer_init(loop, &f->peek_timer);
    f->peek_timer.data = f;
    uv_timer_start(&f->peek_timer, on_peek_timer, 200, 200);
    struct sockaddr_storage sa;
    int salen = sizeof(sa);
    uv_tcp_getsockname(&f->listener, (struct sockaddr *)&sa, &salen);
    f->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                             : ((struct sockaddr_in *)&sa)->sin_port);
    *out = f;
    return PD_OK;
}

int pd_front_port(const struct pd_front *f) {
    return f->port;
}

void pd_front_stop_listening(struct pd_front *f) {
    if (f->listening) {
        f->listening = false;
        uv_close((uv_handle_t *)&f->listener, NULL); /* embedded in f, which outlives the loop */
        uv_timer_stop(&f->peek_timer);
    }
}
