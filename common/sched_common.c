/*
 * sched_common.c — the schedulers' configuration checks and page recount, and the PrefillAdder
 * pieces the prefill and colocated schedulers share (sched_common.h).
 */
#include "common/sched_common.h"
#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/base/status.h"

int pd__prefill_budget(int32_t page_size, int32_t chunked_prefill_size, int32_t max_prefill_tokens,
                       int32_t *budget) {
    int32_t b = max_prefill_tokens;
    if (chunked_prefill_size > 0 && (b <= 0 || chunked_prefill_size < b))
        b = chunked_prefill_size;
    *budget = b;
    if (b < page_size)
        return pd_errorf(PD_EINVAL,
                         "prefill token budget %d (chunked prefill size %d, max prefill tokens "
                         "%d) is smaller than a page (%d tokens)",
                         (int)b, (int)chunked_prefill_size, (int)max_prefill_tokens,
                         (int)page_size);
    return PD_OK;
}

int pd__check_decode_config(const char *who, int32_t page_size, int32_t max_running,
                            int32_t max_queued, double init_ratio, double min_ratio,
                            double ratio_decay, int32_t retract_decode_steps) {
    if (page_size <= 0 || max_running <= 0 || max_queued <= 0 ||
        !(min_ratio >= 0 && min_ratio <= init_ratio && init_ratio <= 1) || !(ratio_decay >= 0) ||
        retract_decode_steps < 0)
        return pd_errorf(PD_EINVAL,
                         "%s scheduler: page size %d, max running %d, max queued %d, token "
                         "ratio %g..%g decay %g: need positive sizes and 0 <= min <= init <= 1",
                         who, (int)page_size, (int)max_running, (int)max_queued, min_ratio,
                         init_ratio, ratio_decay);
    return PD_OK;
}

int pd__generation_pages(const struct pd_page_alloc *pa, int32_t page_size, uint64_t room,
                         int32_t prompt_len, int32_t max_new_tokens, int32_t *cap_pages) {
    if (prompt_len <= 0 || max_new_tokens <= 0)
        return pd_errorf(PD_EINVAL, "room %llu: prompt of %d tokens, max_new_tokens %d",
                         (unsigned long long)room, (int)prompt_len, (int)max_new_tokens);
    int64_t tokens = (int64_t)prompt_len + max_new_tokens - 1;
    *cap_pages = pd__pages_for(tokens, page_size);
    if (*cap_pages > pd_page_alloc_n_total(pa))
        return pd_errorf(PD_ERANGE,
                         "room %llu: %d prompt + %d new tokens need %d pages, the pool has %d",
                         (unsigned long long)room, (int)prompt_len, (int)max_new_tokens,
                         (int)*cap_pages, (int)pd_page_alloc_n_total(pa));
    return PD_OK;
}

int pd__cover_position(struct pd_page_alloc *pa, int32_t page_size, int32_t pos, int32_t *pages,
                       int32_t *n_pages, int32_t cap_pages) {
    while (*n_pages < pos / page_size + 1) {
        PD_ASSERT(*n_pages < cap_pages);
        int32_t hint = *n_pages ? pages[*n_pages - 1] : -1;
        if (pd_page_alloc_get(pa, 1, hint, pages + *n_pages) != PD_OK)
            return PD_EAGAIN;
        (*n_pages)++;
    }
    return PD_OK;
}

void pd__ratio_defaults(double *init_ratio, double *min_ratio, double *ratio_decay,
                        int32_t *retract_decode_steps) {
    *init_ratio = 0.7;
    *min_ratio = 0.1;
    *ratio_decay = (0.7 - 0.1) / 600;
    *retract_decode_steps = 20;
}

int pd__holders_new(struct pd_page_alloc *pa, struct pd_radix_cache *rc, int32_t **holders) {
    *holders = NULL;
    int err = pd_page_alloc_check(pa);
    if (err == PD_OK && rc)
        err = pd_radix_cache_check(rc);
    if (err)
        return err;
    *holders = pd_calloc((size_t)pd_page_alloc_n_total(pa), sizeof(int32_t));
    return *holders ? PD_OK : PD_ENOMEM;
}

int pd__holders_check(struct pd_page_alloc *pa, struct pd_radix_cache *rc, int32_t *holders) {
    int32_t n_pool = pd_page_alloc_n_total(pa), n_cached = 0;
    int err = PD_OK;
    for (int32_t p = 0; p < n_pool && err == PD_OK; p++) {
        bool cached = pd_page_alloc_is_cached(pa, p);
        n_cached += cached;
        if (holders[p] + cached != pd_page_alloc_refcount(pa, p))
            err = pd_errorf(PD_EINTERNAL, "page %d: %d request holders%s, count %d", (int)p,
                            (int)holders[p], cached ? " + cache" : "",
                            (int)pd_page_alloc_refcount(pa, p));
    }
    if (err == PD_OK && rc && n_cached != pd_radix_cache_n_pages(rc))
        err = pd_errorf(PD_EINTERNAL, "%d pages marked cached, the tree holds %d", (int)n_cached,
                        (int)pd_radix_cache_n_pages(rc));
    return err;
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
