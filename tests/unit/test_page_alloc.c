/* Page allocator: runs, hints, fragmentation fallback, refcounts, cache marks, stats, failures. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"

static bool consecutive(const int32_t *p, int32_t n) {
    for (int32_t i = 1; i < n; i++)
        if (p[i] != p[i - 1] + 1)
            return false;
    return true;
}

static void test_runs_and_stats(void) {
    struct pd_page_alloc *pa;
    CHECK_OK(pd_page_alloc_new(100, &pa));
    struct pd_page_stats st;
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.total, 100);
    CHECK_INT(st.free, 100);
    CHECK_INT(st.longest_free_run, 100);

    int32_t a[16], b[70], c[30];
    CHECK_OK(pd_page_alloc_get(pa, 10, -1, a));
    CHECK(consecutive(a, 10));
    CHECK_OK(pd_page_alloc_get(pa, 70, -1, b));
    CHECK(consecutive(b, 70));
    CHECK_INT(pd_page_alloc_get(pa, 21, -1, c), PD_EFULL); /* 20 left: all or nothing */
    CHECK_INT(pd_page_alloc_n_free(pa), 20);
    /* Free a, leaving two holes of 10 and 20: a request for 15 takes the 20-run whole. */
    pd_page_alloc_put(pa, a, 10);
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.free, 30);
    CHECK_INT(st.used, 70);
    CHECK_INT(st.longest_free_run, 20);
    CHECK_OK(pd_page_alloc_get(pa, 15, -1, c));
    CHECK(consecutive(c, 15));
    CHECK_INT(c[0], 80);
    /* 15 free in runs of 10 (0..9) and 5 (95..99): 12 must come as 10 + 2, longest first. */
    CHECK_OK(pd_page_alloc_get(pa, 12, -1, a));
    CHECK_INT(a[0], 0);
    CHECK(consecutive(a, 10));
    CHECK_INT(a[10], 95);
    CHECK_INT(a[11], 96);
    CHECK_OK(pd_page_alloc_check(pa));
    pd_page_alloc_put(pa, a, 12);
    pd_page_alloc_put(pa, b, 70);
    pd_page_alloc_put(pa, c, 15);
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.free, 100);
    CHECK_INT(st.longest_free_run, 100);
    CHECK_OK(pd_page_alloc_check(pa));
    pd_page_alloc_free(pa);
}

static void test_hint_grows_run(void) {
    struct pd_page_alloc *pa;
    CHECK_OK(pd_page_alloc_new(200, &pa));
    int32_t x[4], y[4], g;
    CHECK_OK(pd_page_alloc_get(pa, 4, -1, x));   /* 0..3 */
    CHECK_OK(pd_page_alloc_get(pa, 4, -1, y));   /* 4..7 */
    pd_page_alloc_put(pa, y, 4);                 /* 4..7 free again */
    CHECK_OK(pd_page_alloc_get(pa, 1, 130, &g)); /* grows the run ending at 130 */
    CHECK_INT(g, 131);
    CHECK_OK(pd_page_alloc_get(pa, 1, 3, &g)); /* grows x's run */
    CHECK_INT(g, 4);
    int32_t h;
    CHECK_OK(pd_page_alloc_get(pa, 1, 199, &h)); /* hint at the end: falls back to first fit */
    CHECK_INT(h, 5);
    CHECK_OK(pd_page_alloc_check(pa));
    pd_page_alloc_free(pa);
}

static void test_refcounts_and_cache(void) {
    struct pd_page_alloc *pa;
    CHECK_OK(pd_page_alloc_new(8, &pa));
    int32_t p[2];
    CHECK_OK(pd_page_alloc_get(pa, 2, -1, p));
    pd_page_alloc_cache_hold(pa, p[0]); /* cache + request */
    struct pd_page_stats st;
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.used, 2);
    CHECK_INT(st.cached, 0);
    pd_page_alloc_put(pa, p, 2); /* request ends: p[0] stays, cache-only */
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.free, 7);
    CHECK_INT(st.cached, 1);
    CHECK_INT(st.used, 0);
    CHECK_INT(pd_page_alloc_refcount(pa, p[0]), 1);
    pd_page_alloc_ref(pa, p[0]); /* a new request shares it */
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.cached, 0);
    CHECK_INT(st.used, 1);
    pd_page_alloc_cache_drop(pa, p[0]); /* evicted while in use: the request keeps it */
    CHECK_INT(pd_page_alloc_refcount(pa, p[0]), 1);
    CHECK(!pd_page_alloc_is_cached(pa, p[0]));
    CHECK_OK(pd_page_alloc_check(pa));
    pd_page_alloc_put(pa, p, 1);
    CHECK_INT(pd_page_alloc_n_free(pa), 8);
    CHECK_OK(pd_page_alloc_check(pa));
    pd_page_alloc_free(pa);
}

static void test_bad_args_and_alloc_failure(void) {
    struct pd_page_alloc *pa = (void *)1;
    CHECK_ERR(pd_page_alloc_new(0, &pa), PD_EINVAL, "at least one");
    CHECK(pa == NULL);
    for (long k = 0; k < 4; k++) {
        pd_alloc_fail_after(k);
        CHECK_ERR(pd_page_alloc_new(64, &pa), PD_ENOMEM, "creating a pool of 64 pages");
    }
    pd_alloc_fail_after(-1);
    CHECK_OK(pd_page_alloc_new(64, &pa));
    int32_t p;
    CHECK_ERR(pd_page_alloc_get(pa, -1, -1, &p), PD_EINVAL, "allocating -1");
    pd_page_alloc_free(pa);
    pd_page_alloc_free(NULL);
}

/* Random gets and puts against a shadow count of owners per page. */
static void test_random_against_shadow(void) {
    enum { N = 300, H = 64 };
    struct pd_page_alloc *pa;
    CHECK_OK(pd_page_alloc_new(N, &pa));
    int32_t held[H][16];
    int32_t nheld[H] = {0};
    int owners[N] = {0};
    uint64_t x = 88172645463325252ull;
    int bad = 0;
    for (int it = 0; it < 20000; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int h = (int)(x % H);
        if (nheld[h]) {
            for (int i = 0; i < nheld[h]; i++)
                owners[held[h][i]]--;
            pd_page_alloc_put(pa, held[h], nheld[h]);
            nheld[h] = 0;
        } else {
            int32_t n = 1 + (int32_t)((x >> 20) % 16);
            int rc = pd_page_alloc_get(pa, n, -1, held[h]);
            if (rc == PD_OK) {
                nheld[h] = n;
                for (int i = 0; i < n; i++)
                    bad += owners[held[h][i]]++ != 0; /* never handed out twice */
            } else {
                bad += rc != PD_EFULL || pd_page_alloc_n_free(pa) >= n;
            }
        }
        if (it % 97 == 0)
            bad += pd_page_alloc_check(pa) != PD_OK;
    }
    CHECK_INT(bad, 0);
    for (int h = 0; h < H; h++)
        pd_page_alloc_put(pa, held[h], nheld[h]);
    CHECK_INT(pd_page_alloc_n_free(pa), N);
    CHECK_OK(pd_page_alloc_check(pa));
    pd_page_alloc_free(pa);
}

PD_TEST_MAIN(PD_TEST(test_runs_and_stats), PD_TEST(test_hint_grows_run),
             PD_TEST(test_refcounts_and_cache), PD_TEST(test_bad_args_and_alloc_failure),
             PD_TEST(test_random_against_shadow))
