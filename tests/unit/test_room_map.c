/* Room map: put/get/del, duplicate rooms, capacity, and random churn against a shadow array. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/base/room_map.h"
#include "common/base/room_table.h"

static void test_basic(void) {
    struct pd_room_map m;
    CHECK_ERR(pd_room_map_init(&m, 0), PD_EINVAL, "room map for 0");
    pd_alloc_fail_after(1);
    CHECK_ERR(pd_room_map_init(&m, 4), PD_ENOMEM, "room map for 4");
    pd_alloc_fail_after(-1);
    CHECK_OK(pd_room_map_init(&m, 3));
    CHECK_OK(pd_room_map_put(&m, 7, 0));
    CHECK_ERR(pd_room_map_put(&m, 7, 1), PD_EINVAL, "room 7 already");
    CHECK_OK(pd_room_map_put(&m, UINT64_MAX, 1));
    CHECK_OK(pd_room_map_put(&m, 0, 2));
    CHECK_ERR(pd_room_map_put(&m, 9, 3), PD_EFULL, "full");
    CHECK_INT(pd_room_map_get(&m, 7), 0);
    CHECK_INT(pd_room_map_get(&m, UINT64_MAX), 1);
    CHECK_INT(pd_room_map_get(&m, 0), 2);
    CHECK_INT(pd_room_map_get(&m, 8), -1);
    CHECK_OK(pd_room_map_del(&m, 7));
    CHECK_INT(pd_room_map_del(&m, 7), PD_ENOENT);
    CHECK_INT(pd_room_map_get(&m, 7), -1);
    CHECK_OK(pd_room_map_put(&m, 9, 3));
    pd_room_map_free(&m);
}

static void test_random_churn(void) {
    enum { MAX = 500, KEYS = 2000 };
    struct pd_room_map m;
    CHECK_OK(pd_room_map_init(&m, MAX));
    static int32_t shadow[KEYS];
    for (int i = 0; i < KEYS; i++)
        shadow[i] = -1;
    int n = 0, bad = 0;
    uint64_t x = 12345;
    for (int it = 0; it < 200000; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % KEYS);
        uint64_t room = (uint64_t)k * 1024; /* clustered ids on purpose */
        if (shadow[k] >= 0) {
            bad += pd_room_map_del(&m, room) != PD_OK;
            shadow[k] = -1;
            n--;
        } else {
            int rc = pd_room_map_put(&m, room, it);
            if (n < MAX) {
                bad += rc != PD_OK;
                shadow[k] = it;
                n++;
            } else {
                bad += rc != PD_EFULL;
            }
        }
        int q = (int)((x >> 32) % KEYS);
        bad += pd_room_map_get(&m, (uint64_t)q * 1024) != shadow[q];
    }
    CHECK_INT(bad, 0);
    CHECK_INT(m.n, n);
    pd_room_map_free(&m);
}

/* The room table: slot 0 first, a live room refused, full when every slot is taken, a slot held
 * after its room is unmapped until put back, allocation failures clean. */
static void test_room_table(void) {
    struct pd_room_table t;
    CHECK_INT(pd_room_table_init(&t, 0), PD_EINVAL);
    pd_room_table_free(&t);
    CHECK_OK(pd_room_table_init(&t, 3));
    int32_t a, b, c, d;
    CHECK_OK(pd_room_table_take(&t, 70, &a));
    CHECK_INT(a, 0);
    CHECK_INT(pd_room_table_take(&t, 70, &d), PD_EINVAL);
    CHECK_OK(pd_room_table_take(&t, 71, &b));
    CHECK_OK(pd_room_table_take(&t, 72, &c));
    CHECK_INT(b, 1);
    CHECK_INT(c, 2);
    CHECK(pd_room_table_full(&t));
    CHECK_INT(pd_room_table_take(&t, 73, &d), PD_EFULL);
    CHECK_INT(pd_room_table_get(&t, 71), 1);
    pd_room_table_unmap(&t, 71); /* an ended request: its room is free, its slot not yet */
    CHECK_INT(pd_room_table_get(&t, 71), -1);
    CHECK(pd_room_table_full(&t));
    CHECK_INT(pd_room_table_take(&t, 71, &d), PD_EFULL);
    pd_room_table_put(&t, b);
    CHECK_OK(pd_room_table_take(&t, 71, &d));
    CHECK_INT(d, b); /* the slot given back last is taken first */
    pd_room_table_release(&t, 70, a);
    CHECK_INT(pd_room_table_get(&t, 70), -1);
    CHECK_INT(t.n_free, 1);
    CHECK_INT(t.map.n, 2);
    pd_room_table_free(&t);
    int failed = 0;
    for (long k = 0; k < 8; k++) {
        pd_alloc_fail_after(k);
        int rc = pd_room_table_init(&t, 5);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        failed += rc != PD_OK;
        pd_room_table_free(&t);
    }
    CHECK(failed >= 2); /* the map's two arrays and the free stack */
}

PD_TEST_MAIN(PD_TEST(test_basic), PD_TEST(test_random_churn), PD_TEST(test_room_table))
