/* The router's pure choices: round robin skips unhealthy workers and shares evenly, random is
 * roughly uniform over healthy ones, power_of_two never picks the most loaded of several,
 * least-load picks the minimum and rotates ties, exclusions hold, rooms stay below 2^63. */
#include "pd_test.h"

#include "router/config.h"
#include "router/policy.h"

static void test_round_robin(void) {
    struct pd_router_load w[3] = {{.healthy = true}, {.healthy = false}, {.healthy = true}};
    uint64_t cur = 0;
    struct pd_router_rng rng;
    pd_router_rng_seed_with(&rng, 1);
    int seq[6];
    for (int i = 0; i < 6; i++)
        seq[i] = pd_router_pick(PD_ROUTER_POLICY_ROUND_ROBIN, w, 3, -1, &cur, &rng);
    CHECK_INT(seq[0], 0);
    CHECK_INT(seq[1], 2);
    CHECK_INT(seq[2], 0);
    CHECK_INT(seq[3], 2);
    CHECK_INT(pd_router_pick(PD_ROUTER_POLICY_ROUND_ROBIN, w, 3, 0, &cur, &rng), 2);
    CHECK_INT(pd_router_pick(PD_ROUTER_POLICY_ROUND_ROBIN, w, 3, 2, &cur, &rng), 0);
    w[0].healthy = w[2].healthy = false;
    CHECK_INT(pd_router_pick(PD_ROUTER_POLICY_ROUND_ROBIN, w, 3, -1, &cur, &rng), -1);
    CHECK_INT(pd_router_pick(PD_ROUTER_POLICY_ROUND_ROBIN, w, 0, -1, &cur, &rng), -1);
}

static void test_random_uniform_over_healthy(void) {
    struct pd_router_load w[4] = {
        {.healthy = true}, {.healthy = true}, {.healthy = false}, {.healthy = true}};
    struct pd_router_rng rng;
    pd_router_rng_seed_with(&rng, 42);
    uint64_t cur = 0;
    int count[4] = {0};
    for (int i = 0; i < 30000; i++)
        count[pd_router_pick(PD_ROUTER_POLICY_RANDOM, w, 4, -1, &cur, &rng)]++;
    CHECK_INT(count[2], 0);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            CHECK(count[i] > 9000 && count[i] < 11000);
    /* excluded: never */
    for (int i = 0; i < 1000; i++)
        CHECK(pd_router_pick(PD_ROUTER_POLICY_RANDOM, w, 4, 1, &cur, &rng) != 1);
}

static void test_power_of_two(void) {
    struct pd_router_load w[3] = {{.healthy = true, .polled = 10},
                                  {.healthy = true, .polled = 1},
                                  {.healthy = true, .polled = 5}};
    struct pd_router_rng rng;
    pd_router_rng_seed_with(&rng, 7);
    uint64_t cur = 0;
    int count[3] = {0};
    for (int i = 0; i < 3000; i++)
        count[pd_router_pick(PD_ROUTER_POLICY_POWER_OF_TWO, w, 3, -1, &cur, &rng)]++;
    CHECK_INT(count[0], 0); /* the most loaded loses every comparison */
    CHECK(count[1] > count[2]);
    CHECK(count[1] > 1500 && count[1] < 2500); /* 2 of 3 pairs contain worker 1 */
    /* the router's own in-flight count counts when it exceeds the stale poll */
    w[1].inflight = 20;
    for (int i = 0; i < 100; i++)
        CHECK(pd_router_pick(PD_ROUTER_POLICY_POWER_OF_TWO, w, 3, -1, &cur, &rng) != 1);
    /* one healthy: it, whatever its load */
    w[0].healthy = w[2].healthy = false;
    CHECK_INT(pd_router_pick(PD_ROUTER_POLICY_POWER_OF_TWO, w, 3, -1, &cur, &rng), 1);
    CHECK_INT(pd_router_pick(PD_ROUTER_POLICY_CACHE_AWARE, w, 3, -1, &cur, &rng), 1);
    CHECK_INT(pd_router_pick(PD_ROUTER_POLICY_POWER_OF_TWO, w, 3, 1, &cur, &rng), -1);
}

static void test_least_load(void) {
    struct pd_router_load w[3] = {{.healthy = true, .polled = 3},
                                  {.healthy = true, .polled = 3},
                                  {.healthy = true, .polled = 4}};
    uint64_t cur = 0;
    int a = pd_router_pick_least_load(w, 3, -1, &cur);
    int b = pd_router_pick_least_load(w, 3, -1, &cur);
    CHECK(a != 2 && b != 2);
    CHECK(a != b); /* ties rotate */
    w[2].polled = 0;
    CHECK_INT(pd_router_pick_least_load(w, 3, -1, &cur), 2);
    CHECK(pd_router_pick_least_load(w, 3, 2, &cur) != 2);
    w[2].healthy = false;
    w[0].inflight = 9;
    CHECK_INT(pd_router_pick_least_load(w, 3, -1, &cur), 1);
    w[1].healthy = false;
    w[0].healthy = false;
    CHECK_INT(pd_router_pick_least_load(w, 3, -1, &cur), -1);
}

static void test_rooms(void) {
    struct pd_router_rng a, b;
    CHECK_OK(pd_router_rng_seed(&a));
    CHECK_OK(pd_router_rng_seed(&b));
    CHECK(pd_router_rng_next(&a) != pd_router_rng_next(&b)); /* two getrandom seeds differ */
    int high = 0; /* bit 62 set about half the time: the range reaches up to 2^63 */
    for (int i = 0; i < 10000; i++) {
        uint64_t r = pd_router_rng_room(&a);
        CHECK(r < (UINT64_C(1) << 63));
        high += (int)((r >> 62) & 1);
    }
    CHECK(high > 4500 && high < 5500);
    for (int i = 0; i < 1000; i++)
        CHECK(pd_router_rng_below(&a, 3) < 3);
}

PD_TEST_MAIN(PD_TEST(test_round_robin), PD_TEST(test_random_uniform_over_healthy),
             PD_TEST(test_power_of_two), PD_TEST(test_least_load), PD_TEST(test_rooms))
