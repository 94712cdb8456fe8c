/*
 * upstream.c — libcurl multi on libuv (see upstream.h).
 *
 * Invariants: curl's multi handle is touched (add/remove handle) only outside curl callbacks:
 * `in_curl` is set around every curl_multi_socket_action, and starts and cancels made meanwhile
 * are queued (`pending_add`, `pending_free`) and applied by settle() once curl has returned; so
 * are pauses (`want_paused` vs `paused`). A call paused while curl is delivering to it refuses
 * the next piece with CURL_WRITEFUNC_PAUSE (curl keeps that piece and pauses itself).
 * Every uv handle is freed in its close callback; the upstream itself is freed in the close
 * callback of its timer, after every socket poll it opened has been closed (curl reports each
 * socket's removal through the socket callback before it closes the fd).
 * CURLcode is translated to a PD status in exactly one place, result_from_curl.
 */
#include "router/upstream.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct pd_upstream {
    uv_loop_t *loop;
    const char *ca_certs; /* NULL: curl's default (the system's roots) */
    CURLM *multi;
    uv_timer_t timer;
    bool in_curl;
    bool settling, dirty; /* see settle() */
    bool closing;
    bool timer_closed;              /* freed once this and every poll have closed */
    int n_polls;                    /* open socket polls */
    int n_active;                   /* calls neither done nor cancelled */
    struct pd_upstream_call *calls; /* every call not yet freed, doubly linked */
};

struct pd_upstream_call {
    struct pd_upstream *up;
    struct pd_upstream_call *prev, *next;
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* owned copy of the POST body */
    struct pd_upstream_cbs cbs;
    void *ud;
    bool added;       /* in the multi handle */
    bool cancelled;   /* no callbacks any more; freed by settle() */
    bool want_paused; /* pd_upstream_call_pause's last word */
    bool paused;      /* curl's state as we left it */
    long http_status;
    char content_type[128];
    char errbuf[CURL_ERROR_SIZE];
};

struct poll_ctx {
    uv_poll_t poll;
    struct pd_upstream *up;
    curl_socket_t fd;
};

static void settle(struct pd_upstream *up);

/* Outside curl callbacks only; curl may call on_write from in here when unpausing. */
static void apply_pause(struct pd_upstream_call *c) {
    struct pd_upstream *up = c->up;
    c->paused = c->want_paused; /* before: on_write may pause it again from inside */
    up->in_curl = true;
    CURLcode rc = curl_easy_pause(c->easy, c->want_paused ? CURLPAUSE_RECV : CURLPAUSE_CONT);
    up->in_curl = false;
    if (rc != CURLE_OK)
        pd_warn("upstream: %s a response failed: %s", c->want_paused ? "pausing" : "resuming",
                curl_easy_strerror(rc));
}

static void call_unlink_free(struct pd_upstream_call *c) {
    struct pd_upstream *up = c->up;
    if (c->added)
        curl_multi_remove_handle(up->multi, c->easy);
    curl_easy_cleanup(c->easy);
    curl_slist_free_all(c->headers);
    pd_free(c->body);
    if (c->prev)
        c->prev->next = c->next;
    else
        up->calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pd_free(c);
}

static void result_from_curl(CURLcode code, const struct pd_upstream_call *c,
                             struct pd_upstream_result *r) {
    r->http_status = c->http_status;
    r->unreachable = false;
    r->error = "";
    if (code == CURLE_OK) {
        r->status = PD_OK;
        return;
    }
    r->error = c->errbuf[0] ? c->errbuf : curl_easy_strerror(code);
    switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
        r->unreachable = true;
        r->status = PD_EPEER;
        break;
    case CURLE_OPERATION_TIMEDOUT: {
        long connected = 0;
        curl_easy_getinfo(c->easy, CURLINFO_NUM_CONNECTS, &connected);
        curl_off_t connect_us = 0;
        curl_easy_getinfo(c->easy, CURLINFO_CONNECT_TIME_T, &connect_us);
        r->unreachable = connect_us == 0 && c->http_status == 0 && connected == 0;
        r->status = PD_ETIMEDOUT;
        break;
    }
    case CURLE_OUT_OF_MEMORY: r->status = PD_ENOMEM; break;
    default: r->status = PD_EPEER; break;
    }
}

static void check_done(struct pd_upstream *up) {
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(up->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        struct pd_upstream_call *c = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
        CURLcode code = msg->data.result;
        curl_multi_remove_handle(up->multi, c->easy); /* msg is invalid from here on */
        c->added = false;
        if (c->cancelled)
            continue; /* settle() frees it */
        struct pd_upstream_result r;
        result_from_curl(code, c, &r);
        c->cancelled = true; /* no more callbacks; freed below */
        up->n_active--;
        if (c->cbs.on_done)
            c->cbs.on_done(c->ud, c, &r);
    }
}

/* Applies queued adds and frees once curl has returned. Callbacks run from here may start or
 * cancel calls: starts go to the list head and cancels only mark, so the walk stays valid, and
 * `dirty` makes it walk again for what they queued. */
static void settle(struct pd_upstream *up) {
    if (up->in_curl || up->settling) {
        up->dirty = true;
        return;
    }
    up->settling = true;
    do {
        up->dirty = false;
        check_done(up);
        struct pd_upstream_call *c = up->calls, *next;
        for (; c; c = next) {
            next = c->next;
            if (c->cancelled) {
                call_unlink_free(c);
            } else if (c->added && c->want_paused != c->paused) {
                apply_pause(c);
                up->dirty = true; /* its callbacks may have queued more */
            } else if (!c->added) {
                CURLMcode mc = curl_multi_add_handle(up->multi, c->easy);
                if (mc == CURLM_OK) {
                    c->added = true;
                    continue;
                }
                /* report as a failed call rather than leaving it hanging */
                struct pd_upstream_result r = {.status = PD_EPEER,
                                               .error = curl_multi_strerror(mc)};
                c->cancelled = true;
                up->n_active--;
                up->dirty = true;
                if (c->cbs.on_done)
                    c->cbs.on_done(c->ud, c, &r);
            }
        }
    } while (up->dirty);
    up->settling = false;
}

static void socket_action(struct pd_upstream *up, curl_socket_t fd, int flags) {
    int running;
    up->in_curl = true;
    curl_multi_socket_action(up->multi, fd, flags, &running);
    up->in_curl = false;
    settle(up);
}

/* libuv runs close callbacks newest first, so the timer's may come before the
 * polls' that curl closed while cleaning up: the last of them frees the client. */
static void free_if_closed(struct pd_upstream *up) {
    if (up->closing && up->timer_closed && up->n_polls == 0)
        pd_free(up);
}

static void on_poll_closed(uv_handle_t *h) {
    struct poll_ctx *p = h->data;
    struct pd_upstream *up = p->up;
    pd_free(p);
    up->n_polls--;
    free_if_closed(up);
}

static void on_poll(uv_poll_t *h, int status, int events) {
    struct poll_ctx *p = h->data;
    int flags = 0;
    if (status < 0)
        flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE)
        flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
        flags |= CURL_CSELECT_OUT;
    socket_action(p->up, p->fd, flags);
}

static int on_socket(CURL *easy, curl_socket_t fd, int action, void *userp, void *socketp) {
    struct pd_upstream *up = userp;
    struct poll_ctx *p = socketp;
    if (action == CURL_POLL_REMOVE) {
        if (p) {
            uv_poll_stop(&p->poll);
            uv_close((uv_handle_t *)&p->poll, on_poll_closed);
            curl_multi_assign(up->multi, fd, NULL);
        }
        return 0;
    }
    if (!p) {
        p = pd_calloc(1, sizeof(*p));
        if (!p)
            return -1; /* curl fails the transfer */
        p->up = up;
        p->fd = fd;
        if (uv_poll_init_socket(up->loop, &p->poll, fd) != 0) {
            pd_free(p);
            return -1;
        }
        p->poll.data = p;
        up->n_polls++;
        curl_multi_assign(up->multi, fd, p);
    }
    int events = 0;
    if (action == CURL_POLL_IN || action == CURL_POLL_INOUT)
        events |= UV_READABLE;
    if (action == CURL_POLL_OUT || action == CURL_POLL_INOUT)
        events |= UV_WRITABLE;
    uv_poll_start(&p->poll, events, on_poll);
    return 0;
}

static void on_timer(uv_timer_t *t) {
    socket_action(t->data, CURL_SOCKET_TIMEOUT, 0);
}

static int on_timer_set(CURLM *multi, long timeout_ms, void *userp) {
    struct pd_upstream *up = userp;
    if (timeout_ms < 0)
        uv_timer_stop(&up->timer);
    else
        uv_timer_start(&up->timer, on_timer, (uint64_t)timeout_ms, 0);
    return 0;
}

static size_t on_header(char *buf, size_t size, size_t n, void *userp) {
    struct pd_upstream_call *c = userp;
    size_t len = size * n;
    if (len > 5 && strncmp(buf, "HTTP/", 5) == 0) {
        const char *sp = memchr(buf, ' ', len);
        c->http_status = sp ? strtol(sp + 1, NULL, 10) : 0;
        c->content_type[0] = '\0';
    } else if (len > 13 && strncasecmp(buf, "content-type:", 13) == 0) {
        const char *v = buf + 13;
        size_t vl = len - 13;
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
            vl--;
        if (vl >= sizeof(c->content_type))
            vl = sizeof(c->content_type) - 1;
        memcpy(c->content_type, v, vl);
        c->content_type[vl] = '\0';
    }
    return len;
}

static size_t on_write(char *buf, size_t size, size_t n, void *userp) {
    struct pd_upstream_call *c = userp;
    if (c->cancelled)
        return 0; /* aborts the transfer */
    if (c->want_paused) {
        c->paused = true;
        return CURL_WRITEFUNC_PAUSE; /* curl delivers this piece again when resumed */
    }
    if (c->cbs.on_data && size * n != 0)
        c->cbs.on_data(c->ud, c, buf, size * n);
    return size * n;
}

int pd_upstream_new(uv_loop_t *loop, const char *ca_certs, struct pd_upstream **out) {
    static bool global_done;
    if (!global_done) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return pd_errorf(PD_EINTERNAL, "curl_global_init failed");
        global_done = true;
    }
    struct pd_upstream *up = pd_calloc(1, sizeof(*up));
    if (!up)
        return pd_errorf(PD_ENOMEM, "upstream client");
    up->loop = loop;
    up->ca_certs = ca_certs;
    up->multi = curl_multi_init();
    if (!up->multi) {
        pd_free(up);
        return pd_errorf(PD_ENOMEM, "curl_multi_init");
    }
    uv_timer_init(loop, &up->timer);
    up->timer.data = up;
    curl_multi_setopt(up->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(up->multi, CURLMOPT_SOCKETDATA, up);
    curl_multi_setopt(up->multi, CURLMOPT_TIMERFUNCTION, on_timer_set);
    curl_multi_setopt(up->multi, CURLMOPT_TIMERDATA, up);
    *out = up;
    return PD_OK;
}

static void on_timer_closed(uv_handle_t *h) {
    struct pd_upstream *up = h->data;
    up->timer_closed = true;
    free_if_closed(up);
}

void pd_upstream_free(struct pd_upstream *up) {
    if (!up)
        return;
    PD_ASSERT(!up->in_curl);
    up->closing = true;
    while (up->calls)
        call_unlink_free(up->calls); /* removing the handles closes their socket polls */
    curl_multi_cleanup(up->multi);
    uv_timer_stop(&up->timer);
    uv_close((uv_handle_t *)&up->timer, on_timer_closed);
}

int pd_upstream_call_start(struct pd_upstream *up, const struct pd_upstream_req *req,
                           const struct pd_upstream_cbs *cbs, void *ud,
                           struct pd_upstream_call **out) {
    PD_ASSERT(!up->closing);
    struct pd_upstream_call *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return pd_errorf(PD_ENOMEM, "upstream call to %s", req->url);
    c->up = up;
    c->cbs = *cbs;
    c->ud = ud;
    if (!(c->easy = curl_easy_init())) {
        pd_free(c);
        return pd_errorf(PD_ENOMEM, "curl_easy_init for %s", req->url);
    }
    CURL *e = c->easy;
    struct curl_slist *h = NULL, *t;
    /* no "Expect: 100-continue" round trip on large bodies */
    if ((t = curl_slist_append(h, "Expect:")))
        h = t;
    if (req->body && (t = curl_slist_append(h, "Content-Type: application/json")))
        h = t;
    if (req->auth && (t = curl_slist_append(h, req->auth)))
        h = t;
    c->headers = h;
    curl_easy_setopt(e, CURLOPT_URL, req->url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, c);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (up->ca_certs)
        curl_easy_setopt(e, CURLOPT_CAINFO, up->ca_certs);
    /* decode's SSE must flow as it comes: no decompression buffering, no proxies from env */
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    if (req->timeout_ms > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, req->timeout_ms);
    if (req->connect_timeout_ms > 0)
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms);
    if (strcmp(req->method, "POST") == 0) {
        if (req->body_len && !(c->body = pd_malloc(req->body_len))) {
            curl_slist_free_all(c->headers);
            curl_easy_cleanup(e);
            pd_free(c);
            return pd_errorf(PD_ENOMEM, "copying the body for %s", req->url);
        }
        if (req->body_len)
            memcpy(c->body, req->body, req->body_len);
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, c->body ? c->body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    } else if (strcmp(req->method, "GET") != 0) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method);
    }
    c->next = up->calls;
    if (up->calls)
        up->calls->prev = c;
    up->calls = c;
    up->n_active++;
    if (out)
        *out = c;
    settle(up); /* adds it now, or after curl returns when called from a callback */
    return PD_OK;
}

void pd_upstream_call_cancel(struct pd_upstream_call *c) {
    if (!c || c->cancelled)
        return;
    c->cancelled = true;
    c->up->n_active--;
    settle(c->up);
}

void pd_upstream_call_pause(struct pd_upstream_call *c, bool paused) {
    if (!c || c->cancelled || c->want_paused == paused)
        return;
    c->want_paused = paused;
    settle(c->up); /* now, or once curl has returned */
}

long pd_upstream_call_http_status(const struct pd_upstream_call *c) {
    return c->http_status;
}

const char *pd_upstream_call_content_type(const struct pd_upstream_call *c) {
    return c->content_type;
}

double pd_upstream_call_pretransfer_s(const struct pd_upstream_call *c) {
    curl_off_t us = 0;
    if (curl_easy_getinfo(c->easy, CURLINFO_PRETRANSFER_TIME_T, &us) != CURLE_OK || us < 0)
        return 0;
    return (double)us * 1e-6;
}

int pd_upstream_active(const struct pd_upstream *up) {
    return up->n_active;
}
