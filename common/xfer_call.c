/*
 * xfer_call.c — calls over a pair's endpoints (xfer.h, "Calls"): a call is one active message on
 * our endpoint to the peer, its answer one on the peer's endpoint to us. The messages are queued
 * by the UCX handlers and handed to the user from xfer_run (pd__xfer_run_calls), like every
 * other callback of the engine.
 *
 * Wire (little-endian), both ids in PD_XFER_AM_CALL and PD_XFER_AM_ANSWER:
 *   call:   magic u16 | sender_id u64 | call_id u64 | method u32 | body
 *   answer: magic u16 | sender_id u64 | call_id u64 | status i32 | text_len u16 | text | reply
 * A message of another magic, shorter than its header, or whose text runs past its end is
 * dropped with a warning (fuzzed by pd_xfer_call_decode's unit test).
 */
#include "common/xfer_internal.h"

#define CALL_MAGIC 0x4351u   /* "QC" */
#define ANSWER_MAGIC 0x4341u /* "AC" */
#define CALL_HDR 22
#define ANSWER_HDR 24

/* A call of ours waiting for its answer. peer NULL: its deadline passed (timed_out) or its
 * peer closed (status says why); reported by the next run. */
struct call {
    struct call *next;
    uint64_t id;
    struct pd_xfer_peer *peer;
    uint64_t deadline_ms; /* uv_now */
    bool timed_out;
    int status; /* peer closed with it */
    pd_xfer_answer_fn fn;
    void *ctx;
};

/* A message UCX handed us, kept until the run (the handler may not call the user). */
struct ctl_msg {
    struct ctl_msg *next;
    struct pd_xfer_ctl m;
    size_t len;
    uint8_t bytes[];
};

/* A message of ours UCX may still read. peer NULL: that peer is closed (UCX may never complete
 * a request of a force-closed endpoint; then the engine frees it at the end). */
struct ctl_send {
    struct ctl_send *prev, *next;
    pd_xfer_t *x;
    struct pd_xfer_peer *peer;
    size_t len;
    uint8_t buf[];
};

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static uint16_t get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

int pd_xfer_ctl_decode(const void *buf, size_t len, bool answer, struct pd_xfer_ctl *m) {
    const uint8_t *p = buf;
    size_t hdr = answer ? ANSWER_HDR : CALL_HDR;
    memset(m, 0, sizeof(*m));
    if (len < hdr)
        return pd_errorf(PD_EFORMAT, "%s of %zu bytes, shorter than its %zu-byte header",
                         answer ? "answer" : "call", len, hdr);
    if (get_u16(p) != (answer ? ANSWER_MAGIC : CALL_MAGIC))
        return pd_errorf(PD_EFORMAT, "%s with bad magic 0x%04x", answer ? "answer" : "call",
                         get_u16(p));
    m->sender_id = pd__xfer_get_u64(p + 2);
    m->call_id = pd__xfer_get_u64(p + 10);
    if (!answer) {
        m->method = pd__xfer_get_u32(p + 18);
        m->body = p + CALL_HDR;
        m->len = len - CALL_HDR;
        return PD_OK;
    }
    m->status = (int32_t)pd__xfer_get_u32(p + 18);
    size_t tlen = get_u16(p + 22);
    if (tlen > len - ANSWER_HDR || tlen > PD_XFER_ERROR_TEXT_MAX)
        return pd_errorf(PD_EFORMAT, "answer of %zu bytes with a text of %zu", len, tlen);
    memcpy(m->text, p + ANSWER_HDR, tlen);
    m->text[tlen] = '\0';
    m->body = p + ANSWER_HDR + tlen;
    m->len = len - ANSWER_HDR - tlen;
    if (m->status > 0 || m->status < PD_EINTERNAL)
        m->status = PD_EPEER; /* an unknown failure is still a failure */
    return PD_OK;
}

size_t pd_xfer_ctl_encode(const struct pd_xfer_ctl *m, bool answer, uint8_t *buf, size_t cap) {
    size_t tlen = answer ? strnlen(m->text, PD_XFER_ERROR_TEXT_MAX) : 0;
    size_t need = (answer ? ANSWER_HDR + tlen : CALL_HDR) + m->len;
    if (cap < need)
        return 0;
    put_u16(buf, answer ? ANSWER_MAGIC : CALL_MAGIC);
    pd__xfer_put_u64(buf + 2, m->sender_id);
    pd__xfer_put_u64(buf + 10, m->call_id);
    uint8_t *body = buf + CALL_HDR;
    if (answer) {
        pd__xfer_put_u32(buf + 18, (uint32_t)m->status);
        put_u16(buf + 22, (uint16_t)tlen);
        memcpy(buf + ANSWER_HDR, m->text, tlen);
        body = buf + ANSWER_HDR + tlen;
    } else {
        pd__xfer_put_u32(buf + 18, m->method);
    }
    if (m->len)
        memcpy(body, m->body, m->len);
    return need;
}

static void on_ctl_sent(void *req, ucs_status_t st, void *user_data) {
    struct ctl_send *s = user_data;
    pd_xfer_t *x = s->x;
    if (s->peer) {
        x->n_ctl_sending--;
        x->progress++;
        if (st != UCS_OK) {
            pd__ucs_error(st, "sending a call or an answer");
            pd_warn("xfer: peer %016" PRIx64 ": %s", s->peer->remote_id, pd_error_msg());
            pd__xfer_peer_mark_failed(s->peer, PD_EPEER);
        }
    }
    if (s->prev)
        s->prev->next = s->next;
    else
        x->ctl_sends = s->next;
    if (s->next)
        s->next->prev = s->prev;
    pd_free(s);
    ucp_request_free(req);
}

static int post_ctl(struct pd_xfer_peer *p, unsigned am_id, const struct pd_xfer_ctl *m) {
    pd_xfer_t *x = p->x;
    bool answer = am_id == PD_XFER_AM_ANSWER;
    if (p->state != PEER_UP || p->failed)
        return pd_errorf(PD_EPEER, "peer %016" PRIx64 " is closing", p->remote_id);
    if (m->len > PD_XFER_CALL_MAX)
        return pd_errorf(PD_ERANGE, "a %s body of %zu bytes, over %d", answer ? "answer" : "call",
                         m->len, PD_XFER_CALL_MAX);
    size_t cap = ANSWER_HDR + PD_XFER_ERROR_TEXT_MAX + m->len;
    struct ctl_send *s = pd_malloc(sizeof(*s) + cap);
    if (!s)
        return pd_error_wrap(PD_ENOMEM, "a call to peer %016" PRIx64, p->remote_id);
    s->x = x;
    s->peer = p;
    s->len = pd_xfer_ctl_encode(m, answer, s->buf, cap);
    PD_ASSERT(s->len > 0);
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = on_ctl_sent,
        .user_data = s,
    };
    ucs_status_ptr_t req = ucp_am_send_nbx(p->ep, am_id, NULL, 0, s->buf, s->len, &prm);
    if (req == NULL) {
        pd_free(s);
        x->progress++;
        return PD_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        pd_free(s);
        int rc =
            pd__ucs_error(UCS_PTR_STATUS(req), answer ? "sending an answer" : "sending a call");
        pd__xfer_peer_mark_failed(p, PD_EPEER);
        pd__xfer_kick(x);
        return rc;
    }
    s->prev = NULL;
    s->next = x->ctl_sends;
    if (x->ctl_sends)
        x->ctl_sends->prev = s;
    x->ctl_sends = s;
    x->n_ctl_sending++;
    pd__xfer_kick(x); /* the run arms the timer that keeps it going */
    return PD_OK;
}

int pd_xfer_call(pd_xfer_peer_t *p, uint32_t method, const void *body, size_t len, int deadline_ms,
                 pd_xfer_answer_fn fn, void *ctx) {
    pd_xfer_t *x = p->x;
    struct call *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return pd_error_wrap(PD_ENOMEM, "a call to peer %016" PRIx64, p->remote_id);
    c->id = ++x->next_call_id;
    struct pd_xfer_ctl m = {
        .sender_id = x->id, .call_id = c->id, .method = method, .body = body, .len = len};
    int rc = post_ctl(p, PD_XFER_AM_CALL, &m);
    if (rc) {
        pd_free(c);
        return rc;
    }
    c->peer = p;
    uv_update_time(x->loop); /* uv_now is when this iteration began: maybe long ago */
    c->deadline_ms = uv_now(x->loop) + (uint64_t)(deadline_ms > 0 ? deadline_ms : 1);
    c->fn = fn;
    c->ctx = ctx;
    c->next = x->calls;
    x->calls = c;
    pd__xfer_kick(x); /* the run arms the timer of its deadline */
    return PD_OK;
}

int pd_xfer_answer(pd_xfer_peer_t *p, uint64_t call_id, int status, const char *text,
                   const void *reply, size_t len) {
    struct pd_xfer_ctl m = {.sender_id = p->x->id,
                            .call_id = call_id,
                            .status = status,
                            .body = status == PD_OK ? reply : NULL,
                            .len = status == PD_OK ? len : 0};
    snprintf(m.text, sizeof(m.text), "%s", status != PD_OK && text ? text : "");
    return post_ctl(p, PD_XFER_AM_ANSWER, &m);
}

static ucs_status_t on_ctl_am(pd_xfer_t *x, bool answer, void *data, size_t length,
                              const ucp_am_recv_param_t *param) {
    x->progress++;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        pd_warn("xfer: dropped a %zu-byte rendezvous %s (they go eager)", length,
                answer ? "answer" : "call");
        return UCS_OK;
    }
    struct ctl_msg *q = pd_malloc(sizeof(*q) + (length ? length : 1));
    if (!q) {
        pd_warn("xfer: no memory for a %zu-byte %s; dropped", length, answer ? "answer" : "call");
        return UCS_OK;
    }
    memcpy(q->bytes, data, length);
    q->len = length;
    if (pd_xfer_ctl_decode(q->bytes, length, answer, &q->m)) {
        pd_warn("xfer: dropped a malformed message: %s", pd_error_msg());
        pd_free(q);
        return UCS_OK;
    }
    q->m.answer = answer;
    q->next = NULL;
    *x->ctl_tail = q;
    x->ctl_tail = &q->next;
    return UCS_OK;
}

ucs_status_t pd__xfer_on_call_am(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param) {
    (void)header;
    (void)header_length;
    return on_ctl_am(arg, false, data, length, param);
}

ucs_status_t pd__xfer_on_answer_am(void *arg, const void *header, size_t header_length, void *data,
                                   size_t length, const ucp_am_recv_param_t *param) {
    (void)header;
    (void)header_length;
    return on_ctl_am(arg, true, data, length, param);
}

/* The peer a message came from: an endpoint of ours that is up, to the engine that sent it. */
static struct pd_xfer_peer *peer_of(pd_xfer_t *x, uint64_t sender) {
    for (struct pd_xfer_peer *p = x->peers; p; p = p->next)
        if (p->remote_id == sender && p->state == PEER_UP && !p->failed)
            return p;
    return NULL;
}

static void deliver(pd_xfer_t *x, struct ctl_msg *q) {
    const struct pd_xfer_ctl *m = &q->m;
    struct pd_xfer_peer *p = peer_of(x, m->sender_id);
    if (!m->answer) {
        if (!p) {
            /* nowhere to answer: the caller's deadline ends its wait */
            pd_warn("xfer: call %" PRIu64 " from %016" PRIx64 ", which is no peer of ours; "
                    "dropped",
                    m->call_id, m->sender_id);
        } else if (!x->cb.on_call) {
            if (pd_xfer_answer(p, m->call_id, PD_EUNSUPPORTED, "this engine serves no calls", NULL,
                               0))
                pd_warn("xfer: %s", pd_error_msg());
        } else {
            x->cb.on_call(x->cb.ctx, p, p->user, m);
        }
        return;
    }
    struct call **pp = &x->calls;
    while (*pp && !((*pp)->id == m->call_id && (*pp)->peer && (*pp)->peer == p))
        pp = &(*pp)->next;
    struct call *c = *pp;
    if (!c) {
        pd_debug("xfer: answer to call %" PRIu64 " from %016" PRIx64 ", which waits no more",
                 m->call_id, m->sender_id);
        return;
    }
    *pp = c->next;
    int rc = m->status == PD_OK ? PD_OK : pd_errorf(m->status, "%s", m->text);
    c->fn(c->ctx, rc, rc == PD_OK ? m->body : NULL, rc == PD_OK ? m->len : 0);
    pd_free(c);
}

bool pd__xfer_run_calls(pd_xfer_t *x) {
    bool changed = false;
    while (x->ctl_head) {
        struct ctl_msg *q = x->ctl_head;
        x->ctl_head = q->next;
        if (!x->ctl_head)
            x->ctl_tail = &x->ctl_head;
        deliver(x, q);
        pd_free(q);
        changed = true;
    }
    uint64_t now = uv_now(x->loop);
    for (struct call **pp = &x->calls; *pp;) {
        struct call *c = *pp;
        if (c->peer && now >= c->deadline_ms) {
            c->peer = NULL;
            c->timed_out = true;
        }
        if (c->peer) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        int rc =
            c->timed_out
                ? pd_errorf(PD_ETIMEDOUT, "call %" PRIu64 ": no answer within its deadline", c->id)
                : pd_errorf(c->status,
                            "call %" PRIu64 ": the endpoint to the peer closed before the "
                            "answer (%s)",
                            c->id, pd_status_str(c->status));
        c->fn(c->ctx, rc, NULL, 0);
        pd_free(c);
        changed = true;
    }
    return changed;
}

void pd__xfer_calls_peer_closed(pd_xfer_t *x, struct pd_xfer_peer *p) {
    for (struct call *c = x->calls; c; c = c->next)
        if (c->peer == p) {
            c->peer = NULL;
            c->status = p->close_status ? p->close_status : PD_EPEER;
        }
    for (struct ctl_send *s = x->ctl_sends; s; s = s->next)
        if (s->peer == p) {
            s->peer = NULL;
            x->n_ctl_sending--;
        }
}

bool pd__xfer_calls_waiting(const pd_xfer_t *x) {
    return x->calls != NULL || x->ctl_head != NULL;
}

uint64_t pd__xfer_calls_next_deadline(const pd_xfer_t *x) {
    uint64_t d = UINT64_MAX;
    for (const struct call *c = x->calls; c; c = c->next)
        if (c->peer && c->deadline_ms < d)
            d = c->deadline_ms;
    return d;
}

void pd__xfer_calls_free(pd_xfer_t *x) {
    while (x->ctl_head) {
        struct ctl_msg *q = x->ctl_head;
        x->ctl_head = q->next;
        pd_free(q);
    }
    x->ctl_tail = &x->ctl_head;
    while (x->ctl_sends) { /* the worker is gone: UCX reads none of them any more */
        struct ctl_send *s = x->ctl_sends;
        x->ctl_sends = s->next;
        pd_free(s);
    }
    PD_ASSERT(!x->calls); /* every call was answered when its peer closed */
}
