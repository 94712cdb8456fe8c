/* Prefix cache: match/insert/split, locks, LRU eviction, flush, disabled mode, allocation
 * failures, and a randomized check against brute force over every inserted prompt. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"

enum { PS = 4 };

/* A request computing tokens: takes pages, inserts them, drops its own references. */
static struct pd_radix_node *compute_and_insert(struct pd_page_alloc *pa, struct pd_radix_cache *rc,
                                                const int32_t *toks, int32_t n_pages,
                                                int32_t *pages) {
    struct pd_radix_node *node = NULL;
    CHECK_OK(pd_page_alloc_get(pa, n_pages, -1, pages));
    CHECK_OK(pd_radix_cache_insert(rc, toks, n_pages, pages, &node));
    pd_page_alloc_put(pa, pages, n_pages);
    return node;
}

static void test_match_insert_split(void) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    CHECK_OK(pd_page_alloc_new(64, &pa));
    CHECK_OK(pd_radix_cache_new(pa, PS, false, &rc));
    int32_t a[12], b[12], pa_pages[3], pb[3], got[3];
    for (int i = 0; i < 12; i++) {
        a[i] = i;
        b[i] = i < 4 ? i : 100 + i; /* shares a's first page only */
    }
    compute_and_insert(pa, rc, a, 3, pa_pages);
    CHECK_INT(pd_radix_cache_n_pages(rc), 3);
    struct pd_radix_match m;
    pd_radix_cache_match(rc, a, 12, got, &m);
    CHECK_INT(m.n_pages, 3);
    CHECK(memcmp(got, pa_pages, sizeof(got)) == 0);
    pd_radix_cache_match(rc, a, 11, got, &m); /* whole pages only */
    CHECK_INT(m.n_pages, 2);
    pd_radix_cache_match(rc, b, 12, got, &m);
    CHECK_INT(m.n_pages, 1);
    CHECK_INT(got[0], pa_pages[0]);

    /* b's first page already cached: only its 2 new pages are adopted, after a split */
    struct pd_radix_node *nb = compute_and_insert(pa, rc, b, 3, pb);
    CHECK_INT(pd_radix_cache_n_pages(rc), 5);
    CHECK_INT(pd_radix_cache_n_nodes(rc), 3);
    CHECK_INT(pd_page_alloc_refcount(pa, pb[0]), 0); /* duplicate page went back */
    CHECK_INT(pd_page_alloc_n_free(pa), 64 - 5);
    pd_radix_cache_match(rc, b, 12, got, &m);
    CHECK_INT(m.n_pages, 3);
    CHECK(m.node == nb);
    CHECK_INT(got[0], pa_pages[0]);
    CHECK_INT(got[1], pb[1]);
    pd_radix_cache_match(rc, a, 12, got, &m);
    CHECK_INT(m.n_pages, 3);
    CHECK(memcmp(got, pa_pages, sizeof(got)) == 0);
    CHECK_OK(pd_radix_cache_check(rc));
    struct pd_page_stats st;
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.cached, 5);
    CHECK_INT(st.used, 0);
    CHECK_INT(pd_radix_cache_flush(rc), 5);
    CHECK_INT(pd_page_alloc_n_free(pa), 64);
    CHECK_OK(pd_radix_cache_check(rc));
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
}

static void test_lru_and_locks(void) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    CHECK_OK(pd_page_alloc_new(16, &pa));
    CHECK_OK(pd_radix_cache_new(pa, PS, false, &rc));
    int32_t x[8], y[8], z[8], px[2], py[2], pz[2], got[2];
    for (int i = 0; i < 8; i++)
        x[i] = i, y[i] = 50 + i, z[i] = 90 + i;
    struct pd_radix_node *nx = compute_and_insert(pa, rc, x, 2, px);
    compute_and_insert(pa, rc, y, 2, py);
    struct pd_radix_node *nz = compute_and_insert(pa, rc, z, 2, pz);
    struct pd_radix_match m;
    pd_radix_cache_match(rc, x, 8, got, &m); /* x is now the most recent: order y, z, x */
    CHECK(m.node == nx);
    CHECK_INT(pd_radix_cache_evict(rc, 1), 2); /* a whole leaf goes: y */
    pd_radix_cache_match(rc, y, 8, got, &m);
    CHECK_INT(m.n_pages, 0);
    pd_radix_cache_match(rc, z, 8, got, &m);
    CHECK_INT(m.n_pages, 2);

    /* A request using z: lock + its own refs. Evicting everything must spare z. */
    pd_radix_cache_lock(rc, nz);
    for (int i = 0; i < 2; i++)
        pd_page_alloc_ref(pa, got[i]);
    CHECK_INT(pd_radix_cache_root_lock(rc), 1);
    CHECK_INT(pd_radix_cache_evict(rc, 100), 2); /* only x */
    CHECK_INT(pd_radix_cache_n_pages(rc), 2);
    struct pd_page_stats st;
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.used, 2);
    CHECK_INT(st.cached, 0);
    pd_page_alloc_put(pa, got, 2); /* the request ends */
    pd_radix_cache_unlock(rc, nz);
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.cached, 2);
    CHECK_INT(st.free + st.used + st.cached, 16);
    CHECK_INT(pd_radix_cache_flush(rc), 2);
    CHECK_INT(pd_page_alloc_n_free(pa), 16);
    CHECK_OK(pd_radix_cache_check(rc));
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
}

static void test_disabled(void) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    CHECK_OK(pd_page_alloc_new(8, &pa));
    CHECK_OK(pd_radix_cache_new(pa, PS, true, &rc));
    CHECK(pd_radix_cache_disabled(rc));
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8}, p[2], got[2];
    compute_and_insert(pa, rc, t, 2, p);
    CHECK_INT(pd_radix_cache_n_pages(rc), 0);
    CHECK_INT(pd_page_alloc_n_free(pa), 8);
    struct pd_radix_match m;
    pd_radix_cache_match(rc, t, 8, got, &m);
    CHECK_INT(m.n_pages, 0);
    pd_radix_cache_lock(rc, m.node); /* the root: accepted, ignored */
    pd_radix_cache_unlock(rc, m.node);
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
}

static void test_insert_alloc_failure(void) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    CHECK_OK(pd_page_alloc_new(16, &pa));
    CHECK_ERR(pd_radix_cache_new(pa, 0, false, &rc), PD_EINVAL, "page size 0");
    CHECK_OK(pd_radix_cache_new(pa, PS, false, &rc));
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 4, 9, 9, 9, 9};
    int32_t pa_[2], pb[2], got[2];
    struct pd_radix_node *n;
    CHECK_OK(pd_page_alloc_get(pa, 2, -1, pa_));
    pd_alloc_fail_after(0);
    CHECK_ERR(pd_radix_cache_insert(rc, a, 2, pa_, &n), PD_ENOMEM, "inserting 2 pages");
    pd_alloc_fail_after(-1);
    CHECK_INT(pd_radix_cache_n_pages(rc), 0);
    CHECK_OK(pd_radix_cache_insert(rc, a, 2, pa_, &n));
    pd_page_alloc_put(pa, pa_, 2);
    /* b needs a split (fails first) and then a leaf (fails second) */
    CHECK_OK(pd_page_alloc_get(pa, 2, -1, pb));
    for (long k = 0; k < 2; k++) {
        pd_alloc_fail_after(k);
        CHECK_ERR(pd_radix_cache_insert(rc, b, 2, pb, &n), PD_ENOMEM, "prefix cache");
        pd_alloc_fail_after(-1);
        CHECK_OK(pd_radix_cache_check(rc));
        struct pd_radix_match m;
        pd_radix_cache_match(rc, a, 8, got, &m);
        CHECK_INT(m.n_pages, 2);
        CHECK_INT(got[1], pa_[1]);
    }
    pd_page_alloc_put(pa, pb, 2);
    CHECK_INT(pd_radix_cache_flush(rc), 2);
    CHECK_INT(pd_page_alloc_n_free(pa), 16);
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
}

/* Random prompts over a 2-letter alphabet (many shared prefixes). After each insert, match of
 * every earlier prompt must return pages whose recorded content equals that prompt's pages,
 * and as many as the longest page-aligned common prefix with any inserted prompt. */
static void test_random_against_brute_force(void) {
    enum { N = 60, MAXP = 6, POOL = N * MAXP };
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    CHECK_OK(pd_page_alloc_new(POOL, &pa));
    CHECK_OK(pd_radix_cache_new(pa, PS, false, &rc));
    static int32_t prompts[N][MAXP * PS];
    static int32_t content[POOL][PS]; /* tokens each page holds the KV of */
    int32_t np[N];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        np[i] = 1 + (int32_t)(x % MAXP);
        for (int t = 0; t < np[i] * PS; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            prompts[i][t] = (int32_t)(x & 1);
        }
        int32_t pages[MAXP];
        CHECK_OK(pd_page_alloc_get(pa, np[i], -1, pages));
        for (int p = 0; p < np[i]; p++)
            memcpy(content[pages[p]], &prompts[i][p * PS], sizeof(content[0]));
        struct pd_radix_node *n;
        CHECK_OK(pd_radix_cache_insert(rc, prompts[i], np[i], pages, &n));
        pd_page_alloc_put(pa, pages, np[i]);
        for (int q = 0; q <= i; q++) {
            int32_t best = 0;
            for (int r = 0; r <= i; r++) {
                int32_t k = 0, lim = np[q] < np[r] ? np[q] : np[r];
                while (k < lim && !memcmp(&prompts[q][k * PS], &prompts[r][k * PS], PS * 4))
                    k++;
                best = k > best ? k : best;
            }
            int32_t got[MAXP];
            struct pd_radix_match m;
            pd_radix_cache_match(rc, prompts[q], np[q] * PS, got, &m);
            bad += m.n_pages != best;
            for (int p = 0; p < m.n_pages; p++)
                bad += memcmp(content[got[p]], &prompts[q][p * PS], sizeof(content[0])) != 0;
        }
        bad += pd_radix_cache_check(rc) != PD_OK || pd_page_alloc_check(pa) != PD_OK;
    }
    CHECK_INT(bad, 0);
    struct pd_page_stats st;
    pd_page_alloc_stats(pa, &st);
    CHECK_INT(st.cached, pd_radix_cache_n_pages(rc));
    CHECK_INT(pd_radix_cache_flush(rc), st.cached);
    CHECK_INT(pd_page_alloc_n_free(pa), POOL);
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
}

PD_TEST_MAIN(PD_TEST(test_match_insert_split), PD_TEST(test_lru_and_locks), PD_TEST(test_disabled),
             PD_TEST(test_insert_alloc_failure), PD_TEST(test_random_against_brute_force))
