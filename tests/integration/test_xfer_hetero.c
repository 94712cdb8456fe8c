/*
 * test_xfer_hetero.c — heterogeneous tensor parallelism in the transfer engine, inside one
 * process: a sender and a receiver engine whose pools split the model's kv heads over different
 * shard counts (tp 1 ↔ 2 ↔ 4, heads divided or replicated), over whatever UCX_TLS CTest set.
 * What must hold: every byte of every receiver shard equals the logical page (content is a
 * function of room, page, row and kv head, never of the split), the notice's checksum over the
 * logical pages agrees, with host pools (messages packed by UCX straight from the shards), staged
 * device pools of the deferred host devmem (2-D copies into the ring, completing late), and a
 * staged receiver; rooms aborted from the
 * sender with runs queued end on both sides; peers that cannot work are refused at connect naming
 * what differs (the model's heads, head bytes, rows per page, heads past the model, a peer that
 * does not describe its heads, a puts-only engine); a peer splitting alike keeps its puts.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/xfer.h"
#include "common/xfer_plan.h"
#include "model/devmem.h"
#include "pd_test.h"

#define POOL_PAGES 2048
#define ROWS 16       /* 2 layers x K,V x page size 4 */
#define HEAD_BYTES 24 /* head_dim 12, bf16: rows that are no multiple of 8 bytes */

struct side {
    pd_xfer_t *x;
    struct pd_devmem *dm;
    int n_shards;
    struct pd_xfer_heads heads;
    uint8_t *shard[PD_XFER_SHARDS_MAX];
    size_t spb;
    pd_xfer_peer_t *peer;
    int ended, failed;
    int last_status;
    struct pd_xfer_notice last_notice;
    bool got_notice;
};

static struct side snd, rcv;
static uv_loop_t loop;

static void on_end(void *ctx, uint64_t room, void *user, int status,
                   const struct pd_xfer_notice *n) {
    struct side *s = ctx;
    (void)room;
    (void)user;
    s->ended++;
    s->failed += status != PD_OK;
    s->last_status = status;
    s->got_notice = n != NULL;
    if (n)
        s->last_notice = *n;
}

static void on_deadline(uv_timer_t *t) {
    *(bool *)t->data = true;
    uv_stop(t->loop);
}

static bool run_until(const int *done, int want, int ms) {
    bool expired = false;
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    t.data = &expired;
    uv_timer_start(&t, on_deadline, (uint64_t)ms, 0);
    while (*done < want && !expired)
        uv_run(&loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    return *done >= want;
}

/* A model of `total` kv heads over n ranks, as model.c splits them. */
static struct pd_xfer_heads split(int total, int n) {
    struct pd_xfer_heads h = {.rows_per_page = ROWS,
                              .head_bytes = HEAD_BYTES,
                              .total = (uint32_t)total,
                              .count = (uint32_t)(total >= n ? total / n : 1)};
    for (int r = 0; r < n; r++)
        h.start[r] = (uint32_t)(total >= n ? r * (total / n) : r / (n / total));
    return h;
}

enum pool_kind { HOST, STAGED };

/* Makes one side: n shards of a model of total kv heads, host memory or a staged device pool of
 * the deferred host devmem (copies land when their event is polled, last first). */
static void side_up(struct side *s, int total, int n, enum pool_kind kind,
                    const struct pd_xfer_config *cfg) {
    memset(s, 0, sizeof(*s));
    s->n_shards = n;
    s->heads = split(total, n);
    s->spb = (size_t)ROWS * s->heads.count * HEAD_BYTES;
    for (int k = 0; k < n; k++) {
        s->shard[k] = pd_calloc(POOL_PAGES, s->spb);
        PD_ASSERT(s->shard[k]);
    }
    struct pd_xfer_callbacks cb = {.ctx = s, .on_room_end = on_end};
    CHECK_OK(pd_xfer_new(&loop, cfg, &cb, &s->x));
    if (kind == STAGED) {
        struct pd_devmem_opts o = {
            .kind = PD_DEVMEM_HOST, .host_deferred = true, .host_reverse = true};
        CHECK_OK(pd_devmem_new(&o, &s->dm));
        CHECK_OK(pd_xfer_register_device_pool_shards(s->x, (void *const *)s->shard, n, s->spb,
                                                     POOL_PAGES, s->dm, false));
    } else {
        CHECK_OK(
            pd_xfer_register_pool_shards(s->x, (void *const *)s->shard, n, s->spb, POOL_PAGES));
    }
    CHECK_OK(pd_xfer_register_heads(s->x, &s->heads));
}

static void sides_down(void) {
    pd_xfer_free(snd.x);
    pd_xfer_free(rcv.x);
    uv_run(&loop, UV_RUN_DEFAULT);
    for (struct side *s = &snd; s; s = s == &snd ? &rcv : NULL) {
        pd_devmem_free(s->dm);
        for (int k = 0; k < s->n_shards; k++)
            pd_free(s->shard[k]);
    }
}

/* Connects both ways as Pair does; the sender's connect may be refused (returns its status). */
static int pair(void) {
    struct pd_xfer_peer_info ri;
    pd_xfer_local_peer_info(rcv.x, &ri);
    int rc = pd_xfer_peer_connect(snd.x, &ri, NULL, &snd.peer);
    if (rc)
        return rc;
    struct pd_xfer_peer_info si = {.remote_id = pd_xfer_id(snd.x)};
    pd_xfer_local_address(snd.x, &si.worker_addr, &si.worker_addr_len);
    CHECK_OK(pd_xfer_peer_connect(rcv.x, &si, NULL, &rcv.peer));
    fprintf(stderr, "data lane: %s\n", pd_xfer_peer_transport(snd.peer));
    return PD_OK;
}

static uint32_t checksum(const struct side *s, const uint32_t *pages, uint32_t n) {
    return pd_xfer_plan_checksum_heads((void *const *)s->shard, s->n_shards, &s->heads, pages, n);
}

/* Rooms of 1..300 pages, runs and scattered, each sent in three chunks; every byte of every
 * receiver shard checked against the logical page. Returns the page bytes the receiver got. */
static uint64_t rooms_exact(int n_rooms, uint64_t seed) {
    static uint32_t src[300], dst[300];
    uint64_t rng = seed, got_bytes = 0;
    int bad_pages = 0, bad_sums = 0, bad_status = 0;
    for (int i = 0; i < n_rooms; i++) {
        uint64_t room = seed * 1000 + (uint64_t)i;
        uint32_t n = i % 9 == 0 ? 300 : 1 + (uint32_t)(pd_xfer_plan_rand(&rng) % 120);
        double scatter = (double)(pd_xfer_plan_rand(&rng) % 5) / 4.0;
        CHECK_OK(pd_xfer_plan_pages(room, n, scatter, 0, 1024, 1024, 1024, src, dst));
        for (uint32_t p = 0; p < n; p++) {
            for (int k = 0; k < snd.n_shards; k++)
                pd_xfer_plan_fill_heads(room, p, &snd.heads, k,
                                        snd.shard[k] + (size_t)src[p] * snd.spb);
            for (int k = 0; k < rcv.n_shards; k++)
                memset(rcv.shard[k] + (size_t)dst[p] * rcv.spb, 0x5A, rcv.spb);
        }
        int want_r = rcv.ended + 1, want_s = snd.ended + 1;
        CHECK_OK(pd_xfer_room_expect(rcv.x, rcv.peer, room, dst, n, NULL));
        CHECK_OK(pd_xfer_room_add(snd.x, snd.peer, room, dst, n, NULL));
        uint32_t a = n / 3, b = 2 * n / 3;
        CHECK_OK(pd_xfer_room_send(snd.x, room, 0, src, a));
        CHECK_OK(pd_xfer_room_send(snd.x, room, a, src + a, b - a));
        CHECK_OK(pd_xfer_room_send(snd.x, room, b, src + b, n - b));
        struct pd_xfer_notice done = {.first_token = (int32_t)checksum(&snd, src, n),
                                      .cached_tokens = n};
        CHECK_OK(pd_xfer_room_finish(snd.x, room, &done));
        CHECK(run_until(&rcv.ended, want_r, 10000));
        CHECK(run_until(&snd.ended, want_s, 10000));
        bad_status += rcv.last_status != PD_OK || !rcv.got_notice || snd.last_status != PD_OK;
        for (uint32_t p = 0; p < n; p++)
            for (int k = 0; k < rcv.n_shards; k++)
                bad_pages += pd_xfer_plan_check_heads(room, p, &rcv.heads, k,
                                                      rcv.shard[k] + (size_t)dst[p] * rcv.spb) >= 0;
        bad_sums += rcv.last_notice.first_token != (int32_t)checksum(&rcv, dst, n);
        bad_sums += rcv.last_notice.data_bytes != (uint64_t)n * rcv.spb * (uint64_t)rcv.n_shards;
        got_bytes += (uint64_t)n * rcv.spb * (uint64_t)rcv.n_shards;
    }
    CHECK_INT(bad_status, 0);
    CHECK_INT(bad_pages, 0);
    CHECK_INT(bad_sums, 0);
    return got_bytes;
}

/* One sender/receiver split: rooms byte-exact, through the sender's ring when it has a device
 * pool, else packed from its pool. */
static void hetero_case(int total, int ns, int nr, enum pool_kind sk, enum pool_kind rk,
                        const struct pd_xfer_config *cfg) {
    fprintf(stderr, "hetero: %d kv heads, sender %d shards%s, receiver %d%s\n", total, ns,
            sk == STAGED ? " (staged)" : "", nr, rk == STAGED ? " (staged)" : "");
    side_up(&snd, total, ns, sk, cfg);
    side_up(&rcv, total, nr, rk, cfg);
    CHECK_OK(pair());
    CHECK(strstr(pd_xfer_peer_transport(snd.peer), "regrouped") != NULL);
    uint64_t bytes = rooms_exact(40, (uint64_t)(total * 100 + ns * 10 + nr));
    struct pd_xfer_info si, ri;
    pd_xfer_get_info(snd.x, &si);
    pd_xfer_get_info(rcv.x, &ri);
    /* a device pool's runs through its ring; a host pool's packed by UCX from the pool */
    CHECK_INT((long long)si.staged_bytes, sk == STAGED ? (long long)bytes : 0);
    CHECK_INT((long long)ri.dropped_writes, 0);
    CHECK_INT((int)si.live_rooms, 0);
    CHECK_INT((int)ri.live_rooms, 0);
    sides_down();
}

static void test_host_pools(void) {
    struct pd_xfer_config cfg = {0};
    hetero_case(4, 2, 1, HOST, HOST, &cfg);
    hetero_case(4, 1, 2, HOST, HOST, &cfg);
    hetero_case(4, 4, 2, HOST, HOST, &cfg);
    hetero_case(4, 1, 4, HOST, HOST, &cfg);
    hetero_case(2, 1, 4, HOST, HOST, &cfg); /* the receiver replicates each head on 2 shards */
    hetero_case(2, 4, 1, HOST, HOST, &cfg); /* the sender does: each head taken once */
    hetero_case(2, 4, 2, HOST, HOST, &cfg);
    hetero_case(1, 1, 2, HOST, HOST, &cfg); /* one head on every shard */
}

/* Through small ring slots (many per room, runs split by the receiver's page size) and messages
 * that cut rows: staged sender pools with late copies, a staged receiver. */
static void test_staged_and_small(void) {
    struct pd_xfer_config cfg = {
        .stage_slots = 3, .stage_slot_bytes = 6 * 1536, .am_chunk_bytes = 1000};
    hetero_case(4, 2, 1, STAGED, HOST, &cfg);
    hetero_case(2, 1, 4, STAGED, HOST, &cfg); /* its pages are twice ours */
    hetero_case(4, 4, 2, HOST, STAGED, &cfg);
    hetero_case(2, 2, 4, STAGED, STAGED, &cfg);
    hetero_case(4, 1, 2, HOST, HOST, &cfg);
}

/* The sender aborts a room with runs still queued for the ring: both sides end it. */
static void test_abort_queued(void) {
    struct pd_xfer_config cfg = {.stage_slots = 2, .stage_slot_bytes = 4 * 1536};
    side_up(&snd, 4, 2, STAGED, &cfg);
    side_up(&rcv, 4, 1, HOST, &cfg);
    CHECK_OK(pair());
    uint32_t src[64], dst[64];
    CHECK_OK(pd_xfer_plan_pages(3, 64, 0.5, 0, 256, 0, 256, src, dst));
    CHECK_OK(pd_xfer_room_expect(rcv.x, rcv.peer, 11, dst, 64, NULL));
    CHECK_OK(pd_xfer_room_add(snd.x, snd.peer, 11, dst, 64, NULL));
    CHECK_OK(pd_xfer_room_send(snd.x, 11, 0, src, 64));
    CHECK_OK(pd_xfer_room_abort(snd.x, 11, PD_ECANCELED, "client went away"));
    CHECK(run_until(&rcv.ended, 1, 5000));
    CHECK(run_until(&snd.ended, 1, 5000));
    CHECK_INT(rcv.last_status, PD_ECANCELED);
    rooms_exact(5, 77); /* the ring serves the next rooms */
    sides_down();
}

/* What cannot work is refused at connect, naming it; a peer splitting alike keeps its puts. */
static void test_refusals(void) {
    struct pd_xfer_config cfg = {0};
    side_up(&snd, 4, 2, HOST, &cfg);
    side_up(&rcv, 4, 1, HOST, &cfg);
    struct pd_xfer_peer_info ri;
    pd_xfer_local_peer_info(rcv.x, &ri);
    pd_xfer_peer_t *p = NULL;
    struct pd_xfer_peer_info bad = ri;
    bad.heads.total = 8;
    CHECK_ERR(pd_xfer_peer_connect(snd.x, &bad, NULL, &p), PD_EMISMATCH,
              "the model's kv heads: theirs 8, ours 4");
    bad = ri;
    bad.heads.head_bytes = 48;
    CHECK_ERR(pd_xfer_peer_connect(snd.x, &bad, NULL, &p), PD_EMISMATCH,
              "bytes per kv head (head_dim x element size): theirs 48, ours 24");
    bad = ri;
    bad.heads.rows_per_page = 32;
    CHECK_ERR(pd_xfer_peer_connect(snd.x, &bad, NULL, &p), PD_EMISMATCH,
              "rows per page (layers x K,V x page_size): theirs 32, ours 16");
    bad = ri;
    bad.heads.start[0] = 2; /* heads [2, 6) of 4 */
    CHECK_ERR(pd_xfer_peer_connect(snd.x, &bad, NULL, &p), PD_EMISMATCH, "are past the model's 4");
    bad = ri;
    bad.heads.count = 2; /* 16 rows x 2 heads x 24 bytes is not its 1536-byte shard page */
    CHECK_ERR(pd_xfer_peer_connect(snd.x, &bad, NULL, &p), PD_EMISMATCH,
              "are not 16 rows of 2 kv heads of 24 bytes");
    bad = ri;
    memset(&bad.heads, 0, sizeof(bad.heads)); /* a peer from before heterogeneous tp */
    CHECK_ERR(pd_xfer_peer_connect(snd.x, &bad, NULL, &p), PD_EMISMATCH,
              "the peer does not say how its shards split the kv heads");
    CHECK(p == NULL);
    /* a puts-only engine cannot regroup; its own heads are checked at registration */
    struct pd_xfer_config put = {.data_path = PD_XFER_DATA_PUT};
    struct side other;
    side_up(&other, 4, 2, HOST, &put);
    CHECK_ERR(pd_xfer_peer_connect(other.x, &ri, NULL, &p), PD_EMISMATCH,
              "configured to send them as puts");
    struct pd_xfer_heads h = split(4, 2);
    h.count = 1;
    CHECK_ERR(pd_xfer_register_heads(other.x, &h), PD_EINVAL, "1 heads per shard of 4, 2 shards");
    h = split(4, 2);
    h.start[1] = 0; /* heads 2 and 3 in no shard */
    CHECK_ERR(pd_xfer_register_heads(other.x, &h), PD_EINVAL, "kv head 2 is in no shard");
    /* a peer of our own split, with heads described: shard to shard, puts as configured */
    struct side twin;
    side_up(&twin, 4, 2, HOST, &put);
    struct pd_xfer_peer_info ti;
    pd_xfer_local_peer_info(twin.x, &ti);
    CHECK_OK(pd_xfer_peer_connect(other.x, &ti, NULL, &p));
    CHECK(strstr(pd_xfer_peer_transport(p), "(put)") != NULL);
    pd_xfer_free(other.x);
    pd_xfer_free(twin.x);
    sides_down();
    for (int k = 0; k < 2; k++) {
        pd_free(other.shard[k]);
        pd_free(twin.shard[k]);
    }
}

static void loop_open(void) {
    CHECK_INT(uv_loop_init(&loop), 0);
    pd_log_set_level(PD_LOG_WARNING);
}

static void loop_close(void) {
    CHECK_INT(uv_loop_close(&loop), 0);
}

PD_TEST_MAIN(PD_TEST(loop_open), PD_TEST(test_host_pools), PD_TEST(test_staged_and_small),
             PD_TEST(test_abort_queued), PD_TEST(test_refusals), PD_TEST(loop_close))
