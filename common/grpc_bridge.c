/*
 * grpc_bridge.c — gRPC core's completion queue bridged onto a libuv loop (see grpc_bridge.h).
 *
 * Owns: the completion queue, its thread, the event queue between them (mutex-guarded array,
 * bounded by the number of operations in flight), and the uv_async_t that wakes the loop.
 * Invariants: only the cq thread calls grpc_completion_queue_next; every other gRPC call happens
 * on the loop thread. A tag's memory lives until its event has been dispatched. The bridge
 * counts everything that can still produce an event (servers, channels, calls); the queue is
 * shut down only at zero, so no event ever arrives for freed memory.
 */
#include "common/grpc_bridge.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"

/* How long one connection attempt may take (see pd_grpc_channel_new): as long as a bootstrap
 * RPC's default deadline (PD_BOOTSTRAP_DEADLINE_MS). */
#define PD_GRPC_CONNECT_TIMEOUT_MS 5000
/* A channel pings its server after this long without reading from it, and drops the connection
 * when the ping is not answered within the timeout (see pd_grpc_channel_new). The timeout is
 * generous: a loaded machine (sanitizers, 2 cores) must not drop a healthy connection. */
#define PD_GRPC_KEEPALIVE_TIME_MS 2000
#define PD_GRPC_KEEPALIVE_TIMEOUT_MS 5000

struct tag {
    void (*fn)(struct tag *t, bool ok);
};

struct event {
    struct tag *tag; /* NULL: the queue is shut down and the thread has left */
    bool ok;
};

struct pd_grpc_bridge {
    uv_loop_t *loop;
    uv_async_t async;
    grpc_completion_queue *cq;
    pthread_t thread;
    pthread_mutex_t mu;
    struct event *q; /* guarded by mu */
    size_t q_len, q_cap;
    int live; /* servers + channels + calls that may still produce events */
    bool freeing, cq_shutdown;
};

/* ---- foreign codes: the one place each is interpreted ---- */

static const char *const code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *pd_grpc_code_name(int code) {
    return code >= 0 && (size_t)code < PD_ARRAY_LEN(code_names) ? code_names[code] : "UNKNOWN";
}

enum pd_grpc_code pd_grpc_code_from_status(int status) {
    switch (status) {
    case PD_OK: return PD_GRPC_OK;
    case PD_EINVAL:
    case PD_EFORMAT: return PD_GRPC_INVALID_ARGUMENT;
    case PD_ERANGE: return PD_GRPC_OUT_OF_RANGE;
    case PD_ENOENT: return PD_GRPC_NOT_FOUND;
    case PD_EPERM: return PD_GRPC_PERMISSION_DENIED;
    case PD_EMISMATCH: return PD_GRPC_FAILED_PRECONDITION;
    case PD_EFULL:
    case PD_ENOMEM: return PD_GRPC_RESOURCE_EXHAUSTED;
    case PD_ETIMEDOUT: return PD_GRPC_DEADLINE_EXCEEDED;
    case PD_ECANCELED: return PD_GRPC_CANCELLED;
    case PD_EUNSUPPORTED: return PD_GRPC_UNIMPLEMENTED;
    case PD_EPEER:
    case PD_EAGAIN: return PD_GRPC_UNAVAILABLE;
    default: return PD_GRPC_INTERNAL;
    }
}

int pd_grpc_status_to_pd(int code, const char *details, const char *doing) {
    int rc;
    switch (code) {
    case PD_GRPC_OK: return PD_OK;
    case PD_GRPC_CANCELLED: rc = PD_ECANCELED; break;
    case PD_GRPC_INVALID_ARGUMENT: rc = PD_EINVAL; break;
    case PD_GRPC_DEADLINE_EXCEEDED: rc = PD_ETIMEDOUT; break;
    case PD_GRPC_NOT_FOUND: rc = PD_ENOENT; break;
    case PD_GRPC_ALREADY_EXISTS: rc = PD_EINVAL; break;
    case PD_GRPC_PERMISSION_DENIED:
    case 16 /* UNAUTHENTICATED */: rc = PD_EPERM; break;
    case PD_GRPC_RESOURCE_EXHAUSTED: rc = PD_EFULL; break;
    case PD_GRPC_FAILED_PRECONDITION: rc = PD_EMISMATCH; break;
    case PD_GRPC_OUT_OF_RANGE: rc = PD_ERANGE; break;
    case PD_GRPC_UNIMPLEMENTED: rc = PD_EUNSUPPORTED; break;
    case PD_GRPC_UNAVAILABLE:
    case PD_GRPC_ABORTED: rc = PD_EPEER; break;
    default: rc = PD_EIO; break;
    }
    return pd_errorf(rc, "%s: %s%s%s", doing, pd_grpc_code_name(code),
                     details && *details ? ": " : "", details ? details : "");
}

static int call_error(grpc_call_error e, const char *doing) {
    /* Every grpc_call_error is a misuse of the API by us: a bug, reported, never asserted on,
     * because the call it concerns belongs to the network. */
    return pd_errorf(PD_EINTERNAL, "%s: grpc_call_error %d", doing, (int)e);
}

/* ---- bridge ---- */

static void *cq_thread(void *arg) {
    pd_grpc_bridge_t *b = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(b->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            continue;
        struct event e = {ev.type == GRPC_OP_COMPLETE ? ev.tag : NULL, ev.success != 0};
        pthread_mutex_lock(&b->mu);
        int rc = pd_array_grow((void **)&b->q, &b->q_cap, b->q_len + 1, sizeof(*b->q));
        PD_ASSERT(rc == PD_OK); /* an event must never be lost; the queue holds a few dozen */
        b->q[b->q_len++] = e;
        pthread_mutex_unlock(&b->mu);
        uv_async_send(&b->async);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return NULL;
    }
}

static void on_async_closed(uv_handle_t *h) {
    pd_grpc_bridge_t *b = h->data;
    grpc_completion_queue_destroy(b->cq);
    pthread_mutex_destroy(&b->mu);
    pd_free(b->q);
    pd_free(b);
    /* blocking: gRPC's own cleanup (channels' TLS sessions, subchannels, timers) finishes here
     * rather than on its threads after we return, where a process that exits next would leave
     * it half done (LeakSanitizer saw OpenSSL's allocations of a TLS channel leaked) */
    grpc_shutdown_blocking();
}

static void on_async(uv_async_t *h) {
    pd_grpc_bridge_t *b = h->data;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        if (b->q_len == 0) {
            pthread_mutex_unlock(&b->mu);
            return;
        }
        struct event e = b->q[0];
        memmove(b->q, b->q + 1, (b->q_len - 1) * sizeof(*b->q));
        b->q_len--;
        pthread_mutex_unlock(&b->mu);
        if (e.tag) {
            e.tag->fn(e.tag, e.ok);
            continue;
        }
        pthread_join(b->thread, NULL); /* it has returned already: it sent this event last */
        uv_close((uv_handle_t *)&b->async, on_async_closed);
        return;
    }
}

static void bridge_release(pd_grpc_bridge_t *b) {
    b->live--;
    if (b->freeing && b->live == 0 && !b->cq_shutdown) {
        b->cq_shutdown = true;
        grpc_completion_queue_shutdown(b->cq);
    }
}

/* gRPC's log lines as ours (from any thread: pd_log writes each line at once). Its errors are
 * about a peer or a connection, so they are warnings here. A failed TLS handshake (a peer without
 * TLS, or one that does not trust the certificate) is said in those words; gRPC retries a failed
 * connection every second or so, so one call site logs at most once per GRPC_LOG_QUIET_NS, the
 * next line counting what it left out. gRPC's C API names no peer for a failed handshake: the
 * other side's own log names this one. */
#define GRPC_LOG_QUIET_NS (30ull * 1000000000ull)
#define GRPC_LOG_SITES 16

static struct {
    pthread_mutex_t mu;
    struct {
        const char *file; /* gRPC's static strings */
        int line;
        uint64_t last_ns;
        unsigned quiet; /* lines left out since */
    } site[GRPC_LOG_SITES];
} grpc_log_state = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* True when the site may log now; *left_out: the lines it did not log since the last. */
static bool grpc_log_site_may(const char *file, int line, unsigned *left_out) {
    uint64_t now = uv_hrtime();
    bool may = true;
    *left_out = 0;
    pthread_mutex_lock(&grpc_log_state.mu);
    int slot = -1, oldest = 0;
    for (int i = 0; i < GRPC_LOG_SITES; i++) {
        if (grpc_log_state.site[i].file == file && grpc_log_state.site[i].line == line) {
            slot = i;
            break;
        }
        if (grpc_log_state.site[i].last_ns < grpc_log_state.site[oldest].last_ns)
            oldest = i;
    }
    if (slot < 0) {
        slot = oldest;
        grpc_log_state.site[slot].file = file;
        grpc_log_state.site[slot].line = line;
        grpc_log_state.site[slot].last_ns = 0;
        grpc_log_state.site[slot].quiet = 0;
    }
    if (grpc_log_state.site[slot].last_ns &&
        now - grpc_log_state.site[slot].last_ns < GRPC_LOG_QUIET_NS) {
        grpc_log_state.site[slot].quiet++;
        may = false;
    } else {
        *left_out = grpc_log_state.site[slot].quiet;
        grpc_log_state.site[slot].quiet = 0;
        grpc_log_state.site[slot].last_ns = now;
    }
    pthread_mutex_unlock(&grpc_log_state.mu);
    return may;
}

static void grpc_log(gpr_log_func_args *a) {
    const char *file = a->file ? strrchr(a->file, '/') : NULL;
    file = file ? file + 1 : a->file ? a->file : "?";
    if (a->severity != GPR_LOG_SEVERITY_ERROR) {
        enum pd_log_level lv = a->severity == GPR_LOG_SEVERITY_INFO ? PD_LOG_INFO : PD_LOG_DEBUG;
        if (lv >= pd_log_get_level())
            pd_log(lv, "grpc: %s (%s:%d)", a->message, file, a->line);
        return;
    }
    unsigned left_out;
    if (!grpc_log_site_may(a->file, a->line, &left_out))
        return;
    char more[64] = "";
    if (left_out)
        snprintf(more, sizeof(more), "; %u more such lines in the last %llu s", left_out,
                 GRPC_LOG_QUIET_NS / 1000000000ull);
    bool handshake = strstr(a->message, "Handshake failed") != NULL;
    pd_warn("grpc: %s%s (%s:%d%s)",
            handshake ? "TLS handshake failed (a peer without TLS, or "
                        "one that does not trust the certificate): "
                      : "",
            a->message, file, a->line, more);
}

int pd_grpc_bridge_new(uv_loop_t *loop, pd_grpc_bridge_t **out) {
    int rc;
    *out = NULL;
    pd_grpc_bridge_t *b = pd_calloc(1, sizeof(*b));
    if (!b)
        return pd_error_wrap(PD_ENOMEM, "creating the gRPC bridge");
    gpr_set_log_function(grpc_log);
    grpc_init();
    b->loop = loop;
    b->cq = grpc_completion_queue_create_for_next(NULL);
    pthread_mutex_init(&b->mu, NULL);
    int urc = uv_async_init(loop, &b->async, on_async);
    if (urc) {
        rc = pd_errorf(PD_EIO, "creating the gRPC wake-up handle: %s", uv_strerror(urc));
        goto fail_cq;
    }
    b->async.data = b;
    int prc = pthread_create(&b->thread, NULL, cq_thread, b);
    if (prc) {
        rc = pd_errorf(pd_status_from_errno(prc), "starting the gRPC completion-queue thread");
        /* the handle is released in its close callback; the queue goes with it */
        grpc_completion_queue_shutdown(b->cq);
        uv_close((uv_handle_t *)&b->async, on_async_closed);
        return rc;
    }
    *out = b;
    return PD_OK;

fail_cq:
    pthread_mutex_destroy(&b->mu);
    grpc_completion_queue_shutdown(b->cq);
    grpc_completion_queue_destroy(b->cq);
    pd_free(b);
    grpc_shutdown_blocking();
    return rc;
}

void pd_grpc_bridge_free(pd_grpc_bridge_t *b) {
    if (!b || b->freeing)
        return;
    b->freeing = true;
    b->live++;
    bridge_release(b);
}

/* ---- byte buffers ---- */

static grpc_byte_buffer *buffer_from(const uint8_t *p, size_t n) {
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)p, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Flattens a received buffer; the slice is the caller's to unref. */
static int buffer_read(grpc_byte_buffer *bb, grpc_slice *out) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return pd_errorf(PD_EFORMAT, "reading a gRPC message: cannot decompress it");
    *out = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return PD_OK;
}

/* ---- server ---- */

enum { SC_REQUESTED, SC_RECEIVING, SC_ANSWERING };

struct server_call {
    struct tag tag;
    pd_grpc_server_t *s;
    int stage;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *recv;
    grpc_byte_buffer *send;
    grpc_slice status_details;
    int cancelled;
};

struct pd_grpc_server {
    pd_grpc_bridge_t *b;
    grpc_server *srv;
    pd_grpc_handler_fn fn;
    void *ctx;
    struct tag shutdown_tag;
    bool shutting, shut;
    int calls; /* server_call structs alive */
    char addr[128];
};

static void server_maybe_done(pd_grpc_server_t *s) {
    if (!s->shut || s->calls > 0)
        return;
    grpc_server_destroy(s->srv);
    pd_grpc_bridge_t *b = s->b;
    pd_free(s);
    bridge_release(b);
}

static void server_call_free(struct server_call *sc) {
    pd_grpc_server_t *s = sc->s;
    if (sc->call)
        grpc_call_unref(sc->call);
    grpc_call_details_destroy(&sc->details);
    grpc_metadata_array_destroy(&sc->md);
    if (sc->recv)
        grpc_byte_buffer_destroy(sc->recv);
    if (sc->send)
        grpc_byte_buffer_destroy(sc->send);
    if (sc->stage == SC_ANSWERING)
        grpc_slice_unref(sc->status_details);
    pd_free(sc);
    s->calls--;
    bridge_release(s->b);
    server_maybe_done(s);
}

static void on_server_call(struct tag *t, bool ok);

static int server_request(pd_grpc_server_t *s) {
    struct server_call *sc = pd_calloc(1, sizeof(*sc));
    if (!sc)
        return pd_error_wrap(PD_ENOMEM, "waiting for the next gRPC call");
    sc->tag.fn = on_server_call;
    sc->s = s;
    grpc_call_details_init(&sc->details);
    grpc_metadata_array_init(&sc->md);
    grpc_call_error e = grpc_server_request_call(s->srv, &sc->call, &sc->details, &sc->md, s->b->cq,
                                                 s->b->cq, &sc->tag);
    if (e != GRPC_CALL_OK) {
        grpc_call_details_destroy(&sc->details);
        grpc_metadata_array_destroy(&sc->md);
        pd_free(sc);
        return call_error(e, "waiting for the next gRPC call");
    }
    s->calls++;
    s->b->live++;
    return PD_OK;
}

static void server_answer(struct server_call *sc, struct pd_grpc_answer *ans) {
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (ans->code == PD_GRPC_OK) {
        sc->send = buffer_from(ans->reply, ans->reply_len);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = sc->send;
    }
    sc->status_details = grpc_slice_from_copied_string(ans->message);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)ans->code;
    ops[n++].data.send_status_from_server.status_details = &sc->status_details;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &sc->cancelled;
    sc->stage = SC_ANSWERING;
    grpc_call_error e = grpc_call_start_batch(sc->call, ops, n, &sc->tag, NULL);
    if (e != GRPC_CALL_OK) {
        call_error(e, "answering a gRPC call");
        pd_error("grpc: %s", pd_error_msg());
        server_call_free(sc);
    }
}

static void on_server_call(struct tag *t, bool ok) {
    struct server_call *sc = (struct server_call *)t;
    pd_grpc_server_t *s = sc->s;
    switch (sc->stage) {
    case SC_REQUESTED: {
        if (!ok) { /* the server is shutting down */
            server_call_free(sc);
            return;
        }
        if (!s->shutting && server_request(s) != PD_OK)
            pd_error("grpc: %s: no more calls will be accepted", pd_error_msg());
        grpc_op ops[2];
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_RECV_MESSAGE;
        ops[1].data.recv_message.recv_message = &sc->recv;
        sc->stage = SC_RECEIVING;
        grpc_call_error e = grpc_call_start_batch(sc->call, ops, 2, &sc->tag, NULL);
        if (e != GRPC_CALL_OK) {
            call_error(e, "receiving a gRPC request");
            pd_error("grpc: %s", pd_error_msg());
            server_call_free(sc);
        }
        return;
    }
    case SC_RECEIVING: {
        if (!ok) {
            server_call_free(sc);
            return;
        }
        struct pd_grpc_answer ans = {.code = PD_GRPC_OK};
        char *method = grpc_slice_to_c_string(sc->details.method);
        char *peer = grpc_call_get_peer(sc->call);
        grpc_slice body;
        if (s->shutting) { /* the handler's owner may be gone: never call it after free */
            ans.code = PD_GRPC_UNAVAILABLE;
            snprintf(ans.message, sizeof(ans.message), "%s: server shutting down", method);
        } else if (!sc->recv) {
            ans.code = PD_GRPC_INVALID_ARGUMENT;
            snprintf(ans.message, sizeof(ans.message), "%s: no request message", method);
        } else if (buffer_read(sc->recv, &body) != PD_OK) {
            ans.code = PD_GRPC_INVALID_ARGUMENT;
            snprintf(ans.message, sizeof(ans.message), "%s: %s", method, pd_error_msg());
        } else {
            s->fn(s->ctx, method, peer, GRPC_SLICE_START_PTR(body), GRPC_SLICE_LENGTH(body), &ans);
            grpc_slice_unref(body);
        }
        gpr_free(method);
        gpr_free(peer);
        server_answer(sc, &ans);
        return;
    }
    default: server_call_free(sc); return;
    }
}

static void on_server_shutdown(struct tag *t, bool ok) {
    pd_grpc_server_t *s =
        (pd_grpc_server_t *)((char *)t - offsetof(pd_grpc_server_t, shutdown_tag));
    (void)ok;
    s->shut = true;
    server_maybe_done(s);
}

int pd_grpc_server_new(pd_grpc_bridge_t *b, const char *addr, const struct pd_grpc_tls *tls,
                       pd_grpc_handler_fn fn, void *ctx, pd_grpc_server_t **out) {
    int rc;
    *out = NULL;
    pd_grpc_server_t *s = pd_calloc(1, sizeof(*s));
    if (!s)
        return pd_error_wrap(PD_ENOMEM, "creating the gRPC server");
    s->b = b;
    s->fn = fn;
    s->ctx = ctx;
    s->shutdown_tag.fn = on_server_shutdown;
    snprintf(s->addr, sizeof(s->addr), "%s", addr);
    /* the decodes' keepalive pings (pd_grpc_channel_new) are welcome at any rate, calls or not */
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = 1 << 20},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         .value.integer = PD_GRPC_KEEPALIVE_TIME_MS / 2},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_HTTP2_MAX_PING_STRIKES,
         .value.integer = 0},
    };
    grpc_channel_args ca = {.num_args = PD_ARRAY_LEN(args), .args = args};
    s->srv = grpc_server_create(&ca, NULL);
    grpc_server_register_completion_queue(s->srv, b->cq, NULL);
    grpc_server_credentials *creds;
    if (tls) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->private_key,
                                           .cert_chain = tls->cert_chain};
        creds = grpc_ssl_server_credentials_create_ex(
            NULL, &pair, 1, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    int port = creds ? grpc_server_add_http2_port(s->srv, addr, creds) : 0;
    if (creds)
        grpc_server_credentials_release(creds);
    if (port == 0) {
        rc = pd_errorf(PD_EIO, "gRPC server: cannot listen on %s (port in use%s?)", addr,
                       tls ? ", or a certificate gRPC refuses" : "");
        goto fail_srv;
    }
    grpc_server_start(s->srv);
    b->live++; /* the server itself, until its shutdown completes */
    rc = server_request(s);
    if (rc) {
        pd_grpc_server_free(s);
        return rc;
    }
    pd_info("grpc: serving on %s%s", addr, tls ? " (TLS)" : "");
    *out = s;
    return PD_OK;

fail_srv:
    grpc_server_destroy(s->srv);
    pd_free(s);
    return rc;
}

void pd_grpc_server_free(pd_grpc_server_t *s) {
    if (!s || s->shutting)
        return;
    s->shutting = true;
    grpc_server_shutdown_and_notify(s->srv, s->b->cq, &s->shutdown_tag);
    grpc_server_cancel_all_calls(s->srv);
}

/* ---- client ---- */

struct client_call {
    struct tag tag;
    pd_grpc_channel_t *c;
    struct client_call *prev, *next;
    grpc_call *call;
    grpc_metadata_array init_md, trail_md;
    grpc_byte_buffer *send, *recv;
    grpc_status_code status;
    grpc_slice details;
    pd_grpc_reply_fn fn;
    void *ctx;
    char method[96];
};

struct pd_grpc_channel {
    pd_grpc_bridge_t *b;
    grpc_channel *ch;
    struct client_call *calls;
    uint64_t connection; /* pd_grpc_channel_connection's number for the connection up now */
    bool seen_down;      /* since that number: a look found none, or a call failed */
    bool freeing;
    char target[128];
};

static void channel_maybe_done(pd_grpc_channel_t *c) {
    if (!c->freeing || c->calls)
        return;
    grpc_channel_destroy(c->ch);
    pd_grpc_bridge_t *b = c->b;
    pd_free(c);
    bridge_release(b);
}

static void on_client_call(struct tag *t, bool ok) {
    struct client_call *cc = (struct client_call *)t;
    pd_grpc_channel_t *c = cc->c;
    char doing[192];
    snprintf(doing, sizeof(doing), "calling %s at %s", cc->method, c->target);
    int rc;
    grpc_slice body = grpc_empty_slice();
    if (!ok) {
        rc = pd_errorf(PD_EINTERNAL, "%s: the call's batch failed", doing);
    } else if (cc->status != GRPC_STATUS_OK) {
        char *details = grpc_slice_to_c_string(cc->details);
        rc = pd_grpc_status_to_pd(cc->status, details, doing);
        gpr_free(details);
    } else if (!cc->recv) {
        rc = pd_errorf(PD_EFORMAT, "%s: OK without a reply message", doing);
    } else {
        rc = buffer_read(cc->recv, &body);
    }
    if (!ok || cc->status != GRPC_STATUS_OK)
        c->seen_down = true; /* it may have lost the connection, which gRPC then renews unasked */
    cc->fn(cc->ctx, rc, rc == PD_OK ? GRPC_SLICE_START_PTR(body) : NULL,
           rc == PD_OK ? GRPC_SLICE_LENGTH(body) : 0);
    grpc_slice_unref(body);
    if (cc->prev)
        cc->prev->next = cc->next;
    else
        c->calls = cc->next;
    if (cc->next)
        cc->next->prev = cc->prev;
    grpc_call_unref(cc->call);
    grpc_metadata_array_destroy(&cc->init_md);
    grpc_metadata_array_destroy(&cc->trail_md);
    grpc_byte_buffer_destroy(cc->send);
    if (cc->recv)
        grpc_byte_buffer_destroy(cc->recv);
    grpc_slice_unref(cc->details);
    pd_free(cc);
    pd_grpc_bridge_t *b = c->b;
    channel_maybe_done(c); /* may drop the channel's count; the call's keeps the queue up */
    bridge_release(b);
}

int pd_grpc_channel_new(pd_grpc_bridge_t *b, const char *target, const struct pd_grpc_tls *tls,
                        pd_grpc_channel_t **out) {
    *out = NULL;
    pd_grpc_channel_t *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return pd_error_wrap(PD_ENOMEM, "creating a gRPC channel to %s", target);
    c->b = b;
    snprintf(c->target, sizeof(c->target), "%s", target);
    /* A restarted prefill is back on its bootstrap port within a second or two: reconnect
     * that fast (gRPC's default backoff starts at 1 s and grows to 120 s, during which every
     * Pair fails at once with the old "connection refused"). gRPC reads "min reconnect
     * backoff" as the least time one connection attempt (TCP connect and HTTP/2 handshake) may
     * take, not as a delay: at 100 ms a loaded machine failed Pair calls with "tcp handshaker
     * shutdown" (xfer_pair_aborts_tcp under ctest -j2); an attempt now has as long as a
     * bootstrap RPC's deadline, and a refused connect still fails (and is retried) at once.
     * Keepalive pings, with or without calls: a connection whose peer stops answering (a link
     * down, a host gone) is dropped after PD_GRPC_KEEPALIVE_TIME_MS + _TIMEOUT_MS and the next
     * call connects anew. Without them the connection outlives a network outage stuck in TCP's
     * retransmission backoff, and calls made after the link is back wait up to as long again
     * (tests/integration/test_netfault.py saw Pair time out 6 s after the link returned). */
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_KEEPALIVE_TIME_MS,
         .value.integer = PD_GRPC_KEEPALIVE_TIME_MS},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
         .value.integer = PD_GRPC_KEEPALIVE_TIMEOUT_MS},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA,
         .value.integer = 0},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ENABLE_RETRIES, .value.integer = 0},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = 100},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
         .value.integer = PD_GRPC_CONNECT_TIMEOUT_MS},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
         .value.integer = 1000},
    };
    grpc_channel_args ca = {.num_args = PD_ARRAY_LEN(args), .args = args};
    grpc_channel_credentials *creds =
        tls ? grpc_ssl_credentials_create(tls->root_certs, NULL, NULL, NULL)
            : grpc_insecure_credentials_create();
    c->ch = creds ? grpc_channel_create(target, creds, &ca) : NULL;
    if (creds)
        grpc_channel_credentials_release(creds);
    if (!c->ch) {
        pd_free(c);
        return pd_errorf(PD_EINVAL, "creating a gRPC channel to %s%s", target, tls ? " (TLS)" : "");
    }
    c->seen_down = true; /* not connected yet: the first connection is number 1 */
    b->live++;
    *out = c;
    return PD_OK;
}

void pd_grpc_channel_free(pd_grpc_channel_t *c) {
    if (!c || c->freeing)
        return;
    c->freeing = true;
    for (struct client_call *cc = c->calls; cc; cc = cc->next)
        grpc_call_cancel(cc->call, NULL);
    channel_maybe_done(c);
}

uint64_t pd_grpc_channel_connection(pd_grpc_channel_t *c) {
    if (c->freeing || grpc_channel_check_connectivity_state(c->ch, 0) != GRPC_CHANNEL_READY) {
        c->seen_down = true;
        return 0;
    }
    if (c->seen_down) {
        c->seen_down = false;
        c->connection++;
    }
    return c->connection;
}

int pd_grpc_call(pd_grpc_channel_t *c, const char *method, const uint8_t *req, size_t req_len,
                 int deadline_ms, pd_grpc_reply_fn fn, void *ctx) {
    PD_ASSERT(deadline_ms > 0); /* every call has a deadline */
    if (c->freeing)
        return pd_errorf(PD_ECANCELED, "calling %s: the channel is closing", method);
    /* A call is what connects an idle channel: look first, so that a connection it opens gets a
     * new number (pd_grpc_channel_connection) */
    (void)pd_grpc_channel_connection(c);
    struct client_call *cc = pd_calloc(1, sizeof(*cc));
    if (!cc)
        return pd_error_wrap(PD_ENOMEM, "calling %s", method);
    cc->tag.fn = on_client_call;
    cc->c = c;
    cc->fn = fn;
    cc->ctx = ctx;
    snprintf(cc->method, sizeof(cc->method), "%s", method);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(deadline_ms, GPR_TIMESPAN));
    grpc_slice m = grpc_slice_from_copied_string(method);
    cc->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->b->cq, m, NULL,
                                        deadline, NULL);
    grpc_slice_unref(m);
    grpc_metadata_array_init(&cc->init_md);
    grpc_metadata_array_init(&cc->trail_md);
    cc->send = buffer_from(req, req_len);
    cc->details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = cc->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &cc->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &cc->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &cc->trail_md;
    ops[5].data.recv_status_on_client.status = &cc->status;
    ops[5].data.recv_status_on_client.status_details = &cc->details;
    grpc_call_error e = grpc_call_start_batch(cc->call, ops, 6, &cc->tag, NULL);
    if (e != GRPC_CALL_OK) {
        int rc = call_error(e, "starting a gRPC call");
        grpc_call_unref(cc->call);
        grpc_metadata_array_destroy(&cc->init_md);
        grpc_metadata_array_destroy(&cc->trail_md);
        grpc_byte_buffer_destroy(cc->send);
        pd_free(cc);
        return rc;
    }
    cc->next = c->calls;
    if (c->calls)
        c->calls->prev = cc;
    c->calls = cc;
    c->b->live++;
    return PD_OK;
}
