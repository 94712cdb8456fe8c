/*
 * policy.h — the router's choices, pure: which prefill (round_robin, random, power_of_two on
 * load), which decode (least load), and the bootstrap room (uniform in [0, 2^63)).
 *
 * Nothing here does I/O or reads a clock: callers pass the workers' state (health, last polled
 * /get_load, the router's own in-flight count) and a seeded generator, so tests drive every
 * policy with synthetic states. A worker that is not healthy is never picked.
 */
#ifndef PD_ROUTER_POLICY_H
#define PD_ROUTER_POLICY_H

#include <stdbool.h>
#include <stdint.h>

/* xoshiro256**: fast, 2^256 period, passes BigCrush; seeded from getrandom(2). */
struct pd_router_rng {
    uint64_t s[4];
};

/* Seeds from getrandom(2). PD_OK or PD_EIO. */
int pd_router_rng_seed(struct pd_router_rng *r);
/* Deterministic seeding (tests), expanded with splitmix64. */
void pd_router_rng_seed_with(struct pd_router_rng *r, uint64_t seed);
uint64_t pd_router_rng_next(struct pd_router_rng *r);
/* Uniform in [0, n), unbiased; n > 0. */
uint64_t pd_router_rng_below(struct pd_router_rng *r, uint64_t n);
/* A bootstrap room: uniform in [0, 2^63). */
uint64_t pd_router_rng_room(struct pd_router_rng *r);

struct pd_router_load {
    bool healthy;
    int64_t polled;   /* last /get_load answer; 0 before the first */
    int64_t inflight; /* requests the router has on it now */
};

/* What a policy compares: the polled load goes stale between polls, the router's own count does
 * not, so the larger of the two. */
int64_t pd_router_load_effective(const struct pd_router_load *l);

/* Index of the chosen worker among w[0..n), never `exclude` (-1: none) and never an unhealthy
 * one; -1 when none qualifies. rr_cursor is the round-robin position (advanced on each pick). */
int pd_router_pick(int policy, const struct pd_router_load *w, int n, int exclude,
                   uint64_t *rr_cursor, struct pd_router_rng *rng);
/* Least effective load; ties go to the lowest index after rr_cursor so equal workers share. */
int pd_router_pick_least_load(const struct pd_router_load *w, int n, int exclude,
                              uint64_t *rr_cursor);

/* sglang-router's retry backoff: the delay before retry number `retry` (1 = the first retry) is
 * initial_ms * multiplier^(retry-1), at most max_ms, then scaled by a factor drawn uniformly from
 * [1 - jitter, 1 + jitter] (jitter in [0, 1]). In ms, >= 0. */
struct pd_router_backoff {
    double initial_ms, max_ms, multiplier, jitter;
};
double pd_router_backoff_ms(const struct pd_router_backoff *b, int retry,
                            struct pd_router_rng *rng);

#endif
