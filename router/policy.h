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
#include <stddef.h>
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

/* cache_aware (sglang-router's CacheAwarePolicy) over one role's workers, given what the prefix
 * tree (cache_tree.h) says of each: matched[i] bytes of the request's text_len-byte routing text
 * and tree_size[i] bytes held for worker i. Decisions, in sglang-router's order:
 *   balance   the router's in-flight counts of the eligible workers are imbalanced — max - min >
 *             balance_abs and max > min * balance_rel — → the least loaded one;
 *   match     else, best match / text_len > cache_threshold → the best-matching one;
 *   smallest  else → the one with the smallest tree (the most cache room).
 * Ties go to the lower in-flight count, then to the first after rr_cursor (advanced), so equal
 * workers share. Loads are the router's own counts (sglang-router's worker.load()), not polled
 * ones. -1 when no worker qualifies; *decision says which rule chose. */
enum pd_router_ca_decision {
    PD_ROUTER_CA_MATCH = 0,
    PD_ROUTER_CA_BALANCE = 1,
    PD_ROUTER_CA_SMALLEST = 2,
};
extern const char *const pd_router_ca_decision_names[]; /* enum order */

struct pd_router_cache_aware {
    double cache_threshold; /* --cache-threshold */
    int64_t balance_abs;    /* --balance-abs-threshold */
    double balance_rel;     /* --balance-rel-threshold */
    double eviction_secs;   /* --eviction-interval-secs (the router's timer) */
    int64_t max_tree_size;  /* --max-tree-size, bytes per worker */
};

int pd_router_pick_cache_aware(const struct pd_router_cache_aware *ca,
                               const struct pd_router_load *w, const size_t *matched,
                               const size_t *tree_size, int n, int exclude, size_t text_len,
                               uint64_t *rr_cursor, int *decision);

/* sglang-router's retry backoff: the delay before retry number `retry` (1 = the first retry) is
 * initial_ms * multiplier^(retry-1), at most max_ms, then scaled by a factor drawn uniformly from
 * [1 - jitter, 1 + jitter] (jitter in [0, 1]). In ms, >= 0. */
struct pd_router_backoff {
    double initial_ms, max_ms, multiplier, jitter;
};
double pd_router_backoff_ms(const struct pd_router_backoff *b, int retry,
                            struct pd_router_rng *rng);

#endif
