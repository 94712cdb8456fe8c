/*
 * xfer_pair.c — two-process tests of the KV transfer path: runs pdserve-xfer-test as a sender
 * (prefill side) and a receiver (decode side) on 127.0.0.1, under whatever UCX_TLS CTest set,
 * and checks what a user of the daemons would notice: rooms arrive byte-exact (the receiver
 * checks every page and the done notice's checksum), aborts from either side release both,
 * a SIGKILLed peer fails every room of the survivor within 5 s with its pages back, the
 * bootstrap port refuses bad calls and keeps serving, and pools of different tensor parallelism
 * (kv heads split or replicated otherwise) pair and get every byte of every shard right.
 * argv[1] is the pdserve-xfer-test binary.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pd_test.h"

static const char *tool;

struct proc {
    pid_t pid;
    int out; /* its stdout */
    char buf[16384];
    size_t len;
};

static uint64_t ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void spawn(struct proc *p, const char *const *args) {
    int fds[2];
    if (pipe(fds)) {
        perror("pipe");
        exit(1);
    }
    memset(p, 0, sizeof(*p));
    p->pid = fork();
    if (p->pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        const char *argv[32] = {tool};
        int n = 1;
        for (; args[n - 1] && n < 31; n++)
            argv[n] = args[n - 1];
        argv[n] = NULL;
        execv(tool, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    p->out = fds[0];
}

/* Reads the process's stdout until `needle` shows up; false after timeout_ms or at EOF. */
static bool wait_for(struct proc *p, const char *needle, int timeout_ms) {
    uint64_t end = ms_now() + (uint64_t)timeout_ms;
    for (;;) {
        if (strstr(p->buf, needle))
            return true;
        uint64_t now = ms_now();
        if (now >= end)
            return false;
        struct pollfd pf = {.fd = p->out, .events = POLLIN};
        if (poll(&pf, 1, (int)(end - now)) <= 0)
            continue;
        ssize_t n = read(p->out, p->buf + p->len, sizeof(p->buf) - 1 - p->len);
        if (n <= 0)
            return strstr(p->buf, needle) != NULL;
        p->len += (size_t)n;
        p->buf[p->len] = '\0';
        if (p->len > sizeof(p->buf) / 2) { /* keep the tail */
            size_t keep = sizeof(p->buf) / 4;
            memmove(p->buf, p->buf + p->len - keep, keep);
            p->len = keep;
            p->buf[p->len] = '\0';
        }
    }
}

/* Waits for exit; returns the exit code, or -1 (after SIGKILL) when it outlived timeout_ms. */
static int wait_exit(struct proc *p, int timeout_ms) {
    uint64_t end = ms_now() + (uint64_t)timeout_ms;
    int st;
    for (;;) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid)
            break;
        if (ms_now() >= end) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            close(p->out);
            fprintf(stderr, "process %d did not exit in %d ms; killed\n", (int)p->pid, timeout_ms);
            return -1;
        }
        wait_for(p, "\x01never", 20); /* drain its output meanwhile */
    }
    wait_for(p, "\x01never", 50);
    close(p->out);
    fprintf(stderr, "--- pid %d output tail:\n%s\n", (int)p->pid, p->buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void start_sender_args(struct proc *s, const char *port, const char *const *extra) {
    const char *args[16] = {"--role", "sender", "--port", port};
    for (int i = 0; extra && extra[i] && i < 11; i++)
        args[4 + i] = extra[i];
    spawn(s, args);
    if (!wait_for(s, "READY", 15000)) {
        fprintf(stderr, "sender did not come up: %s\n", s->buf);
        CHECK(false);
    }
}

static void start_sender(struct proc *s, const char *port, const char *extra1, const char *extra2) {
    const char *extra[] = {extra1, extra2, NULL};
    start_sender_args(s, port, extra);
}

static void stop_sender(struct proc *s) {
    kill(s->pid, SIGTERM);
    CHECK_INT(wait_exit(s, 15000), 0);
}

/* 2000 rooms of 1..4096 pages, runs and scattered, 4 in flight. */
static void test_rooms_byte_exact(void) {
    char port[16];
    snprintf(port, sizeof(port), "%d", pd_test_free_port());
    struct proc s, r;
    start_sender(&s, port, NULL, NULL);
    const char *args[] = {"--role", "receiver", "--port", port, "--rooms", "2000", NULL};
    spawn(&r, args);
    CHECK_INT(wait_exit(&r, 90000), 0);
    CHECK(strstr(r.buf, "ok=2000 ") != NULL);
    CHECK(strstr(r.buf, "bad_pages=0 bad_checksums=0") != NULL);
    stop_sender(&s);
    CHECK(strstr(s.buf, "done=2000 ") != NULL);
}

/* Every bad bootstrap call is refused with its status; the server then still serves rooms. */
static void test_bootstrap_rejections(void) {
    char port[16];
    snprintf(port, sizeof(port), "%d", pd_test_free_port());
    struct proc s, p, r;
    start_sender(&s, port, NULL, NULL);
    const char *pargs[] = {"--role", "probe", "--port", port, NULL};
    spawn(&p, pargs);
    CHECK_INT(wait_exit(&p, 30000), 0);
    CHECK(strstr(p.buf, "role=probe checks=23 wrong=0 result=PASS") != NULL);
    const char *rargs[] = {"--role", "receiver", "--port", port, "--rooms", "100", NULL};
    spawn(&r, rargs);
    CHECK_INT(wait_exit(&r, 30000), 0);
    CHECK(strstr(r.buf, "ok=100 ") != NULL);
    stop_sender(&s);
}

/* Pools of 2 shards (tp 2) on both sides: the probe's refusals hold (its decode of another
 * head_dim and tp is refused naming head_dim with both values), rooms arrive byte-exact in every
 * shard, and a real receiver of another head_dim is refused at Pair with FAILED_PRECONDITION
 * before any room is taken. */
static void test_shards(void) {
    char port[16];
    snprintf(port, sizeof(port), "%d", pd_test_free_port());
    struct proc s, p, r, w;
    start_sender(&s, port, "--shards", "2");
    const char *pargs[] = {"--role", "probe", "--port", port, "--shards", "2", NULL};
    spawn(&p, pargs);
    CHECK_INT(wait_exit(&p, 30000), 0);
    CHECK(strstr(p.buf, "role=probe checks=23 wrong=0 result=PASS") != NULL);
    CHECK(strstr(p.buf, "layout mismatch: head_dim: prefill 8, decode 16") != NULL);
    const char *rargs[] = {"--role", "receiver", "--port", port, "--rooms",
                           "300",    "--shards", "2",      NULL};
    spawn(&r, rargs);
    CHECK_INT(wait_exit(&r, 60000), 0);
    CHECK(strstr(r.buf, "ok=300 ") != NULL);
    CHECK(strstr(r.buf, "bad_pages=0 bad_checksums=0") != NULL);
    const char *wargs[] = {"--role",     "receiver", "--port",           port, "--rooms", "1",
                           "--head-dim", "16",       "--model-kv-heads", "4",  NULL};
    spawn(&w, wargs);
    CHECK_INT(wait_exit(&w, 30000), 1);
    CHECK(strstr(w.buf, "rejected: ") != NULL);
    CHECK(strstr(w.buf, "FAILED_PRECONDITION: layout mismatch: head_dim: prefill 8, decode 16") !=
          NULL);
    CHECK(strstr(w.buf, "ok=0 ") != NULL);
    stop_sender(&s);
    CHECK(strstr(s.buf, "live_rooms=0") != NULL);
}

/* Heterogeneous tensor parallelism: the sender's pool over one number of shards, the receiver's
 * over another (tp 1, 2, 4; 4 kv heads split, 2 kv heads replicated at tp 4 on either side), with
 * aborts from both sides in one of them: every room arrives with every byte of every receiver
 * shard equal to the logical page (the content is a function of page, row and kv head), and the
 * done notice's checksum over the logical pages agrees. One sender serves receivers of two other
 * splits one after the other. */
static void test_hetero(void) {
    static const struct {
        const char *heads, *snd, *rcv[2];
    } pairs[] = {
        {"4", "2", {"1", "4"}}, {"4", "1", {"2", "4"}}, {"4", "4", {"2", "1"}},
        {"2", "1", {"4", "2"}}, {"2", "4", {"1", "2"}},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        char port[16];
        snprintf(port, sizeof(port), "%d", pd_test_free_port());
        struct proc s, r;
        const char *sx[] = {"--shards", pairs[i].snd, "--model-kv-heads", pairs[i].heads, NULL};
        start_sender_args(&s, port, sx);
        for (int j = 0; j < 2; j++) {
            fprintf(stderr, "hetero: %s kv heads, sender %s shards, receiver %s\n", pairs[i].heads,
                    pairs[i].snd, pairs[i].rcv[j]);
            const char *rargs[] = {"--role",
                                   "receiver",
                                   "--port",
                                   port,
                                   "--rooms",
                                   "100",
                                   "--shards",
                                   pairs[i].rcv[j],
                                   "--model-kv-heads",
                                   pairs[i].heads,
                                   "--seed",
                                   j ? "2" : "1",
                                   NULL};
            spawn(&r, rargs);
            CHECK_INT(wait_exit(&r, 60000), 0);
            CHECK(strstr(r.buf, "ok=100 ") != NULL);
            CHECK(strstr(r.buf, "bad_pages=0 bad_checksums=0") != NULL);
        }
        stop_sender(&s);
        CHECK(strstr(s.buf, "done=200 ") != NULL);
        CHECK(strstr(s.buf, "live_rooms=0") != NULL);
    }
    /* aborts mid-transfer from both sides on a regrouped pair: nothing corrupt, all released */
    char port[16];
    snprintf(port, sizeof(port), "%d", pd_test_free_port());
    struct proc s, r;
    const char *sx[] = {"--shards", "2", "--model-kv-heads", "4", "--abort-every", "5", NULL};
    start_sender_args(&s, port, sx);
    const char *rargs[] = {"--role",   "receiver", "--port",           port, "--rooms",       "300",
                           "--shards", "1",        "--model-kv-heads", "4",  "--abort-every", "7",
                           NULL};
    spawn(&r, rargs);
    CHECK_INT(wait_exit(&r, 60000), 0);
    CHECK(strstr(r.buf, "rooms=300 ") != NULL);
    CHECK(strstr(r.buf, "canceled=0 ") == NULL);
    CHECK(strstr(r.buf, "peer_failed=0 other_failed=0 bad_pages=0") != NULL);
    stop_sender(&s);
    CHECK(strstr(s.buf, "live_rooms=0") != NULL);
}

/* Aborts from both sides mid-transfer: every room ends, ok or canceled, none corrupt. */
static void test_aborts_both_sides(void) {
    char port[16];
    snprintf(port, sizeof(port), "%d", pd_test_free_port());
    struct proc s, r;
    start_sender(&s, port, "--abort-every", "5");
    const char *args[] = {"--role", "receiver",      "--port", port, "--rooms",
                          "600",    "--abort-every", "7",      NULL};
    spawn(&r, args);
    CHECK_INT(wait_exit(&r, 60000), 0);
    CHECK(strstr(r.buf, "rooms=600 ") != NULL);
    CHECK(strstr(r.buf, "canceled=0 ") == NULL); /* some were canceled */
    CHECK(strstr(r.buf, "peer_failed=0 other_failed=0 bad_pages=0") != NULL);
    stop_sender(&s);
    CHECK(strstr(s.buf, "live_rooms=0") != NULL);
}

/* SIGKILL the receiver mid-transfer: the sender fails every room and frees them within 5 s. */
static void test_kill_receiver(void) {
    char port[16];
    snprintf(port, sizeof(port), "%d", pd_test_free_port());
    struct proc s, r;
    start_sender(&s, port, "--expect-peer-death", NULL);
    const char *args[] = {"--role", "receiver", "--port", port, "--rooms", "10000000", NULL};
    spawn(&r, args);
    CHECK(wait_for(&r, "progress rooms=500", 30000));
    uint64_t t0 = ms_now();
    kill(r.pid, SIGKILL);
    wait_exit(&r, 5000);
    CHECK_INT(wait_exit(&s, 10000), 0);
    uint64_t took = ms_now() - t0;
    fprintf(stderr, "sender failed its rooms %llu ms after the receiver's SIGKILL\n",
            (unsigned long long)took);
    CHECK(took < 5000);
    CHECK(strstr(s.buf, "live_rooms=0 ") != NULL);
}

/* SIGKILL the sender mid-transfer: the receiver fails its rooms and frees them within 5 s. */
static void test_kill_sender(void) {
    char port[16];
    snprintf(port, sizeof(port), "%d", pd_test_free_port());
    struct proc s, r;
    start_sender(&s, port, NULL, NULL);
    const char *args[] = {
        "--role", "receiver", "--port", port, "--rooms", "10000000", "--expect-peer-death", NULL};
    spawn(&r, args);
    CHECK(wait_for(&r, "progress rooms=500", 30000));
    uint64_t t0 = ms_now();
    kill(s.pid, SIGKILL);
    wait_exit(&s, 5000);
    CHECK_INT(wait_exit(&r, 10000), 0);
    uint64_t took = ms_now() - t0;
    fprintf(stderr, "receiver failed its rooms %llu ms after the sender's SIGKILL\n",
            (unsigned long long)took);
    CHECK(took < 5000);
    CHECK(strstr(r.buf, "pages_in_use=0 result=PASS") != NULL);
}

static const char *only;

static void run(const char *name, void (*fn)(void)) {
    if (!only || strcmp(only, name) == 0)
        fn();
}

static void all(void) {
    run("rooms", test_rooms_byte_exact);
    run("rejections", test_bootstrap_rejections);
    run("shards", test_shards);
    run("hetero", test_hetero);
    run("aborts", test_aborts_both_sides);
    run("kill_receiver", test_kill_receiver);
    run("kill_sender", test_kill_sender);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PDSERVE_XFER_TEST [case]\n", argv[0]);
        return 2;
    }
    tool = argv[1];
    only = argc > 2 ? argv[2] : NULL;
    setenv("PDSERVE_CLUSTER_KEY", "xfer-pair-test-secret", 1);
    signal(SIGPIPE, SIG_IGN);
    static const struct pd_test_case cases[] = {PD_TEST(all)};
    return pd_test_run(argv[0], cases, 1);
}
