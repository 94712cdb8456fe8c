/*
 * page_alloc.c — free bitmap + per-page reference counts and prefix-cache marks.
 *
 * The free set is a bitmap (bit set = free) so that finding a run of consecutive free pages is a
 * word scan; `low_word` is a lower bound on the first word with a free bit, which keeps the
 * common one-page allocation of a decode step O(1) amortized. Counters `n_free` and `n_cached`
 * are updated on every transition so stats are cheap; pd_page_alloc_check recounts them.
 */
#include "common/page_alloc.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <string.h>

struct pd_page_alloc {
    int32_t n_pages;
    int32_t n_words;
    int32_t low_word; /* no word below this one has a free bit */
    int32_t n_free;
    int32_t n_cached;  /* marked by the cache and count == 1 */
    uint64_t *bits;    /* [n_words], bit set = free */
    int32_t *refs;     /* [n_pages] holders */
    uint8_t *in_cache; /* [n_pages] the prefix cache holds one of the references */
};

static bool is_free(const struct pd_page_alloc *pa, int32_t p) {
    return (pa->bits[p >> 6] >> (p & 63)) & 1u;
}

static void mark_used(struct pd_page_alloc *pa, int32_t p) {
    PD_ASSERT(is_free(pa, p) && pa->refs[p] == 0);
    pa->bits[p >> 6] &= ~(UINT64_C(1) << (p & 63));
    pa->refs[p] = 1;
    pa->n_free--;
}

static void mark_free(struct pd_page_alloc *pa, int32_t p) {
    pa->bits[p >> 6] |= UINT64_C(1) << (p & 63);
    pa->n_free++;
    if ((p >> 6) < pa->low_word)
        pa->low_word = p >> 6;
}

int pd_page_alloc_new(int32_t n_pages, struct pd_page_alloc **out) {
    *out = NULL;
    if (n_pages <= 0)
        return pd_errorf(PD_EINVAL, "page pool of %d pages: need at least one", (int)n_pages);
    struct pd_page_alloc *pa = pd_calloc(1, sizeof(*pa));
    if (!pa)
        goto fail_struct;
    pa->n_pages = n_pages;
    pa->n_words = (n_pages + 63) / 64;
    pa->bits = pd_calloc((size_t)pa->n_words, sizeof(uint64_t));
    if (!pa->bits)
        goto fail_bits;
    pa->refs = pd_calloc((size_t)n_pages, sizeof(int32_t));
    if (!pa->refs)
        goto fail_refs;
    pa->in_cache = pd_calloc((size_t)n_pages, 1);
    if (!pa->in_cache)
        goto fail_cache;
    for (int32_t p = 0; p < n_pages; p++)
        pa->bits[p >> 6] |= UINT64_C(1) << (p & 63);
    pa->n_free = n_pages;
    *out = pa;
    return PD_OK;

fail_cache:
    pd_free(pa->refs);
fail_refs:
    pd_free(pa->bits);
fail_bits:
    pd_free(pa);
fail_struct:
    return pd_error_wrap(PD_ENOMEM, "creating a pool of %d pages", (int)n_pages);
}

void pd_page_alloc_free(struct pd_page_alloc *pa) {
    if (!pa)
        return;
    pd_free(pa->in_cache);
    pd_free(pa->refs);
    pd_free(pa->bits);
    pd_free(pa);
}

/* Lowest start of a free run of at least n pages, or -1. */
static int32_t first_run(struct pd_page_alloc *pa, int32_t n) {
    while (pa->low_word < pa->n_words && pa->bits[pa->low_word] == 0)
        pa->low_word++;
    int32_t start = -1, len = 0;
    for (int32_t w = pa->low_word; w < pa->n_words; w++) {
        uint64_t x = pa->bits[w];
        if (x == 0) {
            len = 0;
            continue;
        }
        if (x == UINT64_MAX) {
            if (len == 0)
                start = w * 64;
            len += 64;
            if (len >= n)
                return start;
            continue;
        }
        for (int b = 0; b < 64; b++) {
            if ((x >> b) & 1u) {
                if (len == 0)
                    start = w * 64 + b;
                if (++len >= n)
                    return start;
            } else {
                len = 0;
            }
        }
    }
    return -1;
}

/* The longest free run: start in *start, length returned (0 when nothing is free). */
static int32_t longest_run(const struct pd_page_alloc *pa, int32_t *start) {
    int32_t best = 0, best_start = -1, cur = 0, cur_start = 0;
    for (int32_t w = 0; w < pa->n_words; w++) {
        uint64_t x = pa->bits[w];
        if (x == 0 || x == UINT64_MAX) {
            if (x == 0) {
                cur = 0;
                continue;
            }
            if (cur == 0)
                cur_start = w * 64;
            cur += 64;
        } else {
            for (int b = 0; b < 64; b++) {
                if ((x >> b) & 1u) {
                    if (cur == 0)
                        cur_start = w * 64 + b;
                    cur++;
                } else {
                    cur = 0;
                }
                if (cur > best) {
                    best = cur;
                    best_start = cur_start;
                }
            }
            continue;
        }
        if (cur > best) {
            best = cur;
            best_start = cur_start;
        }
    }
    *start = best_start;
    return best;
}

int pd_page_alloc_get(struct pd_page_alloc *pa, int32_t n, int32_t hint, int32_t *pages) {
    if (n < 0)
        return pd_errorf(PD_EINVAL, "allocating %d pages", (int)n);
    if (n > pa->n_free)
        return PD_EFULL;
    if (n == 0)
        return PD_OK;
    /* Growing the caller's own run keeps its transfer one put. */
    if (hint >= 0 && hint + n < pa->n_pages) {
        int32_t k = 0;
        while (k < n && is_free(pa, hint + 1 + k))
            k++;
        if (k == n) {
            for (int32_t i = 0; i < n; i++) {
                pages[i] = hint + 1 + i;
                mark_used(pa, pages[i]);
            }
            return PD_OK;
        }
    }
    int32_t s = first_run(pa, n);
    if (s >= 0) {
        for (int32_t i = 0; i < n; i++) {
            pages[i] = s + i;
            mark_used(pa, s + i);
        }
        return PD_OK;
    }
    /* Fragmented: the fewest runs are the longest ones. */
    int32_t got = 0;
    while (got < n) {
        int32_t st;
        int32_t len = longest_run(pa, &st);
        PD_ASSERT(len > 0); /* n <= n_free was checked */
        if (len > n - got)
            len = n - got;
        for (int32_t i = 0; i < len; i++) {
            pages[got++] = st + i;
            mark_used(pa, st + i);
        }
    }
    return PD_OK;
}

void pd_page_alloc_ref(struct pd_page_alloc *pa, int32_t page) {
    PD_ASSERT(page >= 0 && page < pa->n_pages && pa->refs[page] > 0);
    if (pa->in_cache[page] && pa->refs[page] == 1)
        pa->n_cached--; /* a request uses the cached page again */
    pa->refs[page]++;
}

static void unref(struct pd_page_alloc *pa, int32_t page) {
    PD_ASSERT(page >= 0 && page < pa->n_pages && pa->refs[page] > 0);
    pa->refs[page]--;
    if (pa->refs[page] == 0) {
        PD_ASSERT(!pa->in_cache[page]);
        mark_free(pa, page);
    } else if (pa->refs[page] == 1 && pa->in_cache[page]) {
        pa->n_cached++; /* only the cache keeps it now */
    }
}

void pd_page_alloc_put(struct pd_page_alloc *pa, const int32_t *pages, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        unref(pa, pages[i]);
}

void pd_page_alloc_cache_hold(struct pd_page_alloc *pa, int32_t page) {
    PD_ASSERT(page >= 0 && page < pa->n_pages && pa->refs[page] > 0 && !pa->in_cache[page]);
    pa->refs[page]++;
    pa->in_cache[page] = 1;
}

void pd_page_alloc_cache_drop(struct pd_page_alloc *pa, int32_t page) {
    PD_ASSERT(page >= 0 && page < pa->n_pages && pa->in_cache[page] && pa->refs[page] > 0);
    if (pa->refs[page] == 1)
        pa->n_cached--;
    pa->in_cache[page] = 0;
    unref(pa, page);
}

int32_t pd_page_alloc_n_free(const struct pd_page_alloc *pa) {
    return pa->n_free;
}

int32_t pd_page_alloc_n_cached(const struct pd_page_alloc *pa) {
    return pa->n_cached;
}

int32_t pd_page_alloc_n_total(const struct pd_page_alloc *pa) {
    return pa->n_pages;
}

int32_t pd_page_alloc_refcount(const struct pd_page_alloc *pa, int32_t page) {
    PD_ASSERT(page >= 0 && page < pa->n_pages);
    return pa->refs[page];
}

bool pd_page_alloc_is_cached(const struct pd_page_alloc *pa, int32_t page) {
    PD_ASSERT(page >= 0 && page < pa->n_pages);
    return pa->in_cache[page] != 0;
}

void pd_page_alloc_stats(const struct pd_page_alloc *pa, struct pd_page_stats *st) {
    int32_t start;
    st->total = pa->n_pages;
    st->free = pa->n_free;
    st->cached = pa->n_cached;
    st->used = pa->n_pages - pa->n_free - pa->n_cached;
    st->longest_free_run = longest_run(pa, &start);
}

int pd_page_alloc_check(const struct pd_page_alloc *pa) {
    int32_t n_free = 0, n_cached = 0;
    for (int32_t p = 0; p < pa->n_pages; p++) {
        if (pa->refs[p] < 0)
            return pd_errorf(PD_EINTERNAL, "page %d has count %d", (int)p, (int)pa->refs[p]);
        if (is_free(pa, p) != (pa->refs[p] == 0))
            return pd_errorf(PD_EINTERNAL, "page %d: free bit %d but count %d", (int)p,
                             (int)is_free(pa, p), (int)pa->refs[p]);
        if (pa->in_cache[p] && pa->refs[p] == 0)
            return pd_errorf(PD_EINTERNAL, "page %d is cached but free", (int)p);
        n_free += pa->refs[p] == 0;
        n_cached += pa->in_cache[p] && pa->refs[p] == 1;
    }
    for (int32_t p = pa->n_pages; p < pa->n_words * 64; p++)
        if (is_free(pa, p))
            return pd_errorf(PD_EINTERNAL, "page %d past the pool is marked free", (int)p);
    for (int32_t w = 0; w < pa->low_word && w < pa->n_words; w++)
        if (pa->bits[w])
            return pd_errorf(PD_EINTERNAL, "free page below the low-word hint %d", (int)w);
    if (n_free != pa->n_free || n_cached != pa->n_cached)
        return pd_errorf(PD_EINTERNAL, "counters free %d cached %d, recount %d %d", (int)pa->n_free,
                         (int)pa->n_cached, (int)n_free, (int)n_cached);
    return PD_OK;
}
