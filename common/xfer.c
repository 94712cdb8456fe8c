/*
 * xfer.c — the UCX transfer engine behind xfer.h.
 *
 * Owns: the ucp context and worker, the pool's memory handle and packed rkey, one endpoint per
 * peer, the room table, the ops UCX holds, and three libuv handles (a uv_poll_t on the worker's
 * event fd, a uv_timer_t that keeps progress going while requests are outstanding, a uv_idle_t
 * for "run again on the next loop iteration").
 *
 * Invariants: UCX callbacks never call the user and never post new operations — they only change
 * state and queue work; xfer_run() (from the poll, the timer or the idle handle) posts and calls
 * the user, so user callbacks may re-enter the engine freely. Every UCX request of ours carries an
 * op (not a room) as user_data: the op names its room by id and serial and owns the bytes UCX may
 * still read, so a room can end and be freed while UCX still holds requests of it. That matters
 * because UCX 1.13 does not always complete a request of a force-closed endpoint (seen: a room's
 * flush or notice on posix shared memory after the peer was SIGKILLed): a room that waited for
 * it would never end. A room of a failed peer ends only once the peer's endpoint is
 * force-closed. Any failed request on a peer force-closes that peer: after an unknown failure,
 * what landed where is unknown, and the closed endpoint is the only safe fence.
 *
 * Never a zero-delay uv timer re-armed from its own callback: libuv before 1.45 runs such a timer
 * again inside the same uv__run_timers() pass without updating the loop time, so an engine whose
 * ucp_worker_arm() keeps answering BUSY (as 1.13 does for a while after a shared-memory peer dies)
 * would starve the whole loop — signals and gRPC included. "Again soon" is the idle handle.
 */
#include "common/xfer.h"

#include <infiniband/verbs.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>

#include "common/base/alloc.h"
#include "common/devmem.h"
#include "common/base/log.h"
#include "common/base/status.h"

enum room_role { ROOM_SENDER, ROOM_RECEIVER };

enum op_kind { OP_DATA, OP_FLUSH, OP_NOTICE };

#define DATA_HDR_LEN 32          /* sender_id u64 | room u64 | index u32 | shard u32 | offset u64 */
#define POLL_AFTER_PROGRESS_MS 2 /* keep polling this long after UCX last made progress */
#define AM_CHUNK_MIN 4096        /* page bytes per message when the lane's limit is unknown */
#define AM_MSG_MAX 65535         /* bytes of one message, headers included (see xfer.h) */
#define NOTICE_WIRE_MAX                                                                            \
    (PD_XFER_NOTICE_WIRE_MIN + PD_XFER_ERROR_TEXT_MAX + 1 + 8 * PD_XFER_NOTICE_TOP_MAX)

/* One UCX request of ours. Lives until UCX completes the request (after a forced close maybe
 * never: then until the engine is freed); names its room by id + serial, never by pointer. */
struct op {
    struct op *prev, *next; /* x->ops while UCX holds it; x->free_ops (next only) otherwise */
    pd_xfer_t *x;
    uint64_t room;
    uint64_t serial;
    enum op_kind kind;
    int slot;          /* staging-ring slot whose bytes UCX reads (AM data), or -1 */
    uint32_t slot_gen; /* that slot's generation: a late completion never frees a reused slot */
    uint8_t buf[NOTICE_WIRE_MAX]; /* AM data header or notice wire: UCX may read it until done */
};

enum room_state {
    ROOM_LIVE,      /* sender: chunks may be posted; receiver: waiting for the notice */
    ROOM_FLUSHING,  /* sender: flush posted, notice next */
    ROOM_NOTIFYING, /* sender: notice posted */
    ROOM_ABORTING,  /* receiver: abort asked, waiting for the sender's failed notice */
    ROOM_ENDED,     /* on the end queue: on_room_end next, then freed */
};

struct room {
    uint64_t id;
    uint64_t serial;            /* engine-unique: ops of an older room with the same id miss */
    struct room *hnext;         /* hash chain */
    struct room *pprev, *pnext; /* peer's room list */
    struct room *qnext;         /* end queue or flushed queue */
    struct pd_xfer_peer *peer;
    void *user;
    enum room_role role;
    enum room_state state;
    int pending;                /* ops of this room UCX still holds */
    bool unflushed;             /* sender: puts posted since the last flush */
    bool flushed;               /* sender: flush completed, notice to post */
    bool has_notice;            /* receiver: `notice` holds the received notice */
    int status;                 /* status the room ends with */
    int notice_status;          /* receiver: what the notice says it ends with, once all in */
    uint64_t abort_deadline_ms; /* receiver, ROOM_ABORTING: loop time */
    uint32_t *dst;              /* [n_dst] receiver pool page indices, in the sender's order */
    uint32_t n_dst;
    uint64_t data_bytes;  /* sender: page bytes posted as AM; receiver: bytes in its pages
                             (device pool: whose host→device copies completed) */
    uint32_t staged_jobs; /* sender, staged: runs queued or in the ring, not yet posted */
    bool finish_wait;     /* sender, staged: finished; flush once staged_jobs reaches 0 */
    bool staged_drop;     /* sender, staged: aborted; its queued runs are dropped, not sent */
    bool ipc_posted;      /* sender, IPC peer: device copies enqueued for this room */
    bool ipc_waiting;     /* sender, IPC peer: an event after its copies is queued (ipc_waits) */
    /* receiver, device pool: bytes of its pages copied host→device that are not done yet; the
     * room ends (end_deferred) only once they are, so its pages are never reused under a copy */
    uint64_t recv_copying;
    bool end_deferred; /* ended (state ROOM_ENDED) but waits for recv_copying to reach 0 */
    struct pd_xfer_notice notice;
};

/* Staged GPU pages (device pool, UCX without CUDA memory): a run waits in the job queue, is
 * copied device→host into a free slot of the pinned ring on the transfer stream, and is posted
 * as active messages once the slot's event says the copy is done; the slot is reused when UCX
 * has sent every message of it. The copy of one slot overlaps the sends of the others. */
struct stage_job {
    uint64_t room, serial;
    uint32_t index;    /* the run's position in the room's page list */
    uint32_t src_page; /* the run's first page in our pool */
    uint32_t n;        /* pages; every shard's part goes into the slot, one after another */
};

enum slot_state { SLOT_FREE, SLOT_COPYING, SLOT_SENDING };

struct stage_slot {
    enum slot_state state;
    uint32_t gen;
    int pending; /* AM ops of this slot UCX holds */
    struct pd_xfer_peer *peer;
    struct stage_job job;
    struct pd_devmem_event *ev;
    char *buf; /* pinned host, slot_bytes */
};

/* The receive side of a device pool: each arriving data message is copied into the filling slot
 * of a pinned ring (eager data is only valid during the callback) and from there host→device on
 * the transfer stream. Consecutive messages of a run are consecutive in the slot and at the
 * destination, so their copies coalesce into one (rpend) of up to RECV_COPY_MAX bytes, enqueued
 * when the next message does not continue it, when it is that long, or before the ring is
 * polled — one copy and one event record per run and slot, not per 64 KiB message, since each
 * costs microseconds of CUDA API time. The slot's event is recorded after each. A message counts
 * for its room (data_bytes) only when its slot's event completed, so the room — whose end needs
 * every announced byte counted — never ends before its bytes are on the device. Slots are used in
 * ring order and the stream runs copies in order, so they complete oldest first. A slot keeps which
 * rooms its bytes belong to as spans (consecutive messages of one room merge into one). */
#define RECV_SPANS 64 /* rooms' spans per receive slot; a slot with all of them is sealed */
#define RECV_HELD 256 /* messages kept (UCX persistent data) while the receive ring is full */
#define RECV_COPY_MAX ((size_t)512 << 10) /* bytes: a coalesced copy is enqueued at this size */

struct recv_span {
    uint64_t room, serial;
    uint64_t bytes;
};

struct recv_slot {
    char *buf;   /* pinned host, rslot_bytes */
    size_t used; /* bytes */
    bool sealed; /* takes no more messages; freed once its event completed */
    bool failed; /* a copy from it could not be enqueued: its rooms fail */
    struct pd_devmem_event *ev;
    int n_spans;
    struct recv_span spans[RECV_SPANS];
};

/* A message kept while the ring was full: UCX's persistent data, released after its copy. */
struct recv_held {
    uint64_t room, serial;
    char *dst; /* device: where it goes */
    void *data;
    size_t len;
};

enum peer_state { PEER_UP, PEER_CLOSING, PEER_CLOSED };

struct pd_xfer_peer {
    pd_xfer_t *x;
    struct pd_xfer_peer *prev, *next;
    void *user;
    ucp_ep_h ep;
    ucp_rkey_h rkey[PD_XFER_SHARDS_MAX]; /* per shard; rkey[0] NULL: not a receiver of ours */
    uint64_t remote_id;
    uint64_t base[PD_XFER_SHARDS_MAX]; /* per shard, remote addresses */
    uint64_t page_bytes;
    uint32_t n_pages;
    enum peer_state state;
    bool failed;        /* UCX reported an endpoint error; handled in xfer_run */
    bool fail_reported; /* on_peer_failed called */
    int fail_status;
    int close_status;   /* rooms end with this */
    bool close_pending; /* ucp_ep_close_nbx request in flight */
    bool am_data;       /* pages go as active messages (lane without hardware RMA) */
    bool am_only;       /* its pool is staged GPU memory: no RMA into it, messages only */
    size_t am_chunk;    /* page bytes per active message: one eager fragment of the lane */
    /* the receiver's pool mapped here, per shard (CUDA IPC): pages are device copies; all or
     * none of the shards are mapped */
    void *ipc_base[PD_XFER_SHARDS_MAX];
    struct room *rooms;
    uint32_t n_rooms;
    char transport[112];
};

struct pd_xfer {
    uv_loop_t *loop;
    struct pd_xfer_callbacks cb;
    struct pd_xfer_config cfg;
    uint64_t id;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    uv_poll_t poll;
    uv_timer_t timer;
    uv_idle_t idle;
    int handles_open; /* uv handles not yet through their close callback */
    bool handles_closing;
    bool timer_armed;
    bool idle_armed;
    bool freeing;
    bool in_run;
    bool peer_failed_flag;     /* a peer failed during this progress round */
    uint64_t last_progress_ms; /* loop time UCX last made progress */

    void *worker_addr;
    size_t worker_addr_len;
    /* The pool: n_shards regions of shard_page_bytes * n_pages; a logical page is page_bytes =
     * n_shards * shard_page_bytes. memh[k] maps shard k, except on a staged pool, where
     * memh[0] is the ring (n_memh 1) and every shard hands out the ring's rkey. */
    ucp_mem_h memh[PD_XFER_SHARDS_MAX];
    int n_memh;
    void *rkey_buf[PD_XFER_SHARDS_MAX]; /* packed rkey of memh[k] */
    size_t rkey_len[PD_XFER_SHARDS_MAX];
    int n_shards;
    void *pool_bases[PD_XFER_SHARDS_MAX];
    size_t shard_page_bytes;
    size_t page_bytes;
    uint32_t n_pages;

    struct room **buckets;
    size_t n_buckets; /* power of two */
    uint32_t n_rooms;
    uint32_t n_unflushed; /* sender rooms with puts posted but not flushed */
    int outstanding;      /* ops of live rooms and endpoint closes UCX holds */
    uint64_t next_serial;
    struct op *ops; /* held by UCX */
    struct op *free_ops;
    uint64_t dropped_writes;
    struct room *flushed_head;
    struct room *end_head, **end_tail;
    struct pd_xfer_peer *peers;
    uint32_t n_peers;

    char tls[128];
    char net_devices[256];
    bool cuda_memory;
    bool rdma;

    /* device pool (pd_xfer_register_device_pool) */
    struct pd_devmem *dm; /* NULL: the pool is host memory */
    bool staged;          /* device pool that UCX cannot read: through the ring */
    void *ring;           /* pinned host; memh[0]/rkey_buf[0] above are the ring's */
    size_t slot_bytes;
    int n_slots;
    struct stage_slot *slots;
    struct stage_job *jobs; /* FIFO [jobs_head, jobs_head + n_jobs) mod jobs_cap */
    size_t jobs_cap, jobs_head, n_jobs;
    uint64_t staged_bytes; /* sender: bytes that went through the ring (tests, logs) */
    /* our device pool's export, per shard; ipc_len[0] 0: none (then for every shard) */
    uint8_t ipc_handle[PD_XFER_SHARDS_MAX][PD_DEVMEM_IPC_MAX];
    size_t ipc_len[PD_XFER_SHARDS_MAX];
    /* IPC copies: rooms waiting for the event recorded after their copies, in stream order */
    struct ipc_wait {
        uint64_t room, serial;
        struct pd_devmem_event *ev;
    } * ipc_waits;
    size_t ipc_cap, ipc_head, n_ipc;
    struct pd_devmem_event **free_evs;
    size_t n_free_evs, free_evs_cap;
    uint64_t ipc_bytes; /* sender: bytes copied through IPC mappings */
    /* receive ring (device pool; see struct recv_slot): slots [rhead, rhead + rcount) mod
     * n_rslots are in use, the last of them filling unless sealed */
    void *rring; /* pinned host, n_rslots * rslot_bytes; not registered with UCX */
    size_t rslot_bytes;
    int n_rslots, rhead, rcount;
    struct recv_slot *rslots;
    struct {
        struct recv_slot *slot; /* NULL: nothing pending */
        char *dst;              /* device */
        const char *src;        /* in slot */
        size_t len;
    } rpend;                /* the coalesced copy not yet enqueued (see struct recv_slot) */
    struct recv_held *held; /* FIFO [held_head, held_head + n_held) mod RECV_HELD */
    size_t held_head, n_held;
    uint64_t recv_copying;      /* bytes whose host→device copies are not done */
    uint64_t recv_staged_bytes; /* bytes whose copies completed */
    uint64_t recv_held_msgs;    /* messages kept because the ring was full */
    uint64_t recv_waits;        /* ring full, message not keepable: waited for the oldest slot */
};

static void recv_ring_free(pd_xfer_t *x);

/* ---- status translation: the one place ucs_status_t is interpreted ---- */

static int pd__ucs_error(ucs_status_t s, const char *doing) {
    int code;
    switch (s) {
    case UCS_OK: return PD_OK;
    case UCS_INPROGRESS: code = PD_EAGAIN; break;
    case UCS_ERR_NO_MEMORY: code = PD_ENOMEM; break;
    case UCS_ERR_INVALID_PARAM: code = PD_EINVAL; break;
    case UCS_ERR_UNSUPPORTED: code = PD_EUNSUPPORTED; break;
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_ELEM: code = PD_ENOENT; break;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT: code = PD_ETIMEDOUT; break;
    case UCS_ERR_CANCELED: code = PD_ECANCELED; break;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED: code = PD_EPEER; break;
    default: code = PD_EIO; break;
    }
    return pd_errorf(code, "%s: UCX: %s", doing, ucs_status_string(s));
}

/* ---- notice wire format ---- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Layout: magic u16 | sender_id u64 | room u64 | status i32 | first_token i32 | logprob f32 |
 * cached_tokens u32 | error_len u16 | data_bytes u64 | error bytes (no NUL) | when n_top > 0:
 * n_top u8 | n_top x (id i32 | logprob f32). */
#define NOTICE_MAGIC 0x5044u

size_t pd_xfer_notice_encode(const struct pd_xfer_notice *n, uint64_t sender_id, uint8_t *buf,
                             size_t cap) {
    size_t elen = strnlen(n->error, PD_XFER_ERROR_TEXT_MAX);
    uint32_t n_top = n->n_top < PD_XFER_NOTICE_TOP_MAX ? n->n_top : PD_XFER_NOTICE_TOP_MAX;
    size_t tlen = n_top ? 1 + 8 * (size_t)n_top : 0;
    if (cap < PD_XFER_NOTICE_WIRE_MIN + elen + tlen)
        return 0;
    uint32_t lp;
    memcpy(&lp, &n->first_logprob, sizeof(lp));
    put_u16(buf, NOTICE_MAGIC);
    put_u64(buf + 2, sender_id);
    put_u64(buf + 10, n->room);
    put_u32(buf + 18, (uint32_t)n->status);
    put_u32(buf + 22, (uint32_t)n->first_token);
    put_u32(buf + 26, lp);
    put_u32(buf + 30, n->cached_tokens);
    put_u16(buf + 34, (uint16_t)elen);
    put_u64(buf + 36, n->data_bytes);
    memcpy(buf + PD_XFER_NOTICE_WIRE_MIN, n->error, elen);
    uint8_t *t = buf + PD_XFER_NOTICE_WIRE_MIN + elen;
    if (n_top) {
        *t++ = (uint8_t)n_top;
        for (uint32_t k = 0; k < n_top; k++, t += 8) {
            uint32_t v;
            memcpy(&v, &n->top_logprobs[k], sizeof(v));
            put_u32(t, (uint32_t)n->top_ids[k]);
            put_u32(t + 4, v);
        }
    }
    return PD_XFER_NOTICE_WIRE_MIN + elen + tlen;
}

int pd_xfer_notice_decode(const void *buf, size_t len, struct pd_xfer_notice *n,
                          uint64_t *sender_id) {
    const uint8_t *p = buf;
    if (len < PD_XFER_NOTICE_WIRE_MIN)
        return pd_errorf(PD_EFORMAT, "room notice of %zu bytes, shorter than %d", len,
                         PD_XFER_NOTICE_WIRE_MIN);
    if (get_u16(p) != NOTICE_MAGIC)
        return pd_errorf(PD_EFORMAT, "room notice with bad magic 0x%04x", get_u16(p));
    size_t elen = get_u16(p + 34);
    size_t base = PD_XFER_NOTICE_WIRE_MIN + elen;
    uint32_t n_top = len > base ? p[base] : 0;
    if (elen > PD_XFER_ERROR_TEXT_MAX ||
        (len != base &&
         (n_top == 0 || n_top > PD_XFER_NOTICE_TOP_MAX || len != base + 1 + 8 * (size_t)n_top)))
        return pd_errorf(PD_EFORMAT,
                         "room notice length %zu disagrees with its text length %zu and %u top "
                         "logprobs",
                         len, elen, n_top);
    memset(n, 0, sizeof(*n));
    *sender_id = get_u64(p + 2);
    n->room = get_u64(p + 10);
    n->status = (int32_t)get_u32(p + 18);
    n->first_token = (int32_t)get_u32(p + 22);
    uint32_t lp = get_u32(p + 26);
    memcpy(&n->first_logprob, &lp, sizeof(lp));
    n->cached_tokens = get_u32(p + 30);
    n->data_bytes = get_u64(p + 36);
    memcpy(n->error, p + PD_XFER_NOTICE_WIRE_MIN, elen);
    n->error[elen] = '\0';
    n->n_top = n_top;
    for (uint32_t k = 0; k < n_top; k++) {
        const uint8_t *t = p + base + 1 + 8 * k;
        uint32_t v = get_u32(t + 4);
        n->top_ids[k] = (int32_t)get_u32(t);
        memcpy(&n->top_logprobs[k], &v, sizeof(v));
    }
    if (n->status > 0 || n->status < PD_EINTERNAL)
        n->status = PD_EPEER; /* an unknown failure is still a failure */
    return PD_OK;
}

/* ---- room table ---- */

static size_t room_hash(uint64_t id, size_t n_buckets) {
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (size_t)id & (n_buckets - 1);
}

static struct room *room_find(const pd_xfer_t *x, uint64_t id) {
    for (struct room *r = x->buckets[room_hash(id, x->n_buckets)]; r; r = r->hnext)
        if (r->id == id)
            return r;
    return NULL;
}

static int room_table_grow(pd_xfer_t *x) {
    size_t nb = x->n_buckets * 2;
    struct room **b = pd_calloc(nb, sizeof(*b));
    if (!b)
        return pd_error_wrap(PD_ENOMEM, "growing the room table to %zu buckets", nb);
    for (size_t i = 0; i < x->n_buckets; i++) {
        struct room *r = x->buckets[i];
        while (r) {
            struct room *next = r->hnext;
            size_t h = room_hash(r->id, nb);
            r->hnext = b[h];
            b[h] = r;
            r = next;
        }
    }
    pd_free(x->buckets);
    x->buckets = b;
    x->n_buckets = nb;
    return PD_OK;
}

static int room_new(pd_xfer_t *x, struct pd_xfer_peer *p, uint64_t id, enum room_role role,
                    void *user, struct room **out) {
    if (room_find(x, id))
        return pd_errorf(PD_EINVAL, "room %" PRIu64 " is already live", id);
    if (p->state != PEER_UP || p->failed)
        return pd_errorf(PD_EPEER, "room %" PRIu64 ": peer %016" PRIx64 " has failed", id,
                         p->remote_id);
    if (x->n_rooms + 1 > 2 * x->n_buckets) {
        int rc = room_table_grow(x);
        if (rc)
            return rc;
    }
    struct room *r = pd_calloc(1, sizeof(*r));
    if (!r)
        return pd_error_wrap(PD_ENOMEM, "room %" PRIu64, id);
    r->id = id;
    r->serial = ++x->next_serial;
    r->peer = p;
    r->user = user;
    r->role = role;
    r->state = ROOM_LIVE;
    size_t h = room_hash(id, x->n_buckets);
    r->hnext = x->buckets[h];
    x->buckets[h] = r;
    r->pnext = p->rooms;
    if (p->rooms)
        p->rooms->pprev = r;
    p->rooms = r;
    p->n_rooms++;
    x->n_rooms++;
    *out = r;
    return PD_OK;
}

static void room_end_queue(pd_xfer_t *x, struct room *r) {
    r->end_deferred = false;
    r->qnext = NULL;
    *x->end_tail = r;
    x->end_tail = &r->qnext;
}

/* Ends a room: no data for it is accepted any more, and it moves to the end queue (xfer_run
 * calls on_room_end and frees it) — for a receiver with host→device copies of its data still in
 * flight, only once they are done (recv_complete), since on_room_end hands its pages back. */
static void room_end(pd_xfer_t *x, struct room *r, int status) {
    if (r->state == ROOM_ENDED)
        return;
    if (r->unflushed) {
        r->unflushed = false;
        x->n_unflushed--;
    }
    r->state = ROOM_ENDED;
    r->status = status;
    if (r->recv_copying) {
        r->end_deferred = true;
        return;
    }
    room_end_queue(x, r);
}

static void room_unlink_and_free(pd_xfer_t *x, struct room *r) {
    struct room **pp = &x->buckets[room_hash(r->id, x->n_buckets)];
    while (*pp != r)
        pp = &(*pp)->hnext;
    *pp = r->hnext;
    struct pd_xfer_peer *p = r->peer;
    if (r->pprev)
        r->pprev->pnext = r->pnext;
    else
        p->rooms = r->pnext;
    if (r->pnext)
        r->pnext->pprev = r->pprev;
    p->n_rooms--;
    x->n_rooms--;
    x->outstanding -= r->pending; /* orphaned ops: UCX may complete them late, or never */
    pd_free(r->dst);
    pd_free(r);
}

/* ---- ops: what UCX holds ---- */

static struct op *op_new(pd_xfer_t *x, struct room *r, enum op_kind kind) {
    struct op *op = x->free_ops;
    if (op)
        x->free_ops = op->next;
    else if (!(op = pd_malloc(sizeof(*op))))
        return NULL;
    op->x = x;
    op->room = r->id;
    op->serial = r->serial;
    op->kind = kind;
    op->slot = -1;
    op->prev = NULL;
    op->next = x->ops;
    if (x->ops)
        x->ops->prev = op;
    x->ops = op;
    return op;
}

static void op_free(struct op *op) {
    pd_xfer_t *x = op->x;
    if (op->prev)
        op->prev->next = op->next;
    else
        x->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->next = x->free_ops;
    x->free_ops = op;
}

/* The op was posted and UCX returned a request: account it to its room until it completes. */
static void op_held(pd_xfer_t *x, struct room *r) {
    r->pending++;
    x->outstanding++;
}

/* A completed op's room, or NULL when that room has ended and is gone. */
static struct room *op_done(struct op *op) {
    pd_xfer_t *x = op->x;
    struct room *r = room_find(x, op->room);
    if (r && r->serial != op->serial)
        r = NULL;
    if (r) {
        r->pending--;
        x->outstanding--;
    }
    op_free(op);
    return r;
}

/* ---- UCX callbacks: state changes only ---- */

static void peer_mark_failed(struct pd_xfer_peer *p, int status) {
    if (!p->failed) {
        p->failed = true;
        p->fail_status = status;
        p->x->peer_failed_flag = true;
    }
}

static void peer_start_close(struct pd_xfer_peer *p, int status);

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st) {
    struct pd_xfer_peer *p = arg;
    int rc = pd__ucs_error(st, "endpoint to peer");
    pd_warn("xfer: peer %016" PRIx64 " endpoint failed: %s", p->remote_id, pd_error_msg());
    (void)ep;
    (void)rc;
    peer_mark_failed(p, PD_EPEER);
    /* Close now, not after this progress round: on a put lane, UCX 1.13's software RMA would
     * otherwise go on handling puts already buffered from the dead peer. on_peer_failed is still
     * reported from xfer_run. */
    peer_start_close(p, PD_EPEER);
}

static void on_data_sent(void *req, ucs_status_t st, void *user_data) {
    struct op *op = user_data;
    pd_xfer_t *x = op->x;
    if (op->slot >= 0 && x->slots[op->slot].gen == op->slot_gen &&
        --x->slots[op->slot].pending == 0 && x->slots[op->slot].state == SLOT_SENDING)
        x->slots[op->slot].state = SLOT_FREE;
    struct room *r = op_done(op);
    if (st != UCS_OK && r && !r->peer->failed) { /* one line per peer, not one per message */
        pd__ucs_error(st, "sending the room's pages");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        peer_mark_failed(r->peer, PD_EPEER);
    }
    ucp_request_free(req);
}

static void on_flush_done(void *req, ucs_status_t st, void *user_data) {
    struct room *r = op_done(user_data);
    if (!r) {
        /* its room ended with its peer */
    } else if (st == UCS_OK && r->state == ROOM_FLUSHING) {
        pd_xfer_t *x = r->peer->x;
        r->flushed = true;
        r->qnext = x->flushed_head;
        x->flushed_head = r;
    } else if (st != UCS_OK) {
        pd__ucs_error(st, "flushing the room's puts");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        peer_mark_failed(r->peer, PD_EPEER);
    }
    ucp_request_free(req);
}

static void on_notice_sent(void *req, ucs_status_t st, void *user_data) {
    struct room *r = op_done(user_data);
    if (!r) {
        /* its room ended with its peer */
    } else if (st == UCS_OK && r->state == ROOM_NOTIFYING) {
        room_end(r->peer->x, r, r->notice.status);
    } else if (st != UCS_OK) {
        pd__ucs_error(st, "sending the room's notice");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        peer_mark_failed(r->peer, PD_EPEER);
    }
    ucp_request_free(req);
}

static void on_ep_closed(void *req, ucs_status_t st, void *user_data) {
    struct pd_xfer_peer *p = user_data;
    p->x->outstanding--;
    p->close_pending = false;
    p->state = PEER_CLOSED;
    (void)st; /* a forced close reports nothing we can act on */
    ucp_request_free(req);
}

/* A receiving room that heard its notice ends once every byte the notice announces is in. */
static void room_try_complete(pd_xfer_t *x, struct room *r) {
    if (!r->has_notice || r->state == ROOM_ENDED)
        return;
    if (r->data_bytes == r->notice.data_bytes) {
        room_end(x, r, r->notice_status);
    } else if (r->data_bytes > r->notice.data_bytes) {
        pd_warn("xfer: room %" PRIu64 ": %" PRIu64
                " bytes of pages arrived, the notice says %" PRIu64,
                r->id, r->data_bytes, r->notice.data_bytes);
        room_end(x, r, PD_EFORMAT);
    }
}

/* ---- the receive ring (device pool): see struct recv_slot ---- */

/* The slot a message of len bytes for room r goes into, or NULL when the ring is full. */
static struct recv_slot *recv_slot_take(pd_xfer_t *x, const struct room *r, size_t len) {
    if (x->rcount > 0) {
        struct recv_slot *s = &x->rslots[(x->rhead + x->rcount - 1) % x->n_rslots];
        const struct recv_span *last = s->n_spans ? &s->spans[s->n_spans - 1] : NULL;
        bool merges = last && last->room == r->id && last->serial == r->serial;
        if (!s->sealed && s->used + len <= x->rslot_bytes && (merges || s->n_spans < RECV_SPANS))
            return s;
        s->sealed = true;
    }
    if (x->rcount == x->n_rslots)
        return NULL;
    struct recv_slot *s = &x->rslots[(x->rhead + x->rcount) % x->n_rslots];
    x->rcount++;
    s->used = 0;
    s->n_spans = 0;
    s->sealed = false;
    s->failed = false;
    return s;
}

/* Enqueues the coalesced copy and records its slot's event after it. A failure marks the slot
 * failed (its rooms fail when it is polled) after waiting for the stream, so that nothing of an
 * earlier copy lands after those rooms end. */
static void recv_flush(pd_xfer_t *x) {
    struct recv_slot *s = x->rpend.slot;
    if (!s)
        return;
    int rc = pd_devmem_copy_async(x->dm, x->rpend.dst, x->rpend.src, x->rpend.len);
    if (rc == PD_OK)
        rc = pd_devmem_event_record(x->dm, s->ev);
    if (rc) {
        pd_warn("xfer: receiving pages: %s; failing the rooms of the slot", pd_error_msg());
        s->failed = true;
        (void)pd_devmem_sync(x->dm);
    }
    x->rpend.slot = NULL;
    x->rpend.len = 0;
}

/* Copies a message into the ring and adds its host→device copy to dst to the pending one (see
 * struct recv_slot); it counts for the room once the copy is done. PD_EAGAIN: the ring is full
 * (nothing done). */
static int recv_copy(pd_xfer_t *x, struct room *r, char *dst, const void *data, size_t len) {
    struct recv_slot *s = recv_slot_take(x, r, len);
    if (!s)
        return PD_EAGAIN;
    char *buf = s->buf + s->used;
    memcpy(buf, data, len);
    if (x->rpend.slot == s && x->rpend.src + x->rpend.len == buf &&
        x->rpend.dst + x->rpend.len == dst) {
        x->rpend.len += len; /* the run goes on */
    } else {
        recv_flush(x);
        x->rpend.slot = s;
        x->rpend.dst = dst;
        x->rpend.src = buf;
        x->rpend.len = len;
    }
    s->used += len;
    struct recv_span *last = s->n_spans ? &s->spans[s->n_spans - 1] : NULL;
    if (last && last->room == r->id && last->serial == r->serial)
        last->bytes += len;
    else
        s->spans[s->n_spans++] = (struct recv_span){r->id, r->serial, len};
    r->recv_copying += len;
    x->recv_copying += len;
    if (x->rpend.len >= RECV_COPY_MAX)
        recv_flush(x);
    return PD_OK;
}

/* Slots whose copies are done count their bytes for their rooms and are reused, oldest first.
 * wait: the ring is full and a message cannot be kept — wait until the oldest slot is done
 * (bounded: one slot's copies) and free just that one. Returns true when a slot was freed. */
static bool recv_complete(pd_xfer_t *x, bool wait) {
    bool freed = false;
    recv_flush(x); /* the events must cover every copy of their slots */
    while (x->rcount > 0) {
        struct recv_slot *s = &x->rslots[x->rhead];
        int q = pd_devmem_event_query(x->dm, s->ev);
        for (int spins = 0; q == 0 && wait; spins++) {
            if (spins == 1000 && pd_devmem_sync(x->dm) != PD_OK) { /* then block, not spin */
                q = -1;
                break;
            }
            q = pd_devmem_event_query(x->dm, s->ev);
        }
        if (q == 0)
            break;
        if (q < 0)
            pd_warn("xfer: receiving pages: %s; failing the rooms of %d spans", pd_error_msg(),
                    s->n_spans);
        if (s->failed)
            q = -1;
        for (int i = 0; i < s->n_spans; i++) {
            const struct recv_span *sp = &s->spans[i];
            x->recv_copying -= sp->bytes;
            struct room *r = room_find(x, sp->room);
            if (!r || r->serial != sp->serial)
                continue; /* cannot be: a room with copies in flight does not end */
            r->recv_copying -= sp->bytes;
            if (r->state != ROOM_ENDED) {
                r->data_bytes += q > 0 ? sp->bytes : 0;
                x->recv_staged_bytes += q > 0 ? sp->bytes : 0;
                if (q < 0)
                    room_end(x, r, PD_EINTERNAL);
                else
                    room_try_complete(x, r);
            } else if (r->end_deferred && r->recv_copying == 0) {
                room_end_queue(x, r); /* every copy into its pages is done: they may go back */
            }
        }
        s->used = 0;
        s->n_spans = 0;
        s->sealed = false;
        x->rhead = (x->rhead + 1) % x->n_rslots;
        x->rcount--;
        freed = true;
        if (wait)
            break;
    }
    return freed;
}

/* Messages kept while the ring was full go in as it frees up; those of rooms that ended meanwhile
 * are dropped (their pages may be someone else's). */
static bool recv_drain_held(pd_xfer_t *x) {
    bool changed = false;
    while (x->n_held) {
        struct recv_held *h = &x->held[x->held_head];
        struct room *r = room_find(x, h->room);
        int rc = PD_OK;
        if (!r || r->serial != h->serial || r->state == ROOM_ENDED)
            x->dropped_writes++;
        else if ((rc = recv_copy(x, r, h->dst, h->data, h->len)) == PD_EAGAIN)
            break;
        if (rc) {
            pd_warn("xfer: room %" PRIu64 ": %s; failing the room", r->id, pd_error_msg());
            room_end(x, r, rc);
        }
        ucp_am_data_release(x->worker, h->data);
        x->held_head = (x->held_head + 1) % RECV_HELD;
        x->n_held--;
        changed = true;
    }
    return changed;
}

static bool run_recv(pd_xfer_t *x) {
    bool changed = recv_complete(x, false);
    return recv_drain_held(x) || changed;
}

/* A validated data message for room r into dst (device). Kept (UCS_INPROGRESS) when the ring is
 * full and UCX lets us keep it; else, when the ring is full, waits for its oldest slot. */
static ucs_status_t recv_data(pd_xfer_t *x, struct room *r, char *dst, void *data, size_t len,
                              const ucp_am_recv_param_t *param) {
    if (len > x->rslot_bytes) { /* never from our sender: its messages are one eager fragment */
        x->dropped_writes++;
        pd_warn("xfer: room %" PRIu64 ": a page-data message of %zu bytes, more than a receive "
                "slot of %zu; failing the room",
                r->id, len, x->rslot_bytes);
        room_end(x, r, PD_ERANGE);
        return UCS_OK;
    }
    /* kept messages go first: a message that overtook them could starve them */
    int rc = x->n_held ? PD_EAGAIN : recv_copy(x, r, dst, data, len);
    if (rc == PD_EAGAIN && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) &&
        x->n_held < RECV_HELD) {
        x->held[(x->held_head + x->n_held) % RECV_HELD] =
            (struct recv_held){r->id, r->serial, dst, data, len};
        x->n_held++;
        x->recv_held_msgs++;
        return UCS_INPROGRESS; /* released by recv_drain_held */
    }
    if (rc == PD_EAGAIN) {
        /* The eager data is gone after this callback: wait for the oldest slot (its copies were
         * enqueued before, so this is bounded by one slot of copies), then take it. */
        while ((rc = recv_copy(x, r, dst, data, len)) == PD_EAGAIN) {
            x->recv_waits++;
            recv_complete(x, true);
            if (r->state == ROOM_ENDED) { /* a failed copy ended it meanwhile */
                x->dropped_writes++;
                return UCS_OK;
            }
        }
    }
    if (rc) {
        pd_warn("xfer: room %" PRIu64 ": %s; failing the room", r->id, pd_error_msg());
        room_end(x, r, rc);
    }
    return UCS_OK;
}

static ucs_status_t on_notice_am(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param) {
    pd_xfer_t *x = arg;
    (void)header;
    (void)header_length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        pd_warn("xfer: dropped a %zu-byte rendezvous room notice (notices are small)", length);
        return UCS_OK;
    }
    struct pd_xfer_notice n;
    uint64_t sender;
    if (pd_xfer_notice_decode(data, length, &n, &sender)) {
        pd_warn("xfer: dropped a room notice: %s", pd_error_msg());
        return UCS_OK;
    }
    struct room *r = room_find(x, n.room);
    if (!r || r->role != ROOM_RECEIVER || r->state == ROOM_ENDED || r->has_notice) {
        pd_debug("xfer: room %" PRIu64 ": notice for a room not live here, ignored", n.room);
        return UCS_OK;
    }
    if (r->peer->remote_id != sender) {
        pd_warn("xfer: room %" PRIu64 ": notice from %016" PRIx64 ", expected %016" PRIx64
                ", ignored",
                n.room, sender, r->peer->remote_id);
        return UCS_OK;
    }
    r->notice = n;
    r->has_notice = true;
    r->notice_status = n.status;
    room_try_complete(x, r);
    return UCS_OK;
}

bool pd_xfer_data_fits(const uint32_t *dst, uint32_t n_dst, int n_shards, uint64_t pb,
                       uint32_t shard, uint32_t index, uint64_t off, size_t length) {
    if (length == 0 || pb == 0)
        return false;
    uint64_t first = index + off / pb; /* room positions written: first .. last */
    uint64_t last = index + (off + length - 1) / pb;
    bool ok = shard < (uint32_t)n_shards && index < n_dst && off < (uint64_t)n_dst * pb &&
              length <= (uint64_t)n_dst * pb && last < n_dst;
    for (uint64_t k = first; ok && k <= last; k++)
        ok = dst[k] == dst[index] + (k - index);
    return ok;
}

/* Page data: accepted only for a live receiving room of the peer that sends it, and only into
 * that room's pages at the position the sender was given them; anything else is dropped. Never
 * answers (no reply message can meet a dead endpoint). A message is part of one shard's run: its
 * offset counts bytes of that shard's pages from the run's first (a shard's pages of a run are
 * contiguous, a logical page's shards are not), so it never straddles shards. */
static ucs_status_t on_data_am(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param) {
    pd_xfer_t *x = arg;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || header_length != DATA_HDR_LEN ||
        length == 0) {
        x->dropped_writes++;
        pd_warn("xfer: dropped a malformed page-data message (%zu + %zu bytes%s)", header_length,
                length, (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? ", rendezvous" : "");
        return UCS_OK;
    }
    const uint8_t *h = header;
    uint64_t sender = get_u64(h), room = get_u64(h + 8), off = get_u64(h + 24);
    uint32_t index = get_u32(h + 16), shard = get_u32(h + 20);
    struct room *r = room_find(x, room);
    if (!r || r->role != ROOM_RECEIVER || r->state == ROOM_ENDED) {
        x->dropped_writes++; /* late: the room ended, its pages may be someone else's now */
        pd_debug("xfer: room %" PRIu64 ": %zu bytes of pages for a room not live here, dropped",
                 room, length);
        return UCS_OK;
    }
    if (r->peer->remote_id != sender) {
        x->dropped_writes++;
        pd_warn("xfer: room %" PRIu64 ": pages from %016" PRIx64 ", expected %016" PRIx64
                ", dropped",
                room, sender, r->peer->remote_id);
        return UCS_OK;
    }
    const uint64_t pb = x->shard_page_bytes;
    if (!pd_xfer_data_fits(r->dst, r->n_dst, x->n_shards, pb, shard, index, off, length)) {
        x->dropped_writes++;
        pd_warn("xfer: room %" PRIu64 ": %zu bytes of shard %u at page position %u + %" PRIu64
                " do not fit the room's %u pages of %d shards; failing the room",
                room, length, shard, index, off, r->n_dst, x->n_shards);
        room_end(x, r, PD_ERANGE);
        return UCS_OK;
    }
    char *dst = (char *)x->pool_bases[shard] + (size_t)r->dst[index] * pb + off;
    if (x->dm)
        return recv_data(x, r, dst, data, length, param); /* counted once on the device */
    memcpy(dst, data, length);
    r->data_bytes += length;
    room_try_complete(x, r);
    return UCS_OK;
}

/* ---- the run step: progress, post deferred work, call the user ---- */

static void xfer_run(pd_xfer_t *x);

static void arm_timer(pd_xfer_t *x, bool again);

static void on_timer(uv_timer_t *t) {
    xfer_run(t->data);
}

static void on_idle(uv_idle_t *h) {
    pd_xfer_t *x = h->data;
    uv_idle_stop(h);
    x->idle_armed = false;
    xfer_run(x);
}

static void on_poll(uv_poll_t *h, int status, int events) {
    (void)status;
    (void)events;
    xfer_run(h->data);
}

static void kick(pd_xfer_t *x) {
    if (x->in_run || x->handles_closing || x->idle_armed)
        return;
    uv_idle_start(&x->idle, on_idle);
    x->idle_armed = true;
}

static void peer_start_close(struct pd_xfer_peer *p, int status) {
    if (p->state != PEER_UP)
        return;
    p->state = PEER_CLOSING;
    p->close_status = status;
    pd_info("xfer: peer %016" PRIx64 ": force-closing endpoint (%u rooms): %s", p->remote_id,
            p->n_rooms, pd_status_str(status));
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = on_ep_closed,
        .user_data = p,
    };
    ucs_status_ptr_t req = ucp_ep_close_nbx(p->ep, &prm);
    p->ep = NULL;
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        p->state = PEER_CLOSED;
    } else {
        p->close_pending = true;
        p->x->outstanding++;
    }
}

static void post_notice(pd_xfer_t *x, struct room *r) {
    r->state = ROOM_NOTIFYING;
    struct op *op = op_new(x, r, OP_NOTICE);
    if (!op) {
        pd_warn("xfer: room %" PRIu64 ": no memory for the notice; failing the peer", r->id);
        peer_mark_failed(r->peer, PD_ENOMEM);
        return;
    }
    r->notice.data_bytes = r->peer->am_data ? r->data_bytes : 0;
    size_t len = pd_xfer_notice_encode(&r->notice, x->id, op->buf, sizeof(op->buf));
    PD_ASSERT(len > 0);
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = on_notice_sent,
        .user_data = op,
    };
    ucs_status_ptr_t req =
        ucp_am_send_nbx(r->peer->ep, PD_XFER_AM_NOTICE, NULL, 0, op->buf, len, &prm);
    if (req == NULL) {
        op_free(op);
        room_end(x, r, r->notice.status);
    } else if (UCS_PTR_IS_ERR(req)) {
        op_free(op);
        pd__ucs_error(UCS_PTR_STATUS(req), "posting the room's notice");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        peer_mark_failed(r->peer, PD_EPEER);
    } else {
        op_held(x, r);
    }
}

static void post_flush(pd_xfer_t *x, struct room *r) {
    r->state = ROOM_FLUSHING;
    if (r->unflushed) {
        r->unflushed = false;
        x->n_unflushed--;
    }
    struct op *op = op_new(x, r, OP_FLUSH);
    if (!op) {
        pd_warn("xfer: room %" PRIu64 ": no memory for the flush; failing the peer", r->id);
        peer_mark_failed(r->peer, PD_ENOMEM);
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = on_flush_done,
        .user_data = op,
    };
    ucs_status_ptr_t req = ucp_ep_flush_nbx(r->peer->ep, &prm);
    if (req == NULL) {
        op_free(op);
        post_notice(x, r);
    } else if (UCS_PTR_IS_ERR(req)) {
        op_free(op);
        pd__ucs_error(UCS_PTR_STATUS(req), "flushing the room's puts");
        pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
        peer_mark_failed(r->peer, PD_EPEER);
    } else {
        op_held(x, r);
    }
}

static int send_run_am(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t shard,
                       const char *src, size_t bytes, int slot);

/* A sending room of a staged job, or NULL when it ended, its peer failed or it was aborted. */
static struct room *stage_room(pd_xfer_t *x, const struct stage_job *j) {
    struct room *r = room_find(x, j->room);
    if (!r || r->serial != j->serial || r->state == ROOM_ENDED || r->staged_drop ||
        r->peer->failed || r->peer->state != PEER_UP)
        return NULL;
    return r;
}

/* A run of a room is done with the ring (posted or dropped): a finished room flushes after its
 * last one. */
static void stage_job_done(pd_xfer_t *x, const struct stage_job *j) {
    struct room *r = room_find(x, j->room);
    if (!r || r->serial != j->serial || !r->staged_jobs)
        return;
    if (--r->staged_jobs == 0 && r->finish_wait && r->state == ROOM_LIVE) {
        r->finish_wait = false;
        post_flush(x, r);
    }
}

/* The ring's step: copied slots are posted, free slots take the next queued runs. */
static bool run_stage(pd_xfer_t *x) {
    bool changed = false;
    for (int i = 0; i < x->n_slots; i++) {
        struct stage_slot *sl = &x->slots[i];
        if (sl->state != SLOT_COPYING)
            continue;
        int q = pd_devmem_event_query(x->dm, sl->ev);
        if (q == 0)
            continue;
        changed = true;
        struct room *r = stage_room(x, &sl->job);
        sl->state = SLOT_FREE;
        if (q < 0) {
            pd_warn("xfer: room %" PRIu64 ": %s", sl->job.room, pd_error_msg());
            if (r)
                peer_mark_failed(r->peer, PD_EINTERNAL);
        } else if (r) {
            sl->state = SLOT_SENDING;
            sl->peer = r->peer;
            /* the slot holds the run shard after shard (see below) */
            size_t part = (size_t)sl->job.n * x->shard_page_bytes;
            int rc = PD_OK;
            for (int k = 0; k < x->n_shards && !rc; k++)
                rc = send_run_am(x, r, sl->job.index, (uint32_t)k, sl->buf + (size_t)k * part, part,
                                 i);
            if (rc) {
                pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
                peer_mark_failed(r->peer, rc == PD_ENOMEM ? PD_ENOMEM : PD_EPEER);
            }
            x->staged_bytes += part * (size_t)x->n_shards;
            if (sl->pending == 0) /* UCX took every message inline */
                sl->state = SLOT_FREE;
        }
        stage_job_done(x, &sl->job);
    }
    for (int i = 0; i < x->n_slots && x->n_jobs; i++) {
        struct stage_slot *sl = &x->slots[i];
        if (sl->state != SLOT_FREE)
            continue;
        while (x->n_jobs && sl->state == SLOT_FREE) {
            struct stage_job j = x->jobs[x->jobs_head];
            x->jobs_head = (x->jobs_head + 1) % x->jobs_cap;
            x->n_jobs--;
            changed = true;
            struct room *r = stage_room(x, &j);
            if (!r) {
                stage_job_done(x, &j);
                continue;
            }
            /* one copy per shard: shard k's part of the run at slot + k * part */
            size_t part = (size_t)j.n * x->shard_page_bytes;
            int rc = PD_OK;
            for (int k = 0; k < x->n_shards && !rc; k++)
                rc = pd_devmem_copy_async(x->dm, sl->buf + (size_t)k * part,
                                          (const char *)x->pool_bases[k] +
                                              (size_t)j.src_page * x->shard_page_bytes,
                                          part);
            if (!rc)
                rc = pd_devmem_event_record(x->dm, sl->ev);
            if (rc) {
                pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
                peer_mark_failed(r->peer, PD_EINTERNAL);
                stage_job_done(x, &j);
                continue;
            }
            sl->job = j;
            sl->gen++;
            sl->pending = 0;
            sl->state = SLOT_COPYING;
        }
    }
    return changed;
}

/* Records an event after the room's copies (everything enqueued so far) and queues the room:
 * its flush and notice go once the event completed. */
static int ipc_wait_push(pd_xfer_t *x, struct room *r) {
    if (r->ipc_waiting)
        return PD_OK; /* the event queued earlier covers every copy of the room */
    if (x->n_ipc == x->ipc_cap) {
        size_t cap = x->ipc_cap ? x->ipc_cap * 2 : 64;
        struct ipc_wait *w = pd_malloc(cap * sizeof(*w));
        if (!w)
            return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": waiting for copies", r->id);
        for (size_t k = 0; k < x->n_ipc; k++)
            w[k] = x->ipc_waits[(x->ipc_head + k) % x->ipc_cap];
        pd_free(x->ipc_waits);
        x->ipc_waits = w;
        x->ipc_cap = cap;
        x->ipc_head = 0;
    }
    struct pd_devmem_event *ev = NULL;
    int rc;
    if (x->n_free_evs)
        ev = x->free_evs[--x->n_free_evs];
    else if ((rc = pd_devmem_event_new(x->dm, &ev)) != PD_OK)
        return rc;
    if ((rc = pd_devmem_event_record(x->dm, ev)) != PD_OK) {
        pd_devmem_event_free(x->dm, ev);
        return rc;
    }
    x->ipc_waits[(x->ipc_head + x->n_ipc) % x->ipc_cap] =
        (struct ipc_wait){.room = r->id, .serial = r->serial, .ev = ev};
    x->n_ipc++;
    r->ipc_waiting = true;
    return PD_OK;
}

static void ipc_event_release(pd_xfer_t *x, struct pd_devmem_event *ev) {
    if (x->n_free_evs == x->free_evs_cap) {
        size_t cap = x->free_evs_cap ? x->free_evs_cap * 2 : 64;
        struct pd_devmem_event **f = pd_realloc(x->free_evs, cap * sizeof(*f));
        if (!f) {
            pd_devmem_event_free(x->dm, ev);
            return;
        }
        x->free_evs = f;
        x->free_evs_cap = cap;
    }
    x->free_evs[x->n_free_evs++] = ev;
}

/* Rooms whose copies are done post their flush + notice; one stream, so in queue order. */
static bool run_ipc(pd_xfer_t *x) {
    bool changed = false;
    while (x->n_ipc) {
        struct ipc_wait w = x->ipc_waits[x->ipc_head];
        int q = pd_devmem_event_query(x->dm, w.ev);
        if (q == 0)
            break;
        x->ipc_head = (x->ipc_head + 1) % x->ipc_cap;
        x->n_ipc--;
        ipc_event_release(x, w.ev);
        changed = true;
        struct room *r = room_find(x, w.room);
        if (!r || r->serial != w.serial || r->state == ROOM_ENDED)
            continue;
        r->ipc_waiting = false;
        if (q < 0) {
            pd_warn("xfer: room %" PRIu64 ": %s", r->id, pd_error_msg());
            peer_mark_failed(r->peer, PD_EINTERNAL);
        } else if (r->finish_wait && r->state == ROOM_LIVE && !r->peer->failed &&
                   r->peer->state == PEER_UP) {
            r->finish_wait = false;
            post_flush(x, r);
        }
    }
    return changed;
}

static void peer_free(pd_xfer_t *x, struct pd_xfer_peer *p) {
    if (p->prev)
        p->prev->next = p->next;
    else
        x->peers = p->next;
    if (p->next)
        p->next->prev = p->prev;
    x->n_peers--;
    for (int k = 0; k < PD_XFER_SHARDS_MAX; k++)
        if (p->rkey[k])
            ucp_rkey_destroy(p->rkey[k]);
    pd_free(p);
}

/* Handles failed and closed peers. Returns true when anything changed. */
static bool run_peers(pd_xfer_t *x) {
    bool changed = false;
    struct pd_xfer_peer *next;
    for (struct pd_xfer_peer *p = x->peers; p; p = next) {
        next = p->next;
        if (p->failed && !p->fail_reported) {
            p->fail_reported = true;
            changed = true;
            if (x->cb.on_peer_failed)
                x->cb.on_peer_failed(x->cb.ctx, p, p->user, p->fail_status);
            peer_start_close(p, p->fail_status);
        }
        if (p->state != PEER_CLOSED)
            continue;
        /* copies into its pool must be over before its rooms end (their pages get reused) */
        if (p->ipc_base[0]) {
            if (pd_devmem_sync(x->dm) != PD_OK)
                pd_warn("xfer: peer %016" PRIx64 ": %s", p->remote_id, pd_error_msg());
            for (int k = 0; k < x->n_shards; k++) {
                pd_devmem_ipc_close(x->dm, p->ipc_base[k]);
                p->ipc_base[k] = NULL;
            }
        }
        /* its endpoint is closed: UCX reads no slot of it any more */
        for (int i = 0; i < x->n_slots; i++)
            if (x->slots[i].peer == p && x->slots[i].state == SLOT_SENDING) {
                x->slots[i].state = SLOT_FREE;
                x->slots[i].pending = 0;
                x->slots[i].gen++;
            }
        /* The endpoint is gone: no write of ours or theirs through it can still land. Requests
         * UCX still holds for its rooms are orphaned (their ops name rooms by id). */
        for (struct room *r = p->rooms; r; r = r->pnext)
            if (r->state != ROOM_ENDED) {
                room_end(x, r, p->close_status);
                changed = true;
            }
        if (p->n_rooms == 0) {
            changed = true;
            void *user = p->user;
            peer_free(x, p);
            if (x->cb.on_peer_closed)
                x->cb.on_peer_closed(x->cb.ctx, p, user);
        }
    }
    return changed;
}

static void run_deadlines(pd_xfer_t *x) {
    uint64_t now = uv_now(x->loop);
    for (struct pd_xfer_peer *p = x->peers; p; p = p->next) {
        if (p->state != PEER_UP)
            continue;
        for (struct room *r = p->rooms; r; r = r->pnext) {
            if (r->state == ROOM_ABORTING && now >= r->abort_deadline_ms) {
                pd_warn("xfer: room %" PRIu64 ": no abort acknowledgement from peer %016" PRIx64
                        " in %d ms; force-closing it",
                        r->id, p->remote_id, x->cfg.abort_timeout_ms);
                peer_start_close(p, PD_ETIMEDOUT);
                break;
            }
        }
    }
}

static bool any_aborting(const pd_xfer_t *x) {
    for (struct pd_xfer_peer *p = x->peers; p; p = p->next)
        for (struct room *r = p->rooms; r; r = r->pnext)
            if (r->state == ROOM_ABORTING)
                return true;
    return false;
}

static void close_handles(pd_xfer_t *x);

static void xfer_run(pd_xfer_t *x) {
    if (x->in_run || x->handles_closing)
        return;
    x->in_run = true;
    unsigned progressed = 0;
    for (int round = 0; round < 64; round++) {
        /* Bounded: a worker that always has something to do must not starve the loop. */
        for (int i = 0; i < 256; i++) {
            unsigned n = ucp_worker_progress(x->worker);
            progressed += n;
            if (!n || x->peer_failed_flag) /* handle a failure before anything else arrives */
                break;
        }
        x->peer_failed_flag = false;
        bool changed = false;
        while (x->flushed_head) {
            struct room *r = x->flushed_head;
            x->flushed_head = r->qnext;
            r->flushed = false;
            if (r->state == ROOM_FLUSHING && !r->peer->failed && r->peer->state == PEER_UP)
                post_notice(x, r);
            changed = true;
        }
        if (x->staged)
            changed |= run_stage(x);
        if (x->n_ipc)
            changed |= run_ipc(x);
        if (x->rcount || x->n_held)
            changed |= run_recv(x);
        run_deadlines(x);
        changed |= run_peers(x);
        /* The end queue: call the user, free the room (UCX holds ops, not rooms). */
        while (x->end_head) {
            struct room *r = x->end_head;
            x->end_head = r->qnext;
            if (!x->end_head)
                x->end_tail = &x->end_head;
            changed = true;
            uint64_t id = r->id;
            void *user = r->user;
            int status = r->status;
            struct pd_xfer_notice n = r->notice;
            bool has_notice = r->has_notice;
            room_unlink_and_free(x, r);
            if (x->cb.on_room_end)
                x->cb.on_room_end(x->cb.ctx, id, user, status, has_notice ? &n : NULL);
        }
        if (!changed)
            break;
    }
    /* While data streams, run again on the next loop iteration rather than arm the event fd and
     * sleep: an armed shared-memory worker makes the peer signal the next message it queues (a
     * syscall on each side, and a wake-up), and a sender whose FIFO is full has no event to
     * wait for at all, only the 1 ms timer. So poll for POLL_AFTER_PROGRESS_MS after the last
     * progress, yielding the CPU on empty rounds: on a machine where the peer shares our core
     * (two processes, busy machine) it gets to drain or refill the FIFO at once instead of at
     * the end of our time slice. Then arm; BUSY means events arrived meanwhile: go round again.
     * A spinning engine (bench) never sleeps while it has rooms. */
    uint64_t now = uv_now(x->loop);
    if (progressed > 0)
        x->last_progress_ms = now;
    bool polling =
        progressed == 0 && x->n_peers > 0 &&
        (now - x->last_progress_ms < POLL_AFTER_PROGRESS_MS || (x->cfg.spin && x->n_rooms > 0));
    if (polling)
        sched_yield();
    bool again = progressed > 0 || polling;
    ucs_status_t st = again ? UCS_OK : ucp_worker_arm(x->worker);
    x->in_run = false;
    if (x->freeing && x->n_peers == 0 && !x->end_head) {
        close_handles(x);
        return;
    }
    arm_timer(x, again || (st == UCS_ERR_BUSY && progressed > 0));
    if (st == UCS_ERR_BUSY && progressed == 0 && !x->timer_armed) {
        /* UCX says busy but had nothing to progress (1.13 does this for a while after a
         * shared-memory peer died): poll gently instead of spinning. */
        uv_timer_start(&x->timer, on_timer, 1, 0);
        x->timer_armed = true;
    }
}

/* again: run on the next loop iteration (the worker had more). Else a 1 ms timer while UCX holds
 * requests or rooms have unflushed puts, 50 ms while a receiver abort waits for its deadline,
 * nothing when idle (the event fd wakes us). */
static void arm_timer(pd_xfer_t *x, bool again) {
    bool busy = x->outstanding > 0 || x->n_unflushed > 0 || x->end_head || x->flushed_head ||
                x->n_jobs > 0 || x->n_ipc > 0 || x->rcount > 0 || x->n_held > 0;
    for (int i = 0; !busy && i < x->n_slots; i++)
        busy = x->slots[i].state == SLOT_COPYING;
    for (struct pd_xfer_peer *p = x->peers; !busy && p; p = p->next)
        busy = p->state != PEER_UP || (p->failed && !p->fail_reported);
    if (again || (busy && x->cfg.spin)) {
        kick(x);
    } else if (busy) {
        uv_timer_start(&x->timer, on_timer, 1, 0);
        x->timer_armed = true;
        return;
    } else if (any_aborting(x)) {
        uv_timer_start(&x->timer, on_timer, 50, 0);
        x->timer_armed = true;
        return;
    }
    if (x->timer_armed) {
        uv_timer_stop(&x->timer);
        x->timer_armed = false;
    }
}

/* ---- engine life ---- */

/* Checks --disaggregation-ib-device against libibverbs and builds UCX_NET_DEVICES from it. */
static int check_ib_devices(pd_xfer_t *x, const char *want, char *net, size_t net_cap) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    char present[256] = "";
    size_t used = 0;
    for (int i = 0; list && i < n; i++)
        used +=
            (size_t)snprintf(present + used, used < sizeof(present) ? sizeof(present) - used : 0,
                             "%s%s", i ? ", " : "", ibv_get_device_name(list[i]));
    if (!want || !*want) {
        x->rdma = n > 0;
        net[0] = '\0';
        if (list)
            ibv_free_device_list(list);
        return PD_OK;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", want);
    size_t off = 0;
    net[0] = '\0';
    int rc = PD_OK;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (int i = 0; list && i < n; i++)
            found |= strcmp(ibv_get_device_name(list[i]), tok) == 0;
        if (!found) {
            rc = pd_errorf(PD_ENOENT,
                           "--disaggregation-ib-device: no RDMA device '%s'; devices present: %s",
                           tok, n > 0 ? present : "none");
            break;
        }
        off += (size_t)snprintf(net + off, off < net_cap ? net_cap - off : 0, "%s%s:1",
                                off ? "," : "", tok);
    }
    if (list)
        ibv_free_device_list(list);
    x->rdma = rc == PD_OK;
    return rc;
}

static int config_set(ucp_config_t *c, const char *name, const char *value) {
    char env[64];
    snprintf(env, sizeof(env), "UCX_%s", name);
    if (getenv(env))
        return PD_OK; /* the operator's environment wins */
    ucs_status_t st = ucp_config_modify(c, name, value);
    if (st != UCS_OK)
        return pd__ucs_error(st, "setting UCX configuration");
    return PD_OK;
}

int pd_xfer_new(uv_loop_t *loop, const struct pd_xfer_config *cfg,
                const struct pd_xfer_callbacks *cb, pd_xfer_t **out) {
    int rc;
    ucs_status_t st;
    *out = NULL;
    pd_xfer_t *x = pd_calloc(1, sizeof(*x));
    if (!x)
        return pd_error_wrap(PD_ENOMEM, "creating the transfer engine");
    x->loop = loop;
    x->cb = *cb;
    if (cfg)
        x->cfg = *cfg;
    if (x->cfg.abort_timeout_ms <= 0)
        x->cfg.abort_timeout_ms = 5000;
    if (x->cfg.keepalive_ms <= 0)
        x->cfg.keepalive_ms = 1000;
    if (x->cfg.max_put_bytes == 0)
        x->cfg.max_put_bytes = (size_t)8 << 20;
    x->end_tail = &x->end_head;
    x->efd = -1;
    if (getrandom(&x->id, sizeof(x->id), 0) != (ssize_t)sizeof(x->id)) {
        rc = pd_errorf(PD_EIO, "drawing the transfer engine id");
        goto fail_alloc;
    }
    x->n_buckets = 64;
    x->buckets = pd_calloc(x->n_buckets, sizeof(*x->buckets));
    if (!x->buckets) {
        rc = pd_error_wrap(PD_ENOMEM, "creating the room table");
        goto fail_alloc;
    }

    char net[256];
    rc = check_ib_devices(x, x->cfg.ib_devices, net, sizeof(net));
    if (rc)
        goto fail_buckets;

    ucp_config_t *ucfg;
    st = ucp_config_read(NULL, NULL, &ucfg);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "reading UCX configuration");
        goto fail_buckets;
    }
    char ka[32];
    snprintf(ka, sizeof(ka), "%dms", x->cfg.keepalive_ms);
    if ((rc = config_set(ucfg, "KEEPALIVE_INTERVAL", ka)) ||
        (rc = config_set(ucfg, "MM_SEG_SIZE", PD_XFER_MM_SEG_SIZE)) ||
        (net[0] && (rc = config_set(ucfg, "NET_DEVICES", net)))) {
        ucp_config_release(ucfg);
        goto fail_buckets;
    }
    const char *tls = getenv("UCX_TLS");
    snprintf(x->tls, sizeof(x->tls), "%s", tls ? tls : "all");
    const char *nd = getenv("UCX_NET_DEVICES");
    snprintf(x->net_devices, sizeof(x->net_devices), "%s", nd ? nd : net[0] ? net : "all");
    if (!x->rdma)
        pd_warn("xfer: no RDMA device present; KV pages go over shared memory/TCP "
                "(UCX_TLS=%s)",
                x->tls);

    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    st = ucp_init(&params, ucfg, &x->ctx);
    ucp_config_release(ucfg);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "initializing UCX");
        goto fail_buckets;
    }
    ucp_context_attr_t cattr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    st = ucp_context_query(x->ctx, &cattr);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "querying the UCX context");
        goto fail_ctx;
    }
    x->cuda_memory = (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "creating the UCX worker");
        goto fail_ctx;
    }
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = PD_XFER_AM_NOTICE,
        .cb = on_notice_am,
        .arg = x,
    };
    st = ucp_worker_set_am_recv_handler(x->worker, &ap);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "registering the room notice handler");
        goto fail_worker;
    }
    ap.id = PD_XFER_AM_DATA;
    ap.cb = on_data_am;
    st = ucp_worker_set_am_recv_handler(x->worker, &ap);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "registering the page data handler");
        goto fail_worker;
    }
    ucp_address_t *addr;
    st = ucp_worker_get_address(x->worker, &addr, &x->worker_addr_len);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "getting the UCX worker address");
        goto fail_worker;
    }
    x->worker_addr = pd_malloc(x->worker_addr_len);
    if (!x->worker_addr) {
        ucp_worker_release_address(x->worker, addr);
        rc = pd_error_wrap(PD_ENOMEM, "copying the UCX worker address");
        goto fail_worker;
    }
    memcpy(x->worker_addr, addr, x->worker_addr_len);
    ucp_worker_release_address(x->worker, addr);
    st = ucp_worker_get_efd(x->worker, &x->efd);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "getting the UCX worker event fd");
        goto fail_addr;
    }
    int urc = uv_poll_init(loop, &x->poll, x->efd);
    if (urc) {
        rc = pd_errorf(pd_status_from_errno(-urc), "watching the UCX event fd: %s",
                       uv_strerror(urc));
        goto fail_addr;
    }
    x->poll.data = x;
    uv_timer_init(loop, &x->timer);
    x->timer.data = x;
    uv_idle_init(loop, &x->idle);
    x->idle.data = x;
    x->handles_open = 3;
    uv_poll_start(&x->poll, UV_READABLE, on_poll);
    ucp_worker_arm(x->worker);
    pd_info("xfer: engine %016" PRIx64 " up: UCX %s, UCX_TLS=%s, net devices %s, CUDA memory %s",
            x->id, ucp_get_version_string(), x->tls, x->net_devices,
            x->cuda_memory ? "yes" : "no (host-only UCX: GPU pages need CUDA IPC or staging)");
    *out = x;
    return PD_OK;

fail_addr:
    pd_free(x->worker_addr);
fail_worker:
    ucp_worker_destroy(x->worker);
fail_ctx:
    ucp_cleanup(x->ctx);
fail_buckets:
    pd_free(x->buckets);
fail_alloc:
    pd_free(x);
    return rc;
}

static void on_handle_closed(uv_handle_t *h) {
    pd_xfer_t *x = h->data;
    if (--x->handles_open > 0)
        return;
    for (int k = 0; k < x->n_memh; k++) {
        ucp_rkey_buffer_release(x->rkey_buf[k]);
        ucp_mem_unmap(x->ctx, x->memh[k]);
    }
    for (size_t k = 0; k < x->n_held; k++) /* UCX's: back before the worker goes */
        ucp_am_data_release(x->worker, x->held[(x->held_head + k) % RECV_HELD].data);
    ucp_worker_destroy(x->worker); /* no callback can come after this */
    recv_ring_free(x);
    for (int i = 0; x->slots && i < x->n_slots; i++)
        pd_devmem_event_free(x->dm, x->slots[i].ev);
    pd_free(x->slots);
    pd_free(x->jobs);
    if (x->ring)
        pd_devmem_host_free(x->dm, x->ring); /* the devmem outlives the engine (xfer.h) */
    for (size_t k = 0; k < x->n_ipc; k++)
        pd_devmem_event_free(x->dm, x->ipc_waits[(x->ipc_head + k) % x->ipc_cap].ev);
    for (size_t k = 0; k < x->n_free_evs; k++)
        pd_devmem_event_free(x->dm, x->free_evs[k]);
    pd_free(x->ipc_waits);
    pd_free(x->free_evs);
    ucp_cleanup(x->ctx);
    for (struct op *op = x->ops, *next; op; op = next) {
        next = op->next;
        pd_free(op);
    }
    for (struct op *op = x->free_ops, *next; op; op = next) {
        next = op->next;
        pd_free(op);
    }
    pd_free(x->worker_addr);
    pd_free(x->buckets);
    pd_free(x);
}

static void close_handles(pd_xfer_t *x) {
    if (x->handles_closing)
        return;
    x->handles_closing = true;
    uv_poll_stop(&x->poll);
    uv_timer_stop(&x->timer);
    uv_idle_stop(&x->idle);
    uv_close((uv_handle_t *)&x->poll, on_handle_closed);
    uv_close((uv_handle_t *)&x->timer, on_handle_closed);
    uv_close((uv_handle_t *)&x->idle, on_handle_closed);
}

void pd_xfer_free(pd_xfer_t *x) {
    if (!x || x->freeing)
        return;
    x->freeing = true;
    for (struct pd_xfer_peer *p = x->peers; p; p = p->next)
        peer_start_close(p, PD_ECANCELED);
    if (x->in_run)
        return; /* xfer_run finishes the job */
    xfer_run(x);
}

uint64_t pd_xfer_id(const pd_xfer_t *x) {
    return x->id;
}

void pd_xfer_get_info(const pd_xfer_t *x, struct pd_xfer_info *out) {
    out->transports = x->tls;
    out->net_devices = x->net_devices;
    out->cuda_memory = x->cuda_memory;
    out->rdma = x->rdma;
    out->live_rooms = x->n_rooms;
    out->live_peers = x->n_peers;
    out->pool_pages = x->n_pages;
    out->page_bytes = x->page_bytes;
    out->n_shards = x->n_shards;
    out->shard_page_bytes = x->shard_page_bytes;
    out->dropped_writes = x->dropped_writes;
    out->staged = x->staged;
    out->staged_bytes = x->staged_bytes;
    out->ipc_bytes = x->ipc_bytes;
    out->recv_staged_bytes = x->recv_staged_bytes;
    out->recv_copying_bytes = x->recv_copying;
    out->recv_held = x->recv_held_msgs;
    out->recv_waits = x->recv_waits;
}

/* A pool's shape, checked before anything is mapped. */
static int pool_check(void *const *bases, int n_shards, size_t shard_page_bytes, uint32_t n_pages) {
    if (n_shards < 1 || n_shards > PD_XFER_SHARDS_MAX)
        return pd_errorf(PD_EINVAL, "registering the KV pool: %d shards, not 1 .. %d", n_shards,
                         PD_XFER_SHARDS_MAX);
    if (!bases || shard_page_bytes == 0 || n_pages == 0)
        return pd_errorf(PD_EINVAL, "registering the KV pool: empty pool");
    if (shard_page_bytes > SIZE_MAX / n_pages / (size_t)n_shards)
        return pd_errorf(PD_EINVAL,
                         "registering the KV pool: %d shards of %u pages of %zu bytes overflow",
                         n_shards, n_pages, shard_page_bytes);
    for (int k = 0; k < n_shards; k++)
        if (!bases[k])
            return pd_errorf(PD_EINVAL, "registering the KV pool: shard %d has no memory", k);
    return PD_OK;
}

static void pool_take(pd_xfer_t *x, void *const *bases, int n_shards, size_t shard_page_bytes,
                      uint32_t n_pages) {
    x->n_shards = n_shards;
    for (int k = 0; k < n_shards; k++)
        x->pool_bases[k] = bases[k];
    x->shard_page_bytes = shard_page_bytes;
    x->page_bytes = shard_page_bytes * (size_t)n_shards;
    x->n_pages = n_pages;
}

/* Maps regions [bases[k], bases[k] + bytes) for k < n into memh[k] (CUDA memory when cuda) and
 * packs their rkeys; all or none. `what` names the memory in errors. */
static int map_regions(pd_xfer_t *x, void *const *bases, int n, size_t bytes, bool cuda,
                       const char *what) {
    int k, rc = PD_OK;
    char doing[128];
    for (k = 0; k < n; k++) {
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            .address = bases[k],
            .length = bytes,
        };
        if (cuda) {
            mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
            mp.memory_type = UCS_MEMORY_TYPE_CUDA;
        }
        ucs_status_t st = ucp_mem_map(x->ctx, &mp, &x->memh[k]);
        if (st != UCS_OK) {
            if (n > 1)
                snprintf(doing, sizeof(doing), "registering %s (shard %d of %d) with UCX", what, k,
                         n);
            else
                snprintf(doing, sizeof(doing), "registering %s with UCX", what);
            rc = pd__ucs_error(st, doing);
            break;
        }
        st = ucp_rkey_pack(x->ctx, x->memh[k], &x->rkey_buf[k], &x->rkey_len[k]);
        if (st != UCS_OK) {
            snprintf(doing, sizeof(doing), "packing the rkey of %s", what);
            rc = pd__ucs_error(st, doing);
            ucp_mem_unmap(x->ctx, x->memh[k]);
            break;
        }
    }
    if (rc) {
        while (k-- > 0) {
            ucp_rkey_buffer_release(x->rkey_buf[k]);
            ucp_mem_unmap(x->ctx, x->memh[k]);
        }
        memset(x->memh, 0, sizeof(x->memh));
        memset(x->rkey_buf, 0, sizeof(x->rkey_buf));
        memset(x->rkey_len, 0, sizeof(x->rkey_len));
        return rc;
    }
    x->n_memh = n;
    return PD_OK;
}

int pd_xfer_register_pool(pd_xfer_t *x, void *base, size_t page_bytes, uint32_t n_pages) {
    return pd_xfer_register_pool_shards(x, &base, 1, page_bytes, n_pages);
}

int pd_xfer_register_pool_shards(pd_xfer_t *x, void *const *bases, int n_shards,
                                 size_t shard_page_bytes, uint32_t n_pages) {
    PD_ASSERT(!x->n_memh && !x->dm);
    int rc = pool_check(bases, n_shards, shard_page_bytes, n_pages);
    if (rc)
        return rc;
    rc = map_regions(x, bases, n_shards, shard_page_bytes * n_pages, false, "the KV pool");
    if (rc)
        return rc;
    pool_take(x, bases, n_shards, shard_page_bytes, n_pages);
    if (n_shards == 1)
        pd_info("xfer: KV pool registered: %u pages of %zu bytes at %p", n_pages, shard_page_bytes,
                bases[0]);
    else
        pd_info("xfer: KV pool registered: %u pages of %d shards x %zu bytes (shard 0 at %p)",
                n_pages, n_shards, shard_page_bytes, bases[0]);
    return PD_OK;
}

/* The receive ring of a device pool: as many slots as the send ring, each at least one page and
 * one largest message, with the events and the kept-message queue: nothing per message later. */
static int recv_ring_new(pd_xfer_t *x, struct pd_devmem *dm, size_t page_bytes) {
    size_t want = x->cfg.stage_slot_bytes ? x->cfg.stage_slot_bytes : (size_t)4 << 20;
    want = want < page_bytes ? page_bytes : want;
    x->rslot_bytes = want < AM_MSG_MAX + 1 ? AM_MSG_MAX + 1 : want;
    x->n_rslots = x->cfg.stage_slots > 0 ? x->cfg.stage_slots : 4;
    x->rslots = pd_calloc((size_t)x->n_rslots, sizeof(*x->rslots));
    x->held = pd_malloc(RECV_HELD * sizeof(*x->held));
    int rc = PD_OK;
    if (!x->rslots || !x->held) {
        rc = pd_error_wrap(PD_ENOMEM, "the receive ring");
        goto fail;
    }
    for (int i = 0; i < x->n_rslots; i++)
        if ((rc = pd_devmem_event_new(dm, &x->rslots[i].ev)) != PD_OK)
            goto fail;
    if ((rc = pd_devmem_host_alloc(dm, x->rslot_bytes * (size_t)x->n_rslots, &x->rring)) != PD_OK)
        goto fail;
    for (int i = 0; i < x->n_rslots; i++)
        x->rslots[i].buf = (char *)x->rring + x->rslot_bytes * (size_t)i;
    x->dm = dm;
    return PD_OK;
fail:
    x->dm = dm;
    recv_ring_free(x);
    x->dm = NULL;
    return rc;
}

/* After the worker is gone or before it saw the ring; the devmem is still there. */
static void recv_ring_free(pd_xfer_t *x) {
    for (int i = 0; x->rslots && i < x->n_rslots; i++)
        pd_devmem_event_free(x->dm, x->rslots[i].ev);
    if (x->rring)
        pd_devmem_host_free(x->dm, x->rring);
    pd_free(x->rslots);
    pd_free(x->held);
    x->rslots = NULL;
    x->held = NULL;
    x->rring = NULL;
    x->n_rslots = x->rcount = x->rhead = 0;
    x->n_held = 0;
}

int pd_xfer_register_device_pool(pd_xfer_t *x, void *base, size_t page_bytes, uint32_t n_pages,
                                 struct pd_devmem *dm, bool ucx_direct) {
    return pd_xfer_register_device_pool_shards(x, &base, 1, page_bytes, n_pages, dm, ucx_direct);
}

int pd_xfer_register_device_pool_shards(pd_xfer_t *x, void *const *bases, int n_shards,
                                        size_t shard_page_bytes, uint32_t n_pages,
                                        struct pd_devmem *dm, bool ucx_direct) {
    PD_ASSERT(!x->n_memh && !x->dm);
    int rc = pool_check(bases, n_shards, shard_page_bytes, n_pages);
    if (rc)
        return rc;
    if (!dm)
        return pd_errorf(PD_EINVAL, "registering the GPU KV pool: no device");
    const size_t page_bytes = shard_page_bytes * (size_t)n_shards; /* one logical page */
    if ((rc = recv_ring_new(x, dm, page_bytes)) != PD_OK)
        return rc;
    if (ucx_direct) {
        if (!x->cuda_memory)
            return pd_errorf(PD_EUNSUPPORTED, "registering the GPU KV pool with UCX: this UCX "
                                              "does not support CUDA memory");
        rc = map_regions(x, bases, n_shards, shard_page_bytes * n_pages, true, "the GPU KV pool");
        if (rc) {
            recv_ring_free(x);
            return rc;
        }
    } else {
        /* the ring: enough slots that copies and sends overlap; a slot holds at least a logical
         * page (every shard of it) */
        size_t want = x->cfg.stage_slot_bytes ? x->cfg.stage_slot_bytes : (size_t)4 << 20;
        x->slot_bytes = want < page_bytes ? page_bytes : want / page_bytes * page_bytes;
        x->n_slots = x->cfg.stage_slots > 0 ? x->cfg.stage_slots : 4;
        x->jobs_cap = 1024;
        x->slots = pd_calloc((size_t)x->n_slots, sizeof(*x->slots));
        x->jobs = pd_malloc(x->jobs_cap * sizeof(*x->jobs));
        if (!x->slots || !x->jobs) {
            rc = pd_error_wrap(PD_ENOMEM, "the staging ring");
            goto fail_ring;
        }
        x->dm = dm; /* event_free below needs it */
        for (int i = 0; i < x->n_slots; i++)
            if ((rc = pd_devmem_event_new(dm, &x->slots[i].ev)) != PD_OK)
                goto fail_ring;
        if ((rc = pd_devmem_host_alloc(dm, x->slot_bytes * (size_t)x->n_slots, &x->ring)) != PD_OK)
            goto fail_ring;
        for (int i = 0; i < x->n_slots; i++)
            x->slots[i].buf = (char *)x->ring + x->slot_bytes * (size_t)i;
        if ((rc = map_regions(x, &x->ring, 1, x->slot_bytes * (size_t)x->n_slots, false,
                              "the staging ring")) != PD_OK)
            goto fail_ring;
        x->staged = true;
    }
    x->dm = dm;
    pool_take(x, bases, n_shards, shard_page_bytes, n_pages);
    for (int k = 0; k < n_shards; k++) {
        if (pd_devmem_ipc_export(dm, bases[k], x->ipc_handle[k], &x->ipc_len[k]) != PD_OK) {
            pd_info("xfer: the GPU KV pool%s is not exported for same-node copies: %s",
                    n_shards > 1 ? " (a shard of it)" : "", pd_error_msg());
            memset(x->ipc_len, 0, sizeof(x->ipc_len)); /* all shards or none */
            break;
        }
    }
    if (x->staged)
        pd_info("xfer: GPU KV pool (%s): %u pages of %d x %zu bytes, staged through a pinned "
                "ring of %d x %zu bytes",
                pd_devmem_name(dm), n_pages, n_shards, shard_page_bytes, x->n_slots, x->slot_bytes);
    else
        pd_info("xfer: GPU KV pool (%s) registered with UCX: %u pages of %d x %zu bytes",
                pd_devmem_name(dm), n_pages, n_shards, shard_page_bytes);
    return PD_OK;

fail_ring:
    for (int i = 0; x->slots && i < x->n_slots; i++)
        pd_devmem_event_free(dm, x->slots[i].ev);
    if (x->ring)
        pd_devmem_host_free(dm, x->ring);
    pd_free(x->slots);
    pd_free(x->jobs);
    x->slots = NULL;
    x->jobs = NULL;
    x->ring = NULL;
    x->n_slots = 0;
    recv_ring_free(x);
    x->dm = NULL;
    return rc;
}

void pd_xfer_local_ipc(const pd_xfer_t *x, const void **handle, size_t *len) {
    *handle = x->ipc_len[0] ? x->ipc_handle[0] : NULL;
    *len = x->ipc_len[0];
}

void pd_xfer_local_address(const pd_xfer_t *x, const void **addr, size_t *len) {
    *addr = x->worker_addr;
    *len = x->worker_addr_len;
}

void pd_xfer_local_rkey(const pd_xfer_t *x, const void **rkey, size_t *len, uint64_t *base) {
    *rkey = x->n_memh ? x->rkey_buf[0] : NULL;
    *len = x->n_memh ? x->rkey_len[0] : 0;
    *base = (uint64_t)(uintptr_t)x->pool_bases[0];
}

void pd_xfer_local_peer_info(const pd_xfer_t *x, struct pd_xfer_peer_info *out) {
    memset(out, 0, sizeof(*out));
    out->remote_id = x->id;
    out->worker_addr = x->worker_addr;
    out->worker_addr_len = x->worker_addr_len;
    if (!x->n_memh)
        return;
    out->page_bytes = x->page_bytes;
    out->n_pages = x->n_pages;
    out->n_shards = x->n_shards;
    out->shard_page_bytes = x->shard_page_bytes;
    out->am_only = x->staged; /* the rkeys below are the ring's: no put may use them */
    for (int k = 0; k < x->n_shards; k++) {
        int m = x->staged ? 0 : k; /* a staged pool hands out the ring's rkey for every shard */
        out->shards[k] = (struct pd_xfer_shard){
            .rkey = x->rkey_buf[m],
            .rkey_len = x->rkey_len[m],
            .base = (uint64_t)(uintptr_t)x->pool_bases[k],
            .ipc_handle = x->ipc_len[k] ? x->ipc_handle[k] : NULL,
            .ipc_handle_len = x->ipc_len[k],
        };
    }
    out->rkey = out->shards[0].rkey;
    out->rkey_len = out->shards[0].rkey_len;
    out->base = out->shards[0].base;
    out->ipc_handle = out->shards[0].ipc_handle;
    out->ipc_handle_len = out->shards[0].ipc_handle_len;
}

/* Names the lanes UCX picked out of ucp_ep_print_info (1.13 has no endpoint transport query),
 * e.g. "rc_mlx5/mlx5_0:1", and decides how pages travel to a receiver: puts where a lane has
 * hardware RMA, else active messages ("tcp/lo (am)"), since UCX would only emulate the puts. */
static void peer_find_transport(struct pd_xfer_peer *p) {
    snprintf(p->transport, sizeof(p->transport), "unknown");
    p->am_data = p->rkey[0] && p->x->cfg.data_path != PD_XFER_DATA_PUT; /* unless RMA lane */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    size_t used = 0, eager_max = 0;
    bool hw_rma = false;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        /* "#    am_send: 0..<egr/short>..93..<egr/bcopy>..65600..<rndv>..(inf)": the largest
         * message that still goes eager in one fragment */
        char *am = strstr(line, "am_send:");
        for (char *e = am ? strstr(am, "<egr/") : NULL; e; e = strstr(e + 1, "<egr/")) {
            char *dots = strstr(e, ">..");
            if (dots && dots[3] >= '0' && dots[3] <= '9')
                eager_max = strtoull(dots + 3, NULL, 10);
        }
        /* "#                 lane[0]:  0:tcp/lo.0 md[0]    -> md[0]/tcp/sysdev[255] am am_bw#0" */
        char *lane = strstr(line, "lane[");
        char *colon = lane ? strstr(lane, "]:") : NULL;
        char *tl = colon ? strchr(colon + 2, ':') : NULL;
        if (!tl)
            continue;
        tl++;
        size_t n = strcspn(tl, " ");
        if (n > 2 && tl[n - 2] == '.') /* drop the ".0" path index */
            n -= 2;
        char *arrow = strstr(tl, "->");
        hw_rma |= arrow && (strstr(arrow, " rma") != NULL);
        if (used + n + 2 < sizeof(p->transport))
            used += (size_t)snprintf(p->transport + used, sizeof(p->transport) - used, "%s%.*s",
                                     used ? "+" : "", (int)n, tl);
    }
    free(buf); /* open_memstream's buffer comes from the C library */
    /* Page data per message: the configured size, else one eager fragment of the lane less room
     * for UCX's and our headers (a larger message would be fragmented and reassembled by UCX:
     * one more copy). */
    p->am_chunk = p->x->cfg.am_chunk_bytes;
    if (eager_max > AM_MSG_MAX)
        eager_max = AM_MSG_MAX;
    if (p->am_chunk == 0)
        p->am_chunk = eager_max > AM_CHUNK_MIN + 128 ? (eager_max - 128) & ~(size_t)63
                                                     : AM_CHUNK_MIN; /* 64-byte aligned copies */
    if (p->am_chunk > ((AM_MSG_MAX - 128) & ~(size_t)63))
        p->am_chunk = (AM_MSG_MAX - 128) & ~(size_t)63; /* a configured one, too */
    if (!p->rkey[0])
        return;
    enum pd_xfer_data_path dp = p->x->cfg.data_path;
    p->am_data = dp == PD_XFER_DATA_AM || (dp == PD_XFER_DATA_AUTO && !(used && hw_rma));
    if (p->x->staged || p->am_only) /* GPU pages through a pinned ring (ours or the peer's) */
        p->am_data = true;
    if (p->ipc_base[0]) /* device copies into the peer's mapped pool; UCX carries the notice */
        p->am_data = false;
    if (p->ipc_base[0])
        snprintf(p->transport + used, sizeof(p->transport) - used,
                 " (notice only; GPU pages by CUDA IPC device copies)");
    else if (!p->am_data)
        snprintf(p->transport + used, sizeof(p->transport) - used, " (put)");
    else
        snprintf(p->transport + used, sizeof(p->transport) - used, " (am of %zu bytes%s)",
                 p->am_chunk,
                 p->x->staged ? "; GPU pages staged through pinned host memory"
                 : p->am_only ? "; the peer stages its GPU pages through pinned host memory"
                 : hw_rma     ? ""
                              : "; UCX has only sw-rma here");
}

/* The remote pool's shards as info describes them (one shard: the single-pool fields). */
static int peer_info_shards(const struct pd_xfer_peer_info *info, struct pd_xfer_shard *sh, int *n,
                            uint64_t *shard_page_bytes) {
    if (info->n_shards <= 1) {
        sh[0] = (struct pd_xfer_shard){.rkey = info->rkey,
                                       .rkey_len = info->rkey_len,
                                       .base = info->base,
                                       .ipc_handle = info->ipc_handle,
                                       .ipc_handle_len = info->ipc_handle_len};
        *n = 1;
    } else if (info->n_shards > PD_XFER_SHARDS_MAX) {
        return pd_errorf(PD_EINVAL, "connecting peer %016" PRIx64 ": %d pool shards, at most %d",
                         info->remote_id, info->n_shards, PD_XFER_SHARDS_MAX);
    } else {
        memcpy(sh, info->shards, (size_t)info->n_shards * sizeof(*sh));
        *n = info->n_shards;
    }
    *shard_page_bytes =
        info->shard_page_bytes ? info->shard_page_bytes : info->page_bytes / (uint64_t)*n;
    if (!sh[0].rkey_len)
        return PD_OK; /* not a receiver: no pool */
    if (*shard_page_bytes * (uint64_t)*n != info->page_bytes)
        return pd_errorf(PD_EINVAL,
                         "connecting peer %016" PRIx64 ": its pages of %" PRIu64
                         " bytes are not %d shards of %" PRIu64 " bytes",
                         info->remote_id, info->page_bytes, *n, *shard_page_bytes);
    for (int k = 1; k < *n; k++)
        if (!sh[k].rkey_len)
            return pd_errorf(PD_EINVAL, "connecting peer %016" PRIx64 ": shard %d has no rkey",
                             info->remote_id, k);
    return PD_OK;
}

int pd_xfer_peer_connect(pd_xfer_t *x, const struct pd_xfer_peer_info *info, void *peer_user,
                         pd_xfer_peer_t **out) {
    int rc;
    *out = NULL;
    if (x->freeing)
        return pd_errorf(PD_ECANCELED, "connecting a peer: the engine is shutting down");
    struct pd_xfer_shard sh[PD_XFER_SHARDS_MAX];
    int ns = 0;
    uint64_t spb = 0;
    if ((rc = peer_info_shards(info, sh, &ns, &spb)) != PD_OK)
        return rc;
    const bool receiver = sh[0].rkey_len != 0;
    if (receiver && !x->n_memh)
        return pd_errorf(PD_EINVAL, "connecting a receiver peer before registering our pool");
    if (receiver && info->page_bytes != x->page_bytes)
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its pages are %" PRIu64
                         " bytes, ours %zu",
                         info->remote_id, info->page_bytes, x->page_bytes);
    if (receiver && (ns != x->n_shards || spb != x->shard_page_bytes))
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its KV pool has %d shard%s of %" PRIu64
                         " bytes per page, ours %d of %zu (both sides must run the same tensor "
                         "parallelism: rank r's shard goes to rank r's)",
                         info->remote_id, ns, ns == 1 ? "" : "s", spb, x->n_shards,
                         x->shard_page_bytes);
    if (receiver && info->am_only && x->cfg.data_path == PD_XFER_DATA_PUT)
        return pd_errorf(PD_EMISMATCH,
                         "connecting peer %016" PRIx64 ": its KV pool is GPU memory staged "
                         "through host memory, which takes pages only as active messages, but "
                         "this engine is configured to send them as puts",
                         info->remote_id);
    struct pd_xfer_peer *p = pd_calloc(1, sizeof(*p));
    if (!p)
        return pd_error_wrap(PD_ENOMEM, "connecting peer %016" PRIx64, info->remote_id);
    p->x = x;
    p->am_only = receiver && info->am_only;
    p->user = peer_user;
    p->remote_id = info->remote_id;
    for (int k = 0; k < ns; k++)
        p->base[k] = sh[k].base;
    p->page_bytes = info->page_bytes;
    p->n_pages = info->n_pages;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = info->worker_addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = p},
    };
    ucs_status_t st = ucp_ep_create(x->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "connecting to the peer's UCX worker");
        goto fail_alloc;
    }
    for (int k = 0; receiver && k < ns; k++) {
        st = ucp_ep_rkey_unpack(p->ep, sh[k].rkey, &p->rkey[k]);
        if (st != UCS_OK) {
            char doing[96];
            snprintf(doing, sizeof(doing), "unpacking the rkey of the peer's KV pool shard %d", k);
            rc = pd__ucs_error(st, doing);
            goto fail_rkeys;
        }
    }
    bool ipc_all = receiver && x->dm && !x->cfg.disable_ipc;
    for (int k = 0; k < ns; k++)
        ipc_all &= sh[k].ipc_handle_len != 0;
    for (int k = 0; ipc_all && k < ns; k++) {
        if (pd_devmem_ipc_open(x->dm, sh[k].ipc_handle, sh[k].ipc_handle_len, &p->ipc_base[k]) !=
            PD_OK) {
            pd_info("xfer: peer %016" PRIx64 ": no CUDA IPC (%s); pages go over UCX",
                    info->remote_id, pd_error_msg());
            for (int j = 0; j < k; j++) /* all shards or none */
                pd_devmem_ipc_close(x->dm, p->ipc_base[j]);
            memset(p->ipc_base, 0, sizeof(p->ipc_base));
            break;
        }
    }
    peer_find_transport(p);
    p->next = x->peers;
    if (x->peers)
        x->peers->prev = p;
    x->peers = p;
    x->n_peers++;
    if (ns > 1)
        pd_info("xfer: peer %016" PRIx64 " connected (receiver, %d shards): data lane %s",
                p->remote_id, ns, p->transport);
    else
        pd_info("xfer: peer %016" PRIx64 " connected (%s): data lane %s", p->remote_id,
                receiver ? "receiver" : "sender", p->transport);
    *out = p;
    return PD_OK;

fail_rkeys:
    for (int k = 0; k < ns; k++)
        if (p->rkey[k])
            ucp_rkey_destroy(p->rkey[k]);
    {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t req = ucp_ep_close_nbx(p->ep, &prm);
        if (req && !UCS_PTR_IS_ERR(req))
            ucp_request_free(req); /* completes inside UCX; nothing of ours refers to it */
    }
fail_alloc:
    pd_free(p);
    return rc;
}

void pd_xfer_peer_close(pd_xfer_peer_t *p, int status) {
    if (!p)
        return;
    peer_start_close(p, status);
    kick(p->x);
}

const char *pd_xfer_peer_transport(const pd_xfer_peer_t *p) {
    return p->transport;
}
uint64_t pd_xfer_peer_remote_id(const pd_xfer_peer_t *p) {
    return p->remote_id;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Validates a room's page list against a pool of pool_pages and copies it. */
static int copy_pages(uint64_t room, const uint32_t *pages, uint32_t n, uint32_t pool_pages,
                      const char *whose, uint32_t **out) {
    for (uint32_t i = 0; i < n; i++)
        if (pages[i] >= pool_pages)
            return pd_errorf(PD_ERANGE,
                             "room %" PRIu64 ": destination page %u (entry %u) outside %s pool of "
                             "%u pages",
                             room, pages[i], i, whose, pool_pages);
    uint32_t *dst = pd_malloc((size_t)(n ? n : 1) * sizeof(*dst));
    uint32_t *sorted = pd_malloc((size_t)(n ? n : 1) * sizeof(*sorted));
    if (!dst || !sorted) {
        pd_free(dst);
        pd_free(sorted);
        return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": copying %u destination pages", room, n);
    }
    memcpy(dst, pages, (size_t)n * sizeof(*dst));
    memcpy(sorted, pages, (size_t)n * sizeof(*dst));
    qsort(sorted, n, sizeof(*sorted), cmp_u32);
    for (uint32_t i = 1; i < n; i++) {
        if (sorted[i] == sorted[i - 1]) {
            int rc = pd_errorf(PD_EINVAL, "room %" PRIu64 ": destination page %u listed twice",
                               room, sorted[i]);
            pd_free(dst);
            pd_free(sorted);
            return rc;
        }
    }
    pd_free(sorted);
    *out = dst;
    return PD_OK;
}

/* A new live room of `role` whose destination pages are dst_pages (checked against a pool of
 * pool_pages, `whose` naming it in errors). */
static int room_open(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, enum room_role role,
                     const uint32_t *dst_pages, uint32_t n, uint32_t pool_pages, const char *whose,
                     void *room_user) {
    uint32_t *dst;
    int rc = copy_pages(room, dst_pages, n, pool_pages, whose, &dst);
    if (rc)
        return rc;
    struct room *r;
    rc = room_new(x, p, room, role, room_user, &r);
    if (rc) {
        pd_free(dst);
        return rc;
    }
    r->dst = dst;
    r->n_dst = n;
    return PD_OK;
}

int pd_xfer_room_add(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, const uint32_t *dst_pages,
                     uint32_t n, void *room_user) {
    if (!p->rkey[0])
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": peer has no KV pool to write to", room);
    return room_open(x, p, room, ROOM_SENDER, dst_pages, n, p->n_pages, "the peer's", room_user);
}

static int room_get(const pd_xfer_t *x, uint64_t room, struct room **out) {
    struct room *r = room_find(x, room);
    if (!r || r->state == ROOM_ENDED)
        return pd_errorf(PD_ENOENT, "room %" PRIu64 " is not live", room);
    *out = r;
    return PD_OK;
}

/* Staged: the run waits for a ring slot (run_stage copies and posts it). */
static int stage_queue(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t src_page,
                       uint32_t n) {
    if (x->n_jobs == x->jobs_cap) {
        size_t cap = x->jobs_cap * 2;
        struct stage_job *jobs = pd_malloc(cap * sizeof(*jobs));
        if (!jobs)
            return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": queueing pages", r->id);
        for (size_t k = 0; k < x->n_jobs; k++)
            jobs[k] = x->jobs[(x->jobs_head + k) % x->jobs_cap];
        pd_free(x->jobs);
        x->jobs = jobs;
        x->jobs_cap = cap;
        x->jobs_head = 0;
    }
    x->jobs[(x->jobs_head + x->n_jobs) % x->jobs_cap] = (struct stage_job){
        .room = r->id, .serial = r->serial, .index = index, .src_page = src_page, .n = n};
    x->n_jobs++;
    r->staged_jobs++;
    return PD_OK;
}

/* One shard of a run as one put (hardware RMA lane): completion is observed through the room's
 * flush. */
static int send_run_put(pd_xfer_t *x, struct room *r, uint32_t shard, const char *src,
                        uint32_t dst_page, size_t bytes) {
    struct pd_xfer_peer *p = r->peer;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMH,
        .memh = x->memh[shard],
    };
    uint64_t raddr = p->base[shard] + (uint64_t)dst_page * x->shard_page_bytes;
    ucs_status_ptr_t req = ucp_put_nbx(p->ep, src, bytes, raddr, p->rkey[shard], &prm);
    if (UCS_PTR_IS_ERR(req))
        return pd__ucs_error(UCS_PTR_STATUS(req), "posting a put");
    if (req)
        ucp_request_free(req);
    return PD_OK;
}

/* One shard of a run as eager active messages of at most am_chunk_bytes, each naming the room,
 * the run's position in the room's page list, the shard and the byte offset from the run's
 * start in that shard: the receiver checks and copies. */
static int send_run_am(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t shard,
                       const char *src, size_t bytes, int slot) {
    const size_t chunk = r->peer->am_chunk;
    ucp_mem_h memh = x->staged ? x->memh[0] : x->memh[shard]; /* the ring, or the shard */
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t len = bytes - off < chunk ? bytes - off : chunk;
        struct op *op = op_new(x, r, OP_DATA);
        if (!op)
            return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": sending pages", r->id);
        if (slot >= 0) {
            op->slot = slot;
            op->slot_gen = x->slots[slot].gen;
        }
        put_u64(op->buf, x->id);
        put_u64(op->buf + 8, r->id);
        put_u32(op->buf + 16, index);
        put_u32(op->buf + 20, shard);
        put_u64(op->buf + 24, off);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMH,
            .flags = UCP_AM_SEND_FLAG_EAGER,
            .cb.send = on_data_sent,
            .user_data = op,
            .memh = memh,
        };
        ucs_status_ptr_t req = ucp_am_send_nbx(r->peer->ep, PD_XFER_AM_DATA, op->buf, DATA_HDR_LEN,
                                               src + off, len, &prm);
        if (UCS_PTR_IS_ERR(req)) {
            op_free(op);
            return pd__ucs_error(UCS_PTR_STATUS(req), "sending pages as active messages");
        }
        if (req) {
            op_held(x, r);
            if (slot >= 0)
                x->slots[slot].pending++;
        } else {
            op_free(op);
        }
        r->data_bytes += len;
    }
    return PD_OK;
}

/* One run of len pages, src_page.. → dst_page.. at room position index, every shard of it. */
static int send_run(pd_xfer_t *x, struct room *r, uint32_t index, uint32_t src_page,
                    uint32_t dst_page, uint32_t len) {
    struct pd_xfer_peer *p = r->peer;
    const size_t spb = x->shard_page_bytes, part = (size_t)len * spb;
    if (x->staged && !p->ipc_base[0])
        return stage_queue(x, r, index, src_page, len);
    int rc = PD_OK;
    for (int k = 0; k < x->n_shards && !rc; k++) {
        const char *src = (const char *)x->pool_bases[k] + (size_t)src_page * spb;
        if (p->ipc_base[0]) {
            rc = pd_devmem_copy_async(x->dm, (char *)p->ipc_base[k] + (size_t)dst_page * spb, src,
                                      part);
            r->ipc_posted = true;
            x->ipc_bytes += rc ? 0 : part;
        } else if (p->am_data) {
            rc = send_run_am(x, r, index, (uint32_t)k, src, part, -1);
        } else {
            rc = send_run_put(x, r, (uint32_t)k, src, dst_page, part);
        }
    }
    return rc;
}

int pd_xfer_room_send(pd_xfer_t *x, uint64_t room, uint32_t first, const uint32_t *src_pages,
                      uint32_t n) {
    struct room *r = NULL;
    int rc = room_get(x, room, &r);
    if (rc)
        return rc;
    if (r->role != ROOM_SENDER || r->state != ROOM_LIVE)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": not a sending room open for pages", room);
    if ((uint64_t)first + n > r->n_dst)
        return pd_errorf(PD_ERANGE, "room %" PRIu64 ": pages [%u, %u) beyond its %u destinations",
                         room, first, first + n, r->n_dst);
    for (uint32_t i = 0; i < n; i++)
        if (src_pages[i] >= x->n_pages)
            return pd_errorf(PD_ERANGE, "room %" PRIu64 ": source page %u outside our pool of %u",
                             room, src_pages[i], x->n_pages);
    struct pd_xfer_peer *p = r->peer;
    if (p->failed || p->state != PEER_UP)
        return pd_errorf(PD_EPEER, "room %" PRIu64 ": peer has failed", room);
    const uint32_t *dst = r->dst + first;
    /* Very long runs are split: puts of a few MiB (each shard's) pipeline better on the
     * transports measured; staged runs are at most one ring slot (every shard of them). */
    const bool to_ring = x->staged && !p->ipc_base[0];
    size_t max_bytes = p->ipc_base[0] ? SIZE_MAX : to_ring ? x->slot_bytes : x->cfg.max_put_bytes;
    size_t unit = to_ring ? x->page_bytes : x->shard_page_bytes;
    size_t fit = max_bytes / unit;
    uint32_t max_len = fit == 0 ? 1 : fit > UINT32_MAX ? UINT32_MAX : (uint32_t)fit;
    for (uint32_t i = 0; i < n;) {
        uint32_t len = 1;
        while (i + len < n && len < max_len && src_pages[i + len] == src_pages[i] + len &&
               dst[i + len] == dst[i] + len)
            len++;
        rc = send_run(x, r, first + i, src_pages[i], dst[i], len);
        if (rc) {
            pd_warn("xfer: room %" PRIu64 ": %s", room, pd_error_msg());
            peer_mark_failed(p, rc == PD_ENOMEM ? PD_ENOMEM : PD_EPEER);
            kick(x);
            return rc;
        }
        i += len;
    }
    if (!r->unflushed && n) {
        r->unflushed = true;
        x->n_unflushed++;
    }
    kick(x);
    return PD_OK;
}

static void set_notice(struct room *r, const struct pd_xfer_notice *n) {
    r->notice = *n;
    r->notice.room = r->id;
    r->notice.error[PD_XFER_ERROR_TEXT_MAX] = '\0';
}

int pd_xfer_room_finish(pd_xfer_t *x, uint64_t room, const struct pd_xfer_notice *n) {
    struct room *r = NULL;
    int rc = room_get(x, room, &r);
    if (rc)
        return rc;
    if (r->role != ROOM_SENDER || r->state != ROOM_LIVE || r->finish_wait)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": already finishing", room);
    if (r->peer->failed || r->peer->state != PEER_UP)
        return pd_errorf(PD_EPEER, "room %" PRIu64 ": peer has failed", room);
    set_notice(r, n);
    if (r->ipc_posted) { /* the notice follows the data: once the device copies are done */
        r->finish_wait = true;
        if ((rc = ipc_wait_push(x, r)) != PD_OK) {
            peer_mark_failed(r->peer, rc);
            kick(x);
            return rc;
        }
    } else if (r->staged_jobs) { /* ... once the ring posted every run */
        r->finish_wait = true;
    } else {
        post_flush(x, r);
    }
    kick(x);
    return PD_OK;
}

int pd_xfer_room_expect(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, const uint32_t *dst_pages,
                        uint32_t n, void *room_user) {
    return room_open(x, p, room, ROOM_RECEIVER, dst_pages, n, x->n_pages, "our", room_user);
}

int pd_xfer_room_release(pd_xfer_t *x, uint64_t room, int status) {
    struct room *r = NULL;
    int rc = room_get(x, room, &r);
    if (rc)
        return rc;
    if (r->role != ROOM_RECEIVER)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": only a receiving room is released", room);
    room_end(x, r, status);
    kick(x);
    return PD_OK;
}

int pd_xfer_room_abort(pd_xfer_t *x, uint64_t room, int status, const char *why) {
    struct room *r = NULL;
    int rc = room_get(x, room, &r);
    if (rc)
        return rc;
    if (status == PD_OK)
        status = PD_ECANCELED;
    if (r->role == ROOM_RECEIVER) {
        if (r->state == ROOM_LIVE) {
            r->state = ROOM_ABORTING;
            r->status = status;
            r->abort_deadline_ms = uv_now(x->loop) + (uint64_t)x->cfg.abort_timeout_ms;
            pd_info("xfer: room %" PRIu64 ": aborting (%s); waiting for the sender's flush", room,
                    why ? why : pd_status_str(status));
        }
        kick(x);
        return PD_OK;
    }
    struct pd_xfer_notice n = {.room = room, .status = status, .first_token = -1};
    snprintf(n.error, sizeof(n.error), "%s", why ? why : pd_status_str(status));
    switch (r->state) {
    case ROOM_LIVE:
        if (r->peer->failed || r->peer->state != PEER_UP)
            break; /* the peer's close ends it */
        set_notice(r, &n);
        if (r->ipc_posted) { /* copies into the peer's pages cannot be recalled: wait them out */
            r->finish_wait = true;
            if (ipc_wait_push(x, r) != PD_OK)
                peer_mark_failed(r->peer, PD_ENOMEM);
            break;
        }
        r->staged_drop = true; /* runs still queued or copying are not sent */
        r->finish_wait = false;
        post_flush(x, r);
        break;
    case ROOM_FLUSHING: set_notice(r, &n); break; /* the notice is not out yet: swap it */
    default: break;                               /* the notice is out; it stands */
    }
    pd_info("xfer: room %" PRIu64 ": aborted (%s)", room, n.error);
    kick(x);
    return PD_OK;
}

bool pd_xfer_room_live(const pd_xfer_t *x, uint64_t room) {
    const struct room *r = room_find(x, room);
    return r && r->state != ROOM_ENDED;
}
