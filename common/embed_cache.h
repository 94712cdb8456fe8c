/*
 * embed_cache.h — the vision encoder's output by image content (issue 18; SGLang's multimodal
 * embedding cache): key = a 128-bit hash of an image's processed pixels and grid, value = its
 * embeddings [n_rows][dim] f32. Every chunk of a chunked prefill that covers an image's
 * placeholders reads them from here, so the encoder runs once per image per request, and once
 * overall while a repeated image stays cached.
 *
 * Bounded in bytes (the rows' bytes plus a fixed overhead per entry): a put evicts unreferenced
 * entries, least recently used first, until the new one fits. An entry is referenced while a
 * request still has placeholders of it to prefill; referenced entries are never evicted, so
 * when every entry is referenced the cache may stand above its bound until they are released,
 * and a release evicts back under it. An entry larger than the whole bound is served and
 * dropped at its last release.
 * Pure: no clocks, no locks (the compute thread owns it), no I/O.
 */
#ifndef PD_EMBED_CACHE_H
#define PD_EMBED_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define PD_EMBED_KEY_BYTES 16

struct pd_embed_cache;
struct pd_embed_entry;

struct pd_embed_cache_stats {
    int64_t hits, misses, evictions;
    size_t bytes, cap_bytes; /* bytes may exceed cap_bytes only by referenced entries */
    int32_t entries, referenced;
};

/* cap_bytes 0: nothing stays cached (each entry is dropped at its last release). */
int pd_embed_cache_new(size_t cap_bytes, struct pd_embed_cache **out);
/* Every entry must have been released (asserts). Accepts NULL. */
void pd_embed_cache_free(struct pd_embed_cache *c);

/* The entry for key with a reference taken (a hit), or NULL (a miss); both counted. */
struct pd_embed_entry *pd_embed_cache_get(struct pd_embed_cache *c,
                                          const uint8_t key[PD_EMBED_KEY_BYTES]);
/* Adds rows (pd_malloc'ed [n_rows][dim], owned by the cache from here on, also on failure) for
 * key, which must not be cached, with one reference taken. NULL only when memory runs out. */
struct pd_embed_entry *pd_embed_cache_put(struct pd_embed_cache *c,
                                          const uint8_t key[PD_EMBED_KEY_BYTES], float *rows,
                                          int32_t n_rows, int32_t dim);
/* Drops one reference; the entry may go at once (see above). Accepts NULL. */
void pd_embed_cache_release(struct pd_embed_cache *c, struct pd_embed_entry *e);

const float *pd_embed_entry_rows(const struct pd_embed_entry *e);
int32_t pd_embed_entry_n_rows(const struct pd_embed_entry *e);

void pd_embed_cache_get_stats(const struct pd_embed_cache *c, struct pd_embed_cache_stats *out);

#endif
