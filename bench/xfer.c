/*
 * xfer.c — pdserve-bench-xfer: KV page transfer throughput of the engine (common/xfer.h) between
 * two processes on 127.0.0.1, next to ucx_perftest's ucp_put_bw measured in the same run with
 * the same UCX_TLS and message size.
 *
 * Pages have the shape of qwen2.5-1.5b with page size 16 (28 layers, 2 kv heads, head dim 128,
 * bf16: 448 KiB per page, page-major). Two sets: one run of consecutive pages (one put per room),
 * and a 50%-scattered set (about half the pages start a new run). A room's time counts from its
 * first put until the receiver reports the room ended (notice and every byte in), over the
 * socketpair the two halves share; rooms go one after another.
 *
 * The reference is ucx_perftest ucp_put_bw with -e: endpoints with error handling, as ours have
 * (UCP_ERR_HANDLING_MODE_PEER), so that UCX picks the same lanes for both (without it, shared
 * memory gets cma's zero-copy lane, which UCX 1.13 does not offer to error-handling endpoints, and
 * the comparison is between two different transports). Message size: the room's size for
 * consecutive sets, the mean run in bytes for scattered ones (capped like the engine caps puts).
 * Where pages travel as active messages (lanes without hardware RMA), ucp_am_bw -e at the
 * engine's chunk size is printed next to it. Prints one line per measurement and the ratios.
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

#include "common/alloc.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/status.h"
#include "common/xfer.h"
#include "common/xfer_plan.h"

struct opts {
    int pages; /* per room */
    int reps;  /* rooms per set */
    int perftest_iters;
    const char *perftest;
    int port;
    int log_level;
};

static size_t page_bytes(void) {
    return (size_t)28 * 2 * 16 * 2 * 128 * 2;
}

static uint32_t max_put_pages(void) {
    return (uint32_t)(((size_t)8 << 20) / page_bytes());
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

struct side {
    uv_loop_t loop;
    pd_xfer_t *x;
    uint8_t *pool;
    uint32_t n_pages;
    pd_xfer_peer_t *peer;
    int ended, failed;
    int acked; /* sender: rooms the receiver reported ended */
    int sock;
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
 * receiver's room ended (ok / failed). */
static void on_sock(uv_poll_t *h, int status, int events) {
    (void)status;
    (void)events;
    char c;
    ssize_t got = read(S.sock, &c, 1);
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
        xread(S.sock, &room, sizeof(room));
        xread(S.sock, &n, sizeof(n));
        uint32_t *dst = pd_malloc((n ? n : 1) * sizeof(*dst));
        PD_ASSERT(dst);
        xread(S.sock, dst, n * sizeof(*dst));
        if (pd_xfer_room_expect(S.x, S.peer, room, dst, n, NULL)) {
            fprintf(stderr, "bench: %s\n", pd_error_msg());
            exit(1);
        }
        pd_free(dst);
        xwrite(S.sock, "e", 1); /* expected: the sender may start */
    }
}

static void engine_up(struct side *s, uint32_t n_pages) {
    struct pd_xfer_config cfg = {.spin = true, .max_put_bytes = max_put_pages() * page_bytes()};
    struct pd_xfer_callbacks cb = {.on_room_end = on_end};
    uv_loop_init(&s->loop);
    s->n_pages = n_pages;
    s->pool = pd_calloc(n_pages, page_bytes());
    PD_ASSERT(s->pool);
    if (pd_xfer_new(&s->loop, &cfg, &cb, &s->x) ||
        pd_xfer_register_pool(s->x, s->pool, page_bytes(), n_pages)) {
        fprintf(stderr, "bench: %s\n", pd_error_msg());
        exit(1);
    }
}

static void engine_down(struct side *s) {
    pd_xfer_free(s->x);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    pd_free(s->pool);
}

static int receiver_main(int sock, uint32_t n_pages) {
    S.sock = sock;
    is_receiver = true;
    engine_up(&S, n_pages);
    uint64_t id = pd_xfer_id(S.x), base;
    const void *addr, *rkey;
    size_t addr_len, rkey_len;
    pd_xfer_local_address(S.x, &addr, &addr_len);
    pd_xfer_local_rkey(S.x, &rkey, &rkey_len, &base);
    xwrite(sock, &id, sizeof(id));
    xwrite(sock, &base, sizeof(base));
    send_blob(sock, addr, addr_len);
    send_blob(sock, rkey, rkey_len);
    struct pd_xfer_peer_info pi = {0}; /* the sender: liveness and notices only */
    xread(sock, &pi.remote_id, sizeof(pi.remote_id));
    void *saddr = recv_blob(sock, &pi.worker_addr_len);
    pi.worker_addr = saddr;
    if (pd_xfer_peer_connect(S.x, &pi, NULL, &S.peer)) {
        fprintf(stderr, "bench: %s\n", pd_error_msg());
        exit(1);
    }
    uv_poll_init(&S.loop, &S.sock_poll, sock);
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
static void expect_room(uint64_t room, const uint32_t *dst, uint32_t n) {
    xwrite(S.sock, "e", 1);
    xwrite(S.sock, &room, sizeof(room));
    xwrite(S.sock, &n, sizeof(n));
    xwrite(S.sock, dst, n * sizeof(*dst));
    char c;
    xread(S.sock, &c, 1);
    PD_ASSERT(c == 'e');
}

/* Sends `reps` rooms of the given page set one after another; returns seconds. */
static double run_set(const uint32_t *src, const uint32_t *dst, uint32_t n, int reps) {
    uv_prepare_t prep;
    int want = 0;
    uv_prepare_init(&S.loop, &prep);
    prep.data = &want;
    uv_prepare_start(&prep, on_prepare);
    double secs = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t room = (uint64_t)r + 1 + (uint64_t)S.ended * 1000;
        struct pd_xfer_notice done = {.first_token = 1};
        expect_room(room, dst, n);
        double t0 = now_s();
        want_acked = S.acked + 1;
        if (pd_xfer_room_add(S.x, S.peer, room, dst, n, NULL) ||
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

/* Runs ucx_perftest `test` (ucp_put_bw, ucp_am_bw) with error-handling endpoints over 127.0.0.1
 * with this environment; MB/s (2^20), or -1. */
static double perftest(const struct opts *o, const char *test, size_t bytes) {
    char port[16], size[32], iters[16];
    snprintf(port, sizeof(port), "%d", o->port);
    snprintf(size, sizeof(size), "%zu", bytes);
    /* enough iterations to move ~2 GB: warm-up must not dominate */
    long n_iters = (long)(((size_t)2 << 30) / bytes);
    if (n_iters < o->perftest_iters)
        n_iters = o->perftest_iters;
    snprintf(iters, sizeof(iters), "%ld", n_iters);
    pid_t srv = fork();
    if (srv == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(o->perftest, o->perftest, "-p", port, "-e", (char *)NULL);
        _exit(127);
    }
    usleep(500000);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s 127.0.0.1 -p %s -e -t %s -s %s -n %s 2>/dev/null", o->perftest,
             port, test, size, iters);
    double mbs = -1;
    for (int attempt = 0; attempt < 3 && mbs < 0; attempt++) {
        FILE *f = popen(cmd, "r");
        char line[512];
        while (f && fgets(line, sizeof(line), f)) {
            double v[8];
            /* "Final:  iters  lat_typ lat_avg lat_ovr  bw_avg bw_ovr  rate_avg rate_ovr" */
            const char *p = strstr(line, "Final:");
            if (p && sscanf(p + 6, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                            &v[4], &v[5], &v[6], &v[7]) == 8)
                mbs = v[5];
        }
        if (f)
            pclose(f);
        if (mbs < 0)
            usleep(300000);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    return mbs;
}

static double mean_run_pages(const uint32_t *src, const uint32_t *dst, uint32_t n) {
    uint32_t runs = 1;
    for (uint32_t i = 1; i < n; i++)
        runs += !(src[i] == src[i - 1] + 1 && dst[i] == dst[i - 1] + 1);
    return (double)n / runs;
}

int main(int argc, char **argv) {
    struct opts o = {.pages = 256,
                     .reps = 8,
                     .perftest_iters = 20,
                     .perftest = "/usr/bin/ucx_perftest",
                     .port = 13377,
                     .log_level = PD_LOG_WARNING};
    struct pd_flagset fs;
    pd_flagset_init(&fs, "pdserve-bench-xfer",
                    "KV page transfer throughput (qwen2.5-1.5b pages, page size 16) vs "
                    "ucx_perftest ucp_put_bw, same UCX_TLS, same run.");
    pd_flag_int(&fs, "--pages", &o.pages, "N", 1, 4096, "pages per room");
    pd_flag_int(&fs, "--reps", &o.reps, "N", 1, 100000, "rooms per page set");
    pd_flag_int(&fs, "--perftest-iters", &o.perftest_iters, "N", 1, 1e6, "ucx_perftest iterations");
    pd_flag_string(&fs, "--perftest", &o.perftest, "PATH", "ucx_perftest binary");
    pd_flag_int(&fs, "--perftest-port", &o.port, "PORT", 1024, 65535, "ucx_perftest port");
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
    if (access(o.perftest, X_OK) != 0)
        fprintf(stderr, "bench: %s not found (Debian package ucx-utils); no reference\n",
                o.perftest);
    uint32_t n = (uint32_t)o.pages;
    uint32_t n_pool = 2 * n; /* room for a scattered set */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
        perror("socketpair");
        return 1;
    }
    pid_t child = fork();
    if (child == 0) {
        close(sv[0]);
        _exit(receiver_main(sv[1], n_pool));
    }
    close(sv[1]);
    int sock = sv[0];
    engine_up(&S, n_pool);
    struct pd_xfer_peer_info pi = {.page_bytes = page_bytes(), .n_pages = n_pool};
    xread(sock, &pi.remote_id, sizeof(pi.remote_id));
    xread(sock, &pi.base, sizeof(pi.base));
    void *addr = recv_blob(sock, &pi.worker_addr_len);
    void *rkey = recv_blob(sock, &pi.rkey_len);
    pi.worker_addr = addr;
    pi.rkey = rkey;
    if (pd_xfer_peer_connect(S.x, &pi, NULL, &S.peer)) {
        fprintf(stderr, "bench: %s\n", pd_error_msg());
        return 1;
    }
    uint64_t my_id = pd_xfer_id(S.x);
    const void *my_addr;
    size_t my_addr_len;
    pd_xfer_local_address(S.x, &my_addr, &my_addr_len);
    xwrite(sock, &my_id, sizeof(my_id));
    send_blob(sock, my_addr, my_addr_len);
    S.sock = sock;
    uv_poll_init(&S.loop, &S.sock_poll, sock);
    uv_poll_start(&S.sock_poll, UV_READABLE, on_sock);
    const char *tls = getenv("UCX_TLS");
    printf("bench/xfer: UCX_TLS=%s data lane %s, page %zu bytes (qwen2.5-1.5b, page size 16), "
           "%u pages per room, %d rooms per set\n",
           tls ? tls : "all", pd_xfer_peer_transport(S.peer), page_bytes(), n, o.reps);

    uint32_t *src = pd_malloc(n * sizeof(*src)), *dst = pd_malloc(n * sizeof(*dst));
    PD_ASSERT(src && dst);
    struct {
        const char *name;
        double scatter;
        double gbs, pps, ref_mbs;
        size_t ref_bytes;
    } sets[2] = {{"consecutive", 0.0, 0, 0, 0, 0}, {"scattered-50%", 0.5, 0, 0, 0, 0}};
    for (int k = 0; k < 2; k++) {
        if (sets[k].scatter == 0.0) {
            for (uint32_t i = 0; i < n; i++)
                src[i] = dst[i] = i;
        } else {
            pd_xfer_plan_pages(7, n, sets[k].scatter, 0, n_pool, 0, n_pool, src, dst);
        }
        run_set(src, dst, n, 1); /* warm-up: connection, registration caches */
        double secs = run_set(src, dst, n, o.reps);
        double bytes = (double)n * (double)page_bytes() * o.reps;
        sets[k].gbs = bytes / secs / 1e9;
        sets[k].pps = (double)n * o.reps / secs;
        double run = mean_run_pages(src, dst, n);
        /* what one put carries: the mean run, capped like the engine caps it */
        double put_pages = run < (double)max_put_pages() ? run : (double)max_put_pages();
        sets[k].ref_bytes = (size_t)llround(put_pages * (double)page_bytes());
        printf("bench/xfer: %-14s %7.3f GB/s %9.0f pages/s  (mean run %.2f pages, puts of %zu "
               "bytes, %d failed)\n",
               sets[k].name, sets[k].gbs, sets[k].pps, run, sets[k].ref_bytes, S.failed);
        fflush(stdout);
    }
    xwrite(sock, "q", 1);
    waitpid(child, NULL, 0);
    uv_close((uv_handle_t *)&S.sock_poll, NULL);
    close(sock);
    bool am = strstr(pd_xfer_peer_transport(S.peer), "(am") != NULL;
    engine_down(&S);
    pd_free(addr);
    pd_free(rkey);
    pd_free(src);
    pd_free(dst);

    /* the reference, after our processes are gone so that both measure an idle machine */
    for (int k = 0; k < 2; k++) {
        if (access(o.perftest, X_OK) != 0)
            break;
        sets[k].ref_mbs = perftest(&o, "ucp_put_bw", sets[k].ref_bytes);
        double ref_gbs = sets[k].ref_mbs * 1048576.0 / 1e9;
        printf("bench/xfer: ucx_perftest -e ucp_put_bw -s %zu: %7.3f GB/s -> %s at %.0f%% of it "
               "(target %s)\n",
               sets[k].ref_bytes, ref_gbs, sets[k].name,
               ref_gbs > 0 ? 100.0 * sets[k].gbs / ref_gbs : 0.0, k == 0 ? ">= 85%" : ">= 60%");
    }
    if (am && access(o.perftest, X_OK) == 0) {
        size_t chunk = 8192 - 64; /* the engine's default am_chunk_bytes */
        double am_gbs = perftest(&o, "ucp_am_bw", chunk) * 1048576.0 / 1e9;
        printf("bench/xfer: ucx_perftest -e ucp_am_bw -s %zu: %7.3f GB/s (the data path's own "
               "ceiling: consecutive at %.0f%% of it)\n",
               chunk, am_gbs, am_gbs > 0 ? 100.0 * sets[0].gbs / am_gbs : 0.0);
    }
    return S.failed ? 1 : 0;
}
