/*
 * page_alloc.h — the page allocator over one KV pool (DESIGN.md §3: page-major, so a run of
 * consecutive pages is one transfer). Pages are int32 indices in [0, n_pages).
 *
 * Ownership is by reference count: pd_page_alloc_get hands out pages with one reference each,
 * pd_page_alloc_ref adds a holder (a request sharing a cached prefix), pd_page_alloc_put drops one
 * and the page is free again at zero. The prefix cache holds its pages through
 * pd_page_alloc_cache_hold/drop, one reference plus a mark, so the statistics can tell a page
 * only the cache keeps ("cached": evictable memory) from a page a live request uses ("used").
 * Invariant: free + used + cached == n_pages, a page is free iff its count is zero.
 *
 * Allocation prefers runs: first the pages right after `hint` (a request growing its own run),
 * then the lowest run long enough for the whole request, and only when none is, the longest runs
 * first. Putting a page that is already free is a bug and asserts. Pure: no locks, no I/O.
 */
#ifndef PD_PAGE_ALLOC_H
#define PD_PAGE_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

struct pd_page_alloc;

struct pd_page_stats {
    int32_t total;            /* pages in the pool */
    int32_t free;             /* count zero */
    int32_t used;             /* held by at least one request */
    int32_t cached;           /* held by the prefix cache alone: reclaimable by eviction */
    int32_t longest_free_run; /* pages */
};

/* A pool of n_pages (> 0) pages, all free. PD_EINVAL, PD_ENOMEM. */
int pd_page_alloc_new(int32_t n_pages, struct pd_page_alloc **out);
void pd_page_alloc_free(struct pd_page_alloc *pa);

/* Takes n pages (count 1 each) into pages[0..n), consecutive where possible; hint is the page the
 * caller's run ends with (-1: none). All or nothing: PD_EFULL (no message: the caller evicts or
 * waits) when fewer than n are free; the pool is unchanged then. */
int pd_page_alloc_get(struct pd_page_alloc *pa, int32_t n, int32_t hint, int32_t *pages);
/* One more holder of an allocated page. */
void pd_page_alloc_ref(struct pd_page_alloc *pa, int32_t page);
/* Drops one holder of each page; a page whose count reaches zero is free. */
void pd_page_alloc_put(struct pd_page_alloc *pa, const int32_t *pages, int32_t n);
/* The prefix cache's own reference: ref + mark, and its reverse. At most one hold per page. */
void pd_page_alloc_cache_hold(struct pd_page_alloc *pa, int32_t page);
void pd_page_alloc_cache_drop(struct pd_page_alloc *pa, int32_t page);

int32_t pd_page_alloc_n_free(const struct pd_page_alloc *pa);
int32_t pd_page_alloc_n_total(const struct pd_page_alloc *pa);
/* Pages only the prefix cache holds (what eviction could give back), O(1). */
int32_t pd_page_alloc_n_cached(const struct pd_page_alloc *pa);
int32_t pd_page_alloc_refcount(const struct pd_page_alloc *pa, int32_t page);
bool pd_page_alloc_is_cached(const struct pd_page_alloc *pa, int32_t page);
/* O(n_pages): counters plus the longest free run. */
void pd_page_alloc_stats(const struct pd_page_alloc *pa, struct pd_page_stats *st);
/* Recounts everything from the per-page state and compares with the counters; PD_EINTERNAL with
 * a message naming the first disagreement. For tests and debug builds. */
int pd_page_alloc_check(const struct pd_page_alloc *pa);

#endif
