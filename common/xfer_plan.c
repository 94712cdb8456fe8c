/*
 * xfer_plan.c — deterministic page sets and page contents (see xfer_plan.h). Pure functions of
 * their arguments: no I/O, no global state, so both processes of a test compute the same thing.
 */
#include "common/xfer_plan.h"

#include <string.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "common/status.h"

uint64_t pd_xfer_plan_rand(uint64_t *state) {
    return pd_splitmix64(state);
}

/* A free index, preferably with free neighbours so that a new run does not extend an old one. */
static uint32_t free_start(uint64_t *rng, const uint8_t *taken, uint32_t span) {
    for (int t = 0; t < 64; t++) {
        uint32_t s = (uint32_t)(pd_xfer_plan_rand(rng) % span);
        if (!taken[s] && (s == 0 || !taken[s - 1]) && (s + 1 >= span || !taken[s + 1]))
            return s;
    }
    uint32_t s = (uint32_t)(pd_xfer_plan_rand(rng) % span);
    while (taken[s]) /* the caller guarantees a free index exists */
        s = (s + 1) % span;
    return s;
}

/* Takes n distinct indices out of [lo, lo + span) as runs that continue with probability
 * 1 - scatter. */
static int pick(uint64_t *rng, uint32_t n, double scatter, uint32_t lo, uint32_t span,
                uint32_t *out) {
    if (n > span)
        return pd_errorf(PD_EINVAL, "page plan: %u pages from a span of %u", n, span);
    uint8_t *taken = pd_calloc(span ? span : 1, 1);
    if (!taken)
        return pd_error_wrap(PD_ENOMEM, "page plan of %u pages", span);
    uint64_t cut = (uint64_t)(scatter * (double)UINT32_MAX);
    uint32_t i = 0;
    while (i < n) {
        uint32_t p = free_start(rng, taken, span);
        do {
            taken[p] = 1;
            out[i++] = lo + p;
            p++;
        } while (i < n && p < span && !taken[p] && (pd_xfer_plan_rand(rng) & UINT32_MAX) >= cut);
    }
    pd_free(taken);
    return PD_OK;
}

int pd_xfer_plan_pages(uint64_t seed, uint32_t n, double scatter, uint32_t src_lo,
                       uint32_t src_span, uint32_t dst_lo, uint32_t dst_span, uint32_t *src,
                       uint32_t *dst) {
    uint64_t rng = seed;
    int rc = pick(&rng, n, scatter, src_lo, src_span, src);
    if (rc)
        return rc;
    return pick(&rng, n, scatter, dst_lo, dst_span, dst);
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
