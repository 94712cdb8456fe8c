/*
 * radix_cache.h — the prefill side's prefix cache (SGLang's RadixCache over page-aligned
 * blocks): a radix tree whose edges are runs of whole pages of prompt tokens, each page of the
 * tree holding the KV of exactly those tokens. A new request reuses the pages of its longest
 * cached prefix and computes only the rest.
 *
 * Invariants: every page in the tree is held once by the cache (pd_page_alloc_cache_hold); a
 * node's lock count is the number of live requests whose locked node lies in its subtree, so a
 * locked node is never evicted; only unlocked leaves are evicted, least recently used first.
 * The cache never takes pages from the allocator itself: it adopts pages requests computed.
 * A disabled cache (--disable-prefix-cache) matches nothing and adopts nothing.
 * Pure: no clocks (recency is the order of use), no locks, no I/O.
 */
#ifndef PD_RADIX_CACHE_H
#define PD_RADIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

struct pd_page_alloc;
struct pd_radix_cache;
struct pd_radix_node; /* opaque; a request keeps the one it locked */

struct pd_radix_match {
    int32_t n_pages;            /* pages of the longest cached prefix */
    struct pd_radix_node *node; /* lock this to keep those pages; the root when nothing matched */
};

/* A cache over pa's pages (pa outlives it). PD_EINVAL, PD_ENOMEM. */
int pd_radix_cache_new(struct pd_page_alloc *pa, int32_t page_size, bool disabled,
                       struct pd_radix_cache **out);
/* Drops every cached page; every lock must have been released (asserts). */
void pd_radix_cache_free(struct pd_radix_cache *rc);

bool pd_radix_cache_disabled(const struct pd_radix_cache *rc);

/* Longest cached prefix of tokens[0..n_tokens) in whole pages; its pages go to pages[] (room for
 * n_tokens / page_size). Marks the path as recently used. Takes no references and no lock. */
void pd_radix_cache_match(struct pd_radix_cache *rc, const int32_t *tokens, int32_t n_tokens,
                          int32_t *pages, struct pd_radix_match *m);

/* Records that tokens[0..n_pages*page_size) have their KV in pages[0..n_pages). Pages of a prefix
 * already cached are not adopted (the caller keeps its own copies and puts them as usual); the
 * new ones are held by the cache. *node receives the node ending at the last inserted page.
 * PD_ENOMEM leaves the tree as it was before the failing node, still consistent. */
int pd_radix_cache_insert(struct pd_radix_cache *rc, const int32_t *tokens, int32_t n_pages,
                          const int32_t *pages, struct pd_radix_node **node);

/* Lock a node (and its path) against eviction, or release such a lock. The root and NULL are
 * accepted and ignored. */
void pd_radix_cache_lock(struct pd_radix_cache *rc, struct pd_radix_node *node);
void pd_radix_cache_unlock(struct pd_radix_cache *rc, struct pd_radix_node *node);

/* Evicts unlocked leaves, least recently used first, until n_pages pages went back to the free
 * pool or nothing evictable is left. Returns the pages freed. */
int32_t pd_radix_cache_evict(struct pd_radix_cache *rc, int32_t n_pages);
/* Evicts every entry no request has locked (SGLang /flush_cache). Returns the pages freed. */
int32_t pd_radix_cache_flush(struct pd_radix_cache *rc);

int32_t pd_radix_cache_n_pages(const struct pd_radix_cache *rc);   /* pages held by the tree */
int32_t pd_radix_cache_n_nodes(const struct pd_radix_cache *rc);   /* excluding the root */
int32_t pd_radix_cache_root_lock(const struct pd_radix_cache *rc); /* requests holding locks */

/* Walks the tree: page marks, lock counts (parent >= sum of children), LRU list and counters.
 * PD_EINTERNAL with a message on the first inconsistency. */
int pd_radix_cache_check(const struct pd_radix_cache *rc);

#endif
