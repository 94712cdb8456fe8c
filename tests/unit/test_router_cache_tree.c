/* cache_aware's pieces: the prefix tree (router/cache_tree.c) against a brute-force reference —
 * per tenant the list of texts it was given, matched length = the longest common prefix with any
 * of them, size = the distinct non-empty prefixes of them all — over random inserts, matches,
 * tenant removals and evictions (where only bounds are known: nothing newer than what fits
 * is lost, nothing never inserted appears); allocation failures leave a consistent tree; the
 * policy's three rules (policy.c); the routing text of each route (route_text.c); the flags. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "router/body.h"
#include "router/cache_tree.h"
#include "router/config.h"
#include "router/policy.h"
#include "router/route_text.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static void test_basic(void) {
    struct pd_cache_tree *t;
    CHECK_OK(pd_cache_tree_new(&t));
    int a, b;
    CHECK_OK(pd_cache_tree_tenant_add(t, &a));
    CHECK_OK(pd_cache_tree_tenant_add(t, &b));
    CHECK_INT(a, 0);
    CHECK_INT(b, 1);
    CHECK_OK(pd_cache_tree_insert(t, a, "hello world", 11));
    CHECK_OK(pd_cache_tree_insert(t, b, "hello there", 11));
    CHECK_OK(pd_cache_tree_check(t));
    size_t m[2];
    CHECK_INT(pd_cache_tree_match(t, "hello world!", 12, m, 2), 11);
    CHECK_INT(m[0], 11);
    CHECK_INT(m[1], 6);
    CHECK_INT(pd_cache_tree_match(t, "help", 4, m, 2), 3);
    CHECK_INT(m[0], 3);
    CHECK_INT(m[1], 3);
    CHECK_INT(pd_cache_tree_match(t, "xyz", 3, m, 2), 0);
    CHECK_INT(m[0] + m[1], 0);
    CHECK_INT(pd_cache_tree_tenant_size(t, a), 11);
    CHECK_INT(pd_cache_tree_tenant_size(t, b), 11);
    CHECK_INT(pd_cache_tree_bytes(t), 16); /* "hello " + "world" + "there" */
    CHECK_INT(pd_cache_tree_nodes(t), 3);
    /* removing a drops only a's marks: "world" goes, the shared stem stays */
    pd_cache_tree_tenant_remove(t, a);
    CHECK_OK(pd_cache_tree_check(t));
    CHECK_INT(pd_cache_tree_bytes(t), 11);
    CHECK_INT(pd_cache_tree_match(t, "hello world", 11, m, 2), 6);
    CHECK_INT(m[0], 0);
    CHECK_INT(m[1], 6);
    int c;
    CHECK_OK(pd_cache_tree_tenant_add(t, &c));
    CHECK_INT(c, 0); /* the freed id again */
    CHECK_INT(pd_cache_tree_tenant_size(t, c), 0);
    /* eviction: b holds "hello there" and then "hello world" (newer); at most 11 bytes keeps
     * the newer whole, the older one's own leaf goes */
    CHECK_OK(pd_cache_tree_insert(t, b, "hello world", 11));
    CHECK_INT(pd_cache_tree_tenant_size(t, b), 16);
    int oom = 1;
    CHECK_INT(pd_cache_tree_evict(t, 11, &oom), 5);
    CHECK_INT(oom, 0);
    CHECK_OK(pd_cache_tree_check(t));
    CHECK_INT(pd_cache_tree_match(t, "hello world", 11, m, 2), 11);
    CHECK_INT(m[1], 11);
    CHECK_INT(pd_cache_tree_match(t, "hello there", 11, m, 2), 6);
    pd_cache_tree_tenant_remove(t, b);
    CHECK_INT(pd_cache_tree_nodes(t), 0);
    CHECK_INT(pd_cache_tree_bytes(t), 0);
    pd_cache_tree_free(t);
}

/* ---------------------------------------------------------------- the reference */

#define NT 4
#define MAXS 400
#define SLEN 24

struct ref {
    char s[MAXS][SLEN + 1];
    size_t n;
    size_t exact_from; /* strings before this may have been evicted (bounds only) */
    bool live;
    int id;
};

static size_t lcp(const char *a, const char *b) {
    size_t i = 0;
    while (a[i] && a[i] == b[i])
        i++;
    return i;
}

/* longest prefix of q among strings [from, n) */
static size_t ref_match(const struct ref *r, const char *q, size_t from) {
    size_t best = 0;
    for (size_t i = from; i < r->n; i++) {
        size_t l = lcp(r->s[i], q);
        if (l > best)
            best = l;
    }
    return best;
}

/* distinct non-empty prefixes of strings [from, n) */
static size_t ref_size(const struct ref *r, size_t from) {
    size_t total = 0;
    for (size_t i = from; i < r->n; i++) {
        size_t len = strlen(r->s[i]), shared = 0;
        for (size_t j = from; j < i; j++) {
            size_t l = lcp(r->s[i], r->s[j]);
            if (l > shared)
                shared = l;
        }
        total += len - shared;
    }
    return total;
}

static uint64_t rnd(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void rand_text(uint64_t *x, char *out) {
    /* few letters and shared stems, so texts share prefixes and split nodes often */
    static const char *const stems[] = {"", "sys:A ", "sys:B ", "sys:A user", "s"};
    size_t n = (size_t)snprintf(out, SLEN + 1, "%s", stems[rnd(x) % 5]);
    size_t extra = rnd(x) % (SLEN - n + 1);
    for (size_t i = 0; i < extra; i++)
        out[n++] = "abc "[rnd(x) % 4];
    out[n] = '\0';
}

static void check_all(struct pd_cache_tree *t, struct ref *refs, uint64_t *x) {
    size_t m[16];
    for (int q = 0; q < 8; q++) {
        char text[SLEN + 1];
        rand_text(x, text);
        /* also probe prefixes of stored texts */
        int k = (int)(rnd(x) % NT);
        if (refs[k].n && rnd(x) % 2)
            snprintf(text, sizeof(text), "%s", refs[k].s[rnd(x) % refs[k].n]);
        int cap = pd_cache_tree_tenant_cap(t);
        CHECK(cap <= 16);
        pd_cache_tree_match(t, text, strlen(text), m, cap);
        for (int i = 0; i < NT; i++) {
            if (!refs[i].live)
                continue;
            size_t hi = ref_match(&refs[i], text, 0);
            size_t lo = ref_match(&refs[i], text, refs[i].exact_from);
            if (refs[i].exact_from == 0)
                CHECK_INT(m[refs[i].id], hi);
            CHECK(m[refs[i].id] <= hi && m[refs[i].id] >= lo);
        }
    }
    for (int i = 0; i < NT; i++)
        if (refs[i].live && refs[i].exact_from == 0)
            CHECK_INT(pd_cache_tree_tenant_size(t, refs[i].id), ref_size(&refs[i], 0));
}

static void test_random_differential(void) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 6; round++) {
        struct pd_cache_tree *t;
        CHECK_OK(pd_cache_tree_new(&t));
        static struct ref refs[NT];
        memset(refs, 0, sizeof(refs));
        for (int i = 0; i < NT; i++) {
            CHECK_OK(pd_cache_tree_tenant_add(t, &refs[i].id));
            refs[i].live = true;
        }
        for (int op = 0; op < 600; op++) {
            int k = (int)(rnd(&x) % NT);
            struct ref *r = &refs[k];
            unsigned what = (unsigned)(rnd(&x) % 100);
            if (!r->live) { /* a worker joining (again) */
                CHECK_OK(pd_cache_tree_tenant_add(t, &r->id));
                r->live = true;
                r->n = r->exact_from = 0;
            } else if (what < 70 && r->n < MAXS) {
                rand_text(&x, r->s[r->n]);
                CHECK_OK(pd_cache_tree_insert(t, r->id, r->s[r->n], strlen(r->s[r->n])));
                r->n++;
            } else if (what < 75) { /* a worker leaving */
                pd_cache_tree_tenant_remove(t, r->id);
                r->live = false;
            } else if (what < 85) {
                size_t max = rnd(&x) % 120;
                size_t before[NT];
                for (int i = 0; i < NT; i++)
                    before[i] = refs[i].live ? pd_cache_tree_tenant_size(t, refs[i].id) : 0;
                int oom;
                size_t ev = pd_cache_tree_evict(t, max, &oom);
                size_t dropped = 0;
                for (int i = 0; i < NT; i++) {
                    if (!refs[i].live)
                        continue;
                    size_t after = pd_cache_tree_tenant_size(t, refs[i].id);
                    CHECK(after <= max || after == before[i]);
                    CHECK(after <= before[i]);
                    dropped += before[i] - after;
                    if (after == before[i])
                        continue;
                    /* the newest texts whose union fits in max must all survive */
                    size_t from = refs[i].n;
                    while (from > 0 && ref_size(&refs[i], from - 1) <= max)
                        from--;
                    if (from > refs[i].exact_from)
                        refs[i].exact_from = from;
                    /* and what is left is no more than needed: dropping stops once it fits.
                     * Each drop is one leaf, an edge of at most the tenant's longest text, and
                     * the size before the last drop was still over max. */
                    size_t longest = 0;
                    for (size_t s = 0; s < refs[i].n; s++)
                        if (strlen(refs[i].s[s]) > longest)
                            longest = strlen(refs[i].s[s]);
                    CHECK(after + longest > max);
                }
                CHECK_INT(ev, dropped);
            }
            if (op % 7 == 0) {
                CHECK_OK(pd_cache_tree_check(t));
                check_all(t, refs, &x);
            }
        }
        CHECK_OK(pd_cache_tree_check(t));
        check_all(t, refs, &x);
        for (int i = 0; i < NT; i++)
            if (refs[i].live)
                pd_cache_tree_tenant_remove(t, refs[i].id);
        CHECK_INT(pd_cache_tree_nodes(t), 0);
        CHECK_INT(pd_cache_tree_bytes(t), 0);
        pd_cache_tree_free(t);
    }
}

/* Every allocation of an insert failing in turn: PD_ENOMEM, the tree consistent, and what it
 * holds still a prefix of what was asked (never more). */
static void test_alloc_failures(void) {
    const char *texts[] = {"alpha beta", "alpha gamma", "alp", "delta", "alpha beta gamma"};
    for (long fail = 0; fail < 40; fail++) {
        struct pd_cache_tree *t;
        CHECK_OK(pd_cache_tree_new(&t));
        int a, b;
        CHECK_OK(pd_cache_tree_tenant_add(t, &a));
        CHECK_OK(pd_cache_tree_tenant_add(t, &b));
        CHECK_OK(pd_cache_tree_insert(t, b, "alphabet", 8));
        pd_alloc_fail_after(fail);
        for (size_t i = 0; i < PD_ARRAY_LEN(texts); i++) {
            int rc = pd_cache_tree_insert(t, a, texts[i], strlen(texts[i]));
            CHECK(rc == PD_OK || rc == PD_ENOMEM);
        }
        pd_alloc_fail_after(-1);
        CHECK_OK(pd_cache_tree_check(t));
        size_t m[2];
        pd_cache_tree_match(t, "alphabet", 8, m, 2);
        CHECK_INT(m[1], 8);
        CHECK(pd_cache_tree_tenant_size(t, a) <= 5 + 5 + 6 + 5 + 6 + 1);
        pd_cache_tree_free(t);
    }
}

/* ---------------------------------------------------------------- policy */

static void test_policy(void) {
    struct pd_router_cache_aware ca = {
        .cache_threshold = 0.5, .balance_abs = 4, .balance_rel = 1.5};
    struct pd_router_load w[3] = {{.healthy = true, .inflight = 1},
                                  {.healthy = true, .inflight = 2},
                                  {.healthy = true, .inflight = 1}};
    size_t matched[3] = {10, 60, 30}, size[3] = {500, 100, 50};
    uint64_t cur = 0;
    int d = -1;
    /* balanced, 60/100 > 0.5 → the best match, whatever its load */
    CHECK_INT(pd_router_pick_cache_aware(&ca, w, matched, size, 3, -1, 100, &cur, &d), 1);
    CHECK_INT(d, PD_ROUTER_CA_MATCH);
    /* 60/120 = 0.5 is not above → the smallest tree */
    CHECK_INT(pd_router_pick_cache_aware(&ca, w, matched, size, 3, -1, 120, &cur, &d), 2);
    CHECK_INT(d, PD_ROUTER_CA_SMALLEST);
    /* the best match excluded or unhealthy: the next best */
    CHECK_INT(pd_router_pick_cache_aware(&ca, w, matched, size, 3, 1, 50, &cur, &d), 2);
    CHECK_INT(d, PD_ROUTER_CA_MATCH);
    /* imbalance needs both: 7 - 1 > 4 and 7 > 1.5 */
    w[1].inflight = 7;
    CHECK_INT(pd_router_pick_cache_aware(&ca, w, matched, size, 3, -1, 100, &cur, &d), 0);
    CHECK_INT(d, PD_ROUTER_CA_BALANCE);
    /* abs alone is not enough: 20 - 14 > 4 but 20 < 14 x 1.5 */
    w[0].inflight = 14, w[1].inflight = 20, w[2].inflight = 15;
    CHECK_INT(pd_router_pick_cache_aware(&ca, w, matched, size, 3, -1, 100, &cur, &d), 1);
    CHECK_INT(d, PD_ROUTER_CA_MATCH);
    /* rel alone neither: 3 > 1 x 1.5 but 3 - 1 <= 4 */
    w[0].inflight = 1, w[1].inflight = 3, w[2].inflight = 1;
    CHECK_INT(pd_router_pick_cache_aware(&ca, w, matched, size, 3, -1, 100, &cur, &d), 1);
    /* an unhealthy worker's load does not count toward imbalance */
    w[0].inflight = 0, w[1].inflight = 10, w[2].inflight = 9, w[0].healthy = false;
    CHECK_INT(pd_router_pick_cache_aware(&ca, w, matched, size, 3, -1, 100, &cur, &d), 1);
    CHECK_INT(d, PD_ROUTER_CA_MATCH);
    /* an empty text: never a match, the smallest tree; equal trees share by load, then turns */
    size_t zero[3] = {0, 0, 0};
    struct pd_router_load e[3] = {{.healthy = true}, {.healthy = true}, {.healthy = true}};
    int seen[3] = {0};
    for (int i = 0; i < 6; i++) {
        int k = pd_router_pick_cache_aware(&ca, e, zero, zero, 3, -1, 0, &cur, &d);
        CHECK_INT(d, PD_ROUTER_CA_SMALLEST);
        seen[k]++;
    }
    CHECK(seen[0] == 2 && seen[1] == 2 && seen[2] == 2);
    e[0].inflight = 0, e[1].inflight = 1, e[2].inflight = 1;
    CHECK_INT(pd_router_pick_cache_aware(&ca, e, zero, zero, 3, -1, 0, &cur, &d), 0);
    e[0].healthy = e[1].healthy = e[2].healthy = false;
    CHECK_INT(pd_router_pick_cache_aware(&ca, e, zero, zero, 3, -1, 0, &cur, &d), -1);
}

/* ---------------------------------------------------------------- routing text */

static void expect_text(int route, const char *body, const char *want) {
    char *out = NULL;
    size_t len = 0;
    cJSON *root = cJSON_Parse(body);
    CHECK_OK(pd_router_route_text(route, root, &out, &len));
    cJSON_Delete(root);
    CHECK_STR(out, want);
    CHECK_INT(len, strlen(want));
    pd_free(out);
}

static void test_route_text(void) {
    expect_text(PD_ROUTER_ROUTE_GENERATE, "{\"text\":\"Hello\",\"input_ids\":[1,2]}", "Hello");
    expect_text(PD_ROUTER_ROUTE_GENERATE, "{\"input_ids\":[1,22,333]}", "1 22 333");
    expect_text(PD_ROUTER_ROUTE_GENERATE, "{\"text\":[\"a b\",\"c\"]}", "a b c");
    expect_text(PD_ROUTER_ROUTE_GENERATE, "{\"input_ids\":[[1,2],[3]]}", "1 2 3");
    expect_text(PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":\"Once upon\"}", "Once upon");
    expect_text(PD_ROUTER_ROUTE_COMPLETIONS, "{\"prompt\":[\"x\",\"y\"]}", "x y");
    expect_text(PD_ROUTER_ROUTE_CHAT,
                "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                "{\"role\":\"user\",\"content\":\"Hi\"},"
                "{\"role\":\"assistant\",\"content\":\"Hello!\"},"
                "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What\"},"
                "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}},"
                "{\"type\":\"text\",\"text\":\"now?\"}]}]}",
                "Be brief. Hi Hello! What now?");
    /* a chat's next turn extends the previous turn's text */
    expect_text(PD_ROUTER_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
                "Hi");
    expect_text(PD_ROUTER_ROUTE_CHAT, "not json", "");
    expect_text(PD_ROUTER_ROUTE_CHAT, "{\"messages\":7}", "");
    expect_text(PD_ROUTER_ROUTE_GENERATE, "{}", "");
    /* ids print as "%.0f" prints them, whichever way the route text formats each one */
    static const char *const nums[] = {"0",
                                       "-0",
                                       "7",
                                       "151935",
                                       "4294967296",
                                       "999999999999999",
                                       "1000000000000000",
                                       "9007199254740993",
                                       "1e20",
                                       "-3",
                                       "2.5",
                                       "3.5",
                                       "1e-3"};
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        char body[96], want[96];
        snprintf(body, sizeof(body), "{\"input_ids\":[%s]}", nums[i]);
        snprintf(want, sizeof(want), "%.0f", strtod(nums[i], NULL));
        expect_text(PD_ROUTER_ROUTE_GENERATE, body, want);
    }
}

/* ---------------------------------------------------------------- flags */

static void test_flags(void) {
    struct pd_router_config cfg;
    char *argv0[] = {"r", "--prefill", "http://a:1", "--decode", "http://b:2"};
    CHECK_OK(pd_router_config_parse(&cfg, 5, argv0));
    CHECK_DBL(cfg.ca.cache_threshold, 0.3, 0);
    CHECK_INT(cfg.ca.balance_abs, 64);
    CHECK_DBL(cfg.ca.balance_rel, 1.5, 0);
    CHECK_DBL(cfg.ca.eviction_secs, 60, 0);
    CHECK_INT(cfg.ca.max_tree_size, 1 << 26);
    /* the roles: prefill follows --policy, decode is least load */
    CHECK_INT(cfg.prefill_policy, PD_ROUTER_POLICY_ROUND_ROBIN);
    CHECK_INT(cfg.decode_policy, PD_ROUTER_POLICY_LEAST_LOAD);
    CHECK_STR(pd_router_policy_name(cfg.decode_policy), "least_load");
    pd_router_config_free(&cfg);
    char *argv_roles[] = {"r",           "--prefill",       "http://a:1",   "--decode",
                          "http://b:2",  "--policy",        "power_of_two", "--prefill-policy",
                          "cache_aware", "--decode-policy", "round_robin"};
    CHECK_OK(pd_router_config_parse(&cfg, 11, argv_roles));
    CHECK_INT(cfg.policy, PD_ROUTER_POLICY_POWER_OF_TWO);
    CHECK_INT(cfg.prefill_policy, PD_ROUTER_POLICY_CACHE_AWARE);
    CHECK_INT(cfg.decode_policy, PD_ROUTER_POLICY_ROUND_ROBIN);
    pd_router_config_free(&cfg);
    char *argv_bad[] = {"r",          "--prefill",       "http://a:1", "--decode",
                        "http://b:2", "--decode-policy", "least_load"};
    CHECK_ERR(pd_router_config_parse(&cfg, 7, argv_bad), PD_EINVAL, "--decode-policy");
    pd_router_config_free(&cfg);
    char *argv1[] = {"r",           "--prefill",
                     "http://a:1",  "--decode",
                     "http://b:2",  "--policy",
                     "cache_aware", "--cache-threshold",
                     "0.5",         "--balance-abs-threshold",
                     "32",          "--balance-rel-threshold",
                     "1.0001",      "--eviction-interval-secs",
                     "60",          "--max-tree-size",
                     "16777216"};
    CHECK_OK(pd_router_config_parse(&cfg, 17, argv1));
    CHECK_INT(cfg.policy, PD_ROUTER_POLICY_CACHE_AWARE);
    CHECK_DBL(cfg.ca.cache_threshold, 0.5, 0);
    CHECK_INT(cfg.ca.balance_abs, 32);
    CHECK_DBL(cfg.ca.balance_rel, 1.0001, 0);
    CHECK_DBL(cfg.ca.eviction_secs, 60, 0);
    CHECK_INT(cfg.ca.max_tree_size, 1 << 24);
    pd_router_config_free(&cfg);
    char *argv2[] = {"r",          "--prefill",         "http://a:1", "--decode",
                     "http://b:2", "--cache-threshold", "1.5"};
    CHECK_ERR(pd_router_config_parse(&cfg, 7, argv2), PD_EINVAL, "--cache-threshold");
    pd_router_config_free(&cfg);
}

PD_TEST_MAIN(PD_TEST(test_basic), PD_TEST(test_random_differential), PD_TEST(test_alloc_failures),
             PD_TEST(test_policy), PD_TEST(test_route_text), PD_TEST(test_flags))
