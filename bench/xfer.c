/*
 * xfer.c — pdserve-bench-xfer: KV page transfer throughput of the engine (common/xfer.h) between
 * two processes on 127.0.0.1, next to ucx_perftest's ucp_put_bw measured in the same run with
 * the same UCX_TLS.
 *
 * Pages have the shape of qwen2.5-1.5b with page size 16 (28 layers, K and V, 2 kv heads, head
 * dim 128, bf16: 448 KiB per page, all layers of a page contiguous in the page-major pool). Two
 * sets of --pages pages out of pools twice that size: one run of consecutive pages, and a
 * scattered set where --scatter of the pages are single and the rest come in runs of 2..16
 * (common/xfer_plan.h). A room's time counts from its first send until the receiver reports it
 * ended (notice and every byte in), over the socketpair the two halves share; rooms go one after
 * another. Each measurement times both sets and then the references while our engines sit idle;
 * --repeats measurements, medians reported: the machine is shared and noisy.
 *
 * The reference is ucx_perftest ucp_put_bw with -e: endpoints with error handling, as ours have
 * (UCP_ERR_HANDLING_MODE_PEER), so that UCX picks the same lanes for both (without it, shared
 * memory gets cma's zero-copy lane, which UCX 1.13 does not offer to error-handling endpoints),
 * and with the engine's UCX_MM_SEG_SIZE and UCX_TCP_TX_SEG_SIZE (PD_XFER_MM_SEG_SIZE,
 * PD_XFER_TCP_SEG_SIZE) unless the environment sets them.
 * ucx_perftest puts one buffer of the message size over and over, so a page-sized message is
 * served from the CPU cache while our pages come from a pool larger than it: a reference at
 * the page size measures the cache, not memory. The judged reference is therefore one put of the
 * room's bytes from a buffer the room's size: the consecutive set's own run, and the best case
 * for moving the scattered set's bytes. The page-sized one is printed beside it, not judged.
 *
 * --shards N splits the same page bytes over N pool shards (tensor-parallel ranks, xfer.h): a
 * run then moves as N puts or N streams of messages of a shard's part, so this measures what
 * tensor parallelism costs the transfer at equal bytes.
 *
 * --send-shards A --recv-shards B (A != B) measures heterogeneous tensor parallelism: the pools
 * split the model's 2 kv heads over A and B ranks as model.c does (replicated past 2), and the
 * sender regroups every page into the receiver's shards through its staging ring. The same
 * sender serves, in the same run, a receiver of its own split (A -> A, the homogeneous figure,
 * shard to shard on the lane's own path); the two alternate within each measurement, and the
 * judged figure is the ratio of the hetero room rate (pages/s) to the homogeneous one (target
 * >= 85%). No ucx_perftest then: the homogeneous pair is the reference.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/base/alloc.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "common/xfer.h"
#include "common/xfer_plan.h"

struct opts {
    int pages;   /* per room */
    int reps;    /* rooms per set and measurement */
    int repeats; /* measurements; medians are reported */
    double scatter;
    int am_chunk; /* bytes; 0 = the engine's choice */
    int perftest_iters;
    int perftest_seconds; /* wall-clock cap of one ucx_perftest run */
    const char *perftest;
    int port;
    int shards;
    int send_shards, recv_shards; /* 0: --shards */
    int log_level;
};

static size_t page_bytes(void) {
    return (size_t)28 * 2 * 16 * 2 * 128 * 2;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the blocking exchange before the loops start (a socketpair between the two halves) ---- */

/* The socket is non-blocking once a uv_poll_t watches it: wait for it rather than fail. */
static bool again(int fd, short events) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return false;
    struct pollfd pf = {.fd = fd, .events = events};
    poll(&pf, 1, -1);
    return true;
}

static void xwrite(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && again(fd, POLLOUT))
            continue;
        if (k <= 0) {
            perror("bench: write");
            exit(1);
        }
        c += k;
        n -= (size_t)k;
    }
}

static void xread(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && again(fd, POLLIN))
            continue;
        if (k <= 0) {
            perror("bench: read");
            exit(1);
        }
        c += k;
        n -= (size_t)k;
    }
}

static void send_blob(int fd, const void *p, size_t n) {
    uint64_t len = n;
    xwrite(fd, &len, sizeof(len));
    xwrite(fd, p, n);
}

static void *recv_blob(int fd, size_t *n) {
    uint64_t len;
    xread(fd, &len, sizeof(len));
    void *p = pd_malloc(len ? len : 1);
    PD_ASSERT(p);
    xread(fd, p, len);
    *n = len;
    return p;
}

/* A receiver as the sender sees it: its child process, socket and peer handle. */
struct conn {
    pid_t pid;
    int sock;
    uv_poll_t poll;
    pd_xfer_peer_t *peer;
    void *addr, *rkeys[PD_XFER_SHARDS_MAX];
    int n_shards;
    size_t page_bytes; /* its logical page */
};

struct side {
    uv_loop_t loop;
    pd_xfer_t *x;
    uint8_t *pool[PD_XFER_SHARDS_MAX]; /* [n_pages][shard bytes] each */
    uint32_t n_pages;
    pd_xfer_peer_t *peer; /* receiver: the sender */
    int ended, failed;
    int acked; /* sender: rooms a receiver reported ended */
    int sock;  /* receiver: to the sender */
    uv_poll_t sock_poll;
    bool quit;
};

static struct side S;

static bool is_receiver;

static void on_end(void *ctx, uint64_t room, void *user, int status,
                   const struct pd_xfer_notice *n) {
    (void)ctx;
    (void)room;
    (void)user;
    (void)n;
    S.ended++;
    S.failed += status != PD_OK;
    if (is_receiver)
        xwrite(S.sock, status == PD_OK ? "d" : "f", 1);
}

/* Receiver: 'e' room u64 n u32 dst[n] = expect a room; 'q' = quit. Sender: 'd'/'f' = the
 * receiver's room ended (ok / failed). The handle's data is its socket. */
static void on_sock(uv_poll_t *h, int status, int events) {
    (void)status;
    (void)events;
    const int fd = (int)(intptr_t)h->data;
    char c;
    ssize_t got = read(fd, &c, 1);
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (got <= 0 || c == 'q') {
        S.quit = true;
        uv_poll_stop(h);
        uv_stop(h->loop);
    } else if (c == 'd' || c == 'f') {
        S.acked++;
        S.failed += c == 'f';
    } else if (c == 'e') {
        uint64_t room;
        uint32_t n;
        xread(fd, &room, sizeof(room));
        xread(fd, &n, sizeof(n));
        uint32_t *dst = pd_malloc((n ? n : 1) * sizeof(*dst));
        PD_ASSERT(dst);
        xread(fd, dst, n * sizeof(*dst));
        if (pd_xfer_room_expect(S.x, S.peer, room, dst, n, NULL)) {
            fprintf(stderr, "bench: %s\n", pd_error_msg());
            exit(1);
        }
        pd_free(dst);
        xwrite(fd, "e", 1); /* expected: the sender may start */
    }
}

static size_t am_chunk;  /* --am-chunk, for both halves */
static int n_shards = 1; /* this process's pool shards */
/* --send-shards != --recv-shards: the pools split the model's kv heads as model.c does */
static bool use_heads;

/* qwen2.5-1.5b's 2 kv heads over n ranks (replicated on n / 2 ranks each past 2) */
static struct pd_xfer_heads model_heads(int n) {
    struct pd_xfer_heads h = {.rows_per_page = 28 * 2 * 16,
                              .head_bytes = 128 * 2,
                              .total = 2,
                              .count = n <= 2 ? (uint32_t)(2 / n) : 1};
    for (int r = 0; r < n; r++)
        h.start[r] = n <= 2 ? (uint32_t)r * h.count : (uint32_t)(r / (n / 2));
    return h;
}

/* One page of one shard of a pool of n shards. */
static size_t shard_bytes(int n) {
    if (!use_heads)
        return page_bytes() / (size_t)n; /* the same bytes split n ways */
    struct pd_xfer_heads h = model_heads(n);
    return (size_t)h.rows_per_page * h.count * h.head_bytes;
}

static void engine_up(struct side *s, uint32_t n_pages) {
    struct pd_xfer_config cfg = {.am_chunk_bytes = am_chunk}; /* as the daemons run it */
    struct pd_xfer_callbacks cb = {.on_room_end = on_end};
    uv_loop_init(&s->loop);
    s->n_pages = n_pages;
    const size_t spb = shard_bytes(n_shards);
    for (int k = 0; k < n_shards; k++) {
        s->pool[k] = pd_calloc(n_pages, spb);
        PD_ASSERT(s->pool[k]);
    }
    struct pd_xfer_heads h = model_heads(n_shards);
    if (pd_xfer_new(&s->loop, &cfg, &cb, &s->x) ||
        pd_xfer_register_pool_shards(s->x, (void *const *)s->pool, n_shards, spb, n_pages) ||
        (use_heads && pd_xfer_register_heads(s->x, &h))) {
        fprintf(stderr, "bench: %s\n", pd_error_msg());
        exit(1);
    }
}

static void engine_down(struct side *s) {
    pd_xfer_free(s->x);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    for (int k = 0; k < n_shards; k++)
        pd_free(s->pool[k]);
}

static int receiver_main(int sock, uint32_t n_pages) {
    S.sock = sock;
    is_receiver = true;
    engine_up(&S, n_pages);
    struct pd_xfer_peer_info me;
    pd_xfer_local_peer_info(S.x, &me);
    xwrite(sock, &me.remote_id, sizeof(me.remote_id));
    send_blob(sock, me.worker_addr, me.worker_addr_len);
    xwrite(sock, &me.n_shards, sizeof(me.n_shards));
    xwrite(sock, &me.heads, sizeof(me.heads)); /* one binary on both ends */
    for (int k = 0; k < n_shards; k++) {       /* every shard: base, rkey */
        xwrite(sock, &me.shards[k].base, sizeof(me.shards[k].base));
        send_blob(sock, me.shards[k].rkey, me.shards[k].rkey_len);
    }
    struct pd_xfer_peer_info pi = {0}; /* the sender: liveness and notices only */
    xread(sock, &pi.remote_id, sizeof(pi.remote_id));
    void *saddr = recv_blob(sock, &pi.worker_addr_len);
    pi.worker_addr = saddr;
    if (pd_xfer_peer_connect(S.x, &pi, NULL, &S.peer)) {
        fprintf(stderr, "bench: %s\n", pd_error_msg());
        exit(1);
    }
    uv_poll_init(&S.loop, &S.sock_poll, sock);
    S.sock_poll.data = (void *)(intptr_t)sock;
    uv_poll_start(&S.sock_poll, UV_READABLE, on_sock);
    while (!S.quit)
        uv_run(&S.loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&S.sock_poll, NULL);
    engine_down(&S);
    pd_free(saddr);
    return 0;
}

static int want_acked;

static void on_prepare(uv_prepare_t *p) {
    if (S.ended >= *(int *)p->data && S.acked >= want_acked)
        uv_stop(p->loop);
}

/* Tells the receiver to expect the room and waits until it does (not timed: decode expects a
 * room before prefill hears of it). */
static void expect_room(int sock, uint64_t room, const uint32_t *dst, uint32_t n) {
    xwrite(sock, "e", 1);
    xwrite(sock, &room, sizeof(room));
    xwrite(sock, &n, sizeof(n));
    xwrite(sock, dst, n * sizeof(*dst));
    char c;
    xread(sock, &c, 1);
    PD_ASSERT(c == 'e');
}

/* Sends `reps` rooms of the given page set to receiver c one after another; returns seconds. */
static double run_set(struct conn *c, const uint32_t *src, const uint32_t *dst, uint32_t n,
                      int reps) {
    uv_prepare_t prep;
    int want = 0;
    uv_prepare_init(&S.loop, &prep);
    prep.data = &want;
    uv_prepare_start(&prep, on_prepare);
    double secs = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t room = (uint64_t)r + 1 + (uint64_t)S.ended * 1000;
        struct pd_xfer_notice done = {.first_token = 1};
        expect_room(c->sock, room, dst, n);
        double t0 = now_s();
        want_acked = S.acked + 1;
        if (pd_xfer_room_add(S.x, c->peer, room, dst, n, NULL) ||
            pd_xfer_room_send(S.x, room, 0, src, n) || pd_xfer_room_finish(S.x, room, &done)) {
            fprintf(stderr, "bench: %s\n", pd_error_msg());
            exit(1);
        }
        want = S.ended + 1;
        while (S.ended < want || S.acked < want_acked)
            uv_run(&S.loop, UV_RUN_DEFAULT);
        secs += now_s() - t0;
    }
    uv_close((uv_handle_t *)&prep, NULL);
    uv_run(&S.loop, UV_RUN_NOWAIT);
    return secs;
}

/* Runs ucx_perftest `test` (ucp_put_bw) with error-handling endpoints over 127.0.0.1 with this
 * environment (UCX_TLS included); GB/s (10^9), or -1. UCX's software puts over tcp crawl at
 * large sizes (25 MB/s for 8 MiB and up here), so a run is capped at --perftest-seconds; one
 * that hit the cap sets *partial and yields a figure that flatters the reference: its last
 * one-second report (what it had posted by then), else the bound its unfinished puts set. */
static double perftest(const struct opts *o, const char *test, size_t bytes, bool *partial) {
    char cmd[512];
    /* ~1 GiB, at least --perftest-iters iterations: warm-up must not dominate */
    long n_iters = (long)(((size_t)1 << 30) / bytes);
    if (n_iters < o->perftest_iters)
        n_iters = o->perftest_iters;
    long warm = n_iters / 10 > 1 ? n_iters / 10 : 1;
    pid_t srv = fork();
    if (srv == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 1);
        dup2(devnull, 2);
        char port[16];
        snprintf(port, sizeof(port), "%d", o->port);
        execl(o->perftest, o->perftest, "-p", port, "-e", (char *)NULL);
        _exit(127);
    }
    usleep(300000);
    snprintf(cmd, sizeof(cmd),
             "timeout -s INT %d %s 127.0.0.1 -p %d -e -t %s -s %zu -n %ld -w %ld 2>/dev/null",
             o->perftest_seconds, o->perftest, o->port, test, bytes, n_iters, warm);
    double mbs = -1, last = -1, secs = 0;
    for (int attempt = 0; attempt < 3 && mbs < 0 && last < 0 && secs < 2; attempt++) {
        double t0 = now_s();
        FILE *f = popen(cmd, "r");
        char line[512];
        while (f && fgets(line, sizeof(line), f)) {
            double v[8];
            /* "Final:  iters  lat_typ lat_avg lat_ovr  bw_avg bw_ovr  rate_avg rate_ovr", and
             * once a second the same columns after "[thread 0]" */
            const char *p = strstr(line, "Final:"), *q = strstr(line, "[thread 0]");
            if (p && sscanf(p + 6, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                            &v[4], &v[5], &v[6], &v[7]) == 8)
                mbs = v[5];
            else if (q && sscanf(q + 10, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2],
                                 &v[3], &v[4], &v[5], &v[6], &v[7]) == 8)
                last = v[5];
        }
        if (f)
            pclose(f);
        secs = now_s() - t0; /* a quick failure (port not up yet) is tried again */
        if (mbs < 0 && last < 0 && secs < 2)
            usleep(300000);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    *partial = mbs < 0 && secs >= o->perftest_seconds - 0.5;
    if (mbs >= 0)
        return mbs * 1048576.0 / 1e9; /* perftest's MB are 2^20 bytes */
    if (!*partial)
        return -1;
    if (last >= 0)
        return last * 1048576.0 / 1e9;
    return (double)bytes * (double)(n_iters + warm) / secs / 1e9; /* not all of them done */
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[n] (sorted in place); -1 when any is -1 (a reference that did not run). */
static double median(double *v, int n) {
    for (int i = 0; i < n; i++)
        if (v[i] < 0)
            return -1;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define MAX_REPEATS 64

struct set {
    const char *name;
    uint32_t *src, *dst;
    double gbs[MAX_REPEATS];
    double pps[2][MAX_REPEATS]; /* pages/s to receiver 0 (homogeneous) and 1 (hetero) */
    double target;              /* share of the reference */
    uint32_t runs, single;
};

/* Forks a receiver of `shards` shards (before the sender's engine exists: the child must not
 * inherit UCX state). */
static void spawn_receiver(struct conn *c, int shards, uint32_t n_pool) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
        perror("socketpair");
        exit(1);
    }
    c->pid = fork();
    if (c->pid == 0) {
        close(sv[0]);
        n_shards = shards;
        _exit(receiver_main(sv[1], n_pool));
    }
    close(sv[1]);
    c->sock = sv[0];
}

/* Learns the receiver's pool, connects to it and gives it our address. */
static void connect_receiver(struct conn *c, uint32_t n_pool) {
    struct pd_xfer_peer_info pi = {.n_pages = n_pool};
    xread(c->sock, &pi.remote_id, sizeof(pi.remote_id));
    c->addr = recv_blob(c->sock, &pi.worker_addr_len);
    pi.worker_addr = c->addr;
    xread(c->sock, &pi.n_shards, sizeof(pi.n_shards));
    xread(c->sock, &pi.heads, sizeof(pi.heads));
    PD_ASSERT(pi.n_shards >= 1 && pi.n_shards <= PD_XFER_SHARDS_MAX);
    c->n_shards = pi.n_shards;
    pi.shard_page_bytes = shard_bytes(pi.n_shards);
    pi.page_bytes = pi.shard_page_bytes * (uint64_t)pi.n_shards;
    c->page_bytes = pi.page_bytes;
    for (int k = 0; k < pi.n_shards; k++) {
        xread(c->sock, &pi.shards[k].base, sizeof(pi.shards[k].base));
        c->rkeys[k] = recv_blob(c->sock, &pi.shards[k].rkey_len);
        pi.shards[k].rkey = c->rkeys[k];
    }
    pi.rkey = pi.shards[0].rkey; /* one shard: the fields that predate shards */
    pi.rkey_len = pi.shards[0].rkey_len;
    pi.base = pi.shards[0].base;
    if (pd_xfer_peer_connect(S.x, &pi, NULL, &c->peer)) {
        fprintf(stderr, "bench: %s\n", pd_error_msg());
        exit(1);
    }
    uint64_t my_id = pd_xfer_id(S.x);
    const void *my_addr;
    size_t my_addr_len;
    pd_xfer_local_address(S.x, &my_addr, &my_addr_len);
    xwrite(c->sock, &my_id, sizeof(my_id));
    send_blob(c->sock, my_addr, my_addr_len);
    uv_poll_init(&S.loop, &c->poll, c->sock);
    c->poll.data = (void *)(intptr_t)c->sock;
    uv_poll_start(&c->poll, UV_READABLE, on_sock);
}

static void close_receiver(struct conn *c) {
    xwrite(c->sock, "q", 1);
    waitpid(c->pid, NULL, 0);
    uv_close((uv_handle_t *)&c->poll, NULL);
}

static void free_receiver(struct conn *c) {
    close(c->sock);
    pd_free(c->addr);
    for (int k = 0; k < c->n_shards; k++)
        pd_free(c->rkeys[k]);
}

int main(int argc, char **argv) {
    struct opts o = {.pages = 256,
                     .reps = 8,
                     .repeats = 5,
                     .scatter = 0.5,
                     .perftest_iters = 3,
                     .perftest_seconds = 10,
                     .perftest = "/usr/bin/ucx_perftest",
                     .port = 13377,
                     .shards = 1,
                     .log_level = PD_LOG_WARNING};
    struct pd_flagset fs;
    pd_flagset_init(&fs, "pdserve-bench-xfer",
                    "KV page transfer throughput between two processes (qwen2.5-1.5b pages, page "
                    "size 16) next to ucx_perftest -e ucp_put_bw with the same UCX_TLS, measured "
                    "in the same run; medians of --repeats measurements, PASS/FAIL against the "
                    "targets (consecutive >= 85%, scattered >= 60% of the reference). With "
                    "--send-shards != --recv-shards: heterogeneous tensor parallelism against "
                    "the same run's homogeneous pair (target >= 85% of its room rate).");
    pd_flag_int(&fs, "--pages", &o.pages, "N", 1, 4096, "pages per room");
    pd_flag_int(&fs, "--reps", &o.reps, "N", 1, 100000, "rooms per page set and measurement");
    pd_flag_int(&fs, "--repeats", &o.repeats, "N", 1, MAX_REPEATS,
                "measurements of each set and reference; medians are reported");
    pd_flag_double(&fs, "--scatter", &o.scatter, "F", 0.0, 1.0,
                   "share of the scattered set's pages that are single (not in a run)");
    pd_flag_int(&fs, "--am-chunk", &o.am_chunk, "BYTES", 0, 65344,
                "page data per active message (0: the engine's choice for the lane)");
    pd_flag_int(&fs, "--perftest-iters", &o.perftest_iters, "N", 1, 1e6,
                "least ucx_perftest iterations (more for small messages: ~1 GiB each)");
    pd_flag_int(&fs, "--perftest-seconds", &o.perftest_seconds, "S", 1, 3600,
                "cap of one ucx_perftest run; past it, its last report is taken (marked partial)");
    pd_flag_string(&fs, "--perftest", &o.perftest, "PATH",
                   "ucx_perftest binary (Debian package ucx-utils)");
    pd_flag_int(&fs, "--perftest-port", &o.port, "PORT", 1024, 65535, "ucx_perftest port");
    pd_flag_int(&fs, "--shards", &o.shards, "N", 1, PD_XFER_SHARDS_MAX,
                "KV pool shards (tensor-parallel ranks): the same bytes per page split into N "
                "shards on both sides");
    pd_flag_int(&fs, "--send-shards", &o.send_shards, "N", 0, PD_XFER_SHARDS_MAX,
                "the sender's tensor-parallel ranks (0: --shards); with --recv-shards other "
                "than it, the 2 kv heads split per rank and the pages regrouped");
    pd_flag_int(&fs, "--recv-shards", &o.recv_shards, "N", 0, PD_XFER_SHARDS_MAX,
                "the receiver's tensor-parallel ranks (0: --shards)");
    pd_flag_log_level(&fs, &o.log_level);
    if (pd_flags_parse(&fs, argc, argv)) {
        fprintf(stderr, "pdserve-bench-xfer: %s\n", pd_error_msg());
        return 2;
    }
    if (fs.help) {
        pd_flags_usage(&fs, stdout);
        return 0;
    }
    pd_log_set_level((enum pd_log_level)o.log_level);
    const int ss = o.send_shards ? o.send_shards : o.shards;
    const int rs = o.recv_shards ? o.recv_shards : o.shards;
    const bool hetero = ss != rs;
    use_heads = hetero;
    if (!hetero && page_bytes() % (size_t)ss) {
        fprintf(stderr, "pdserve-bench-xfer: --shards %d does not divide a page's %zu bytes\n", ss,
                page_bytes());
        return 2;
    }
    if (hetero && ((ss > 2 && ss % 2) || (rs > 2 && rs % 2))) {
        fprintf(stderr, "pdserve-bench-xfer: %d and %d ranks cannot both split 2 kv heads\n", ss,
                rs);
        return 2;
    }
    bool have_ref = !hetero && access(o.perftest, X_OK) == 0;
    if (!hetero && !have_ref)
        fprintf(stderr, "bench: %s not found (Debian package ucx-utils); no reference\n",
                o.perftest);
    /* the engine's shared-memory and tcp segment sizes, for the engine and ucx_perftest alike */
    setenv("UCX_MM_SEG_SIZE", PD_XFER_MM_SEG_SIZE, 0);
    setenv("UCX_TCP_TX_SEG_SIZE", PD_XFER_TCP_SEG_SIZE, 0);
    uint32_t n = (uint32_t)o.pages;
    uint32_t n_pool = 2 * n; /* room for a scattered set */
    am_chunk = (size_t)o.am_chunk;
    /* receiver 0 splits as we do; receiver 1 (hetero) as --recv-shards says */
    const int n_conns = hetero ? 2 : 1;
    struct conn conns[2] = {{0}};
    spawn_receiver(&conns[0], ss, n_pool);
    if (hetero)
        spawn_receiver(&conns[1], rs, n_pool);
    n_shards = ss;
    engine_up(&S, n_pool);
    for (int c = 0; c < n_conns; c++)
        connect_receiver(&conns[c], n_pool);
    const char *tls = getenv("UCX_TLS");
    const size_t pb = page_bytes(), room_bytes = (size_t)n * pb;
    if (!hetero)
        printf("bench/xfer: UCX_TLS=%s UCX_MM_SEG_SIZE=%s UCX_TCP_TX_SEG_SIZE=%s, data lane %s; "
               "pages of %zu bytes "
               "(qwen2.5-1.5b, page size 16) in %d shard(s), %u per room (%.1f MiB), %d rooms "
               "per measurement, %d measurements\n",
               tls ? tls : "all", getenv("UCX_MM_SEG_SIZE"), getenv("UCX_TCP_TX_SEG_SIZE"),
               pd_xfer_peer_transport(conns[0].peer), pb, ss, n, (double)room_bytes / 1048576,
               o.reps, o.repeats);
    else
        printf("bench/xfer: UCX_TLS=%s UCX_MM_SEG_SIZE=%s UCX_TCP_TX_SEG_SIZE=%s; qwen2.5-1.5b "
               "pages (2 kv heads, page "
               "size 16), %u per room, %d rooms per measurement, %d measurements; homogeneous "
               "%d -> %d shards (pages of %zu bytes), data lane %s; heterogeneous %d -> %d "
               "(receiver pages of %zu bytes), data lane %s\n",
               tls ? tls : "all", getenv("UCX_MM_SEG_SIZE"), getenv("UCX_TCP_TX_SEG_SIZE"), n,
               o.reps, o.repeats, ss, ss, conns[0].page_bytes,
               pd_xfer_peer_transport(conns[0].peer), ss, rs, conns[1].page_bytes,
               pd_xfer_peer_transport(conns[1].peer));

    static char scat_name[32];
    snprintf(scat_name, sizeof(scat_name), "scattered-%.0f%%", 100 * o.scatter);
    struct set sets[2] = {{.name = "consecutive", .target = 0.85},
                          {.name = scat_name, .target = hetero ? 0.85 : 0.60}};
    for (int k = 0; k < 2; k++) {
        sets[k].src = pd_malloc(n * sizeof(uint32_t));
        sets[k].dst = pd_malloc(n * sizeof(uint32_t));
        PD_ASSERT(sets[k].src && sets[k].dst);
    }
    for (uint32_t i = 0; i < n; i++)
        sets[0].src[i] = sets[0].dst[i] = i;
    if (pd_xfer_plan_pages(7, n, o.scatter, 0, n_pool, 0, n_pool, sets[1].src, sets[1].dst)) {
        fprintf(stderr, "bench: %s\n", pd_error_msg());
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        pd_xfer_plan_runs(sets[k].src, sets[k].dst, n, &sets[k].runs, &sets[k].single);
        printf("bench/xfer: %-15s %u runs, %u of %u pages single, mean run %.2f pages\n",
               sets[k].name, sets[k].runs, sets[k].single, n, (double)n / sets[k].runs);
        for (int c = 0; c < n_conns; c++) /* warm-up: connection, first touch */
            run_set(&conns[c], sets[k].src, sets[k].dst, n, 1);
    }
    /* The references. ucx_perftest puts one buffer of the message size again and again, so a
     * message of one page (448 KiB) lives in the CPU cache while our pages come from a pool
     * larger than it: that one is shown, not judged. The judged reference puts the room's bytes
     * as one message (the consecutive set's run), from a buffer the size of the room. Hetero:
     * the homogeneous pair of the same measurement, the two in alternating order. */
    double ref_room[MAX_REPEATS], ref_page[MAX_REPEATS];
    bool partial = false;
    for (int r = 0; r < o.repeats; r++) {
        printf("bench/xfer: measurement %d:", r + 1);
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < n_conns; i++) {
                int c = (r + k + i) % n_conns;
                double secs = run_set(&conns[c], sets[k].src, sets[k].dst, n, o.reps);
                sets[k].pps[c][r] = (double)n * o.reps / secs;
                if (c == 0)
                    sets[k].gbs[r] = (double)room_bytes * o.reps / secs / 1e9;
                if (hetero)
                    printf(" %s %s %.0f pages/s;", sets[k].name, c ? "hetero" : "homogeneous",
                           sets[k].pps[c][r]);
                else
                    printf(" %s %.3f GB/s;", sets[k].name, sets[k].gbs[r]);
            }
        }
        if (hetero) {
            printf("\n");
            fflush(stdout);
            continue;
        }
        /* our engines sit idle meanwhile: both measure the same machine */
        bool pr = false, pp = false;
        ref_room[r] = have_ref ? perftest(&o, "ucp_put_bw", room_bytes, &pr) : -1;
        ref_page[r] = have_ref ? perftest(&o, "ucp_put_bw", pb, &pp) : -1;
        partial |= pr || pp;
        printf(" ucx_perftest -s %zu %.3f GB/s%s, -s %zu %.3f GB/s%s\n", room_bytes, ref_room[r],
               pr ? " (partial)" : "", pb, ref_page[r], pp ? " (partial)" : "");
        fflush(stdout);
    }
    for (int c = 0; c < n_conns; c++)
        close_receiver(&conns[c]);
    engine_down(&S);
    for (int c = 0; c < n_conns; c++)
        free_receiver(&conns[c]);

    bool all_pass = true;
    if (hetero) {
        printf("bench/xfer: medians of %d; reference: the same run's homogeneous pair %d -> %d "
               "(page of %zu bytes), heterogeneous %d -> %d (receiver page of %zu bytes)\n",
               o.repeats, ss, ss, conns[0].page_bytes, ss, rs, conns[1].page_bytes);
        for (int k = 0; k < 2; k++) {
            double homo = median(sets[k].pps[0], o.repeats);
            double het = median(sets[k].pps[1], o.repeats);
            double ratio = homo > 0 ? het / homo : 0;
            bool pass = ratio >= sets[k].target;
            all_pass &= pass;
            printf("bench/xfer: %-15s homogeneous %7.0f pages/s %7.3f GB/s | hetero %7.0f "
                   "pages/s %7.3f GB/s | %4.0f%% (target >= %.0f%%) %s\n",
                   sets[k].name, homo, homo * (double)conns[0].page_bytes / 1e9, het,
                   het * (double)conns[1].page_bytes / 1e9, 100 * ratio, 100 * sets[k].target,
                   pass ? "PASS" : "FAIL");
        }
        printf("bench/xfer: %s\n", all_pass ? "PASS" : "FAIL");
    } else {
        double room_ref = median(ref_room, o.repeats), page_ref = median(ref_page, o.repeats);
        printf("bench/xfer: medians of %d; reference: ucx_perftest -e ucp_put_bw, same UCX_TLS\n",
               o.repeats);
        for (int k = 0; k < 2; k++) {
            double gbs = median(sets[k].gbs, o.repeats);
            double ratio = room_ref > 0 ? gbs / room_ref : 0;
            bool pass = room_ref > 0 && ratio >= sets[k].target;
            all_pass &= pass;
            printf("bench/xfer: %-15s %7.3f GB/s %9.0f pages/s | -s %zu (%s): %7.3f GB/s | "
                   "%4.0f%% (target >= %.0f%%) %s\n",
                   sets[k].name, gbs, gbs * 1e9 / (double)pb, room_bytes,
                   k == 0 ? "the run" : "the room's bytes", room_ref, 100 * ratio,
                   100 * sets[k].target, room_ref > 0 ? (pass ? "PASS" : "FAIL") : "NO REFERENCE");
        }
        if (page_ref > 0)
            printf("bench/xfer: (not judged) ucx_perftest -s %zu (one page, its buffer stays in "
                   "cache): %.3f GB/s; %s at %.0f%% of it\n",
                   pb, page_ref, sets[1].name, 100 * median(sets[1].gbs, o.repeats) / page_ref);
        if (partial)
            printf("bench/xfer: some ucx_perftest runs hit --perftest-seconds (%d s): their "
                   "figure (last report, or the bound their unfinished puts set) flatters them\n",
                   o.perftest_seconds);
        printf("bench/xfer: %s\n", !have_ref ? "no reference" : all_pass ? "PASS" : "FAIL");
    }
    for (int k = 0; k < 2; k++) {
        pd_free(sets[k].src);
        pd_free(sets[k].dst);
    }
    return S.failed ? 1 : 0;
}
