/* pd_ct_equal (common/base/ct.h): the verdict for equal, differing and differently long inputs,
 * empty and NULL ones; and its time, which must not depend on where the inputs differ nor on the
 * secret's length (a memcmp or an early length check would answer a first-byte mismatch or a
 * short secret a thousand times sooner than a match). */
#include "pd_test.h"

#include "common/base/ct.h"

#include <stdlib.h>
#include <time.h>

static void test_verdicts(void) {
    const char *k = "sk-0123456789abcdef";
    size_t n = strlen(k);
    CHECK(pd_ct_equal(k, n, k, n));
    char buf[64];
    memcpy(buf, k, n);
    CHECK(pd_ct_equal(buf, n, k, n));
    for (size_t i = 0; i < n; i++) { /* one flipped bit anywhere */
        memcpy(buf, k, n);
        buf[i] ^= 1;
        CHECK(!pd_ct_equal(buf, n, k, n));
        CHECK(!pd_ct_equal(k, n, buf, n));
    }
    /* a prefix of the secret, the secret plus one byte, the secret twice (same bytes at every
     * position the wrapped index visits) */
    CHECK(!pd_ct_equal(k, n - 1, k, n));
    memcpy(buf, k, n);
    buf[n] = 'x';
    CHECK(!pd_ct_equal(buf, n + 1, k, n));
    memcpy(buf + n, k, n);
    CHECK(!pd_ct_equal(buf, 2 * n, k, n));
    CHECK(!pd_ct_equal("aa", 2, "a", 1));
    CHECK(!pd_ct_equal("a", 1, "aa", 2));
    /* empty and NULL */
    CHECK(pd_ct_equal(NULL, 0, NULL, 0));
    CHECK(pd_ct_equal("", 0, "", 0));
    CHECK(!pd_ct_equal(NULL, 0, k, n));
    CHECK(!pd_ct_equal(k, n, NULL, 0));
    CHECK(!pd_ct_equal("\0", 1, NULL, 0)); /* the wrapped index of an empty secret reads 0 */
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The fastest of a few runs (other processes on the machine only ever add time). */
static double time_of(const char *given, size_t given_len, const char *secret, size_t secret_len,
                      bool want) {
    double best = 1e9;
    for (int rep = 0; rep < 11; rep++) {
        double t0 = seconds();
        bool eq = pd_ct_equal(given, given_len, secret, secret_len);
        double t = seconds() - t0;
        CHECK(eq == want);
        if (t < best)
            best = t;
    }
    return best;
}

static void test_time_independent_of_the_secret(void) {
    size_t n = 1u << 20; /* long enough that one comparison takes a measurable time */
    char *a = malloc(n), *b = malloc(n);
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] = (char)(i * 131 + 7);
    double equal = time_of(a, n, b, n, true);
    b[0] ^= 0x55; /* differs at the first byte */
    double first = time_of(a, n, b, n, false);
    double short_secret = time_of(a, n, b, 1, false); /* lengths differ */
    fprintf(stderr,
            "note: 1 MiB: equal %.3f ms, first byte differs %.3f ms, 1-byte secret %.3f ms\n",
            equal * 1e3, first * 1e3, short_secret * 1e3);
    /* the same work each time: within a factor that noise explains, far from the 1000x an early
     * exit gives */
    CHECK(first > equal / 4 && first < equal * 4);
    CHECK(short_secret > equal / 4 && short_secret < equal * 4);
    free(a);
    free(b);
}

PD_TEST_MAIN(PD_TEST(test_verdicts), PD_TEST(test_time_independent_of_the_secret))
