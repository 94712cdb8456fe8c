/* Metrics: bucket placement on the edges (le inclusive), cumulative counts, label escaping, the
 * exact text of a small registry, bad descriptions, allocation failures, exact sums from
 * concurrent updaters, and a strict reader of the text format that every rendering passes (and
 * that refuses broken text, so it can fail). */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/base/metrics.h"
#include "pd_prom_check.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>

/* ---- tests ---- */

#define DESC(k, n, h) ((struct pd_metric_desc){.kind = (k), .name = (n), .help = (h)})
#define LDESC(k, n, h, nl, l)                                                                      \
    ((struct pd_metric_desc){                                                                      \
        .kind = (k), .name = (n), .help = (h), .n_labels = (nl), .labels = (l)})

static const char *WW[] = {"w", "w"};
static const double B3[] = {0.1, 0.2, 0.4};

static struct pd_metric *hist_of(struct pd_metrics *m, const char *name) {
    struct pd_metric *s = NULL;
    struct pd_metric_desc d = {
        .kind = PD_METRIC_HISTOGRAM, .name = name, .help = "h", .n_bounds = 3, .bounds = B3};
    CHECK_OK(pd_metrics_single(m, &d, &s));
    return s;
}

static void test_bucket_edges(void) {
    struct pd_metrics *m;
    CHECK_OK(pd_metrics_new(0, NULL, NULL, &m));
    struct pd_metric *h = hist_of(m, "lat_seconds");
    pd_metric_observe(h, 0.1);               /* exactly on a bound: that bucket (le inclusive) */
    pd_metric_observe(h, nextafter(0.1, 1)); /* just above: the next one */
    pd_metric_observe(h, 0.2);
    pd_metric_observe(h, 0.4);
    pd_metric_observe(h, 0.40000001); /* +Inf */
    pd_metric_observe(h, 1e300);      /* +Inf */
    pd_metric_observe(h, -5);         /* below everything: first bucket */
    pd_metric_observe(h, NAN);        /* ignored */
    CHECK_INT(pd_metric_bucket(h, 0), 2);
    CHECK_INT(pd_metric_bucket(h, 1), 4);
    CHECK_INT(pd_metric_bucket(h, 2), 5);
    CHECK_INT(pd_metric_bucket(h, 3), 7);
    CHECK_INT(pd_metric_count(h), 7);
    CHECK_DBL(pd_metric_value(h), 0.1 + nextafter(0.1, 1) + 0.2 + 0.4 + 0.40000001 + 1e300 - 5,
              1e285);
    char *txt;
    size_t len;
    CHECK_OK(pd_metrics_render(m, &txt, &len));
    CHECK_INT(strlen(txt), len);
    CHECK(strstr(txt, "lat_seconds_bucket{le=\"0.1\"} 2\n") != NULL);
    CHECK(strstr(txt, "lat_seconds_bucket{le=\"0.2\"} 4\n") != NULL);
    CHECK(strstr(txt, "lat_seconds_bucket{le=\"0.4\"} 5\n") != NULL);
    CHECK(strstr(txt, "lat_seconds_bucket{le=\"+Inf\"} 7\n") != NULL);
    CHECK(strstr(txt, "lat_seconds_count 7\n") != NULL);
    CHECK_INT(check_exposition(txt), 6);
    pd_free(txt);
    pd_metrics_free(m);
}

static void test_exact_text(void) {
    const char *cn[] = {"model_name"}, *cv[] = {"m\"o\\d\nel"};
    struct pd_metrics *m;
    CHECK_OK(pd_metrics_new(1, cn, cv, &m));
    struct pd_metric *c, *g, *h, *w1, *w2;
    CHECK_OK(pd_metrics_single(
        m, &DESC(PD_METRIC_COUNTER, "a:req_total", "Requests.\nAll of them."), &c));
    CHECK_OK(pd_metrics_single(m, &DESC(PD_METRIC_GAUGE, "b_usage", "Use \\."), &g));
    const double b2[] = {1, 2.5};
    CHECK_OK(pd_metrics_single(m,
                               &(struct pd_metric_desc){.kind = PD_METRIC_HISTOGRAM,
                                                        .name = "c_seconds",
                                                        .help = "Time.",
                                                        .n_bounds = 2,
                                                        .bounds = b2},
                               &h));
    const char *wl[] = {"worker", "outcome"};
    struct pd_metric_family *wf;
    CHECK_OK(pd_metrics_family(m, &LDESC(PD_METRIC_COUNTER, "d_total", "Per worker.", 2, wl), &wf));
    CHECK_OK(pd_metrics_series(wf, (const char *[]){"http://a:1", "ok"}, &w1));
    CHECK_OK(pd_metrics_series(wf, (const char *[]){"http://b\"", "error"}, &w2));
    struct pd_metric *again;
    CHECK_OK(pd_metrics_series(wf, (const char *[]){"http://a:1", "ok"}, &again));
    CHECK(again == w1);
    struct pd_metric_family *gf;
    struct pd_metric *ga, *gb;
    CHECK_OK(pd_metrics_family(
        m, &LDESC(PD_METRIC_GAUGE, "e_up", "Gone ones read 0.", 1, (const char *[]){"w"}), &gf));
    CHECK_OK(pd_metrics_series(gf, (const char *[]){"a"}, &ga));
    CHECK_OK(pd_metrics_series(gf, (const char *[]){"b"}, &gb));
    pd_metric_set(ga, 5);
    pd_metric_set(gb, 7);
    pd_metrics_family_set(gf, 0);
    pd_metric_set(gb, 1);
    CHECK_DBL(pd_metric_value(ga), 0, 0);
    CHECK_DBL(pd_metric_value(gb), 1, 0);
    pd_metric_add(c, 3);
    pd_metric_set(g, 0.25);
    pd_metric_add(g, -1);
    pd_metric_observe(h, 1);
    pd_metric_observe(h, 3);
    pd_metric_add(w1, 2);
    pd_metric_add(w2, 1);
    char *txt;
    size_t len;
    CHECK_OK(pd_metrics_render(m, &txt, &len));
    const char *want =
        "# HELP a:req_total Requests.\\nAll of them.\n"
        "# TYPE a:req_total counter\n"
        "a:req_total{model_name=\"m\\\"o\\\\d\\nel\"} 3\n"
        "# HELP b_usage Use \\\\.\n"
        "# TYPE b_usage gauge\n"
        "b_usage{model_name=\"m\\\"o\\\\d\\nel\"} -0.75\n"
        "# HELP c_seconds Time.\n"
        "# TYPE c_seconds histogram\n"
        "c_seconds_bucket{model_name=\"m\\\"o\\\\d\\nel\",le=\"1\"} 1\n"
        "c_seconds_bucket{model_name=\"m\\\"o\\\\d\\nel\",le=\"2.5\"} 1\n"
        "c_seconds_bucket{model_name=\"m\\\"o\\\\d\\nel\",le=\"+Inf\"} 2\n"
        "c_seconds_sum{model_name=\"m\\\"o\\\\d\\nel\"} 4\n"
        "c_seconds_count{model_name=\"m\\\"o\\\\d\\nel\"} 2\n"
        "# HELP d_total Per worker.\n"
        "# TYPE d_total counter\n"
        "d_total{model_name=\"m\\\"o\\\\d\\nel\",worker=\"http://a:1\",outcome=\"ok\"} 2\n"
        "d_total{model_name=\"m\\\"o\\\\d\\nel\",worker=\"http://b\\\"\",outcome=\"error\"} 1\n"
        "# HELP e_up Gone ones read 0.\n"
        "# TYPE e_up gauge\n"
        "e_up{model_name=\"m\\\"o\\\\d\\nel\",w=\"a\"} 0\n"
        "e_up{model_name=\"m\\\"o\\\\d\\nel\",w=\"b\"} 1\n";
    CHECK_STR(txt, want);
    CHECK_INT(check_exposition(txt), 11);
    pd_free(txt);
    pd_metrics_free(m);
}

static void test_values_read_back(void) {
    struct pd_metrics *m;
    CHECK_OK(pd_metrics_new(0, NULL, NULL, &m));
    struct pd_metric *g;
    CHECK_OK(pd_metrics_single(m, &DESC(PD_METRIC_GAUGE, "g", "values"), &g));
    const double vals[] = {0.1, 1.0 / 3, 1e-300, 123456789012345678.0, -0.0, 2.5e17, 7};
    for (size_t i = 0; i < PD_ARRAY_LEN(vals); i++) {
        pd_metric_set(g, vals[i]);
        char *txt;
        size_t len;
        CHECK_OK(pd_metrics_render(m, &txt, &len));
        const char *v = strstr(txt, "\ng ");
        CHECK(v != NULL);
        if (v)
            CHECK(strtod(v + 3, NULL) == vals[i]); /* the shortest form still reads back */
        pd_free(txt);
    }
    pd_metric_set(g, INFINITY);
    char *txt;
    size_t len;
    CHECK_OK(pd_metrics_render(m, &txt, &len));
    CHECK(strstr(txt, "\ng +Inf\n") != NULL);
    pd_free(txt);
    pd_metric_set(g, NAN);
    CHECK_OK(pd_metrics_render(m, &txt, &len));
    CHECK(strstr(txt, "\ng NaN\n") != NULL);
    CHECK_INT(check_exposition(txt), 1);
    pd_free(txt);
    pd_metrics_free(m);
}

static void test_bad_descriptions(void) {
    const char *cn[] = {"model_name"}, *cv[] = {"x"};
    struct pd_metrics *m;
    CHECK_ERR(pd_metrics_new(1, (const char *[]){"le"}, cv, &m), PD_EINVAL, "\"le\"");
    CHECK_ERR(pd_metrics_new(1, (const char *[]){"a-b"}, cv, &m), PD_EINVAL, "\"a-b\"");
    CHECK_OK(pd_metrics_new(1, cn, cv, &m));
    struct pd_metric *s;
    struct pd_metric_family *f;
    CHECK_ERR(pd_metrics_single(m, &DESC(PD_METRIC_GAUGE, "9abc", ""), &s), PD_EINVAL, "\"9abc\"");
    CHECK_ERR(pd_metrics_single(m, &DESC(PD_METRIC_GAUGE, "a b", ""), &s), PD_EINVAL, "\"a b\"");
    CHECK_ERR(pd_metrics_single(m, &DESC(7, "k", ""), &s), PD_EINVAL, "unknown kind 7");
    CHECK_OK(pd_metrics_single(m, &DESC(PD_METRIC_GAUGE, "dup", ""), &s));
    CHECK_ERR(pd_metrics_single(m, &DESC(PD_METRIC_COUNTER, "dup", ""), &s), PD_EINVAL,
              "dup registered twice");
    CHECK_ERR(pd_metrics_family(
                  m, &LDESC(PD_METRIC_COUNTER, "c1", "", 1, (const char *[]){"model_name"}), &f),
              PD_EINVAL, "constant label");
    CHECK_ERR(pd_metrics_family(m, &LDESC(PD_METRIC_COUNTER, "c2", "", 2, WW), &f), PD_EINVAL,
              "label \"w\" twice");
    CHECK_ERR(
        pd_metrics_family(m, &LDESC(PD_METRIC_COUNTER, "c3", "", 1, (const char *[]){"__x"}), &f),
        PD_EINVAL, "\"__x\"");
    const double bad1[] = {1, 1}, bad2[] = {1, INFINITY}, ok[] = {1};
    CHECK_ERR(pd_metrics_single(
                  m,
                  &(struct pd_metric_desc){
                      .kind = PD_METRIC_HISTOGRAM, .name = "h1", .n_bounds = 2, .bounds = bad1},
                  &s),
              PD_EINVAL, "bounds must increase");
    CHECK_ERR(pd_metrics_single(
                  m,
                  &(struct pd_metric_desc){
                      .kind = PD_METRIC_HISTOGRAM, .name = "h2", .n_bounds = 2, .bounds = bad2},
                  &s),
              PD_EINVAL, "not finite");
    CHECK_ERR(pd_metrics_single(
                  m, &(struct pd_metric_desc){.kind = PD_METRIC_HISTOGRAM, .name = "h3"}, &s),
              PD_EINVAL, "at least one bucket");
    CHECK_ERR(pd_metrics_family(m,
                                &(struct pd_metric_desc){.kind = PD_METRIC_HISTOGRAM,
                                                         .name = "h4",
                                                         .n_labels = 1,
                                                         .labels = (const char *[]){"le"},
                                                         .n_bounds = 1,
                                                         .bounds = ok},
                                &f),
              PD_EINVAL, "cannot have a label \"le\"");
    CHECK_ERR(
        pd_metrics_single(m,
                          &(struct pd_metric_desc){
                              .kind = PD_METRIC_GAUGE, .name = "g5", .n_bounds = 1, .bounds = ok},
                          &s),
        PD_EINVAL, "only histograms");
    /* nothing half-registered: the text still reads */
    char *txt;
    size_t len;
    CHECK_OK(pd_metrics_render(m, &txt, &len));
    CHECK_INT(check_exposition(txt), 1);
    pd_free(txt);
    pd_metrics_free(m);
}

static void test_alloc_failures(void) {
    /* every allocation of a registry's life fails once, in turn: clean errors, no leaks (ASan) */
    for (long k = 0; k < 40; k++) {
        struct pd_metrics *m = NULL;
        pd_alloc_fail_after(k);
        int rc = pd_metrics_new(1, (const char *[]){"model_name"}, (const char *[]){"x"}, &m);
        struct pd_metric_family *f = NULL;
        struct pd_metric *s = NULL;
        if (!rc)
            rc = pd_metrics_family(m,
                                   &(struct pd_metric_desc){.kind = PD_METRIC_HISTOGRAM,
                                                            .name = "h",
                                                            .n_labels = 1,
                                                            .labels = (const char *[]){"w"},
                                                            .n_bounds = 3,
                                                            .bounds = B3},
                                   &f);
        if (!rc)
            rc = pd_metrics_series(f, (const char *[]){"a"}, &s);
        char *txt = NULL;
        size_t len;
        if (!rc) {
            pd_metric_observe(s, 0.15);
            rc = pd_metrics_render(m, &txt, &len);
        }
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        if (rc == PD_OK) {
            CHECK_INT(check_exposition(txt), 6);
            CHECK(strstr(txt, "h_bucket{model_name=\"x\",w=\"a\",le=\"0.2\"} 1\n") != NULL);
        }
        pd_free(txt);
        pd_metrics_free(m);
    }
}

/* ---- concurrency ---- */

enum { THREADS = 4, PER_THREAD = 100000 };

struct worker_arg {
    struct pd_metric *c, *g, *h;
    int id;
};

static void *updater(void *p) {
    struct worker_arg *a = p;
    for (int i = 0; i < PER_THREAD; i++) {
        pd_metric_add(a->c, 1);
        pd_metric_add(a->g, (i & 1) ? -0.5 : 1.5);
        /* 0, 0.25, 0.5, 0.75 in turn: quarters, so every partial sum is exact */
        pd_metric_observe(a->h, (double)((i + a->id) % 4) * 0.25);
    }
    return NULL;
}

struct render_arg {
    struct pd_metrics *m;
    volatile bool stop;
    int bad, renders;
};

static void *renderer(void *p) {
    struct render_arg *a = p;
    while (!a->stop) {
        char *txt;
        size_t len;
        if (pd_metrics_render(a->m, &txt, &len) != PD_OK || check_exposition(txt) != 8) {
            a->bad++;
            fprintf(stderr, "render during updates: %s\n", chk_err);
        }
        pd_free(txt);
        a->renders++;
    }
    return NULL;
}

static void test_threads_sum_exactly(void) {
    struct pd_metrics *m;
    CHECK_OK(pd_metrics_new(0, NULL, NULL, &m));
    struct pd_metric *c, *g, *h;
    CHECK_OK(pd_metrics_single(m, &DESC(PD_METRIC_COUNTER, "c_total", ""), &c));
    CHECK_OK(pd_metrics_single(m, &DESC(PD_METRIC_GAUGE, "g", ""), &g));
    h = hist_of(m, "h_seconds");
    pthread_t th[THREADS], rth;
    struct worker_arg wa[THREADS];
    struct render_arg ra = {.m = m};
    pthread_create(&rth, NULL, renderer, &ra);
    for (int i = 0; i < THREADS; i++) {
        wa[i] = (struct worker_arg){c, g, h, i};
        pthread_create(&th[i], NULL, updater, &wa[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    ra.stop = true;
    pthread_join(rth, NULL);
    CHECK_INT(ra.bad, 0);
    CHECK(ra.renders > 0);
    CHECK_DBL(pd_metric_value(c), (double)THREADS * PER_THREAD, 0);
    CHECK_DBL(pd_metric_value(g), (double)THREADS * PER_THREAD / 2, 0); /* (1.5-0.5) per pair */
    CHECK_INT(pd_metric_count(h), THREADS * PER_THREAD);
    /* values 0, 0.25, 0.5, 0.75 equally often: buckets le 0.1 / 0.2 / 0.4 / +Inf */
    CHECK_INT(pd_metric_bucket(h, 0), THREADS * PER_THREAD / 4);              /* 0 */
    CHECK_INT(pd_metric_bucket(h, 1), THREADS * PER_THREAD / 4);              /* 0.2: nothing new */
    CHECK_INT(pd_metric_bucket(h, 2), THREADS * PER_THREAD / 2);              /* 0.25 */
    CHECK_INT(pd_metric_bucket(h, 3), THREADS * PER_THREAD);                  /* 0.5, 0.75 */
    CHECK_DBL(pd_metric_value(h), (double)THREADS * PER_THREAD / 4 * 1.5, 0); /* exact: quarters */
    pd_metrics_free(m);
}

/* The checker itself: broken texts are refused (else the checks above could not fail). */
static void test_checker_refuses(void) {
    CHECK_INT(check_exposition("# TYPE a counter\na 1\n"), 1);
    CHECK_INT(check_exposition("a 1\n"), -1); /* no TYPE */
    CHECK_INT(check_exposition("# HELP a x\\q\n# TYPE a gauge\na 1\n"), -1);
    CHECK_INT(check_exposition("# HELP a x\\\\q\\n\n# TYPE a gauge\na 1\n"), 1);
    CHECK_INT(check_exposition("# TYPE a counter\na -1\n"), -1);           /* negative counter */
    CHECK_INT(check_exposition("# TYPE a counter\na{x=\"1} 1\n"), -1);     /* open quote */
    CHECK_INT(check_exposition("# TYPE a counter\na{x=\"\\q\"} 1\n"), -1); /* bad escape */
    CHECK_INT(check_exposition("# TYPE a gauge\na one\n"), -1);
    CHECK_INT(check_exposition("# TYPE a gauge\nb 1\n"), -1);
    CHECK_INT(check_exposition("# TYPE a gauge\na 1"), -1);
    CHECK_INT(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} "
                               "1\nh_sum 1\nh_count 1\n"),
              -1); /* not cumulative */
    CHECK_INT(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"),
              -1); /* no +Inf */
    CHECK_INT(check_exposition("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n"),
              -1); /* count differs */
    CHECK_INT(check_exposition("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n"),
              3);
}

PD_TEST_MAIN(PD_TEST(test_bucket_edges), PD_TEST(test_exact_text), PD_TEST(test_values_read_back),
             PD_TEST(test_bad_descriptions), PD_TEST(test_alloc_failures),
             PD_TEST(test_threads_sum_exactly), PD_TEST(test_checker_refuses))
