/*
 * xfer_internal.h — the transfer engine's insides, shared by its files: xfer.c (the engine:
 * UCX context and worker, ops, UCX callbacks, the run step, pools, peers), xfer_rooms.c (the
 * room table and the room calls), xfer_send.c (posting runs, the staging ring, CUDA IPC, the
 * flush and the notice), xfer_recv.c (active messages in, the device pool's receive ring) and
 * xfer_notice.c (the notice's wire format). See xfer.c for the invariants all of them keep.
 * Internal to those files.
 */
#ifndef PD_XFER_INTERNAL_H
#define PD_XFER_INTERNAL_H

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
#include "model/devmem.h"
#include "common/base/log.h"
#include "common/base/status.h"

enum room_role { ROOM_SENDER, ROOM_RECEIVER };

enum op_kind { OP_DATA, OP_FLUSH, OP_NOTICE };

#define DATA_HDR_LEN 32 /* sender_id u64 | room u64 | index u32 | shard u32 | offset u64 */
#define POLL_AFTER_PROGRESS_US 200       /* keep polling this long after UCX last made progress */
#define SEND_POLL_AFTER_PROGRESS_US 2000 /* ... and this long while UCX holds our sends */
#define CALL_POLL_MS 100  /* progress at least this often while calls wait for answers */
#define AM_CHUNK_MIN 4096 /* page bytes per message when the lane's limit is unknown */
#define AM_MSG_MAX 65535  /* bytes of one message, headers included (see xfer.h) */
#define NOTICE_WIRE_MAX                                                                            \
    (PD_XFER_NOTICE_WIRE_MIN + PD_XFER_ERROR_TEXT_MAX + 1 + 8 * PD_XFER_NOTICE_TOP_MAX)

/* One 2-D copy of a run regrouped for a peer that splits the kv heads otherwise (xfer.h): the
 * heads [src_off, src_off + width) of each row of our shard src go to [dst_off, ...) of each row
 * of its shard dst (bytes within a row). */
struct regroup_copy {
    uint8_t src, dst;
    uint32_t src_off, dst_off, width;
};
#define REGROUP_COPIES_MAX (2 * PD_XFER_SHARDS_MAX * PD_XFER_SHARDS_MAX)
#define REGROUP_PIECES_MAX (2 * PD_XFER_SHARDS_MAX) /* of one destination shard's row */

/* A page-data message of a regrouped run from a host pool, packed by UCX's generic datatype
 * straight from our shards into its send buffer (xfer_heads.c): bytes [off, off + len) of the
 * destination shard's part of the run, whose row r is row r of our shards from page src_page on
 * (a shard's pages are consecutive rows). Self-contained (no pointer to the peer): UCX may pack it
 * until it completes. */
struct regroup_msg {
    const pd_xfer_t *x;
    uint32_t src_page;
    uint32_t src_pitch, dst_pitch; /* bytes of a row: of our shards, of the destination's */
    uint64_t off;
    size_t len;
    int n_pieces;
    struct regroup_copy pieces[REGROUP_PIECES_MAX]; /* of the destination shard, by dst_off */
};

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
    struct regroup_msg rg;        /* a regrouped message's source (UCX packs it until done) */
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
    /* it splits the kv heads otherwise than we do: every run goes through the staging ring,
     * regrouped into its shards' layout by these copies */
    bool regroup;
    int n_shards;              /* its pool's shards */
    uint64_t shard_page_bytes; /* one page of one of its shards */
    uint32_t dst_pitch;        /* bytes of one row of one of its shards */
    int n_copies;              /* by destination shard, then dst_off */
    struct regroup_copy copies[REGROUP_COPIES_MAX];
    int first_copy[PD_XFER_SHARDS_MAX + 1]; /* its shard j's are [first_copy[j], [j + 1]) */
    struct room *rooms;
    uint32_t n_rooms;
    char transport[160];
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
    uint64_t last_progress_us; /* uv_hrtime (µs) when UCX last made progress */

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
    struct pd_xfer_heads heads; /* rows_per_page 0: not described (pd_xfer_register_heads) */

    struct room **buckets;
    size_t n_buckets; /* power of two */
    uint32_t n_rooms;
    uint32_t n_unflushed; /* sender rooms with puts posted but not flushed */
    int outstanding;      /* ops of live rooms and endpoint closes UCX holds */
    uint64_t progress;    /* ops completed and messages received: /health's stall check */
    uint64_t next_serial;
    struct op *ops; /* held by UCX */
    struct op *free_ops;
    uint64_t dropped_writes;
    struct room *flushed_head;
    struct room *end_head, **end_tail;
    struct pd_xfer_peer *peers;
    uint32_t n_peers;
    /* calls (xfer_call.c): ours waiting for answers, messages received and not yet handed to
     * the user, and our messages UCX holds */
    struct call *calls;
    uint64_t next_call_id;
    struct ctl_msg *ctl_head, **ctl_tail;
    struct ctl_send *ctl_sends;
    uint32_t n_ctl_sending; /* of ctl_sends, those whose peer is not closed */

    char tls[128];
    char net_devices[256];
    bool cuda_memory;
    bool rdma;

    /* device pool (pd_xfer_register_device_pool) */
    struct pd_devmem *dm; /* NULL: the pool is host memory */
    bool staged;          /* device pool that UCX cannot read: through the ring */
    /* host pool: runs regrouped for a peer are packed by this UCX generic datatype straight
     * from the pool (xfer_heads.c); a device pool's go through the staging ring; 0: none yet */
    ucp_datatype_t regroup_dt;
    void *ring; /* pinned host; staged: memh[0]/rkey_buf[0] above are the ring's, else unmapped */
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

/* xfer.c */
void pd__xfer_kick(pd_xfer_t *x);
/* After an event record on x->dm: the loop runs again once the copies before it are done. */
void pd__xfer_wake_after_copies(pd_xfer_t *x);
int pd__xfer_map_regions(pd_xfer_t *x, void *const *bases, int n, size_t bytes, bool cuda,
                         const char *what);
void pd__xfer_on_data_sent(void *req, ucs_status_t st, void *user_data);
void pd__xfer_on_flush_done(void *req, ucs_status_t st, void *user_data);
void pd__xfer_on_notice_sent(void *req, ucs_status_t st, void *user_data);
void pd__xfer_op_free(struct op *op);
void pd__xfer_op_held(pd_xfer_t *x, struct room *r);
size_t pd__xfer_ep_lanes(ucp_ep_h ep, char *names, size_t cap, size_t *eager_max, bool *hw_rma);
size_t pd__xfer_am_chunk(const pd_xfer_t *x, size_t eager_max);
struct op *pd__xfer_op_new(pd_xfer_t *x, struct room *r, enum op_kind kind);
int pd__ucs_error(ucs_status_t s, const char *doing);
void pd__xfer_peer_mark_failed(struct pd_xfer_peer *p, int status);
int pd__xfer_pool_check(void *const *bases, int n_shards, size_t shard_page_bytes,
                        uint32_t n_pages);
void pd__xfer_pool_take(pd_xfer_t *x, void *const *bases, int n_shards, size_t shard_page_bytes,
                        uint32_t n_pages);
void pd__xfer_room_try_complete(pd_xfer_t *x, struct room *r);

/* xfer_rooms.c */
void pd__xfer_room_end(pd_xfer_t *x, struct room *r, int status);
void pd__xfer_room_end_queue(pd_xfer_t *x, struct room *r);
struct room *pd__xfer_room_find(const pd_xfer_t *x, uint64_t id);
int pd__xfer_room_get(const pd_xfer_t *x, uint64_t room, struct room **out);
void pd__xfer_room_unlink_and_free(pd_xfer_t *x, struct room *r);

/* xfer_send.c */
/* The staging ring: stage_slots slots of slot_bytes of x->dm's pinned memory, their events and
 * the job queue; all or nothing. Not mapped with UCX (a staged pool maps it itself). */
int pd__xfer_ring_new(pd_xfer_t *x, size_t slot_bytes);
void pd__xfer_ring_free(pd_xfer_t *x); /* with x->dm; accepts none */
int pd__xfer_ipc_wait_push(pd_xfer_t *x, struct room *r);
void pd__xfer_post_flush(pd_xfer_t *x, struct room *r);
void pd__xfer_post_notice(pd_xfer_t *x, struct room *r);
bool pd__xfer_run_ipc(pd_xfer_t *x);
bool pd__xfer_run_stage(pd_xfer_t *x);
void pd__xfer_set_notice(struct room *r, const struct pd_xfer_notice *n);

/* xfer_recv.c */
ucs_status_t pd__xfer_on_data_am(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param);
ucs_status_t pd__xfer_on_notice_am(void *arg, const void *header, size_t header_length, void *data,
                                   size_t length, const ucp_am_recv_param_t *param);
bool pd__xfer_recv_complete(pd_xfer_t *x, bool wait);
void pd__xfer_recv_ring_free(pd_xfer_t *x);
bool pd__xfer_run_recv(pd_xfer_t *x);

/* xfer_heads.c */
int pd__xfer_peer_regroup(pd_xfer_t *x, const struct pd_xfer_peer_info *info, int ns, uint64_t spb,
                          struct pd_xfer_peer *p);
/* Fills m for bytes [off, off + len) of p's shard dst's part of a run from our page src_page. */
void pd__xfer_regroup_msg(const pd_xfer_t *x, const struct pd_xfer_peer *p, uint32_t dst,
                          uint32_t src_page, uint64_t off, size_t len, struct regroup_msg *m);

/* xfer_call.c */
ucs_status_t pd__xfer_on_call_am(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param);
ucs_status_t pd__xfer_on_answer_am(void *arg, const void *header, size_t header_length, void *data,
                                   size_t length, const ucp_am_recv_param_t *param);
/* Hands received calls and answers to the user, and reports the calls that timed out or whose
 * peer closed. true when anything happened. */
bool pd__xfer_run_calls(pd_xfer_t *x);
/* p's endpoint is closed: its calls end with its close status, its messages are UCX's alone. */
void pd__xfer_calls_peer_closed(pd_xfer_t *x, struct pd_xfer_peer *p);
bool pd__xfer_calls_waiting(const pd_xfer_t *x);
uint64_t pd__xfer_calls_next_deadline(const pd_xfer_t *x); /* uv_now ms; UINT64_MAX: none */
void pd__xfer_calls_free(pd_xfer_t *x);                    /* after the worker is destroyed */

/* xfer_notice.c */
uint32_t pd__xfer_get_u32(const uint8_t *p);
uint64_t pd__xfer_get_u64(const uint8_t *p);
void pd__xfer_put_u32(uint8_t *p, uint32_t v);
void pd__xfer_put_u64(uint8_t *p, uint64_t v);

#endif
