/*
 * embed_cache.c — a byte-bounded LRU of image embeddings with reference counts (embed_cache.h).
 * A chained hash table finds entries by key; unreferenced entries sit on a list in the order of
 * their last release (the head is evicted first). Referenced ones are off that list, so eviction
 * never has to skip them.
 */
#include "common/embed_cache.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <stdbool.h>
#include <string.h>

#define ENTRY_OVERHEAD 128 /* bytes counted per entry beside its rows */

struct pd_embed_entry {
    uint8_t key[PD_EMBED_KEY_BYTES];
    float *rows;
    int32_t n_rows, dim;
    size_t bytes;
    int32_t refs;
    struct pd_embed_entry *chain;       /* next in its bucket */
    struct pd_embed_entry *prev, *next; /* the unreferenced list, when refs == 0 */
};

struct pd_embed_cache {
    size_t cap, bytes;
    struct pd_embed_entry **buckets;
    size_t n_buckets; /* a power of two */
    int32_t entries, referenced;
    struct pd_embed_entry *lru_head, *lru_tail; /* unreferenced, least recently released first */
    int64_t hits, misses, evictions;
};

static size_t bucket_of(const struct pd_embed_cache *c, const uint8_t *key) {
    uint64_t h;
    memcpy(&h, key, sizeof(h)); /* the key is a hash already */
    return (size_t)h & (c->n_buckets - 1);
}

int pd_embed_cache_new(size_t cap_bytes, struct pd_embed_cache **out) {
    struct pd_embed_cache *c = pd_calloc(1, sizeof(*c));
    if (!c || !(c->buckets = pd_calloc(64, sizeof(*c->buckets)))) {
        pd_free(c);
        return pd_error_wrap(PD_ENOMEM, "creating the embedding cache");
    }
    c->n_buckets = 64;
    c->cap = cap_bytes;
    *out = c;
    return PD_OK;
}

static void lru_unlink(struct pd_embed_cache *c, struct pd_embed_entry *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        c->lru_head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(struct pd_embed_cache *c, struct pd_embed_entry *e) {
    e->prev = c->lru_tail;
    e->next = NULL;
    if (c->lru_tail)
        c->lru_tail->next = e;
    else
        c->lru_head = e;
    c->lru_tail = e;
}

/* Removes an unreferenced entry from the table and the list and frees it. */
static void drop(struct pd_embed_cache *c, struct pd_embed_entry *e) {
    PD_ASSERT(e->refs == 0);
    struct pd_embed_entry **p = &c->buckets[bucket_of(c, e->key)];
    while (*p != e)
        p = &(*p)->chain;
    *p = e->chain;
    lru_unlink(c, e);
    c->bytes -= e->bytes;
    c->entries--;
    pd_free(e->rows);
    pd_free(e);
}

/* Evicts unreferenced entries, oldest first, until `need` more bytes fit under the bound. */
static void evict_for(struct pd_embed_cache *c, size_t need) {
    while (c->lru_head && c->bytes + need > c->cap) {
        drop(c, c->lru_head);
        c->evictions++;
    }
}

void pd_embed_cache_free(struct pd_embed_cache *c) {
    if (!c)
        return;
    PD_ASSERT(c->referenced == 0);
    while (c->lru_head)
        drop(c, c->lru_head);
    pd_free(c->buckets);
    pd_free(c);
}

static struct pd_embed_entry *find(const struct pd_embed_cache *c, const uint8_t *key) {
    for (struct pd_embed_entry *e = c->buckets[bucket_of(c, key)]; e; e = e->chain)
        if (memcmp(e->key, key, PD_EMBED_KEY_BYTES) == 0)
            return e;
    return NULL;
}

static void take_ref(struct pd_embed_cache *c, struct pd_embed_entry *e) {
    if (e->refs++ == 0) {
        lru_unlink(c, e);
        c->referenced++;
    }
}

struct pd_embed_entry *pd_embed_cache_get(struct pd_embed_cache *c,
                                          const uint8_t key[PD_EMBED_KEY_BYTES]) {
    struct pd_embed_entry *e = find(c, key);
    if (!e) {
        c->misses++;
        return NULL;
    }
    c->hits++;
    take_ref(c, e);
    return e;
}

/* Doubles the table when it holds more entries than buckets. */
static void maybe_grow(struct pd_embed_cache *c) {
    if ((size_t)c->entries < c->n_buckets)
        return;
    size_t n = c->n_buckets * 2;
    struct pd_embed_entry **b = pd_calloc(n, sizeof(*b));
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < c->n_buckets; i++)
        for (struct pd_embed_entry *e = c->buckets[i], *next; e; e = next) {
            next = e->chain;
            uint64_t h;
            memcpy(&h, e->key, sizeof(h));
            e->chain = b[(size_t)h & (n - 1)];
            b[(size_t)h & (n - 1)] = e;
        }
    pd_free(c->buckets);
    c->buckets = b;
    c->n_buckets = n;
}

struct pd_embed_entry *pd_embed_cache_put(struct pd_embed_cache *c,
                                          const uint8_t key[PD_EMBED_KEY_BYTES], float *rows,
                                          int32_t n_rows, int32_t dim) {
    PD_ASSERT(!find(c, key) && n_rows >= 0 && dim > 0);
    struct pd_embed_entry *e = pd_calloc(1, sizeof(*e));
    if (!e) {
        pd_free(rows);
        pd_errorf(PD_ENOMEM, "caching an image's embeddings");
        return NULL;
    }
    memcpy(e->key, key, PD_EMBED_KEY_BYTES);
    e->rows = rows;
    e->n_rows = n_rows;
    e->dim = dim;
    e->bytes = (size_t)n_rows * (size_t)dim * sizeof(float) + ENTRY_OVERHEAD;
    evict_for(c, e->bytes);
    maybe_grow(c);
    size_t b = bucket_of(c, key);
    e->chain = c->buckets[b];
    c->buckets[b] = e;
    c->bytes += e->bytes;
    c->entries++;
    e->refs = 1;
    c->referenced++;
    return e;
}

void pd_embed_cache_release(struct pd_embed_cache *c, struct pd_embed_entry *e) {
    if (!e)
        return;
    PD_ASSERT(e->refs > 0);
    if (--e->refs > 0)
        return;
    c->referenced--;
    lru_push(c, e);
    evict_for(c, 0); /* back under the bound: this entry goes too when it alone exceeds it */
}

const float *pd_embed_entry_rows(const struct pd_embed_entry *e) {
    return e->rows;
}

int32_t pd_embed_entry_n_rows(const struct pd_embed_entry *e) {
    return e->n_rows;
}

void pd_embed_cache_get_stats(const struct pd_embed_cache *c, struct pd_embed_cache_stats *out) {
    *out = (struct pd_embed_cache_stats){.hits = c->hits,
                                         .misses = c->misses,
                                         .evictions = c->evictions,
                                         .bytes = c->bytes,
                                         .cap_bytes = c->cap,
                                         .entries = c->entries,
                                         .referenced = c->referenced};
}
