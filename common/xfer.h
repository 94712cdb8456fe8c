/*
 * xfer.h — the KV transfer engine: UCX (ucp) puts of whole KV pages from a prefill's pool straight
 * into pages a decode reserved, then a per-room notice as an active message (DESIGN.md §1, §3).
 *
 * One engine per daemon, driven from that daemon's libuv loop: the worker's event fd sits in a
 * uv_poll_t, and a short timer keeps progress going while requests are outstanding. All calls and
 * all callbacks happen on the loop thread. The pool (base, page_bytes, n_pages) is registered once
 * with ucp_mem_map; its rkey is packed once and handed to peers at pairing. Nothing is registered
 * on the request path.
 *
 * Rooms. A room is one request's transfer, identified by a 64-bit id unique per side. The sender
 * (prefill) adds a room with the receiver's destination pages (validated: inside the receiver's
 * pool, no duplicates), sends it in chunks and finishes it: one flush of the endpoint, then the
 * notice. The receiver (decode) expects the room with the same destination pages and hears its
 * notice.
 *
 * Data path, chosen per peer from the lanes UCX picked. Where the lane has hardware RMA (rc/dc/ud
 * verbs, cuda_ipc), each run of consecutive (src, dst) pages is one ucp_put_nbx; the flush
 * completes only when every earlier put is complete at the receiver, so a notice never overtakes
 * its data. Where UCX would emulate RMA in software (tcp, posix shared memory: "sw-rma"), pages
 * travel as eager active messages instead: the receiver's handler checks every write against the
 * room's own pages (room live, from that peer, page position inside the room) and copies it in;
 * the notice says how many bytes were sent, and the room ends only once all of them arrived.
 * A write for a room that has ended is dropped, so it can never land in a reused page, and the
 * receiver never answers a data message (UCX 1.13's sw-rma acknowledges every put and aborts the
 * process when that acknowledgement meets a dead endpoint). Each message is one eager fragment
 * of the lane (64 KiB on shared memory and tcp, see PD_XFER_MM_SEG_SIZE and PD_XFER_TCP_SEG_SIZE),
 * and the engine keeps polling for a moment after progress instead of sleeping, so a stream is not
 * paced by wake-ups. Not cma's process_vm_writev, although it is zero-copy and works here: UCX 1.13
 * offers it no lane with peer error handling, and a write the sender makes itself cannot be refused
 * by the receiver once the room has ended.
 *
 * Ending. on_room_end fires exactly once per room, when that side may reuse the room's pages:
 * sender — after the notice left (or the failed notice, after an abort); receiver — when the
 * notice and all the data it announces arrived (into a device pool: are on the device), and a
 * receiving room that ends otherwise only once no copy into its pages is in flight. A room on a
 * failed peer ends with PD_EPEER only after that peer's endpoint is force-closed, because UCX
 * cannot cancel a put already posted: a late write must never land in a reused page. An abort on
 * the receiver ends when the sender's failed notice (sent after a flush) arrives, when the
 * control plane says no write can land (pd_xfer_room_release), or — bounded — abort_timeout_ms
 * later by force-closing the peer.
 *
 * Shards. Under tensor parallelism a daemon's KV pool is S pools, one per rank, each holding that
 * rank's share of the kv heads for the same pages: logical page p is page p of every shard, and a
 * page index anywhere in this API names the logical page. Each shard is registered (and its rkey
 * packed) on its own; the peer info carries every shard's rkey and base. When both sides split
 * the heads alike (same shard count, shard page bytes and head ranges), shard k goes to shard k:
 * a run of pages is one put per shard; as active messages, each message carries its shard
 * number and stays within that shard's run, and the receiver bounds-checks it against that
 * shard's pages of the room. One shard is exactly the unsharded pool, on the wire too.
 *
 * Heterogeneous tensor parallelism (pd_xfer_register_heads): the sides may split the kv heads
 * differently (prefill tp 2, decode tp 1; or heads replicated over tp / kv_heads ranks). A shard
 * page is rows_per_page rows (layers x K,V x page_size tokens) of the shard's heads, so a run of
 * n pages of one shard is n * rows_per_page equally strided rows, and the heads one destination
 * shard takes from one source shard are one contiguous interval: one 2-D copy per such pair.
 * Each destination head is taken from the first of our shards that holds it, so every byte is
 * written once. Such a peer is accepted at connect when every head of its shards is in one of
 * ours and rows_per_page, head_bytes and the model's kv heads are equal (else PD_EMISMATCH naming
 * what differs). Its runs go as that peer's shards' active messages, already in the
 * DESTINATION's layout, so the receiver cannot tell them from a homogeneous sender's and checks
 * them as always: from a host pool each message is packed by UCX through a generic datatype
 * whose callback gathers those pieces straight from our shards into UCX's send buffer (no copy
 * of ours); from a device pool the run is 2-D copied into a slot of the staging ring (made at the
 * first such peer when the pool has none), shard after shard, and sent from there. Peers that
 * split alike keep their puts, IPC copies and direct messages.
 *
 * GPU pools (pd_xfer_register_device_pool): registered with UCX directly when it takes CUDA
 * memory, else staged through a pinned host ring (see there); received page data goes host→device
 * through a pinned receive ring, counted only once its copy is done.
 * Not here: the page allocator (callers own page indices), the bootstrap RPCs (common/bootstrap.h).
 */
#ifndef PD_XFER_H
#define PD_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

/* The UCX active-message ids of room notices, page data, and calls and their answers (below).
 * Fixed: both sides must agree. */
#define PD_XFER_AM_NOTICE 0x5044u
#define PD_XFER_AM_DATA 0x5045u
#define PD_XFER_AM_CALL 0x5047u
#define PD_XFER_AM_ANSWER 0x5048u
#define PD_XFER_CALL_MAX (4 << 20) /* bytes of a call's body or an answer's reply */
#define PD_XFER_ERROR_TEXT_MAX 240 /* bytes of a notice's error text, NUL excluded */
/* The engine's UCX_MM_SEG_SIZE unless the environment sets one: shared-memory FIFO elements of
 * 64 KiB rather than 8 KiB, so a 448 KiB page is 8 active messages, not 57, and a FIFO holds
 * 4 MiB (measured 20-30% more throughput, far more when the two processes share a core). Not
 * larger: UCX 1.13's FIFO element keeps a message's length in 16 bits, and a longer message
 * (UCX's own software puts included) arrives truncated. bench/xfer gives ucx_perftest the same. */
#define PD_XFER_MM_SEG_SIZE "65535"
/* The engine's UCX_TCP_TX_SEG_SIZE unless the environment sets one (and only where UCX_TLS may
 * pick tcp: UCX warns of a setting no transport took): tcp send buffers of 64 KiB rather than
 * 8 KiB, so an active message of 64 KiB goes eager in one fragment (UCX's receive segment is
 * 64 KiB by default). With 8 KiB, UCX sends a contiguous message of up to 20 KiB zero-copy but
 * one it packs itself (the regroup datatype, xfer_heads.c) as 8 KiB fragments, each a send call,
 * that the receiver reassembles with one more copy: regrouped pages ran at 30-60% of the
 * homogeneous pair (bench/xfer, 2 cores). With 64 KiB a contiguous message is still one sendmsg
 * straight from the pool (UCX copies only below UCX_TCP_SENDV_THRESH), now of 64 KiB: the
 * homogeneous pair moved 4-4.7 GB/s instead of 2.1, the regrouped one 82-97% of that. */
#define PD_XFER_TCP_SEG_SIZE "65536"
#define PD_XFER_NOTICE_TOP_MAX 20 /* top logprobs of the first token a notice carries */
#define PD_XFER_SHARDS_MAX 8      /* shards of one pool (tensor-parallel ranks, PD_TP_MAX) */

typedef struct pd_xfer pd_xfer_t;
#define PD_XFER_NOTICE_STAGES 3 /* pd_xfer_notice.sender_us */
typedef struct pd_xfer_peer pd_xfer_peer_t;

/* What a room's notice carries: "done" when status == PD_OK, else "failed" with a reason. */
struct pd_xfer_notice {
    uint64_t room;
    int32_t status;         /* PD_OK or a PD_E* code */
    int32_t first_token;    /* token id sampled by prefill; -1 when none */
    float first_logprob;    /* of first_token */
    uint32_t cached_tokens; /* prompt tokens prefill found in its prefix cache */
    /* the first token's top logprobs (most likely first), when the request asked for them:
     * SGLang carries them in its transfer metadata too, since only prefill saw those logits */
    uint32_t n_top;
    int32_t top_ids[PD_XFER_NOTICE_TOP_MAX];
    float top_logprobs[PD_XFER_NOTICE_TOP_MAX];
    uint64_t data_bytes; /* set by the engine: page bytes sent as active messages before the
                            notice (0 when the data went by RMA) */
    /* the sender's side of the hand-over, in microseconds (saturating), so the receiver can
     * tell where its wait went: the room's Transfer arrived → its first chunk scheduled, → that
     * chunk's pages posted, → the last pages posted with this notice (daemon.c's timeline) */
    uint32_t sender_us[PD_XFER_NOTICE_STAGES];
    char error[PD_XFER_ERROR_TEXT_MAX + 1];
};

/* A call or an answer as it came (pd_xfer_call, pd_xfer_answer); body valid during the callback
 * only. */
struct pd_xfer_ctl {
    uint64_t sender_id; /* the sending engine (pd_xfer_id) */
    uint64_t call_id;   /* the caller's, unique per caller engine */
    bool answer;
    uint32_t method;                       /* call: the caller's method number */
    int32_t status;                        /* answer: PD_OK or a PD_E* code */
    char text[PD_XFER_ERROR_TEXT_MAX + 1]; /* answer: why it failed */
    const uint8_t *body;                   /* call: the request; answer: the reply (status PD_OK) */
    size_t len;
};

/* The answer to a pd_xfer_call, once: status PD_OK with the reply, or the failure (the peer's,
 * PD_ETIMEDOUT past the deadline, or its peer's close status) with pd_error_msg() saying why
 * during the call. The same shape as a gRPC reply (common/grpc_bridge.h). */
typedef void (*pd_xfer_answer_fn)(void *ctx, int status, const uint8_t *reply, size_t len);

struct pd_xfer_callbacks {
    void *ctx;
    /* The room is over and its pages on this side may be reused. notice is the received notice
     * (receiver, when one arrived), else NULL. */
    void (*on_room_end)(void *ctx, uint64_t room, void *room_user, int status,
                        const struct pd_xfer_notice *notice);
    /* The peer's endpoint failed (the peer died or the network broke). Its rooms end with
     * PD_EPEER once its endpoint is closed; then on_peer_closed follows. May be NULL. */
    void (*on_peer_failed)(void *ctx, pd_xfer_peer_t *peer, void *peer_user, int status);
    /* The peer's endpoint is closed, every room of it has ended; the handle is gone after this. */
    void (*on_peer_closed)(void *ctx, pd_xfer_peer_t *peer, void *peer_user);
    /* A call from a peer (pd_xfer_call on its side): answer it with pd_xfer_answer on the same
     * peer, now or later. NULL: every call is answered PD_EUNSUPPORTED. */
    void (*on_call)(void *ctx, pd_xfer_peer_t *peer, void *peer_user,
                    const struct pd_xfer_ctl *call);
};

struct pd_xfer_config {
    /* Comma list of RDMA devices ("mlx5_0,mlx5_1"), checked against libibverbs; NULL or "" =
     * none given: RDMA devices are used if present, else shared memory/TCP with a warning. */
    const char *ib_devices;
    int abort_timeout_ms; /* receiver abort waits this long for the sender's ack; 0 = 5000 */
    int keepalive_ms;     /* UCX keepalive (peer death on shm); 0 = 1000; env UCX_* wins */
    bool spin;            /* progress every loop iteration while busy (bench), not a 1 ms timer */
    size_t max_put_bytes; /* longer runs are split into puts of at most this; 0 = 8 MiB */
    enum pd_xfer_data_path {
        PD_XFER_DATA_AUTO = 0, /* puts on hardware RMA lanes, active messages on sw-rma ones */
        PD_XFER_DATA_PUT,      /* always ucp_put_nbx (tests of the RMA path without RDMA) */
        PD_XFER_DATA_AM,       /* always active messages */
    } data_path;
    size_t am_chunk_bytes;   /* page data per active message, at most 65344; 0 = one eager
                                fragment of the lane less headers (65344 on shared memory) */
    size_t stage_slot_bytes; /* staged GPU pool: bytes per ring slot; 0 = 4 MiB */
    int stage_slots;         /* staged GPU pool: ring slots; 0 = 4 */
    bool disable_ipc;        /* GPU pools: never copy through a peer's CUDA IPC mapping */
};

/* Facts about the engine, for logs and /server_info. Strings owned by the engine. */
struct pd_xfer_info {
    const char *transports;  /* UCX_TLS in effect, e.g. "all" or "tcp" */
    const char *net_devices; /* UCX_NET_DEVICES in effect */
    bool cuda_memory;        /* this UCX can put from/to CUDA memory */
    bool rdma;               /* an RDMA device is in use */
    uint32_t live_rooms;
    uint32_t live_peers;
    uint32_t outstanding; /* operations UCX holds now (puts, messages, flushes, closes) */
    uint64_t progress;    /* operations completed and page messages received since start: a
                             count that stands still while operations are outstanding means the
                             engine is stuck (the daemons' /health, --transfer-stall-timeout) */
    uint32_t pool_pages;  /* registered pool; 0 before pd_xfer_register_pool */
    size_t page_bytes;    /* one logical page: n_shards * shard_page_bytes */
    int n_shards;         /* 0 before the pool is registered */
    size_t shard_page_bytes;
    uint64_t dropped_writes; /* receiver: page data refused (room not live, wrong peer, outside
                                the room's pages) */
    bool staged;             /* GPU pool moved through the pinned staging ring */
    uint64_t staged_bytes;   /* sender: page bytes that went through the ring (staged, or
                                regrouped for a peer of another tensor parallelism) */
    uint64_t ipc_bytes;      /* sender: page bytes copied into peers' pools by CUDA IPC */
    /* receiver, device pool (the receive ring, see pd_xfer_register_device_pool) */
    uint64_t recv_staged_bytes;  /* page bytes whose host→device copies completed */
    uint64_t recv_copying_bytes; /* page bytes whose copies are in flight now */
    uint64_t recv_held;          /* messages kept by UCX while the ring was full (back-pressure) */
    uint64_t recv_waits;         /* ring full, message not keepable: waits for the oldest slot */
};

/* How a pool's shards split the model's kv heads (heterogeneous tensor parallelism, above).
 * Shard k holds heads [start[k], start[k] + count) of total; each of its page is rows_per_page
 * rows of count * head_bytes bytes: shard page bytes = rows_per_page * count * head_bytes. Every
 * shard holds the same number of heads (one pool, one shard page size). */
struct pd_xfer_heads {
    uint32_t rows_per_page; /* layers * 2 (K, V) * page_size; 0: not described */
    uint32_t head_bytes;    /* head_dim * element bytes */
    uint32_t total;         /* the model's kv heads */
    uint32_t count;         /* heads of each shard */
    uint32_t start[PD_XFER_SHARDS_MAX];
};

/* One shard of a remote pool, as exchanged at Pair. */
struct pd_xfer_shard {
    const void *rkey; /* packed rkey of the shard's region */
    size_t rkey_len;
    uint64_t base;          /* the shard's address on the remote side */
    const void *ipc_handle; /* its same-node export (see ipc_handle below); NULL, 0: none */
    size_t ipc_handle_len;
};

/* Remote side of a pair, as exchanged at Pair. The receiver's side of the pair (decode connects
 * back to prefill only to watch its liveness) has rkey_len == 0 and no pool. */
struct pd_xfer_peer_info {
    uint64_t remote_id; /* the remote engine's id (pd_xfer_id), checked on every notice */
    const void *worker_addr;
    size_t worker_addr_len;
    const void *rkey; /* packed rkey of the remote pool; NULL when the peer is not a receiver */
    size_t rkey_len;
    uint64_t base;       /* remote pool base address */
    uint64_t page_bytes; /* must equal ours */
    uint32_t n_pages;
    /* the receiver's device pool exported for same-node copies (pd_xfer_local_ipc); a sender
     * with a device pool that can map it copies pages device to device on its transfer stream
     * instead of sending them, and sends the notice once the copies' event completed. NULL, 0:
     * none (host pool, other node, or export failed). */
    const void *ipc_handle;
    size_t ipc_handle_len;
    /* A pool of several shards: n_shards > 1 and shards[k] describes shard k for every
     * k < n_shards (shards[0] then supersedes rkey, base and ipc_handle above). n_shards 0 or 1:
     * one shard, the fields above. An IPC export is used only when every shard has one. */
    int n_shards;
    uint64_t shard_page_bytes; /* one page of one shard; 0 = page_bytes / n_shards */
    struct pd_xfer_shard shards[PD_XFER_SHARDS_MAX];
    /* The receiver's pool is GPU memory staged through a pinned host ring: its rkeys are the
     * ring's, not the pool's, so nothing may be put into it; pages must come as active messages
     * (or by IPC copies). A sender configured for puts only (PD_XFER_DATA_PUT) is refused. */
    bool am_only;
    /* how its shards split the kv heads (rows_per_page 0: not described; then only a peer that
     * splits them as we do is accepted) */
    struct pd_xfer_heads heads;
};

/* Engine. cb is copied. The engine lives until pd_xfer_free's close completes on the loop. */
int pd_xfer_new(uv_loop_t *loop, const struct pd_xfer_config *cfg,
                const struct pd_xfer_callbacks *cb, pd_xfer_t **out);
/* Force-closes every peer (their rooms end with PD_ECANCELED), then closes the loop handles;
 * memory is released in the last close callback, so run the loop afterwards. Accepts NULL. */
void pd_xfer_free(pd_xfer_t *x);

uint64_t pd_xfer_id(const pd_xfer_t *x); /* random, per process start */
void pd_xfer_get_info(const pd_xfer_t *x, struct pd_xfer_info *out);

/* The self-check the daemons run at start (xfer_doctor.c): two workers of their own on the
 * engine's UCX context, so UCX wires the transports it would between two processes of this
 * host; a page and a room (64 pages, at most 16 MiB) from host memory to host memory, moved as
 * the engine moves pages (puts on a hardware RMA lane, else active messages), medians of 5, every
 * byte checked. With an RDMA device in use, the room over tcp too, and a warning when tcp is
 * faster. Bounded: a move that does not complete within 2 s ends the check with an error. */
struct pd_xfer_doctor {
    char ucx_version[32];
    char lanes[112];  /* the transports UCX picked, "posix/memory+cma/memory", "tcp/lo" */
    const char *path; /* "put" or "am" */
    size_t page_bytes, room_bytes;
    double page_gbps, room_gbps; /* 0 when not measured */
    char tcp_lanes[112];         /* RDMA in use: the tcp comparison */
    double tcp_room_gbps;
    double ms;         /* the whole check */
    char error[200];   /* why it stopped, else "" */
    char warning[200]; /* e.g. RDMA slower than tcp, else "" */
};
/* page_bytes 0: the registered pool's logical page. PD_OK, or the failure also in out->error. */
int pd_xfer_doctor_run(pd_xfer_t *x, size_t page_bytes, struct pd_xfer_doctor *out);

struct pd_devmem;

/* Registers the KV pool (host memory): [base, base + page_bytes * n_pages). Once per engine.
 * The one-shard case of pd_xfer_register_pool_shards. */
int pd_xfer_register_pool(pd_xfer_t *x, void *base, size_t page_bytes, uint32_t n_pages);
/* Registers a KV pool of n_shards (1 .. PD_XFER_SHARDS_MAX) shards: shard k is
 * [bases[k], bases[k] + shard_page_bytes * n_pages), logical page p is page p of every shard
 * (one logical page = n_shards * shard_page_bytes). Once per engine. */
int pd_xfer_register_pool_shards(pd_xfer_t *x, void *const *bases, int n_shards,
                                 size_t shard_page_bytes, uint32_t n_pages);
/* Registers a KV pool in device memory (instead of pd_xfer_register_pool). ucx_direct: UCX
 * takes the GPU memory itself (pd_xfer_info.cuda_memory; PD_EUNSUPPORTED otherwise) and pages
 * move as on a host pool. Else pages are staged: the sender copies each run device→host into a
 * slot of a pinned ring (registered with UCX; its rkey is what peers get) on dm's transfer
 * stream and sends the slot as active messages once the copy's event completed — the copy of
 * the next run overlaps the send of this one, and the room's flush + notice follow the last
 * run's send. Either way the receiver copies each arriving message into a pinned receive ring
 * (stage_slots slots of max(stage_slot_bytes, 64 KiB)) and from there host→device on dm's
 * stream, asynchronously: a message counts for its room only once its copy's event completed,
 * so the room ends only with every byte on the device, and a room that ends otherwise (release,
 * failure, peer closed) reports on_room_end only after its copies in flight are done. A full
 * ring keeps the message as UCX's persistent data (retried as slots free up) or, where UCX
 * cannot keep it, waits for the oldest slot's copies (bounded by one slot). A staged pool's
 * peer info says am_only: its rkey is the ring's, so pages must come as active messages. dm
 * (the device the pool is on; devmem.h) must outlive the engine. */
int pd_xfer_register_device_pool(pd_xfer_t *x, void *base, size_t page_bytes, uint32_t n_pages,
                                 struct pd_devmem *dm, bool ucx_direct);
/* The same over shards (as pd_xfer_register_pool_shards), all on dm's transfer stream: ucx_direct
 * maps every shard; staged copies each shard's part of a run into the slot (one copy per shard)
 * and the receiver copies each message into its shard; a same-node export is one handle per
 * shard (each shard its own allocation). */
int pd_xfer_register_device_pool_shards(pd_xfer_t *x, void *const *bases, int n_shards,
                                        size_t shard_page_bytes, uint32_t n_pages,
                                        struct pd_devmem *dm, bool ucx_direct);
/* Describes how the registered pool's shards split the model's kv heads (after the pool, once),
 * so that peers splitting them otherwise can be served (heterogeneous tensor parallelism, above).
 * PD_EINVAL when it does not fit the pool (shard count, shard page bytes, heads past total).
 * Without it, only peers whose pool has our shard count and shard page bytes are accepted. */
int pd_xfer_register_heads(pd_xfer_t *x, const struct pd_xfer_heads *h);
/* Our worker address (always) and packed pool rkey (after register_pool; else NULL, 0): shard
 * 0's for a pool of shards. Valid for the engine's life. */
void pd_xfer_local_address(const pd_xfer_t *x, const void **addr, size_t *len);
void pd_xfer_local_rkey(const pd_xfer_t *x, const void **rkey, size_t *len, uint64_t *base);
/* The device pool's same-node export (CUDA IPC handle); NULL, 0 for a host pool. Shard 0's. */
void pd_xfer_local_ipc(const pd_xfer_t *x, const void **handle, size_t *len);
/* Everything a peer needs to connect to us (what Pair carries): id, worker address and, after a
 * pool was registered, page_bytes, n_pages and every shard (n_shards, shards[]; shard 0 also in
 * rkey/base/ipc_handle), and the heads after pd_xfer_register_heads. Pointers valid for the
 * engine's life. */
void pd_xfer_local_peer_info(const pd_xfer_t *x, struct pd_xfer_peer_info *out);

/* One endpoint per peer, with UCP_ERR_HANDLING_MODE_PEER. A receiver peer (info has a pool)
 * whose shards split the kv heads otherwise than ours is served through the staging ring when
 * both sides described their heads and every head of its shards is in ours (see "Heterogeneous
 * tensor parallelism"); otherwise one whose page bytes, shard count or shard page bytes differ
 * from ours is refused with PD_EMISMATCH naming both. */
int pd_xfer_peer_connect(pd_xfer_t *x, const struct pd_xfer_peer_info *info, void *peer_user,
                         pd_xfer_peer_t **out);
/* Force-closes the endpoint; its rooms end with `status`, then on_peer_closed. Idempotent. */
void pd_xfer_peer_close(pd_xfer_peer_t *p, int status);
/* The lanes UCX chose to this peer and how pages travel: "rc_mlx5/mlx5_0:1 (put)",
 * "tcp/lo (am of 65344 bytes; UCX has only sw-rma here)", ... */
const char *pd_xfer_peer_transport(const pd_xfer_peer_t *p);
uint64_t pd_xfer_peer_remote_id(const pd_xfer_peer_t *p);

/* Sender. dst_pages (n of them) index the peer's pool: each < its n_pages, no two equal, else
 * PD_ERANGE / PD_EINVAL. A room id already live → PD_EINVAL. The list is copied. */
int pd_xfer_room_add(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, const uint32_t *dst_pages,
                     uint32_t n, void *room_user);
/* Posts src_pages[i] → dst_pages[first + i] for i < n; consecutive runs on both sides become one
 * put each. Source pages must stay untouched until the room ends. */
int pd_xfer_room_send(pd_xfer_t *x, uint64_t room, uint32_t first, const uint32_t *src_pages,
                      uint32_t n);
/* Flush, then notice (n->room is ignored; the room's id is used). Nothing may be sent after. */
int pd_xfer_room_finish(pd_xfer_t *x, uint64_t room, const struct pd_xfer_notice *n);

/* Receiver. dst_pages (n of them, copied) are the pages of our pool reserved for the room, in
 * the order the sender was given them: each < our pool's pages, no two equal, else PD_ERANGE /
 * PD_EINVAL. The room's notice and page data are accepted only from peer p, and page data only
 * into these pages. */
int pd_xfer_room_expect(pd_xfer_t *x, pd_xfer_peer_t *p, uint64_t room, const uint32_t *dst_pages,
                        uint32_t n, void *room_user);
/* Control plane confirmed that no write of this room can still land: end it now (aborting or
 * not): it takes no more data at once, and on_room_end follows once the host→device copies of
 * data it already took (device pool) are done. PD_ENOENT if the room is not live. */
int pd_xfer_room_release(pd_xfer_t *x, uint64_t room, int status);

/* Either side. Sender: flush what was posted, then send a failed notice with status and why;
 * the room ends with status. Receiver: mark it aborting (see above). PD_ENOENT if not live. */
int pd_xfer_room_abort(pd_xfer_t *x, uint64_t room, int status, const char *why);
bool pd_xfer_room_live(const pd_xfer_t *x, uint64_t room);
/* The peer a live room moves its pages with (pd_xfer_room_add's), or NULL when it is not live. */
pd_xfer_peer_t *pd_xfer_room_peer(const pd_xfer_t *x, uint64_t room);

/* Calls over a pair's endpoints: the per-room control messages of the bootstrap protocol
 * (common/bootstrap.h) ride the endpoints the pair already holds instead of a gRPC call each.
 * A call is one eager active message on our endpoint to p; the peer's engine finds the endpoint
 * it holds to us (the one whose remote id is our engine id) and hands the call to its on_call,
 * and the answer comes back on that endpoint. A call from an engine the receiver holds no
 * endpoint to is dropped there (it has nowhere to answer): the deadline ends the caller's wait.
 * fn is called exactly once, from the loop: with the answer, PD_ETIMEDOUT after deadline_ms,
 * or p's close status when its endpoint closes first (pd_xfer_free included). Calls on one
 * endpoint arrive in the order they were made. PD_EPEER at once when p is closing. */
int pd_xfer_call(pd_xfer_peer_t *p, uint32_t method, const void *body, size_t len, int deadline_ms,
                 pd_xfer_answer_fn fn, void *ctx);
/* Answers call call_id of peer p: status PD_OK with reply (len bytes, copied), or a failure
 * with its text (at most PD_XFER_ERROR_TEXT_MAX bytes are sent). */
int pd_xfer_answer(pd_xfer_peer_t *p, uint64_t call_id, int status, const char *text,
                   const void *reply, size_t len);
/* Wire format of calls and answers (exposed for tests): encode returns the bytes written, 0 when
 * cap is too small; decode points m->body into buf. */
size_t pd_xfer_ctl_encode(const struct pd_xfer_ctl *m, bool answer, uint8_t *buf, size_t cap);
int pd_xfer_ctl_decode(const void *buf, size_t len, bool answer, struct pd_xfer_ctl *m);

/* Notice wire format (fixed, little-endian): exposed for tests of malformed notices. The top
 * logprobs follow the error text (n_top u8, then n_top x {id i32, logprob f32}); a notice
 * without them ends at the error text. */
#define PD_XFER_NOTICE_WIRE_MIN 56 /* bytes before the error text */
size_t pd_xfer_notice_encode(const struct pd_xfer_notice *n, uint64_t sender_id, uint8_t *buf,
                             size_t cap);
int pd_xfer_notice_decode(const void *buf, size_t len, struct pd_xfer_notice *n,
                          uint64_t *sender_id);

/* The receive-side check of a page-data message's header against its room (exposed for tests
 * and fuzzing): length bytes (> 0) at byte offset off of shard `shard`'s pages from room position
 * index, in a room of n_dst destination pages dst[] with shard pages of pb bytes, n_shards
 * shards. true when every page it touches is the room's and they are consecutive in the pool,
 * so the write stays inside the room's pages. */
bool pd_xfer_data_fits(const uint32_t *dst, uint32_t n_dst, int n_shards, uint64_t pb,
                       uint32_t shard, uint32_t index, uint64_t off, size_t length);

#endif
