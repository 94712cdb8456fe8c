/*
 * policy.c — prefill/decode selection and the room generator (see policy.h). Pure functions over
 * caller-owned state; the only system call is getrandom(2) in pd_router_rng_seed.
 */
#include "router/policy.h"
#include "router/config.h"

#include "common/base/rng.h"
#include "common/base/status.h"

#include <errno.h>
#include <sys/random.h>

uint64_t pd_router_rng_next(struct pd_router_rng *r) {
    return pd_xoshiro256ss(r->s);
}

void pd_router_rng_seed_with(struct pd_router_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = pd_splitmix64(&seed);
}

int pd_router_rng_seed(struct pd_router_rng *r) {
    uint64_t seed[4];
    size_t got = 0;
    while (got < sizeof(seed)) {
        ssize_t n = getrandom((char *)seed + got, sizeof(seed) - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return pd_errorf(pd_status_from_errno(errno), "seeding the room generator: getrandom");
        }
        got += (size_t)n;
    }
    /* an all-zero state is xoshiro's one fixed point */
    if ((seed[0] | seed[1] | seed[2] | seed[3]) == 0)
        seed[0] = 1;
    for (int i = 0; i < 4; i++)
        r->s[i] = seed[i];
    return PD_OK;
}

uint64_t pd_router_rng_below(struct pd_router_rng *r, uint64_t n) {
    PD_ASSERT(n > 0);
    uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* reject the short last bucket */
    uint64_t x;
    do {
        x = pd_router_rng_next(r);
    } while (x >= limit);
    return x % n;
}

uint64_t pd_router_rng_room(struct pd_router_rng *r) {
    return pd_router_rng_next(r) >> 1;
}

int64_t pd_router_load_effective(const struct pd_router_load *l) {
    return l->polled > l->inflight ? l->polled : l->inflight;
}

static bool eligible(const struct pd_router_load *w, int i, int exclude) {
    return i != exclude && w[i].healthy;
}

static int pick_round_robin(const struct pd_router_load *w, int n, int exclude, uint64_t *cursor) {
    for (int k = 0; k < n; k++) {
        int i = (int)((*cursor + (uint64_t)k) % (uint64_t)n);
        if (eligible(w, i, exclude)) {
            *cursor = (uint64_t)i + 1;
            return i;
        }
    }
    return -1;
}

int pd_router_pick(int policy, const struct pd_router_load *w, int n, int exclude,
                   uint64_t *rr_cursor, struct pd_router_rng *rng) {
    int cand[2];
    int n_ok = 0;
    for (int i = 0; i < n; i++)
        n_ok += eligible(w, i, exclude);
    if (n_ok == 0)
        return -1;
    switch (policy) {
    case PD_ROUTER_POLICY_ROUND_ROBIN: return pick_round_robin(w, n, exclude, rr_cursor);
    case PD_ROUTER_POLICY_RANDOM:
    case PD_ROUTER_POLICY_POWER_OF_TWO:
    case PD_ROUTER_POLICY_CACHE_AWARE: {
        /* draw among the eligible ones: the k-th eligible index */
        int draws = policy == PD_ROUTER_POLICY_RANDOM || n_ok == 1 ? 1 : 2;
        uint64_t first = pd_router_rng_below(rng, (uint64_t)n_ok);
        uint64_t second = draws == 2 ? pd_router_rng_below(rng, (uint64_t)n_ok - 1) : 0;
        if (draws == 2 && second >= first)
            second++; /* distinct from the first */
        uint64_t want[2] = {first, second};
        for (int d = 0; d < draws; d++) {
            uint64_t k = 0;
            for (int i = 0; i < n; i++) {
                if (!eligible(w, i, exclude))
                    continue;
                if (k++ == want[d]) {
                    cand[d] = i;
                    break;
                }
            }
        }
        if (draws == 1)
            return cand[0];
        return pd_router_load_effective(&w[cand[1]]) < pd_router_load_effective(&w[cand[0]])
                   ? cand[1]
                   : cand[0];
    }
    default: PD_ASSERT(!"unknown policy");
    }
    return -1;
}

int pd_router_pick_least_load(const struct pd_router_load *w, int n, int exclude,
                              uint64_t *rr_cursor) {
    int best = -1;
    int64_t best_load = 0;
    for (int k = 0; k < n; k++) {
        int i = (int)((*rr_cursor + (uint64_t)k) % (uint64_t)n);
        if (!eligible(w, i, exclude))
            continue;
        int64_t l = pd_router_load_effective(&w[i]);
        if (best < 0 || l < best_load) {
            best = i;
            best_load = l;
        }
    }
    if (best >= 0)
        *rr_cursor = (uint64_t)best + 1;
    return best;
}

const char *const pd_router_ca_decision_names[] = {"match", "balance", "smallest"};

/* What a cache_aware decision maximises for worker i. */
static int64_t ca_key(int decision, const struct pd_router_load *w, const size_t *matched,
                      const size_t *tree_size, int i) {
    switch (decision) {
    case PD_ROUTER_CA_BALANCE: return -w[i].inflight;
    case PD_ROUTER_CA_MATCH: return (int64_t)matched[i];
    default: return -(int64_t)tree_size[i];
    }
}

int pd_router_pick_cache_aware(const struct pd_router_cache_aware *ca,
                               const struct pd_router_load *w, const size_t *matched,
                               const size_t *tree_size, int n, int exclude, size_t text_len,
                               uint64_t *rr_cursor, int *decision) {
    int64_t max_load = 0, min_load = 0;
    size_t best_match = 0;
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (!eligible(w, i, exclude))
            continue;
        /* sglang-router takes max and min over all workers, unhealthy ones too; an unhealthy
         * worker holds few requests and would make any busy cluster look imbalanced, so only
         * the ones that can be picked count here */
        int64_t l = w[i].inflight;
        if (!any || l > max_load)
            max_load = l;
        if (!any || l < min_load)
            min_load = l;
        if (matched[i] > best_match)
            best_match = matched[i];
        any = true;
    }
    if (!any)
        return -1;
    /* sglang-router: match_rate = matched chars / text chars, 0 for an empty text; strictly
     * above the threshold routes by match */
    double rate = text_len ? (double)best_match / (double)text_len : 0.0;
    if (max_load - min_load > ca->balance_abs &&
        (double)max_load > (double)min_load * ca->balance_rel)
        *decision = PD_ROUTER_CA_BALANCE;
    else if (rate > ca->cache_threshold)
        *decision = PD_ROUTER_CA_MATCH;
    else
        *decision = PD_ROUTER_CA_SMALLEST;
    /* the highest key; ties to the lower in-flight count, then to the first after the cursor */
    int best = -1;
    int64_t best_key = 0;
    for (int k = 0; k < n; k++) {
        int i = (int)((*rr_cursor + (uint64_t)k) % (uint64_t)n);
        if (!eligible(w, i, exclude))
            continue;
        int64_t key = ca_key(*decision, w, matched, tree_size, i);
        if (best < 0 || key > best_key || (key == best_key && w[i].inflight < w[best].inflight)) {
            best = i;
            best_key = key;
        }
    }
    *rr_cursor = (uint64_t)best + 1;
    return best;
}

double pd_router_backoff_ms(const struct pd_router_backoff *b, int retry,
                            struct pd_router_rng *rng) {
    double d = b->initial_ms;
    for (int i = 1; i < retry && d < b->max_ms; i++)
        d *= b->multiplier;
    if (d > b->max_ms)
        d = b->max_ms;
    /* 53 random bits → [0, 1) */
    double u = (double)(pd_router_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    d *= 1.0 + b->jitter * (2.0 * u - 1.0);
    return d > 0 ? d : 0;
}
