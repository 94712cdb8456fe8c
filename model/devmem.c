/*
 * devmem.c — dispatch of devmem.h (pd_devmem_new is the registry's, model/backend_reg.c), and its
 * host implementation: "device" memory is host memory, copies are memcpy. In deferred mode a copy
 * is only queued, and every other event query runs the queue up to that event, so the transfer's
 * consumers are tested against copies that complete late (a reader that does not wait for its
 * event sees the old bytes).
 */
#include "model/devmem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/alloc.h"
#include "common/base/status.h"

void pd_devmem_free(struct pd_devmem *d) {
    if (d)
        d->ops->free(d);
}

const char *pd_devmem_name(const struct pd_devmem *d) {
    return d->name;
}

int pd_devmem_copy_async(struct pd_devmem *d, void *dst, const void *src, size_t bytes) {
    return bytes ? d->ops->copy_async(d, dst, src, bytes) : PD_OK;
}

int pd_devmem_copy2d_async(struct pd_devmem *d, void *dst, size_t dpitch, const void *src,
                           size_t spitch, size_t width, size_t height) {
    PD_ASSERT(width <= dpitch && width <= spitch);
    if (!width || !height)
        return PD_OK;
    if (width == dpitch && width == spitch && height <= SIZE_MAX / width) /* contiguous */
        return d->ops->copy_async(d, dst, src, width * height);
    return d->ops->copy2d_async(d, dst, dpitch, src, spitch, width, height);
}

int pd_devmem_copy(struct pd_devmem *d, void *dst, const void *src, size_t bytes) {
    return bytes ? d->ops->copy(d, dst, src, bytes) : PD_OK;
}

int pd_devmem_event_new(struct pd_devmem *d, struct pd_devmem_event **out) {
    return d->ops->event_new(d, out);
}

void pd_devmem_event_free(struct pd_devmem *d, struct pd_devmem_event *e) {
    if (e)
        d->ops->event_free(d, e);
}

int pd_devmem_event_record(struct pd_devmem *d, struct pd_devmem_event *e) {
    return d->ops->event_record(d, e);
}

int pd_devmem_event_query(struct pd_devmem *d, struct pd_devmem_event *e) {
    return d->ops->event_query(d, e);
}

int pd_devmem_host_alloc(struct pd_devmem *d, size_t bytes, void **out) {
    return d->ops->host_alloc(d, bytes, out);
}

void pd_devmem_host_free(struct pd_devmem *d, void *p) {
    if (p)
        d->ops->host_free(d, p);
}

int pd_devmem_sync(struct pd_devmem *d) {
    return d->ops->sync(d);
}

int pd_devmem_notify(struct pd_devmem *d, pd_devmem_done_fn fn, void *arg) {
    return d->ops->notify(d, fn, arg);
}

int pd_devmem_ipc_export(struct pd_devmem *d, void *base, uint8_t *handle, size_t *len) {
    return d->ops->ipc_export(d, base, handle, len);
}

int pd_devmem_ipc_open(struct pd_devmem *d, const uint8_t *handle, size_t len, void **base) {
    *base = NULL;
    return d->ops->ipc_open(d, handle, len, base);
}

int pd_devmem_host_stall(struct pd_devmem *d, bool stall) {
    if (!d->ops->host_stall || d->ops->host_stall(d, stall) != PD_OK)
        return pd_errorf(PD_EINVAL, "stalling copies: %s is not a deferred host devmem", d->name);
    return PD_OK;
}

void pd_devmem_ipc_close(struct pd_devmem *d, void *base) {
    if (base)
        d->ops->ipc_close(d, base);
}

/* ---- host implementation ---- */

struct host_copy { /* height rows of bytes; a 1-D copy is one row */
    void *dst;
    const void *src;
    size_t bytes;
    size_t dpitch, spitch, height;
    pd_devmem_done_fn fn; /* non-NULL: no copy but pd_devmem_notify's call, in stream order */
    void *arg;
};

static void host_copy_run(const struct host_copy *c) {
    if (c->fn) {
        c->fn(c->arg);
        return;
    }
    char *d = c->dst;
    const char *s = c->src;
    for (size_t i = 0; i < c->height; i++, d += c->dpitch, s += c->spitch)
        memcpy(d, s, c->bytes);
}

struct host_devmem {
    struct pd_devmem base;
    bool deferred;
    bool reverse;
    bool stalled;        /* tests: queries run nothing */
    struct host_copy *q; /* queued copies q[done - head_seq ..] */
    size_t q_len, q_cap, q_head;
    uint64_t enqueued, done;
    uint64_t queries;
};

struct pd_devmem_event {
    uint64_t target; /* host: copies that must be done */
};

static void host_run_one(struct host_devmem *h) {
    struct host_copy *c = &h->q[h->q_head++];
    host_copy_run(c);
    h->done++;
    if (h->q_head == h->q_len)
        h->q_head = h->q_len = 0;
}

static void host_free(struct pd_devmem *d) {
    struct host_devmem *h = (struct host_devmem *)d;
    while (h->q_head < h->q_len)
        host_run_one(h);
    pd_free(h->q);
    pd_free(h);
}

static int host_enqueue(struct host_devmem *h, const struct host_copy *c) {
    h->enqueued++;
    if (!h->deferred) { /* every earlier copy is done already */
        host_copy_run(c);
        h->done++;
        return PD_OK;
    }
    if (h->q_len == h->q_cap) {
        size_t cap = h->q_cap ? h->q_cap * 2 : 64;
        struct host_copy *q = pd_realloc(h->q, cap * sizeof(*q));
        if (!q) {
            h->enqueued--;
            return pd_error_wrap(PD_ENOMEM, "queueing a copy");
        }
        h->q = q;
        h->q_cap = cap;
    }
    h->q[h->q_len++] = *c;
    return PD_OK;
}

static int host_copy_async(struct pd_devmem *d, void *dst, const void *src, size_t bytes) {
    struct host_copy c = {
        .dst = dst, .src = src, .bytes = bytes, .dpitch = bytes, .spitch = bytes, .height = 1};
    return host_enqueue((struct host_devmem *)d, &c);
}

static int host_copy2d_async(struct pd_devmem *d, void *dst, size_t dpitch, const void *src,
                             size_t spitch, size_t width, size_t height) {
    struct host_copy c = {.dst = dst,
                          .src = src,
                          .bytes = width,
                          .dpitch = dpitch,
                          .spitch = spitch,
                          .height = height};
    return host_enqueue((struct host_devmem *)d, &c);
}

static int host_copy(struct pd_devmem *d, void *dst, const void *src, size_t bytes) {
    struct host_devmem *h = (struct host_devmem *)d;
    while (h->q_head < h->q_len) /* stream order: earlier copies first */
        host_run_one(h);
    memcpy(dst, src, bytes);
    return PD_OK;
}

static int host_event_new(struct pd_devmem *d, struct pd_devmem_event **out) {
    (void)d;
    *out = pd_calloc(1, sizeof(**out));
    return *out ? PD_OK : pd_error_wrap(PD_ENOMEM, "creating a copy event");
}

static void host_event_free(struct pd_devmem *d, struct pd_devmem_event *e) {
    (void)d;
    pd_free(e);
}

static int host_event_record(struct pd_devmem *d, struct pd_devmem_event *e) {
    e->target = ((struct host_devmem *)d)->enqueued;
    return PD_OK;
}

/* Runs the queued copies up to the target last-first (reverse mode), then the batch's notify
 * calls in their order: a call comes once the copies before it are done, whatever their order. */
static void host_run_reversed(struct host_devmem *h, uint64_t target) {
    size_t n = h->q_len - h->q_head;
    if (target - h->done < n)
        n = (size_t)(target - h->done);
    const struct host_copy *b = &h->q[h->q_head];
    for (size_t k = n; k-- > 0;)
        if (!b[k].fn)
            host_copy_run(&b[k]);
    for (size_t k = 0; k < n; k++)
        if (b[k].fn)
            host_copy_run(&b[k]);
    h->q_head += n;
    h->done += n;
    if (h->q_head == h->q_len)
        h->q_head = h->q_len = 0;
}

static int host_event_query(struct pd_devmem *d, struct pd_devmem_event *e) {
    struct host_devmem *h = (struct host_devmem *)d;
    /* every other query runs the queue up to the event: a first look always finds it pending */
    if (h->done < e->target && !h->stalled && (h->queries++ & 1)) {
        if (h->reverse)
            host_run_reversed(h, e->target);
        while (h->done < e->target && h->q_head < h->q_len)
            host_run_one(h);
    }
    return h->done >= e->target ? 1 : 0;
}

static int host_alloc(struct pd_devmem *d, size_t bytes, void **out) {
    (void)d;
    *out = pd_calloc(1, bytes);
    return *out ? PD_OK : pd_error_wrap(PD_ENOMEM, "staging buffer of %zu bytes", bytes);
}

static void host_host_free(struct pd_devmem *d, void *p) {
    (void)d;
    pd_free(p);
}

static int host_sync(struct pd_devmem *d) {
    struct host_devmem *h = (struct host_devmem *)d;
    while (h->q_head < h->q_len)
        host_run_one(h);
    return PD_OK;
}

static int host_notify(struct pd_devmem *d, pd_devmem_done_fn fn, void *arg) {
    struct host_copy c = {.fn = fn, .arg = arg};
    return host_enqueue((struct host_devmem *)d, &c);
}

/* "IPC" inside one process: the handle names the process and the address, and only that process
 * can open it (the transfer's IPC path runs on CPU machines in one-process tests). */
#define HOST_IPC_MAGIC 0x50444950u /* "PDIP" */

static int host_ipc_export(struct pd_devmem *d, void *base, uint8_t *handle, size_t *len) {
    (void)d;
    uint32_t magic = HOST_IPC_MAGIC, pid = (uint32_t)getpid();
    uint64_t addr = (uint64_t)(uintptr_t)base;
    memcpy(handle, &magic, 4);
    memcpy(handle + 4, &pid, 4);
    memcpy(handle + 8, &addr, 8);
    *len = 16;
    return PD_OK;
}

static int host_ipc_open(struct pd_devmem *d, const uint8_t *handle, size_t len, void **base) {
    (void)d;
    uint32_t magic, pid;
    uint64_t addr;
    if (len != 16)
        return pd_errorf(PD_EUNSUPPORTED, "not a host IPC handle (%zu bytes)", len);
    memcpy(&magic, handle, 4);
    memcpy(&pid, handle + 4, 4);
    memcpy(&addr, handle + 8, 8);
    if (magic != HOST_IPC_MAGIC || pid != (uint32_t)getpid())
        return pd_errorf(PD_EUNSUPPORTED, "host IPC handle of another process");
    *base = (void *)(uintptr_t)addr;
    return PD_OK;
}

static void host_ipc_close(struct pd_devmem *d, void *base) {
    (void)d;
    (void)base;
}

static int host_stall(struct pd_devmem *d, bool stall) {
    struct host_devmem *h = (struct host_devmem *)d;
    if (!h->deferred)
        return PD_EINVAL; /* copies run at once: nothing to hold */
    h->stalled = stall;
    return PD_OK;
}

static const struct pd_devmem_ops host_ops = {
    .free = host_free,
    .copy_async = host_copy_async,
    .copy2d_async = host_copy2d_async,
    .copy = host_copy,
    .event_new = host_event_new,
    .event_free = host_event_free,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .host_alloc = host_alloc,
    .host_free = host_host_free,
    .sync = host_sync,
    .notify = host_notify,
    .ipc_export = host_ipc_export,
    .ipc_open = host_ipc_open,
    .ipc_close = host_ipc_close,
    .host_stall = host_stall,
};

int pd__devmem_host_new(const struct pd_devmem_opts *o, struct pd_devmem **out) {
    struct host_devmem *h = pd_calloc(1, sizeof(*h));
    if (!h)
        return pd_error_wrap(PD_ENOMEM, "host device-memory");
    h->base.ops = &host_ops;
    h->deferred = o->host_deferred;
    h->reverse = o->host_deferred && o->host_reverse;
    snprintf(h->base.name, sizeof(h->base.name), "host%s",
             h->reverse    ? " (deferred, out of order)"
             : h->deferred ? " (deferred)"
                           : "");
    *out = &h->base;
    return PD_OK;
}
