/*
 * test_embed_cache.c — common/embed_cache.c: hits and misses counted, references keep entries
 * from eviction, unreferenced ones go least recently released first when a put needs room, the
 * bytes stay within the bound once nothing is referenced (under 1,000 puts of random sizes with
 * random hit/release orders, against a model of what should be cached), an entry larger than
 * the bound is served and dropped at its release, and a cache of 0 bytes keeps nothing.
 */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/embed_cache.h"

#include <string.h>

static void key_of(uint32_t id, uint8_t *key) {
    memset(key, 0, PD_EMBED_KEY_BYTES);
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    memcpy(key, &h, sizeof(h));
    memcpy(key + 8, &id, sizeof(id));
}

static float *rows_of(uint32_t id, int n, int dim) {
    float *r = pd_malloc(sizeof(float) * (size_t)n * (size_t)dim);
    for (int i = 0; i < n * dim; i++)
        r[i] = (float)id + (float)i / 1024.0f;
    return r;
}

static size_t entry_bytes(int n, int dim) { /* what the cache counts: rows + overhead */
    return (size_t)n * (size_t)dim * sizeof(float) + 128;
}

static void test_lru_and_refs(void) {
    struct pd_embed_cache *c;
    size_t one = entry_bytes(10, 8);
    CHECK_OK(pd_embed_cache_new(3 * one, &c));
    uint8_t k[4][PD_EMBED_KEY_BYTES];
    struct pd_embed_entry *e[4];
    for (int i = 0; i < 4; i++)
        key_of((uint32_t)i, k[i]);
    CHECK(pd_embed_cache_get(c, k[0]) == NULL);
    for (int i = 0; i < 3; i++)
        e[i] = pd_embed_cache_put(c, k[i], rows_of((uint32_t)i, 10, 8), 10, 8);
    CHECK(pd_embed_entry_rows(e[1])[8] == 1.0f + 8.0f / 1024.0f);
    pd_embed_cache_release(c, e[1]); /* released first: evicted first */
    pd_embed_cache_release(c, e[0]);
    /* entry 2 is referenced: a fourth evicts 1 (oldest released), keeps 0 and 2 */
    e[3] = pd_embed_cache_put(c, k[3], rows_of(3, 10, 8), 10, 8);
    struct pd_embed_entry *g = pd_embed_cache_get(c, k[1]);
    CHECK(g == NULL);
    g = pd_embed_cache_get(c, k[0]);
    CHECK(g != NULL && pd_embed_entry_n_rows(g) == 10 && pd_embed_entry_rows(g)[0] == 0.0f);
    struct pd_embed_cache_stats st;
    pd_embed_cache_get_stats(c, &st);
    CHECK_INT(st.hits, 1);
    CHECK_INT(st.misses, 2);
    CHECK_INT(st.evictions, 1);
    CHECK_INT(st.entries, 3);
    CHECK_INT(st.referenced, 3);
    CHECK(st.bytes == 3 * one);
    /* everything referenced: a put goes over the bound; the releases bring it back */
    uint8_t k5[PD_EMBED_KEY_BYTES];
    key_of(5, k5);
    struct pd_embed_entry *e5 = pd_embed_cache_put(c, k5, rows_of(5, 10, 8), 10, 8);
    pd_embed_cache_get_stats(c, &st);
    CHECK(st.bytes == 4 * one && st.entries == 4);
    pd_embed_cache_release(c, g);
    pd_embed_cache_release(c, e[2]);
    pd_embed_cache_release(c, e[3]);
    pd_embed_cache_release(c, e5);
    pd_embed_cache_get_stats(c, &st);
    CHECK(st.bytes <= st.cap_bytes && st.referenced == 0 && st.entries == 3);
    /* larger than the whole bound: served, then gone */
    uint8_t kb[PD_EMBED_KEY_BYTES];
    key_of(99, kb);
    struct pd_embed_entry *big = pd_embed_cache_put(c, kb, rows_of(99, 100, 8), 100, 8);
    CHECK(big != NULL && pd_embed_entry_rows(big)[799] == 99.0f + 799.0f / 1024.0f);
    pd_embed_cache_release(c, big);
    CHECK(pd_embed_cache_get(c, kb) == NULL);
    pd_embed_cache_get_stats(c, &st);
    CHECK(st.bytes <= st.cap_bytes && st.entries == 0); /* the big one evicted all to fit */
    pd_embed_cache_free(c);

    CHECK_OK(pd_embed_cache_new(0, &c)); /* keeps nothing */
    struct pd_embed_entry *z = pd_embed_cache_put(c, k[0], rows_of(0, 4, 4), 4, 4);
    CHECK(z != NULL);
    pd_embed_cache_release(c, z);
    CHECK(pd_embed_cache_get(c, k[0]) == NULL);
    pd_embed_cache_free(c);
}

/* 1,000 images of 1-64 rows drawn from 300 distinct ones, each held by 0-3 live requests at a
 * time: after every release with nothing referenced the bytes are within the bound, a hit
 * always returns the image's own rows, and hits + misses count every lookup. */
static void test_load(void) {
    enum { DISTINCT = 300, LIVE = 3, DIM = 16 };
    struct pd_embed_cache *c;
    size_t cap = 40 * entry_bytes(32, DIM);
    CHECK_OK(pd_embed_cache_new(cap, &c));
    uint64_t s = 12345;
    struct pd_embed_entry *live[LIVE] = {0};
    int64_t lookups = 0, bad = 0;
    for (int i = 0; i < 1000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t id = (uint32_t)(s >> 33) % DISTINCT;
        int n = 1 + (int)(id % 64), slot = (int)((s >> 20) % LIVE);
        pd_embed_cache_release(c, live[slot]);
        live[slot] = NULL;
        uint8_t k[PD_EMBED_KEY_BYTES];
        key_of(id, k);
        struct pd_embed_entry *e = pd_embed_cache_get(c, k);
        lookups++;
        if (!e)
            e = pd_embed_cache_put(c, k, rows_of(id, n, DIM), n, DIM);
        int last = (n - 1) * DIM; /* the last row's first value */
        bad += !e || pd_embed_entry_n_rows(e) != n ||
               pd_embed_entry_rows(e)[last] != (float)id + (float)last / 1024.0f;
        live[slot] = e;
        struct pd_embed_cache_stats st;
        pd_embed_cache_get_stats(c, &st);
        size_t held = 0;
        for (int j = 0; j < LIVE; j++)
            held += live[j] ? entry_bytes(pd_embed_entry_n_rows(live[j]), DIM) : 0;
        bad += st.bytes > cap + held; /* only live references may stand above the bound */
    }
    for (int j = 0; j < LIVE; j++)
        pd_embed_cache_release(c, live[j]);
    struct pd_embed_cache_stats st;
    pd_embed_cache_get_stats(c, &st);
    CHECK_INT(bad, 0);
    CHECK(st.hits + st.misses == lookups && st.hits > 100 && st.evictions > 0);
    CHECK(st.bytes <= cap && st.referenced == 0);
    pd_embed_cache_free(c);
}

PD_TEST_MAIN(PD_TEST(test_lru_and_refs), PD_TEST(test_load))
