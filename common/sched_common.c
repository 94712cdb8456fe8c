/*
 * sched_common.c — the slot pool the schedulers build their request queues on, and the
 * PrefillAdder pieces the prefill and colocated schedulers share (sched_common.h).
 */
#include "common/sched_common.h"
#include "common/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/status.h"

int pd__slot_pool_init(struct pd__slot_pool *p, int32_t cap) {
    p->prev = pd_calloc((size_t)cap, sizeof(int32_t));
    p->next = pd_calloc((size_t)cap, sizeof(int32_t));
    p->free = pd_calloc((size_t)cap, sizeof(int32_t));
    if (!p->prev || !p->next || !p->free) {
        pd__slot_pool_free(p);
        return PD_ENOMEM;
    }
    for (int32_t i = 0; i < cap; i++)
        p->free[i] = cap - 1 - i; /* slot 0 first */
    p->n_free = cap;
    return PD_OK;
}

void pd__slot_pool_free(struct pd__slot_pool *p) {
    pd_free(p->prev);
    pd_free(p->next);
    pd_free(p->free);
    p->prev = p->next = p->free = NULL;
    p->n_free = 0;
}

int32_t pd__chunk_len(int32_t page_size, bool unchunked, int32_t rest, int32_t rem,
                      bool batch_empty, bool *stop) {
    *stop = false;
    if (rest <= rem)
        return rest;
    if (unchunked) {
        if (!batch_empty)
            return 0;
        *stop = true;
        return rest;
    }
    int32_t len = rem > 0 ? rem / page_size * page_size : 0;
    *stop = len > 0;
    return len;
}

bool pd__prefix_admit(struct pd_page_alloc *pa, struct pd_radix_cache *rc, int32_t page_size,
                      bool unchunked, struct pd__prefix_admit *a) {
    struct pd_radix_match m = {0, NULL};
    int32_t match_len = a->n_tokens - 1;
    if (a->cache_limited && a->cache_max < match_len)
        match_len = a->cache_max > 0 ? a->cache_max : 0;
    if (rc && match_len > 0)
        pd_radix_cache_match(rc, a->tokens, match_len, a->pages, &m);
    a->len = pd__chunk_len(page_size, unchunked, a->n_tokens - m.n_pages * page_size, a->rem,
                           a->batch_empty, &a->stop);
    if (a->len == 0)
        return false;
    if (rc) /* before evicting: the matched path must survive it */
        pd_radix_cache_lock(rc, m.node);
    int32_t need = a->n_pages - m.n_pages;
    int32_t n_free = pd_page_alloc_n_free(pa);
    /* evict only when that can make it fit: a head that cannot be admitted must not flush the
     * cache step after step */
    if (n_free < need + a->reserve && rc &&
        n_free + pd_page_alloc_n_cached(pa) >= need + a->reserve)
        pd_radix_cache_evict(rc, need + a->reserve - n_free);
    int32_t hint = m.n_pages ? a->pages[m.n_pages - 1] : -1;
    if (pd_page_alloc_n_free(pa) - need < a->reserve ||
        pd_page_alloc_get(pa, need, hint, a->pages + m.n_pages) != PD_OK) {
        if (rc)
            pd_radix_cache_unlock(rc, m.node);
        return false;
    }
    for (int32_t i = 0; i < m.n_pages; i++)
        pd_page_alloc_ref(pa, a->pages[i]);
    a->cached_pages = m.n_pages;
    a->node = m.node;
    return true;
}

void pd__prefix_commit(struct pd_radix_cache *rc, const int32_t *tokens, int32_t done_tokens,
                       int32_t page_size, const int32_t *pages, struct pd_radix_node **node) {
    if (!rc || done_tokens < page_size)
        return;
    struct pd_radix_node *n;
    /* on PD_ENOMEM n is the deepest prefix that made it: still a valid lock */
    (void)pd_radix_cache_insert(rc, tokens, done_tokens / page_size, pages, &n);
    pd_radix_cache_lock(rc, n);
    pd_radix_cache_unlock(rc, *node);
    *node = n;
}
