/* The router's circuit breaker on an injected clock: closed → open at the failure threshold,
 * the failure window restarts a run, open refuses until its timeout and then turns half-open,
 * half-open closes after the success threshold and reopens on one failure, outcomes while open
 * are ignored, /health recovery skips the wait, disabled stays closed. Also the reading of a
 * worker's error that blames the KV transfer, the retry backoff, and URL normalisation (the
 * static + DNS dedupe key). */
#include "pd_test.h"

#include "router/breaker.h"
#include "router/config.h"
#include "router/policy.h"

#include <string.h>

static const struct pd_router_cb_config CFG = {
    .failure_threshold = 3, .success_threshold = 2, .timeout_s = 10, .window_s = 60};

static void test_opens_at_threshold(void) {
    struct pd_router_cb cb;
    struct pd_router_cb_change ch;
    pd_router_cb_init(&cb, 100);
    CHECK(pd_router_cb_allows(&cb, &CFG, 100, &ch));
    CHECK(pd_router_cb_record(&cb, &CFG, false, 101, &ch));
    CHECK(pd_router_cb_record(&cb, &CFG, false, 102, &ch));
    CHECK_INT(ch.from, ch.to);
    CHECK_INT(cb.state, PD_ROUTER_CB_CLOSED);
    /* a success in between starts the run again */
    CHECK(pd_router_cb_record(&cb, &CFG, true, 103, &ch));
    CHECK_INT(cb.consecutive_failures, 0);
    pd_router_cb_record(&cb, &CFG, false, 104, &ch);
    pd_router_cb_record(&cb, &CFG, false, 105, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_CLOSED);
    pd_router_cb_record(&cb, &CFG, false, 106, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_OPEN);
    CHECK_INT(ch.from, PD_ROUTER_CB_CLOSED);
    CHECK_INT(ch.to, PD_ROUTER_CB_OPEN);
    CHECK_INT((int)cb.total_failures, 5);
    CHECK_INT((int)cb.total_successes, 1);
    CHECK(!pd_router_cb_allows(&cb, &CFG, 106, &ch));
    CHECK_DBL(pd_router_cb_open_remaining(&cb, &CFG, 110), 6, 1e-9);
    /* outcomes of calls that started before it opened say nothing now */
    CHECK(!pd_router_cb_record(&cb, &CFG, true, 107, &ch));
    CHECK(!pd_router_cb_record(&cb, &CFG, false, 108, &ch));
    CHECK_INT((int)cb.total_failures, 5);
    CHECK(!pd_router_cb_allows(&cb, &CFG, 115.9, &ch));
    CHECK_INT(ch.from, ch.to);
}

static void test_window(void) {
    struct pd_router_cb cb;
    struct pd_router_cb_change ch;
    pd_router_cb_init(&cb, 0);
    pd_router_cb_record(&cb, &CFG, false, 0, &ch);
    pd_router_cb_record(&cb, &CFG, false, 50, &ch);
    /* 70 s after the last one: a new run of one, not the third in a row */
    pd_router_cb_record(&cb, &CFG, false, 120.5, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_CLOSED);
    CHECK_INT(cb.consecutive_failures, 1);
    pd_router_cb_record(&cb, &CFG, false, 121, &ch);
    pd_router_cb_record(&cb, &CFG, false, 122, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_OPEN);
}

static void test_half_open(void) {
    struct pd_router_cb cb;
    struct pd_router_cb_change ch;
    pd_router_cb_init(&cb, 0);
    for (int i = 0; i < 3; i++)
        pd_router_cb_record(&cb, &CFG, false, 1, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_OPEN);
    /* the timeout is over: the next question moves it, and requests go again */
    CHECK(pd_router_cb_allows(&cb, &CFG, 11, &ch));
    CHECK_INT(ch.from, PD_ROUTER_CB_OPEN);
    CHECK_INT(ch.to, PD_ROUTER_CB_HALF_OPEN);
    CHECK(pd_router_cb_allows(&cb, &CFG, 11.5, &ch));
    CHECK_INT(ch.from, ch.to);
    /* one failure while half-open: open again, for a full timeout from now */
    pd_router_cb_record(&cb, &CFG, false, 12, &ch);
    CHECK_INT(ch.to, PD_ROUTER_CB_OPEN);
    CHECK(!pd_router_cb_allows(&cb, &CFG, 21.9, &ch));
    CHECK(pd_router_cb_allows(&cb, &CFG, 22, &ch));
    CHECK_INT(cb.state, PD_ROUTER_CB_HALF_OPEN);
    /* successes close it after the threshold, not before */
    pd_router_cb_record(&cb, &CFG, true, 23, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_HALF_OPEN);
    pd_router_cb_record(&cb, &CFG, true, 24, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_CLOSED);
    CHECK_INT(ch.from, PD_ROUTER_CB_HALF_OPEN);
    CHECK_INT(ch.to, PD_ROUTER_CB_CLOSED);
    CHECK_INT(cb.consecutive_failures, 0);
    /* closed again: it takes the whole threshold to open */
    pd_router_cb_record(&cb, &CFG, false, 25, &ch);
    pd_router_cb_record(&cb, &CFG, false, 26, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_CLOSED);
}

static void test_recovered_and_disabled(void) {
    struct pd_router_cb cb;
    struct pd_router_cb_change ch;
    pd_router_cb_init(&cb, 0);
    pd_router_cb_recovered(&cb, &CFG, 1, &ch); /* closed: nothing to do */
    CHECK_INT(cb.state, PD_ROUTER_CB_CLOSED);
    for (int i = 0; i < 3; i++)
        pd_router_cb_record(&cb, &CFG, false, 2, &ch);
    pd_router_cb_recovered(&cb, &CFG, 3, &ch);
    CHECK_INT(ch.from, PD_ROUTER_CB_OPEN);
    CHECK_INT(ch.to, PD_ROUTER_CB_CLOSED);
    CHECK_INT(cb.consecutive_failures, 0);
    CHECK(pd_router_cb_allows(&cb, &CFG, 3, &ch));
    /* a clean slate: one failure does not open it again */
    pd_router_cb_record(&cb, &CFG, false, 4, &ch);
    CHECK_INT(cb.state, PD_ROUTER_CB_CLOSED);

    struct pd_router_cb_config off = CFG;
    off.disabled = true;
    pd_router_cb_init(&cb, 0);
    for (int i = 0; i < 10; i++)
        CHECK(!pd_router_cb_record(&cb, &off, false, i, &ch));
    CHECK(pd_router_cb_allows(&cb, &off, 10, &ch));
    CHECK_INT(pd_router_cb_state_at(&cb, &off, 10, &ch), PD_ROUTER_CB_CLOSED);
    CHECK_INT((int)cb.total_failures, 0);
}

static void test_transfer_failed(void) {
    char m[128];
    const char *dec = "{\"error\":{\"message\":\"KV transfer failed: Pair with 127.0.0.1:9: "
                      "UNAVAILABLE\",\"type\":\"server_error\",\"param\":null,\"code\":500}}";
    CHECK(pd_router_transfer_failed(dec, strlen(dec), m, sizeof(m)));
    CHECK(strncmp(m, "KV transfer failed: Pair", 24) == 0);
    /* the same as the first event of a stream, followed by [DONE] */
    char sse[400];
    snprintf(sse, sizeof(sse), "data: %s\n\ndata: [DONE]\n\n", dec);
    CHECK(pd_router_transfer_failed(sse, strlen(sse), NULL, 0));
    const char *wait = "{\"error\":{\"message\":\"timed out waiting for the prefill's KV cache "
                       "(--waiting-timeout)\"}}";
    CHECK(pd_router_transfer_failed(wait, strlen(wait), NULL, 0));
    const char *full = "{\"error\":{\"message\":\"the decode daemon's queue is full\"}}";
    CHECK(!pd_router_transfer_failed(full, strlen(full), m, sizeof(m)));
    CHECK_STR(m, "the decode daemon's queue is full");
    CHECK(!pd_router_transfer_failed("not json", 8, m, sizeof(m)));
    CHECK_STR(m, "");
    CHECK(!pd_router_transfer_failed(NULL, 0, m, sizeof(m)));
    /* not NUL-terminated: only len bytes are read */
    char cut[300];
    memcpy(cut, dec, strlen(dec));
    memset(cut + strlen(dec), 'x', 20);
    CHECK(pd_router_transfer_failed(cut, strlen(dec), NULL, 0));
}

static void test_backoff(void) {
    struct pd_router_rng rng;
    pd_router_rng_seed_with(&rng, 3);
    struct pd_router_backoff b = {.initial_ms = 50, .max_ms = 300, .multiplier = 2, .jitter = 0};
    CHECK_DBL(pd_router_backoff_ms(&b, 1, &rng), 50, 1e-9);
    CHECK_DBL(pd_router_backoff_ms(&b, 2, &rng), 100, 1e-9);
    CHECK_DBL(pd_router_backoff_ms(&b, 3, &rng), 200, 1e-9);
    CHECK_DBL(pd_router_backoff_ms(&b, 4, &rng), 300, 1e-9);
    CHECK_DBL(pd_router_backoff_ms(&b, 40, &rng), 300, 1e-9);
    b.jitter = 0.2;
    double lo = 1e9, hi = 0;
    for (int i = 0; i < 2000; i++) {
        double d = pd_router_backoff_ms(&b, 2, &rng);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
    }
    CHECK(lo >= 80 && lo < 82);
    CHECK(hi <= 120 && hi > 118);
}

static void test_url_normalize(void) {
    char a[128], b[128];
    CHECK_OK(pd_router_url_normalize("http://127.0.0.1:8000/", a, sizeof(a)));
    CHECK_STR(a, "http://127.0.0.1:8000");
    CHECK_OK(pd_router_url_normalize("HTTP://LocalHost", a, sizeof(a)));
    CHECK_STR(a, "http://localhost:80");
    CHECK_OK(pd_router_url_normalize("http://localhost:80/", b, sizeof(b)));
    CHECK_STR(a, b);
    CHECK_OK(pd_router_url_normalize("http://[0:0::1]:30000", a, sizeof(a)));
    CHECK_STR(a, "http://[::1]:30000");
    CHECK_OK(pd_router_url_normalize("http://[::1]:30000/", b, sizeof(b)));
    CHECK_STR(a, b);
    /* https: its own scheme (a worker on both is two workers) and default port */
    CHECK_OK(pd_router_url_normalize("HTTPS://X:1/", a, sizeof(a)));
    CHECK_STR(a, "https://x:1");
    CHECK_OK(pd_router_url_normalize("https://[::1]", a, sizeof(a)));
    CHECK_STR(a, "https://[::1]:443");
    CHECK_ERR(pd_router_url_normalize("ftp://x:1", a, sizeof(a)), PD_EINVAL, "https://");
    CHECK_ERR(pd_router_url_normalize("http://x:1/v1", a, sizeof(a)), PD_EINVAL, "no path");
    CHECK_ERR(pd_router_url_normalize("http://127.0.0.1:8000", a, 10), PD_ERANGE, "fit");
}

PD_TEST_MAIN(PD_TEST(test_opens_at_threshold), PD_TEST(test_window), PD_TEST(test_half_open),
             PD_TEST(test_recovered_and_disabled), PD_TEST(test_transfer_failed),
             PD_TEST(test_backoff), PD_TEST(test_url_normalize))
