/* libFuzzer target: the receive-side check of a page-data active message's header (sender, room,
 * page position, shard, byte offset) against the room it names (common/xfer.c
 * pd_xfer_data_fits, which on_data_am calls before writing into the KV pool). Input: n_shards u8,
 * page bytes u16, shard u32, index u32, offset u64, length u32 (little-endian), then the room's
 * destination pages as u16s. Whenever the check passes, every pool page the write touches must be
 * the room's page at that position (checked here independently), else the write would land in
 * someone else's pages. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/xfer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HDR 23
#define MAX_PAGES 256

static uint64_t get(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < HDR)
        return 0;
    int n_shards = data[0] % 5; /* 0 (no pool) .. 4 */
    uint64_t pb = get(data + 1, 2);
    uint32_t shard = (uint32_t)get(data + 3, 4), index = (uint32_t)get(data + 7, 4);
    uint64_t off = get(data + 11, 8);
    size_t length = (size_t)get(data + 19, 4);
    uint32_t dst[MAX_PAGES];
    uint32_t n_dst = 0;
    for (size_t i = HDR; i + 1 < size && n_dst < MAX_PAGES; i += 2)
        dst[n_dst++] = (uint32_t)get(data + i, 2);

    if (!pd_xfer_data_fits(dst, n_dst, n_shards, pb, shard, index, off, length))
        return 0;
    if (length == 0 || pb == 0 || shard >= (uint32_t)n_shards || index >= n_dst)
        abort();
    /* the pool byte range written, in shard-page units of pb bytes */
    uint64_t start = (uint64_t)dst[index] * pb + off;
    uint64_t end = start + length - 1;
    for (uint64_t p = start / pb; p <= end / pb; p++) {
        uint64_t pos = index + (p - dst[index]); /* the room position that page must be */
        if (pos >= n_dst || dst[pos] != p)
            abort();
    }
    return 0;
}
