/*
 * test_xfer_plan.c — the page sets the transfer tests and bench/xfer draw (common/xfer_plan.h):
 * every index distinct and inside its span, and the scatter share is what the set really has —
 * a "50%-scattered" set has half its pages alone and the other half in runs, counted on the
 * (src, dst) pairs the engine coalesces, not on each side separately. Page contents by kv head
 * are the same logical page whatever the split: pools of tp 1, 2 and 4 (4 heads divided, or 2
 * heads replicated at tp 4) filled alike check clean against each other's content and have one
 * checksum; one wrong byte is found at its offset.
 */
#include <math.h>
#include <stdbool.h>

#include <string.h>

#include "common/base/alloc.h"
#include "common/xfer.h"
#include "common/xfer_plan.h"
#include "pd_test.h"

static bool distinct_in(const uint32_t *v, uint32_t n, uint32_t lo, uint32_t span) {
    uint8_t *seen = pd_calloc(span, 1);
    bool ok = seen != NULL;
    for (uint32_t i = 0; ok && i < n; i++) {
        ok = v[i] >= lo && v[i] < lo + span && !seen[v[i] - lo];
        if (ok)
            seen[v[i] - lo] = 1;
    }
    pd_free(seen);
    return ok;
}

static void test_scatter_shares(void) {
    static uint32_t src[4096], dst[4096];
    const double shares[] = {0.0, 0.25, 0.5, 0.75, 1.0};
    for (int k = 0; k < 5; k++) {
        for (uint64_t seed = 1; seed <= 20; seed++) {
            uint32_t n = 1 + (uint32_t)((seed * 997) % 2048);
            CHECK_OK(pd_xfer_plan_pages(seed, n, shares[k], 100, 2 * n, 7, 2 * n + 3, src, dst));
            CHECK(distinct_in(src, n, 100, 2 * n));
            CHECK(distinct_in(dst, n, 7, 2 * n + 3));
            uint32_t runs, single;
            pd_xfer_plan_runs(src, dst, n, &runs, &single);
            if (shares[k] == 0.0) {
                CHECK_INT(runs, 1);
            } else {
                /* a run the span has no window for is split, rarely into a single page */
                long want = lround(shares[k] * n), slack = 1 + (long)n / 200;
                CHECK((long)single >= want && (long)single <= want + slack);
                /* the rest is in runs of 2..16: no fewer runs than that allows */
                CHECK(runs - single >= (n - single + 15) / 16);
                CHECK(n - single == 0 || runs - single <= (n - single) / 2);
            }
        }
    }
}

/* A full span (n == span) cannot keep runs apart: still distinct and complete. */
static void test_full_span(void) {
    static uint32_t src[512], dst[512];
    CHECK_OK(pd_xfer_plan_pages(9, 512, 0.5, 0, 512, 0, 512, src, dst));
    CHECK(distinct_in(src, 512, 0, 512));
    CHECK(distinct_in(dst, 512, 0, 512));
}

static void test_same_seed_same_set(void) {
    uint32_t a[300], b[300], c[300], d[300];
    CHECK_OK(pd_xfer_plan_pages(42, 300, 0.5, 0, 1000, 0, 1000, a, b));
    CHECK_OK(pd_xfer_plan_pages(42, 300, 0.5, 0, 1000, 0, 1000, c, d));
    CHECK(memcmp(a, c, sizeof(a)) == 0 && memcmp(b, d, sizeof(b)) == 0);
}

static void test_bad_input(void) {
    uint32_t a[8], b[8];
    CHECK_ERR(pd_xfer_plan_pages(1, 8, 0.5, 0, 4, 0, 64, a, b), PD_EINVAL, "spans");
    CHECK_ERR(pd_xfer_plan_pages(1, 8, 1.5, 0, 64, 0, 64, a, b), PD_EINVAL, "scatter");
}

static struct pd_xfer_heads split(int total, int n) {
    struct pd_xfer_heads h = {.rows_per_page = 6,
                              .head_bytes = 10,
                              .total = (uint32_t)total,
                              .count = (uint32_t)(total >= n ? total / n : 1)};
    for (int r = 0; r < n; r++)
        h.start[r] = (uint32_t)(total >= n ? r * (total / n) : r / (n / total));
    return h;
}

/* Checksum of 3 pages (2, 5, 6 of pools of 8) filled for room 9 over n shards of total heads. */
static uint32_t filled_sum(int total, int n) {
    struct pd_xfer_heads h = split(total, n);
    size_t spb = (size_t)h.rows_per_page * h.count * h.head_bytes;
    void *bases[4];
    uint32_t pages[3] = {2, 5, 6};
    for (int k = 0; k < n; k++) {
        bases[k] = pd_calloc(8, spb);
        for (uint32_t i = 0; i < 3; i++)
            pd_xfer_plan_fill_heads(9, i, &h, k, (char *)bases[k] + pages[i] * spb);
    }
    for (int k = 0; k < n; k++)
        for (uint32_t i = 0; i < 3; i++)
            CHECK_INT(pd_xfer_plan_check_heads(9, i, &h, k, (char *)bases[k] + pages[i] * spb), -1);
    /* one byte off in the last shard's last head of the second page's row 4 */
    char *b = (char *)bases[n - 1] + pages[1] * spb + 4 * h.count * h.head_bytes +
              (h.count - 1) * h.head_bytes + 3;
    *b ^= 1;
    CHECK_INT(pd_xfer_plan_check_heads(9, 1, &h, n - 1, (char *)bases[n - 1] + pages[1] * spb),
              (long)(4 * h.count * h.head_bytes + (h.count - 1) * h.head_bytes + 3));
    *b ^= 1;
    uint32_t sum = pd_xfer_plan_checksum_heads(bases, n, &h, pages, 3);
    for (int k = 0; k < n; k++)
        pd_free(bases[k]);
    return sum;
}

static void test_heads_independent_of_split(void) {
    uint32_t one = filled_sum(4, 1);
    CHECK_INT(filled_sum(4, 2), one);
    CHECK_INT(filled_sum(4, 4), one);
    uint32_t two = filled_sum(2, 1);
    CHECK_INT(filled_sum(2, 2), two);
    CHECK_INT(filled_sum(2, 4), two); /* each head on 2 shards: counted once */
    CHECK(two != one);
}

PD_TEST_MAIN(PD_TEST(test_scatter_shares), PD_TEST(test_full_span),
             PD_TEST(test_same_seed_same_set), PD_TEST(test_bad_input),
             PD_TEST(test_heads_independent_of_split))
