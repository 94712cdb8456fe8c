/*
 * xfer_plan.c — deterministic page sets and page contents (see xfer_plan.h). Pure functions of
 * their arguments: no I/O, no global state, so both processes of a test compute the same thing.
 */
#include "common/xfer_plan.h"
#include "common/xfer.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "common/base/alloc.h"
#include "common/base/rng.h"
#include "common/base/status.h"

uint64_t pd_xfer_plan_rand(uint64_t *state) {
    return pd_splitmix64(state);
}

/* Longest run of the pages that are not scattered: runs of 2 .. PLAN_RUN_MAX pages, as a page
 * allocator with some free stretches left hands them out. */
#define PLAN_RUN_MAX 16

static bool window_free(const uint8_t *taken, uint32_t span, uint32_t s, uint32_t len,
                        bool isolated) {
    if (s + len > span)
        return false;
    for (uint32_t k = 0; k < len; k++)
        if (taken[s + k])
            return false;
    return !isolated || ((s == 0 || !taken[s - 1]) && (s + len >= span || !taken[s + len]));
}

/* Start of `len` free indices, preferably with free neighbours so that the run does not extend
 * another one; 0 .. len-1 shorter when the span has no such window (*len is updated; >= 1 while
 * a free index exists, which the caller guarantees). */
static uint32_t place(uint64_t *rng, const uint8_t *taken, uint32_t span, uint32_t *len) {
    for (int t = 0; t < 64; t++) {
        uint32_t s = (uint32_t)(pd_xfer_plan_rand(rng) % span);
        if (window_free(taken, span, s, *len, true))
            return s;
    }
    for (;;) {
        uint32_t s0 = (uint32_t)(pd_xfer_plan_rand(rng) % span);
        for (int isolated = 1; isolated >= 0; isolated--)
            for (uint32_t k = 0; k < span; k++) {
                uint32_t s = (s0 + k) % span;
                if (window_free(taken, span, s, *len, isolated))
                    return s;
            }
        PD_ASSERT(*len > 1);
        (*len)--;
    }
}

int pd_xfer_plan_pages(uint64_t seed, uint32_t n, double scatter, uint32_t src_lo,
                       uint32_t src_span, uint32_t dst_lo, uint32_t dst_span, uint32_t *src,
                       uint32_t *dst) {
    if (n > src_span || n > dst_span)
        return pd_errorf(PD_EINVAL, "page plan: %u pages from spans of %u and %u", n, src_span,
                         dst_span);
    if (!(scatter >= 0.0 && scatter <= 1.0))
        return pd_errorf(PD_EINVAL, "page plan: scatter %g outside [0, 1]", scatter);
    uint32_t *runs = pd_malloc((size_t)(n ? n : 1) * sizeof(*runs));
    uint8_t *ts = pd_calloc(src_span ? src_span : 1, 1);
    uint8_t *td = pd_calloc(dst_span ? dst_span : 1, 1);
    if (!runs || !ts || !td) {
        pd_free(runs);
        pd_free(ts);
        pd_free(td);
        return pd_error_wrap(PD_ENOMEM, "page plan of %u pages", n);
    }
    uint64_t rng = seed;
    /* Run lengths: `single` runs of one page, the other pages in runs of 2 .. PLAN_RUN_MAX (the
     * last one may be shorter), in a random order. scatter 0 is one run of all n. */
    uint32_t single = (uint32_t)llround(scatter * (double)n), n_runs = 0;
    if (scatter == 0.0 && n > 0) {
        runs[n_runs++] = n;
    } else {
        for (uint32_t k = 0; k < single; k++)
            runs[n_runs++] = 1;
        for (uint32_t left = n - single; left > 0;) {
            uint32_t len = 2 + (uint32_t)(pd_xfer_plan_rand(&rng) % (PLAN_RUN_MAX - 1));
            if (len > left || left - len == 1)
                len = left; /* no stray single page: the singles are counted above */
            runs[n_runs++] = len;
            left -= len;
        }
        for (uint32_t k = n_runs; k > 1; k--) { /* Fisher-Yates */
            uint32_t j = (uint32_t)(pd_xfer_plan_rand(&rng) % k), t = runs[k - 1];
            runs[k - 1] = runs[j];
            runs[j] = t;
        }
    }
    uint32_t i = 0;
    for (uint32_t r = 0; r < n_runs; r++) {
        for (uint32_t want = runs[r]; want > 0;) {
            uint32_t len = want, len_d;
            uint32_t s = place(&rng, ts, src_span, &len);
            len_d = len;
            uint32_t d = place(&rng, td, dst_span, &len_d);
            len = len_d; /* the destination window may be shorter: the rest goes next */
            if (len > 2 && want - len == 1)
                len--; /* a split leaves two pages, not a single one */
            for (uint32_t k = 0; k < len; k++) {
                ts[s + k] = td[d + k] = 1;
                src[i] = src_lo + s + k;
                dst[i] = dst_lo + d + k;
                i++;
            }
            want -= len;
        }
    }
    PD_ASSERT(i == n);
    pd_free(runs);
    pd_free(ts);
    pd_free(td);
    return PD_OK;
}

void pd_xfer_plan_runs(const uint32_t *src, const uint32_t *dst, uint32_t n, uint32_t *runs,
                       uint32_t *single) {
    *runs = 0;
    *single = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t len = 1;
        while (i + len < n && src[i + len] == src[i] + len && dst[i + len] == dst[i] + len)
            len++;
        (*runs)++;
        *single += len == 1;
        i += len;
    }
}

void pd_xfer_plan_fill(uint64_t room, uint32_t pos, void *page, size_t bytes) {
    uint64_t st = room * 0x100000001b3ull ^ ((uint64_t)pos << 17);
    uint8_t *p = page;
    size_t off = 0;
    for (; off + 8 <= bytes; off += 8) {
        uint64_t v = pd_xfer_plan_rand(&st);
        memcpy(p + off, &v, 8);
    }
    if (off < bytes) {
        uint64_t v = pd_xfer_plan_rand(&st);
        memcpy(p + off, &v, bytes - off);
    }
}

long pd_xfer_plan_check(uint64_t room, uint32_t pos, const void *page, size_t bytes) {
    uint64_t st = room * 0x100000001b3ull ^ ((uint64_t)pos << 17);
    const uint8_t *p = page;
    for (size_t off = 0; off < bytes; off += 8) {
        uint64_t v = pd_xfer_plan_rand(&st);
        size_t k = bytes - off < 8 ? bytes - off : 8;
        if (memcmp(p + off, &v, k) != 0) {
            const uint8_t *e = (const uint8_t *)&v;
            for (size_t j = 0; j < k; j++)
                if (p[off + j] != e[j])
                    return (long)(off + j);
        }
    }
    return -1;
}

static uint64_t head_seed(uint64_t room, uint32_t pos, uint32_t row, uint32_t head) {
    uint64_t st = room * 0x100000001b3ull ^ ((uint64_t)pos << 17) ^ ((uint64_t)row << 40) ^
                  ((uint64_t)head * 0x9e3779b97f4a7c15ull);
    return pd_xfer_plan_rand(&st);
}

void pd_xfer_plan_fill_heads(uint64_t room, uint32_t pos, const struct pd_xfer_heads *h, int shard,
                             void *page) {
    uint8_t *p = page;
    for (uint32_t r = 0; r < h->rows_per_page; r++)
        for (uint32_t c = 0; c < h->count; c++, p += h->head_bytes)
            pd_xfer_plan_fill(head_seed(room, pos, r, h->start[shard] + c), 0, p, h->head_bytes);
}

long pd_xfer_plan_check_heads(uint64_t room, uint32_t pos, const struct pd_xfer_heads *h, int shard,
                              const void *page) {
    const uint8_t *p = page;
    for (uint32_t r = 0; r < h->rows_per_page; r++)
        for (uint32_t c = 0; c < h->count; c++, p += h->head_bytes) {
            long off = pd_xfer_plan_check(head_seed(room, pos, r, h->start[shard] + c), 0, p,
                                          h->head_bytes);
            if (off >= 0)
                return (long)(p - (const uint8_t *)page) + off;
        }
    return -1;
}

uint32_t pd_xfer_plan_checksum_heads(void *const *bases, int n_shards,
                                     const struct pd_xfer_heads *h, const uint32_t *pages,
                                     uint32_t n) {
    const size_t row = (size_t)h->count * h->head_bytes, spb = row * h->rows_per_page;
    uint32_t sum = 2166136261u;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t r = 0; r < h->rows_per_page; r++)
            for (uint32_t head = 0; head < h->total; head++) {
                int k = 0;
                while (k < n_shards && !(head >= h->start[k] && head - h->start[k] < h->count))
                    k++;
                PD_ASSERT(k < n_shards); /* every head is in some shard */
                const uint8_t *p = (const uint8_t *)bases[k] + (size_t)pages[i] * spb + r * row +
                                   (size_t)(head - h->start[k]) * h->head_bytes;
                for (uint32_t j = 0; j < h->head_bytes; j++)
                    sum = (sum ^ p[j]) * 16777619u;
            }
    return sum;
}

uint32_t pd_xfer_plan_checksum(const void *base, size_t page_bytes, const uint32_t *pages,
                               uint32_t n) {
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p = (const uint8_t *)base + (size_t)pages[i] * page_bytes;
        for (size_t j = 0; j < page_bytes; j++)
            h = (h ^ p[j]) * 16777619u;
    }
    return h;
}
