/*
 * test_devmem_host.c — the host devmem's test modes, which the transfer's ordering tests rely on:
 * deferred copies land only when an event is polled (never at the first look), reverse mode
 * really completes a batch out of order, and a stalled devmem holds its copies across any number
 * of polls until released (sync still runs them). Each is checked by what a reader of the
 * destination would see. The 2-D copy (heads of KV rows regrouped between pools of different tp)
 * moves exactly width bytes of every row between pitches, immediate and deferred. A notify call
 * (the transfer loop's wake-up) comes exactly once, never before the copies enqueued before it
 * have landed, whatever their order, not while stalled, and at the latest at sync or free.
 */
#include <string.h>

#include "model/devmem.h"
#include "common/base/status.h"
#include "pd_test.h"

static struct pd_devmem *host_new(bool deferred, bool reverse) {
    struct pd_devmem_opts o = {
        .kind = PD_DEVMEM_HOST, .host_deferred = deferred, .host_reverse = reverse};
    struct pd_devmem *d = NULL;
    CHECK_OK(pd_devmem_new(&o, &d));
    return d;
}

/* Two copies into the same byte, then an event: in order the second wins, reversed the first. */
static char two_copies_into_one(bool reverse) {
    struct pd_devmem *d = host_new(true, reverse);
    char dst = '0';
    const char a = 'a', b = 'b';
    struct pd_devmem_event *e = NULL;
    CHECK_OK(pd_devmem_event_new(d, &e));
    CHECK_OK(pd_devmem_copy_async(d, &dst, &a, 1));
    CHECK_OK(pd_devmem_copy_async(d, &dst, &b, 1));
    CHECK_OK(pd_devmem_event_record(d, e));
    int q = pd_devmem_event_query(d, e);
    CHECK_INT(q, 0);     /* the first look finds it pending ... */
    CHECK_INT(dst, '0'); /* ... and nothing landed */
    for (int i = 0; i < 4 && q == 0; i++)
        q = pd_devmem_event_query(d, e);
    CHECK_INT(q, 1);
    pd_devmem_event_free(d, e);
    pd_devmem_free(d);
    return dst;
}

static void test_deferred_order(void) {
    CHECK_INT(two_copies_into_one(false), 'b');
    CHECK_INT(two_copies_into_one(true), 'a'); /* out of order: only the event says "done" */
}

static void test_stall(void) {
    struct pd_devmem *d = host_new(true, false);
    char dst[4] = "000", src[4] = "xyz";
    struct pd_devmem_event *e = NULL;
    CHECK_OK(pd_devmem_event_new(d, &e));
    CHECK_OK(pd_devmem_host_stall(d, true));
    CHECK_OK(pd_devmem_copy_async(d, dst, src, 3));
    CHECK_OK(pd_devmem_event_record(d, e));
    int pending = 0;
    for (int i = 0; i < 100; i++)
        pending += pd_devmem_event_query(d, e) == 0;
    CHECK_INT(pending, 100);
    CHECK_STR(dst, "000");
    CHECK_OK(pd_devmem_host_stall(d, false));
    int q = 0;
    for (int i = 0; i < 4 && q == 0; i++)
        q = pd_devmem_event_query(d, e);
    CHECK_INT(q, 1);
    CHECK_STR(dst, "xyz");
    /* sync runs stalled copies too */
    CHECK_OK(pd_devmem_host_stall(d, true));
    CHECK_OK(pd_devmem_copy_async(d, dst, "abc", 3));
    CHECK_OK(pd_devmem_sync(d));
    CHECK_STR(dst, "abc");
    pd_devmem_event_free(d, e);
    pd_devmem_free(d);
    /* copies that run at once have nothing to hold */
    d = host_new(false, false);
    CHECK_ERR(pd_devmem_host_stall(d, true), PD_EINVAL, "is not a deferred host devmem");
    pd_devmem_free(d);
}

/* 5 rows of 3 bytes from a pitch of 7 at column 2 into a pitch of 4 at column 1: the rest of
 * both buffers untouched; the contiguous case (width == both pitches) too. */
static void copy2d(bool deferred) {
    struct pd_devmem *d = host_new(deferred, false);
    char src[35], dst[20];
    for (int i = 0; i < 35; i++)
        src[i] = (char)('A' + i);
    memset(dst, '.', sizeof(dst));
    struct pd_devmem_event *e = NULL;
    CHECK_OK(pd_devmem_event_new(d, &e));
    CHECK_OK(pd_devmem_copy2d_async(d, dst + 1, 4, src + 2, 7, 3, 5));
    CHECK_OK(pd_devmem_copy2d_async(d, dst, 4, src, 7, 0, 5)); /* nothing */
    CHECK_OK(pd_devmem_event_record(d, e));
    while (pd_devmem_event_query(d, e) == 0) {
    }
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 4; c++)
            CHECK_INT(dst[r * 4 + c], c == 0 ? '.' : src[r * 7 + 2 + c - 1]);
    char flat[12];
    CHECK_OK(pd_devmem_copy2d_async(d, flat, 4, src, 4, 4, 3));
    CHECK_OK(pd_devmem_sync(d));
    CHECK(memcmp(flat, src, 12) == 0);
    pd_devmem_event_free(d, e);
    pd_devmem_free(d);
}

static void test_copy2d(void) {
    copy2d(false);
    copy2d(true);
}

/* What a notify call saw: how often it came, and whether the bytes it follows were there. */
struct seen {
    int calls;
    const char *dst, *want;
    size_t len;
    bool landed;
};

static void on_done(void *arg) {
    struct seen *s = arg;
    s->calls++;
    s->landed = memcmp(s->dst, s->want, s->len) == 0;
}

static void test_notify(void) {
    /* copies that run at once: the call comes at once */
    struct pd_devmem *d = host_new(false, false);
    char dst[4] = "000";
    struct seen s = {.dst = dst, .want = "xyz", .len = 3};
    CHECK_OK(pd_devmem_copy_async(d, dst, "xyz", 3));
    CHECK_OK(pd_devmem_notify(d, on_done, &s));
    CHECK_INT(s.calls, 1);
    CHECK(s.landed);
    pd_devmem_free(d);

    /* deferred, in order and reversed: two copies, the call, a third copy into the first byte;
     * the call comes once both earlier copies landed, and only once */
    for (int reverse = 0; reverse < 2; reverse++) {
        d = host_new(true, reverse);
        memcpy(dst, "000", 4);
        s = (struct seen){.dst = dst, .want = "ab", .len = 2};
        struct pd_devmem_event *e = NULL;
        CHECK_OK(pd_devmem_event_new(d, &e));
        CHECK_OK(pd_devmem_copy_async(d, dst, "a", 1));
        CHECK_OK(pd_devmem_copy_async(d, dst + 1, "b", 1));
        CHECK_OK(pd_devmem_notify(d, on_done, &s));
        CHECK_OK(pd_devmem_copy_async(d, dst + 2, "c", 1));
        CHECK_OK(pd_devmem_event_record(d, e));
        CHECK_INT(pd_devmem_event_query(d, e), 0);
        CHECK_INT(s.calls, 0); /* nothing ran yet */
        while (pd_devmem_event_query(d, e) == 0) {
        }
        CHECK_INT(s.calls, 1);
        CHECK(s.landed);
        CHECK_STR(dst, "abc");
        CHECK_OK(pd_devmem_sync(d));
        CHECK_INT(s.calls, 1);
        pd_devmem_event_free(d, e);
        pd_devmem_free(d);
    }

    /* stalled: no call however often the events are polled; sync makes it, as free does */
    d = host_new(true, false);
    memcpy(dst, "000", 4);
    s = (struct seen){.dst = dst, .want = "xyz", .len = 3};
    struct pd_devmem_event *e = NULL;
    CHECK_OK(pd_devmem_event_new(d, &e));
    CHECK_OK(pd_devmem_host_stall(d, true));
    CHECK_OK(pd_devmem_copy_async(d, dst, "xyz", 3));
    CHECK_OK(pd_devmem_notify(d, on_done, &s));
    CHECK_OK(pd_devmem_event_record(d, e));
    for (int i = 0; i < 100; i++)
        CHECK_INT(pd_devmem_event_query(d, e), 0);
    CHECK_INT(s.calls, 0);
    CHECK_OK(pd_devmem_sync(d));
    CHECK_INT(s.calls, 1);
    CHECK(s.landed);
    struct seen late = {.dst = dst, .want = "uvw", .len = 3};
    CHECK_OK(pd_devmem_copy_async(d, dst, "uvw", 3));
    CHECK_OK(pd_devmem_notify(d, on_done, &late));
    pd_devmem_event_free(d, e);
    pd_devmem_free(d);
    CHECK_INT(late.calls, 1);
    CHECK(late.landed);
}

PD_TEST_MAIN(PD_TEST(test_deferred_order), PD_TEST(test_stall), PD_TEST(test_copy2d),
             PD_TEST(test_notify))
