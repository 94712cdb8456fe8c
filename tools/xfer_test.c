/*
 * xfer_test.c — pdserve-xfer-test: the KV transfer path end to end between two processes on
 * 127.0.0.1 (or --host), with the real control plane (gRPC bootstrap) and data plane (UCX).
 *
 *   --role sender    prefill's side: bootstrap server + engine; writes each room's pages (content
 *                    a function of the room) when its Transfer arrives. Runs until SIGTERM/SIGINT,
 *                    or, with --expect-peer-death, until a decode's endpoint fails and every
 *                    room has ended.
 *   --role receiver  decode's side: keeps --window rooms in flight until --rooms have ended; checks
 *                    every page byte for byte and against the checksum the done notice carries.
 *   --role probe     a stranger and a clumsy decode: wrong/missing key, garbage and truncated
 *                    protobuf, mismatched layout, out-of-range and duplicate pages, duplicate
 *                    room, an Abort of another decode's room; each must be refused with its
 *                    status (that Abort: answered as unknown, the room kept), and the server
 *                    must still serve.
 *
 * --shards N gives this side's pool N shards (tensor-parallel ranks, layout tp_size N), each
 * holding its share of --model-kv-heads as model.c splits them (replicated past the head count).
 * The two sides may give different --shards: the sender then regroups the kv heads of every page
 * into the receiver's shards (heterogeneous tp, xfer.h). Page content is a function of (room,
 * page, row, kv head) whatever the split, and the receiver checks every byte of every shard.
 *
 * --room-timeout S (receiver) is the lossy-link mode (tests/integration/test_netfault.py runs the
 * two sides in two network namespaces, --host naming the sender's address): a room not ended S
 * seconds after it was issued is aborted, as decode's --waiting-timeout does; a room that ends
 * without its data (timed out, its endpoint failed, refused) counts as lost and the receiver goes
 * on (the next room pairs again). The pages of a lost room are filled with a marker and held for
 * --watch-lost seconds before reuse: a byte that changed meanwhile was written after its room
 * ended (late_writes, which fails the run), the corruption a reused page must never see.
 *
 * Prints one "xfer-test: key=value ..." summary line and exits 0 when everything held, 1 when not.
 * tests/integration/xfer_pair.c drives it (including SIGKILL of either side).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/base/alloc.h"
#include "decode/bootstrap_client.h"
#include "prefill/bootstrap_server.h"
#include "common/base/flags.h"
#include "common/grpc_bridge.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "common/xfer.h"
#include "common/xfer_plan.h"

#define SLOT_PAGES 4096 /* the largest room */
#define MAX_WINDOW 64
#define PROBE_GOOD_ROOM 0x7000u
#define LOST_MARK 0x5A /* the bytes of a lost room's pages while they are watched */

enum role { ROLE_SENDER, ROLE_RECEIVER, ROLE_PROBE };
static const char *const role_names[] = {"sender", "receiver", "probe", NULL};

struct opts {
    int role;
    int port;
    const char *key_path;
    int rooms;
    int window;
    int layers, kv_heads, head_dim, page_size;
    int model_kv_heads; /* 0: kv_heads x shards */
    int shards;
    int abort_every;
    bool expect_peer_death;
    int64_t seed;
    int log_level;
    int max_pages;
    const char *host;
    double room_timeout_s;
    double watch_lost_s;
};

struct slot {
    bool busy;
    uint64_t room;
    uint32_t n;
    uint32_t dst[SLOT_PAGES];
    bool aborted;
    uint64_t t_issued;    /* ms */
    bool timeout_sent;    /* --room-timeout: its abort went out */
    uint64_t watch_until; /* ms; nonzero: a lost room's pages, watched for late writes */
};

struct app {
    struct opts o;
    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    uv_timer_t tick;
    pd_grpc_bridge_t *bridge;
    pd_xfer_t *x;
    pd_bootstrap_server_t *server;
    pd_bootstrap_client_t *client;
    uint8_t key[PD_CLUSTER_KEY_MAX];
    size_t key_len;
    struct pd_bootstrap_layout layout;
    struct pd_xfer_heads heads;        /* how this side's shards split the kv heads */
    uint8_t *pool[PD_XFER_SHARDS_MAX]; /* [pool_pages][shard_bytes] each */
    size_t shard_bytes;                /* one page of one shard */
    uint32_t pool_pages;
    /* receiver */
    struct slot slots[MAX_WINDOW];
    uint64_t next_seq;
    int issued, ended, ok, canceled, peer_failed, bad_pages, bad_sums, other_fail;
    int lost, timed_out, late_writes; /* --room-timeout */
    long pages_moved;
    uint64_t t_start, t_end, t_fail;
    bool stopping, peer_dead;
    /* sender */
    int s_rooms, s_done, s_failed, s_aborted;
    uint64_t s_slot_room[MAX_WINDOW]; /* the room whose source pages a slot holds */
    /* probe */
    int probe_step, probe_fail;
    int exit_code;
};

static struct app A;

static void shutdown_all(void);

static uint64_t now_ms(void) {
    return uv_now(&A.loop);
}

static uint8_t *page_at(int k, uint32_t page) {
    return A.pool[k] + (size_t)page * A.shard_bytes;
}

/* Over the logical pages: the same on both sides whatever their shards. */
static uint32_t pages_sum(const uint32_t *pages, uint32_t n) {
    return pd_xfer_plan_checksum_heads((void *const *)A.pool, A.o.shards, &A.heads, pages, n);
}

static double room_scatter(uint64_t room) {
    return (double)((room >> 8) % 5) / 4.0;
}

static uint32_t room_size(uint64_t seq, uint64_t *rng) {
    if (seq % 97 == 0)
        return (uint32_t)A.o.max_pages;
    uint32_t cap = (uint32_t)A.o.max_pages;
    uint32_t n;
    switch (pd_xfer_plan_rand(rng) % 4) {
    case 0: n = 1; break;
    case 1: n = 1 + (uint32_t)(pd_xfer_plan_rand(rng) % 16); break;
    case 2: n = 1 + (uint32_t)(pd_xfer_plan_rand(rng) % 256); break;
    default: n = 1 + (uint32_t)(pd_xfer_plan_rand(rng) % 1024); break;
    }
    return n < cap ? n : cap;
}

/* ---- sender ---- */

static void sender_on_room(void *ctx, uint64_t room, const char *decode_id, uint32_t n,
                           uint32_t held_pages, uint32_t prompt_len) {
    (void)ctx;
    (void)held_pages;
    (void)decode_id;
    (void)prompt_len;
    static uint32_t src[SLOT_PAGES], dst[SLOT_PAGES];
    if (strcmp(decode_id, "probe") == 0 && room != PROBE_GOOD_ROOM)
        return; /* held, as a prefill still computing holds it: the room stays live */
    uint32_t slot = (uint32_t)(room & 0xff) % (uint32_t)A.o.window;
    A.s_rooms++;
    /* One live room per slot: the slot's source pages are its. A Transfer the receiver gave up
     * on can still arrive after it reissued the slot (a call whose answer was cut by an outage
     * lands when the link returns): the newer room (its sequence is the id's high bits) keeps
     * the slot and the older one is refused, so it never rewrites pages the other still sends
     * from (seen once in pd_netfault as a room done with another room's bytes). */
    uint64_t held = A.s_slot_room[slot];
    if (held && held != room && pd_xfer_room_live(A.x, held)) {
        if ((room >> 8) < (held >> 8)) {
            pd_xfer_room_abort(A.x, room, PD_ECANCELED, "stale: its slot serves a newer room");
            return;
        }
        pd_xfer_room_abort(A.x, held, PD_ECANCELED, "stale: its slot serves a newer room");
    }
    A.s_slot_room[slot] = room;
    if (n > SLOT_PAGES || pd_xfer_plan_pages(room, n, room_scatter(room), slot * SLOT_PAGES,
                                             SLOT_PAGES, 0, SLOT_PAGES, src, dst) != PD_OK) {
        pd_xfer_room_abort(A.x, room, PD_EINVAL, "room too large for this test");
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        for (int k = 0; k < A.o.shards; k++)
            pd_xfer_plan_fill_heads(room, i, &A.heads, k, page_at(k, src[i]));
    /* in chunks, as chunked prefill sends them */
    uint32_t a = n / 3, b = 2 * n / 3;
    int rc = pd_xfer_room_send(A.x, room, 0, src, a);
    if (!rc && A.o.abort_every && (room >> 8) % (uint64_t)A.o.abort_every == 0) {
        pd_xfer_room_abort(A.x, room, PD_ECANCELED, "prefill aborted the request");
        return;
    }
    if (!rc)
        rc = pd_xfer_room_send(A.x, room, a, src + a, b - a);
    if (!rc)
        rc = pd_xfer_room_send(A.x, room, b, src + b, n - b);
    struct pd_xfer_notice done = {
        .first_token = (int32_t)pages_sum(src, n),
        .first_logprob = -1.0f,
        .cached_tokens = n,
    };
    if (!rc)
        rc = pd_xfer_room_finish(A.x, room, &done);
    if (rc)
        pd_warn("xfer-test: room %" PRIu64 ": %s", room, pd_error_msg());
}

static void sender_on_room_end(uint64_t room, int status) {
    (void)room;
    if (status == PD_OK)
        A.s_done++;
    else if (status == PD_ECANCELED)
        A.s_aborted++;
    else
        A.s_failed++;
}

/* ---- receiver ---- */

static void receiver_fill(void);

static void receiver_finish_if_done(void) {
    if (A.stopping)
        return;
    bool busy = false;
    for (int i = 0; i < A.o.window; i++)
        busy |= A.slots[i].busy;
    bool out_of_work = A.issued >= A.o.rooms || A.peer_dead;
    if (busy || !out_of_work)
        return;
    A.t_end = now_ms();
    double secs = (double)(A.t_end - A.t_start) / 1000.0;
    int bad = A.bad_pages + A.bad_sums + A.late_writes;
    if (A.o.room_timeout_s > 0) /* lossy link: rooms may be lost, never corrupted */
        bad += A.ok == 0;
    else if (A.o.expect_peer_death)
        bad += A.other_fail + !A.peer_dead;
    else
        bad += A.other_fail + A.peer_failed;
    if (!A.o.abort_every && !A.o.expect_peer_death && A.o.room_timeout_s <= 0)
        bad += A.canceled;
    printf("xfer-test: role=receiver rooms=%d ok=%d canceled=%d peer_failed=%d other_failed=%d "
           "bad_pages=%d bad_checksums=%d lost=%d timed_out=%d late_writes=%d pages=%ld "
           "seconds=%.2f pages_in_use=0 result=%s\n",
           A.ended, A.ok, A.canceled, A.peer_failed, A.other_fail, A.bad_pages, A.bad_sums, A.lost,
           A.timed_out, A.late_writes, A.pages_moved, secs, bad ? "FAIL" : "PASS");
    fflush(stdout);
    A.exit_code = bad ? 1 : 0;
    shutdown_all();
}

static void receiver_room_done(int slot_i, int status, const struct pd_xfer_notice *n) {
    struct slot *s = &A.slots[slot_i];
    A.ended++;
    if (status == PD_OK) {
        for (uint32_t i = 0; i < s->n; i++) {
            for (int k = 0; k < A.o.shards; k++) {
                long off = pd_xfer_plan_check_heads(s->room, i, &A.heads, k, page_at(k, s->dst[i]));
                if (off >= 0) {
                    if (A.bad_pages < 5)
                        pd_error("xfer-test: room %" PRIu64
                                 ": page %u (pool %u) shard %d differs at byte %ld",
                                 s->room, i, s->dst[i], k, off);
                    A.bad_pages++;
                }
            }
        }
        uint32_t sum = pages_sum(s->dst, s->n);
        if (!n || n->first_token != (int32_t)sum || n->cached_tokens != s->n) {
            pd_error("xfer-test: room %" PRIu64 ": done notice disagrees with the data "
                     "(checksum %08x, notice %08x)",
                     s->room, sum, n ? (uint32_t)n->first_token : 0);
            A.bad_sums++;
        }
        A.ok++;
        A.pages_moved += s->n;
    } else if (status == PD_ECANCELED) {
        A.canceled++;
    } else if (status == PD_EPEER || status == PD_ETIMEDOUT) {
        A.peer_failed++;
        A.peer_dead = A.o.room_timeout_s <= 0; /* a lossy link: the next room pairs again */
    } else if (A.o.room_timeout_s > 0) {
        A.other_fail++; /* a refusal (not paired, ...): lost too */
    } else {
        pd_error("xfer-test: room %" PRIu64 " failed: %s (%s)", s->room, pd_status_str(status),
                 n ? n->error : "");
        A.other_fail++;
    }
    if (status != PD_OK && A.o.room_timeout_s > 0) {
        /* no write may land any more: mark its pages and watch them before reuse (on_tick) */
        A.lost++;
        for (uint32_t i = 0; i < s->n; i++)
            for (int k = 0; k < A.o.shards; k++)
                memset(page_at(k, s->dst[i]), LOST_MARK, A.shard_bytes);
        s->watch_until = now_ms() + (uint64_t)(A.o.watch_lost_s * 1000.0);
    } else {
        s->busy = false; /* its pages are free again */
    }
    if (A.ended % 500 == 0 || A.ended == 50) {
        printf("xfer-test: progress rooms=%d\n", A.ended);
        fflush(stdout);
    }
    receiver_fill();
    receiver_finish_if_done();
}

static void receiver_fill(void) {
    if (A.stopping || A.peer_dead)
        return;
    for (int i = 0; i < A.o.window && A.issued < A.o.rooms; i++) {
        struct slot *s = &A.slots[i];
        if (s->busy)
            continue;
        uint64_t seq = ++A.next_seq;
        uint64_t rng = (uint64_t)A.o.seed ^ (seq * 0x9e3779b97f4a7c15ull);
        s->room = (seq << 8) | (uint64_t)i;
        s->n = room_size(seq, &rng);
        static uint32_t src[SLOT_PAGES];
        int rc = pd_xfer_plan_pages(s->room, s->n, room_scatter(s->room), 0, SLOT_PAGES,
                                    (uint32_t)i * SLOT_PAGES, SLOT_PAGES, src, s->dst);
        PD_ASSERT(rc == PD_OK);
        for (uint32_t k = 0; k < s->n; k++)
            for (int j = 0; j < A.o.shards; j++)
                memset(page_at(j, s->dst[k]), 0xA5, A.shard_bytes);
        s->busy = true;
        s->aborted = false;
        s->timeout_sent = false;
        s->watch_until = 0;
        s->t_issued = now_ms();
        A.issued++;
        rc = pd_bootstrap_client_transfer(A.client, s->room, s->dst, s->n, 0, s->n * 16,
                                          (void *)(intptr_t)i);
        if (rc) {
            pd_error("xfer-test: room %" PRIu64 ": %s", s->room, pd_error_msg());
            s->busy = false;
            A.other_fail++;
            continue;
        }
        if (A.o.abort_every && seq % (uint64_t)A.o.abort_every == 3 % (uint64_t)A.o.abort_every)
            s->aborted = true; /* the tick aborts it, mid-transfer */
    }
}

static void on_rejected(void *ctx, uint64_t room, void *user, int status, const char *msg) {
    (void)ctx;
    (void)room;
    printf("xfer-test: room %" PRIu64 " rejected: %s\n", room, msg); /* what tests look for */
    fflush(stdout);
    receiver_room_done((int)(intptr_t)user, status, NULL);
}

/* A lost room's pages after the watch: any byte off the mark was written after the room ended. */
static void watch_done(struct slot *s) {
    for (uint32_t i = 0; i < s->n; i++) {
        for (int k = 0; k < A.o.shards; k++) {
            const uint8_t *b = page_at(k, s->dst[i]);
            for (size_t j = 0; j < A.shard_bytes; j++) {
                if (b[j] != LOST_MARK) {
                    pd_error("xfer-test: room %" PRIu64 ": page %u (pool %u) shard %d written "
                             "at byte %zu after the room ended",
                             s->room, i, s->dst[i], k, j);
                    A.late_writes++;
                    break;
                }
            }
        }
    }
    s->watch_until = 0;
    s->busy = false;
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    uint64_t now = now_ms();
    bool freed = false;
    for (int i = 0; i < A.o.window && !A.stopping; i++) {
        struct slot *s = &A.slots[i];
        if (s->busy && s->aborted) {
            s->aborted = false;
            pd_bootstrap_client_abort(A.client, s->room, "client disconnected");
        }
        if (s->busy && s->watch_until && now >= s->watch_until) {
            watch_done(s);
            freed = true;
        } else if (s->busy && !s->watch_until && !s->timeout_sent && A.o.room_timeout_s > 0 &&
                   (double)(now - s->t_issued) >= A.o.room_timeout_s * 1000.0) {
            s->timeout_sent = true; /* as decode's --waiting-timeout: give it up */
            A.timed_out++;
            pd_bootstrap_client_abort(A.client, s->room, "timed out");
        }
    }
    if (freed) {
        receiver_fill();
        receiver_finish_if_done();
    }
}

/* ---- engine callbacks ---- */

static void on_room_end(void *ctx, uint64_t room, void *user, int status,
                        const struct pd_xfer_notice *n) {
    (void)ctx;
    if (A.o.role == ROLE_SENDER)
        sender_on_room_end(room, status);
    else if (A.o.role == ROLE_RECEIVER)
        receiver_room_done((int)(intptr_t)user, status, n);
    else
        A.ended++, A.peer_failed += status != PD_OK; /* probe: the last check's room */
}

static void on_peer_failed(void *ctx, pd_xfer_peer_t *p, void *user, int status) {
    (void)ctx;
    (void)p;
    (void)user;
    A.peer_dead = true;
    A.t_fail = now_ms();
    pd_warn("xfer-test: peer failed: %s", pd_status_str(status));
}

/* The receiver's Transfer and Abort, as calls over its endpoint (common/bootstrap.h). */
static void on_call(void *ctx, pd_xfer_peer_t *p, void *user, const struct pd_xfer_ctl *call) {
    (void)ctx;
    (void)user;
    if (A.server)
        pd_bootstrap_server_call(A.server, p, call);
    else if (pd_xfer_answer(p, call->call_id, PD_EUNSUPPORTED, "no bootstrap server", NULL, 0))
        pd_warn("xfer-test: %s", pd_error_msg());
}

static void on_peer_closed(void *ctx, pd_xfer_peer_t *p, void *user) {
    (void)ctx;
    (void)user;
    if (A.server)
        pd_bootstrap_server_peer_closed(A.server, p);
    if (A.client)
        pd_bootstrap_client_peer_closed(A.client, p);
    if (A.o.role == ROLE_SENDER && A.o.expect_peer_death && !A.stopping) {
        struct pd_xfer_info info;
        pd_xfer_get_info(A.x, &info);
        printf("xfer-test: role=sender rooms=%d done=%d aborted=%d failed=%d live_rooms=%u "
               "ms_to_fail=%" PRIu64 " result=%s\n",
               A.s_rooms, A.s_done, A.s_aborted, A.s_failed, info.live_rooms, now_ms() - A.t_fail,
               info.live_rooms == 0 ? "PASS" : "FAIL");
        fflush(stdout);
        A.exit_code = info.live_rooms == 0 ? 0 : 1;
        shutdown_all();
    } else if (A.o.role == ROLE_RECEIVER) {
        receiver_finish_if_done();
    }
}

/* ---- probe: a scripted series of bad calls, then a good one ---- */

struct expect {
    const char *what;
    int want; /* PD_* the call must fail with; PD_OK = must succeed */
};

static void probe_next(void);

static const char *probe_needle; /* the next check's message must contain it; NULL: any */

static void probe_check(const char *what, int want, int got, const char *msg) {
    bool ok = want == got && (!probe_needle || strstr(msg, probe_needle));
    probe_needle = NULL;
    printf("xfer-test: probe %-28s want=%-18s got=%-18s %s  (%s)\n", what, pd_status_str(want),
           pd_status_str(got), ok ? "ok" : "WRONG", msg);
    fflush(stdout);
    A.probe_fail += !ok;
}

static struct expect probe_cur;

/* An Abort check's expected AbortReply.found: 0 or 1; -1: not an Abort, or any. */
static int probe_want_found = -1;

static void on_probe_reply(void *ctx, int status, const uint8_t *reply, size_t len) {
    (void)ctx;
    const char *msg = status ? pd_error_msg() : "";
    char wrong[64];
    bool found = false;
    if (status == PD_OK && probe_want_found >= 0 &&
        (pd_bootstrap_decode_abort_reply(reply, len, &found) != PD_OK ||
         found != (probe_want_found == 1))) {
        snprintf(wrong, sizeof(wrong), "found=%d, want found=%d", found, probe_want_found);
        status = PD_EMISMATCH; /* reported as the wrong answer it is */
        msg = wrong;
    }
    probe_want_found = -1;
    probe_check(probe_cur.what, probe_cur.want, status, msg);
    probe_next();
}

static pd_bootstrap_client_t *probe_bad_client;

static void on_probe_paired(void *ctx, int status, const char *msg) {
    (void)ctx;
    if (probe_cur.what)
        probe_check(probe_cur.what, probe_cur.want, status, msg);
    probe_cur.what = NULL;
}

static void on_probe_rejected(void *ctx, uint64_t room, void *user, int status, const char *msg) {
    (void)ctx;
    (void)room;
    (void)user;
    (void)status;
    (void)msg;
    probe_next();
}

static void probe_raw_via(const char *what, int want, const char *method, uint32_t ucx_method,
                          const uint8_t *body, size_t len) {
    probe_cur = (struct expect){what, want};
    if (pd_bootstrap_client_raw(A.client, method, ucx_method, body, len, on_probe_reply, NULL)) {
        probe_check(what, want, PD_EINTERNAL, pd_error_msg());
        A.exit_code = 1;
        shutdown_all();
    }
}

static void probe_raw(const char *what, int want, const char *method, const uint8_t *body,
                      size_t len) {
    probe_raw_via(what, want, method, 0, body, len);
}

static void probe_room_end_watch(uv_timer_t *t);
static uv_timer_t probe_timer;
static uint64_t probe_room_id;

static void probe_next(void) {
    int step = A.probe_step++;
    uint8_t *body = NULL;
    size_t len = 0;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99, 0x01, 0x02};
    uint32_t pages[4] = {1, 2, 3, 4};
    switch (step) {
    case 0: { /* a decode with a wrong key: pairing is refused */
        struct pd_bootstrap_client_config cc = {.target = NULL,
                                                .key = (const uint8_t *)"wrong-key",
                                                .key_len = 9,
                                                .layout = A.layout,
                                                .decode_id = "probe-wrong-key"};
        char target[64];
        snprintf(target, sizeof(target), "%s:%d", A.o.host, A.o.port);
        cc.target = target;
        struct pd_bootstrap_client_callbacks cb = {.on_paired = on_probe_paired,
                                                   .on_room_rejected = on_probe_rejected};
        pd_bootstrap_client_new(A.bridge, A.x, &cc, &cb, &probe_bad_client);
        probe_cur = (struct expect){"Pair with wrong key", PD_EPERM};
        pd_bootstrap_client_transfer(probe_bad_client, 999, pages, 4, 0, 64, NULL);
        return;
    }
    case 1: { /* a decode with another model layout */
        pd_bootstrap_client_free(probe_bad_client);
        probe_bad_client = NULL;
        struct pd_bootstrap_client_config cc = {
            .key = A.key, .key_len = A.key_len, .layout = A.layout, .decode_id = "probe-layout"};
        char target[64];
        snprintf(target, sizeof(target), "%s:%d", A.o.host, A.o.port);
        cc.target = target;
        cc.layout.kv_heads += 2;
        struct pd_bootstrap_client_callbacks cb = {.on_paired = on_probe_paired,
                                                   .on_room_rejected = on_probe_rejected};
        pd_bootstrap_client_new(A.bridge, A.x, &cc, &cb, &probe_bad_client);
        probe_cur = (struct expect){"Pair with other layout", PD_EMISMATCH};
        pd_bootstrap_client_transfer(probe_bad_client, 998, pages, 4, 0, 64, NULL);
        return;
    }
    case 2:
        pd_bootstrap_client_free(probe_bad_client);
        probe_bad_client = NULL;
        probe_raw("garbage Pair bytes", PD_EINVAL, PD_BOOTSTRAP_METHOD_PAIR, garbage,
                  sizeof(garbage));
        return;
    case 3:
        pd_bootstrap_encode_health(NULL, 0, &body, &len);
        probe_raw("Health without key", PD_EPERM, PD_BOOTSTRAP_METHOD_HEALTH, body, len);
        pd_free(body);
        return;
    case 4:
        pd_bootstrap_encode_health((const uint8_t *)"nope", 4, &body, &len);
        probe_raw("Health with wrong key", PD_EPERM, PD_BOOTSTRAP_METHOD_HEALTH, body, len);
        pd_free(body);
        return;
    case 5:
        probe_raw("unknown method", PD_EUNSUPPORTED, "/pdserve.v1.Bootstrap/Nope", garbage, 3);
        return;
    case 6: /* pair properly: a good room end to end */
        probe_cur = (struct expect){NULL, PD_OK};
        probe_room_id = PROBE_GOOD_ROOM;
        pd_bootstrap_client_transfer(A.client, probe_room_id, pages, 4, 0, 64, NULL);
        uv_timer_start(&probe_timer, probe_room_end_watch, 20, 20);
        return;
    case 7: {
        uint32_t bad[] = {1, A.pool_pages + 5};
        pd_bootstrap_encode_transfer(A.key, A.key_len, 0x7001, "probe", bad, 2, 0, &body, &len);
        probe_raw("Transfer page out of pool", PD_ERANGE, PD_BOOTSTRAP_METHOD_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 8: {
        uint32_t dup[] = {7, 8, 7};
        pd_bootstrap_encode_transfer(A.key, A.key_len, 0x7002, "probe", dup, 3, 0, &body, &len);
        probe_raw("Transfer duplicate page", PD_EINVAL, PD_BOOTSTRAP_METHOD_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 9: {
        uint32_t many[64];
        for (int i = 0; i < 64; i++)
            many[i] = 100 + (uint32_t)i;
        pd_bootstrap_encode_transfer(A.key, A.key_len, 0x7003, "probe", many, 64, 0, &body, &len);
        probe_raw("Transfer truncated bytes", PD_EINVAL, PD_BOOTSTRAP_METHOD_TRANSFER, body,
                  len - 7);
        pd_free(body);
        return;
    }
    case 10: {
        uint32_t p1[] = {200};
        pd_bootstrap_encode_transfer(A.key, A.key_len, 0x7004, "probe", p1, 1, 0, &body, &len);
        probe_raw("Transfer new room", PD_OK, PD_BOOTSTRAP_METHOD_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 11: {
        uint32_t p1[] = {201};
        pd_bootstrap_encode_transfer(A.key, A.key_len, 0x7004, "probe", p1, 1, 0, &body, &len);
        probe_raw("Transfer duplicate room", PD_EINVAL, PD_BOOTSTRAP_METHOD_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 12: {
        uint32_t p1[] = {202};
        pd_bootstrap_encode_transfer(A.key, A.key_len, 0x7005, "stranger", p1, 1, 0, &body, &len);
        /* NOT_FOUND: the one answer that tells a decode to pair again */
        probe_raw("Transfer from unpaired id", PD_ENOENT, PD_BOOTSTRAP_METHOD_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 13: { /* a call sent under an earlier pairing of ours names another pair id: over UCX
                  it must not be taken as this pairing's (its pages may be others' by now) */
        uint32_t p1[] = {203};
        uint64_t stale = pd_bootstrap_client_pair_id(A.client) + 1;
        pd_bootstrap_encode_transfer(NULL, 0, 0x7006, "probe", p1, 1, stale, &body, &len);
        probe_needle = "has not paired with this prefill";
        probe_raw_via("Transfer over UCX, stale pair", PD_ENOENT, PD_BOOTSTRAP_METHOD_TRANSFER,
                      PD_BOOTSTRAP_CALL_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 14: {
        uint32_t p1[] = {204};
        pd_bootstrap_encode_transfer(NULL, 0, 0x7007, "probe", p1, 1, 0, &body, &len);
        /* an older decode's (a rolling upgrade): served as before */
        probe_raw_via("Transfer over UCX, no pair id", PD_OK, PD_BOOTSTRAP_METHOD_TRANSFER,
                      PD_BOOTSTRAP_CALL_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 15: {
        uint32_t p1[] = {205};
        uint64_t stale = pd_bootstrap_client_pair_id(A.client) + 1;
        pd_bootstrap_encode_transfer(A.key, A.key_len, 0x7008, "probe", p1, 1, stale, &body, &len);
        probe_raw("Transfer over gRPC, stale pair", PD_ENOENT, PD_BOOTSTRAP_METHOD_TRANSFER, body,
                  len);
        pd_free(body);
        return;
    }
    case 16: {
        uint32_t p1[] = {206};
        pd_bootstrap_encode_transfer(NULL, 0, 0x7009, "probe", p1, 1,
                                     pd_bootstrap_client_pair_id(A.client), &body, &len);
        probe_raw_via("Transfer over UCX, this pair", PD_OK, PD_BOOTSTRAP_METHOD_TRANSFER,
                      PD_BOOTSTRAP_CALL_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 17: /* an Abort of a room whose Transfer has not come (its call timed out on the
                decode's side, which then frees its pages when told the room is unknown) */
        pd_bootstrap_encode_abort(A.key, A.key_len, 0x700a, "probe", 0, &body, &len);
        probe_raw("Abort of a room not yet sent", PD_OK, PD_BOOTSTRAP_METHOD_ABORT, body, len);
        pd_free(body);
        return;
    case 18: { /* ... its Transfer, late: refused, or it would write into freed pages */
        uint32_t p1[] = {207};
        pd_bootstrap_encode_transfer(NULL, 0, 0x700a, "probe", p1, 1,
                                     pd_bootstrap_client_pair_id(A.client), &body, &len);
        probe_needle = "aborted this room before its Transfer came";
        probe_raw_via("Transfer after its Abort", PD_EINVAL, PD_BOOTSTRAP_METHOD_TRANSFER,
                      PD_BOOTSTRAP_CALL_TRANSFER, body, len);
        pd_free(body);
        return;
    }
    case 19:
        pd_bootstrap_encode_health(A.key, A.key_len, &body, &len);
        probe_raw("Health still served", PD_OK, PD_BOOTSTRAP_METHOD_HEALTH, body, len);
        pd_free(body);
        return;
    case 20: { /* a decode of another head_dim (and tp): refused naming head_dim, not tp_size,
                  which may differ */
        struct pd_bootstrap_client_config cc = {
            .key = A.key, .key_len = A.key_len, .layout = A.layout, .decode_id = "probe-head-dim"};
        char target[64];
        snprintf(target, sizeof(target), "%s:%d", A.o.host, A.o.port);
        cc.target = target;
        cc.layout.head_dim = A.layout.head_dim * 2;
        cc.layout.tp_size = A.layout.tp_size == 1 ? 2 : 1;
        static char needle[96];
        snprintf(needle, sizeof(needle),
                 "FAILED_PRECONDITION: layout mismatch: head_dim: prefill %u, decode %u",
                 A.layout.head_dim, cc.layout.head_dim);
        struct pd_bootstrap_client_callbacks cb = {.on_paired = on_probe_paired,
                                                   .on_room_rejected = on_probe_rejected};
        pd_bootstrap_client_new(A.bridge, A.x, &cc, &cb, &probe_bad_client);
        probe_cur = (struct expect){"Pair with other head_dim", PD_EMISMATCH};
        probe_needle = needle;
        pd_bootstrap_client_transfer(probe_bad_client, 997, pages, 4, 0, 64, NULL);
        return;
    }
    case 21: /* another decode's live room (0x7004, held for "probe" since check 10): not
                the caller's to end, answered as unknown */
        pd_bootstrap_encode_abort(A.key, A.key_len, 0x7004, "stranger", 0, &body, &len);
        probe_want_found = 0;
        probe_raw("Abort of another's room", PD_OK, PD_BOOTSTRAP_METHOD_ABORT, body, len);
        pd_free(body);
        return;
    case 22: /* ... which its own decode still ends */
        pd_bootstrap_encode_abort(A.key, A.key_len, 0x7004, "probe", 0, &body, &len);
        probe_want_found = 1;
        probe_raw("Abort of its own room", PD_OK, PD_BOOTSTRAP_METHOD_ABORT, body, len);
        pd_free(body);
        return;
    default:
        printf("xfer-test: role=probe checks=%d wrong=%d result=%s\n", A.probe_step - 1,
               A.probe_fail, A.probe_fail ? "FAIL" : "PASS");
        fflush(stdout);
        A.exit_code = A.probe_fail ? 1 : 0;
        shutdown_all();
        return;
    }
}

static void probe_room_end_watch(uv_timer_t *t) {
    if (A.ended == 0)
        return;
    uv_timer_stop(t);
    probe_check("good room end to end", PD_OK, A.peer_failed ? PD_EIO : PD_OK, "");
    probe_next();
}

/* ---- life ---- */

static void on_signal(uv_signal_t *s, int signum) {
    (void)s;
    pd_info("xfer-test: signal %d, shutting down", signum);
    if (A.o.role == ROLE_SENDER) {
        struct pd_xfer_info info;
        pd_xfer_get_info(A.x, &info);
        printf("xfer-test: role=sender rooms=%d done=%d aborted=%d failed=%d live_rooms=%u "
               "result=PASS\n",
               A.s_rooms, A.s_done, A.s_aborted, A.s_failed, info.live_rooms);
        fflush(stdout);
    }
    shutdown_all();
}

static void shutdown_all(void) {
    if (A.stopping)
        return;
    A.stopping = true;
    uv_signal_stop(&A.sigterm);
    uv_signal_stop(&A.sigint);
    uv_close((uv_handle_t *)&A.sigterm, NULL);
    uv_close((uv_handle_t *)&A.sigint, NULL);
    uv_close((uv_handle_t *)&A.tick, NULL);
    if (A.o.role == ROLE_PROBE)
        uv_close((uv_handle_t *)&probe_timer, NULL);
    pd_bootstrap_client_free(probe_bad_client);
    pd_bootstrap_server_free(A.server);
    pd_bootstrap_client_free(A.client);
    probe_bad_client = NULL;
    A.server = NULL;
    A.client = NULL;
    pd_xfer_free(A.x);
    pd_grpc_bridge_free(A.bridge);
}

/* The layout and head split of a model of --model-kv-heads bf16 heads over --shards ranks, as
 * model.c splits them: tp divides the heads, or each head is replicated on tp / heads ranks. */
static int layout_from_opts(const struct opts *o, struct pd_bootstrap_layout *l,
                            struct pd_xfer_heads *h) {
    const int S = o->shards, H = o->model_kv_heads ? o->model_kv_heads : o->kv_heads * S;
    if (S <= H ? H % S != 0 : S % H != 0)
        return pd_errorf(PD_EINVAL, "--shards %d cannot split %d kv heads", S, H);
    *h = (struct pd_xfer_heads){.rows_per_page = (uint32_t)(o->layers * 2 * o->page_size),
                                .head_bytes = (uint32_t)o->head_dim * 2,
                                .total = (uint32_t)H,
                                .count = (uint32_t)(H >= S ? H / S : 1)};
    for (int r = 0; r < S; r++)
        h->start[r] = (uint32_t)(H >= S ? r * (H / S) : r / (S / H));
    memset(l, 0, sizeof(*l));
    snprintf(l->model, sizeof(l->model), "xfer-test");
    l->layers = (uint32_t)o->layers;
    l->kv_heads = h->count;
    l->kv_heads_total = h->total;
    l->head_dim = (uint32_t)o->head_dim;
    l->page_size = (uint32_t)o->page_size;
    snprintf(l->dtype, sizeof(l->dtype), "bf16");
    l->tp_size = (uint32_t)S; /* kv_heads per rank; one pool shard per rank */
    l->page_bytes = (uint64_t)S * h->rows_per_page * h->count * h->head_bytes;
    return PD_OK;
}

int main(int argc, char **argv) {
    struct opts *o = &A.o;
    const char *key_path = NULL;
    *o = (struct opts){.host = "127.0.0.1",
                       .port = 8998,
                       .rooms = 2000,
                       .window = 4,
                       .layers = 1,
                       .kv_heads = 2,
                       .head_dim = 8,
                       .page_size = 16,
                       .shards = 1,
                       .seed = 1,
                       .log_level = PD_LOG_WARNING,
                       .max_pages = SLOT_PAGES,
                       .watch_lost_s = 4};
    struct pd_flagset fs;
    pd_flagset_init(&fs, "pdserve-xfer-test",
                    "Two-process KV transfer test (on 127.0.0.1 unless --host says otherwise): a "
                    "sender (prefill side) and a receiver (decode side) through the gRPC "
                    "bootstrap and UCX.");
    pd_flag_choice(&fs, "--role", &o->role, role_names, "which side this process plays")->required =
        true;
    pd_flag_string(&fs, "--host", &o->host, "ADDR",
                   "bootstrap address: the sender listens on it, the receiver and probe call it");
    pd_flag_int(&fs, "--port", &o->port, "PORT", 1, 65535, "bootstrap port");
    pd_flag_cluster_key(&fs, &key_path);
    pd_flag_int(&fs, "--rooms", &o->rooms, "N", 1, 1e7, "receiver: rooms to transfer");
    pd_flag_int(&fs, "--window", &o->window, "N", 1, MAX_WINDOW, "receiver: rooms in flight");
    pd_flag_int(&fs, "--layers", &o->layers, "N", 1, 256, "layout: layers");
    pd_flag_int(&fs, "--kv-heads", &o->kv_heads, "N", 1, 256,
                "layout: kv heads per shard (without --model-kv-heads)");
    pd_flag_int(&fs, "--model-kv-heads", &o->model_kv_heads, "N", 0, 256,
                "layout: the model's kv heads, split over --shards as model.c splits them (0: "
                "--kv-heads x --shards)");
    pd_flag_int(&fs, "--head-dim", &o->head_dim, "N", 1, 1024, "layout: head dim");
    pd_flag_int(&fs, "--page-size", &o->page_size, "TOKENS", 1, 1024, "layout: tokens per page");
    pd_flag_int(&fs, "--shards", &o->shards, "N", 1, PD_XFER_SHARDS_MAX,
                "KV pool shards of this side (tensor-parallel ranks, layout tp_size); the other "
                "side may run another count");
    pd_flag_int(&fs, "--max-pages", &o->max_pages, "N", 1, SLOT_PAGES, "largest room, pages");
    pd_flag_int(&fs, "--abort-every", &o->abort_every, "K", 0, 1e6,
                "abort every K-th room mid-transfer (receiver: by Abort RPC; sender: failed "
                "notice)");
    pd_flag_bool(&fs, "--expect-peer-death", &o->expect_peer_death,
                 "succeed when the peer dies and every room has ended within bounds");
    pd_flag_int64(&fs, "--seed", &o->seed, "N", 0, 9e18, "receiver: page-set seed");
    pd_flag_double(&fs, "--room-timeout", &o->room_timeout_s, "SECONDS", 0, 86400,
                   "receiver, lossy-link mode: abort a room not ended this long after it was "
                   "issued, count rooms ended without their data as lost and go on, and check "
                   "that no page of a lost room is written after it ended (0 = off)");
    pd_flag_double(&fs, "--watch-lost", &o->watch_lost_s, "SECONDS", 0.1, 86400,
                   "receiver, lossy-link mode: how long a lost room's pages are watched for late "
                   "writes before they serve another room (longer than a link outage)");
    pd_flag_log_level(&fs, &o->log_level);
    if (pd_flags_parse(&fs, argc, argv)) {
        fprintf(stderr, "pdserve-xfer-test: %s\n", pd_error_msg());
        return 2;
    }
    if (fs.help) {
        pd_flags_usage(&fs, stdout);
        return 0;
    }
    pd_log_set_name(role_names[o->role]);
    pd_log_set_level((enum pd_log_level)o->log_level);
    if (layout_from_opts(o, &A.layout, &A.heads) ||
        pd_cluster_key_load(key_path, A.key, &A.key_len)) {
        fprintf(stderr, "pdserve-xfer-test: %s\n", pd_error_msg());
        return 2;
    }
    /* both sides: one slot of SLOT_PAGES per room in flight (sender and receiver agree on
     * --window); the probe needs only a few pages */
    A.pool_pages = o->role == ROLE_PROBE ? 1024 : (uint32_t)o->window * SLOT_PAGES;
    A.shard_bytes = A.layout.page_bytes / (uint64_t)o->shards;
    for (int k = 0; k < o->shards; k++) {
        A.pool[k] = pd_calloc(A.pool_pages, A.shard_bytes);
        if (!A.pool[k]) {
            fprintf(stderr, "pdserve-xfer-test: %s\n", pd_error_msg());
            return 2;
        }
    }
    uv_loop_init(&A.loop);
    uv_signal_init(&A.loop, &A.sigterm);
    uv_signal_init(&A.loop, &A.sigint);
    uv_signal_start(&A.sigterm, on_signal, SIGTERM);
    uv_signal_start(&A.sigint, on_signal, SIGINT);
    uv_timer_init(&A.loop, &A.tick);
    uv_timer_init(&A.loop, &probe_timer);
    signal(SIGPIPE, SIG_IGN);

    struct pd_xfer_config xc = {.abort_timeout_ms = 3000};
    struct pd_xfer_callbacks xcb = {.on_room_end = on_room_end,
                                    .on_peer_failed = on_peer_failed,
                                    .on_peer_closed = on_peer_closed,
                                    .on_call = on_call};
    char addr[64];
    snprintf(addr, sizeof(addr), "%s:%d", o->host, o->port);
    int rc = pd_grpc_bridge_new(&A.loop, &A.bridge);
    if (!rc)
        rc = pd_xfer_new(&A.loop, &xc, &xcb, &A.x);
    if (!rc)
        rc = pd_xfer_register_pool_shards(A.x, (void *const *)A.pool, o->shards, A.shard_bytes,
                                          A.pool_pages);
    if (!rc)
        rc = pd_xfer_register_heads(A.x, &A.heads);
    if (!rc && o->role == ROLE_SENDER) {
        struct pd_bootstrap_server_config sc = {.addr = addr,
                                                .key = A.key,
                                                .key_len = A.key_len,
                                                .layout = A.layout,
                                                .prefill_id = "xfer-test"};
        struct pd_bootstrap_server_callbacks scb = {.on_room = sender_on_room};
        rc = pd_bootstrap_server_new(A.bridge, A.x, &sc, &scb, &A.server);
        if (!rc) {
            printf("xfer-test: READY port=%d\n", o->port);
            fflush(stdout);
        }
    } else if (!rc) {
        struct pd_bootstrap_client_config cc = {.target = addr,
                                                .key = A.key,
                                                .key_len = A.key_len,
                                                .layout = A.layout,
                                                .decode_id =
                                                    o->role == ROLE_PROBE ? "probe" : "receiver"};
        struct pd_bootstrap_client_callbacks ccb = {.on_room_rejected = on_rejected};
        rc = pd_bootstrap_client_new(A.bridge, A.x, &cc, &ccb, &A.client);
        A.t_start = uv_now(&A.loop);
        if (!rc && o->role == ROLE_RECEIVER) {
            /* Room ids unique across receivers run against one sender, as the router's random
             * ones are, and newer than any earlier run's (the sender's slot rule): a sender
             * refuses for good the id of a room aborted before its Transfer came, and a second
             * run counting from 1 again reused an id the first had aborted in an outage
             * (pd_netfault, once). Microseconds of the wall clock: below 2^56 until 4253. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            A.next_seq = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
            receiver_fill();
            if (o->abort_every)
                uv_timer_start(&A.tick, on_tick, 2, 2);
            else if (o->room_timeout_s > 0)
                uv_timer_start(&A.tick, on_tick, 50, 50);
        } else if (!rc) {
            probe_next();
        }
    }
    if (rc) {
        fprintf(stderr, "pdserve-xfer-test: %s\n", pd_error_msg());
        A.exit_code = 2;
        shutdown_all();
    }
    uv_run(&A.loop, UV_RUN_DEFAULT);
    uv_loop_close(&A.loop);
    for (int k = 0; k < o->shards; k++)
        pd_free(A.pool[k]);
    return A.exit_code;
}
