/*
 * xfer_plan.h — page sets and page contents for exercising the transfer engine: the self-test
 * tool (pdserve-xfer-test), bench/xfer and the tests share them so that a sender and a receiver
 * in different processes agree on what should arrive without talking about it.
 *
 * A page set is drawn from a seed: n (src, dst) pairs with every index distinct within its pool
 * range, of which a "scatter" fraction are single pages (no neighbour in the room continues them
 * on both sides) and the rest runs of consecutive pairs; 0 = one run of all n. Page contents are a
 * pure function of (room, position), so the receiver checks them byte for byte and the checksum a
 * notice carries independently.
 */
#ifndef PD_XFER_PLAN_H
#define PD_XFER_PLAN_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64 step: the one generator every side uses. */
uint64_t pd_xfer_plan_rand(uint64_t *state);

/* Fills src[n], dst[n] with distinct indices from [src_lo, src_lo + src_span) and
 * [dst_lo, dst_lo + dst_span); needs n <= both spans. scatter in [0, 1]: the share of the n
 * pairs that are runs of one page; the others come in runs of 2 .. 16 in random order (0: one
 * run). Runs are placed apart so that they do not join, and are split where the spans have no
 * room for them: within a page or two of exact when both spans are about twice n. PD_OK or
 * PD_EINVAL. */
int pd_xfer_plan_pages(uint64_t seed, uint32_t n, double scatter, uint32_t src_lo,
                       uint32_t src_span, uint32_t dst_lo, uint32_t dst_span, uint32_t *src,
                       uint32_t *dst);

/* Counts the runs of consecutive (src, dst) pairs in a page set and how many are one page. */
void pd_xfer_plan_runs(const uint32_t *src, const uint32_t *dst, uint32_t n, uint32_t *runs,
                       uint32_t *single);

/* Writes the content of the room's page at `pos` (its index in the room) into page[bytes]. */
void pd_xfer_plan_fill(uint64_t room, uint32_t pos, void *page, size_t bytes);
/* Byte-exact check of one page; returns the first differing offset, or -1 when equal. */
long pd_xfer_plan_check(uint64_t room, uint32_t pos, const void *page, size_t bytes);
/* FNV-1a over the room's n pages at base[pages[i]] (page_bytes each), in room order. */
uint32_t pd_xfer_plan_checksum(const void *base, size_t page_bytes, const uint32_t *pages,
                               uint32_t n);

/* Page contents that do not depend on how a pool's shards split the kv heads (heterogeneous
 * tensor parallelism, xfer.h): the bytes of kv head `head` in row `row` of the room's page at
 * `pos` are a function of (room, pos, row, head), so pools of any tp hold the same logical page
 * and a receiver checks each of its shards against it. fill/check: shard `shard`'s part of one
 * page (rows_per_page rows of h->count heads from h->start[shard]). */
struct pd_xfer_heads;
void pd_xfer_plan_fill_heads(uint64_t room, uint32_t pos, const struct pd_xfer_heads *h, int shard,
                             void *page);
long pd_xfer_plan_check_heads(uint64_t room, uint32_t pos, const struct pd_xfer_heads *h, int shard,
                              const void *page);
/* FNV-1a over the room's logical pages (n of them at pages[i] of shards bases[k], shard page
 * bytes from h): row by row, every head of the model from the first shard holding it. The same on
 * both sides whatever their tp. */
uint32_t pd_xfer_plan_checksum_heads(void *const *bases, int n_shards,
                                     const struct pd_xfer_heads *h, const uint32_t *pages,
                                     uint32_t n);

#endif
