/*
 * pd_test_rng.h — the seeded xorshift64* stream of the scheduler simulations (test_sched_sim.c,
 * test_sched_trace.c, test_sched_coloc.c): set rng_state, then rnd / rint_ / chance. One stream per
 * test binary; the trace golden (tests/fixtures/sched_trace.txt) depends on its exact sequence.
 */
#ifndef PD_TEST_RNG_H
#define PD_TEST_RNG_H

#include <stdbool.h>
#include <stdint.h>

static uint64_t rng_state;
static inline uint64_t rnd(void) {
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static inline int32_t rint_(int32_t n) { /* [0, n) */
    return (int32_t)(rnd() % (uint64_t)n);
}
static inline bool chance(double p) {
    return (double)(rnd() >> 11) / 9007199254740992.0 < p;
}

#endif
