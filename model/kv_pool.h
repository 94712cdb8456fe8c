/*
 * kv_pool.h — the KV cache of one daemon: n_pages pages on the backend's device, page-major
 * (DESIGN.md §3): page p is one contiguous region holding, for every layer in order, K then V,
 * each [page_size][kv_heads][head_dim]. So a run of consecutive pages is one contiguous range
 * on both sides of a transfer.
 *
 * The pool is sized once at start (process lifetime): an explicit page count, or SGLang's rule
 * for --mem-fraction-static (what is still free after the weights, less the share of device
 * memory kept out of the fraction). It does not decide which request owns which page: the page
 * allocator/scheduler does, and hands the model int32 page lists; the pool only says whether a
 * list is inside it.
 */
#ifndef PD_KV_POOL_H
#define PD_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"

struct pd_kv_pool_opts {
    int n_layers, kv_heads, head_dim;
    int page_size;              /* tokens per page (--page-size, default 16) */
    enum pd_dtype dtype;        /* element type of K and V */
    int64_t n_pages;            /* > 0: exactly this many; 0: derive from mem_fraction_static */
    double mem_fraction_static; /* share of device memory for weights + KV pool */
};

struct pd_kv_pool {
    struct pd_backend *be;
    struct pd_kv_layout layout; /* base, n_pages, geometry, page_bytes */
};

/* Bytes of one page for these options. */
size_t pd_kv_pool_page_bytes(const struct pd_kv_pool_opts *o);

/* Pages that fit when the device has total bytes and avail bytes are free now (weights already
 * loaded): (avail - total * (1 - mem_fraction_static)) / page_bytes, as SGLang sizes its pool.
 * PD_ENOMEM, saying how much memory is missing, when not even one page fits. */
int pd_kv_pool_pages_for(const struct pd_kv_pool_opts *o, size_t total, size_t avail,
                         int64_t *n_pages);

/* Sizes (see pd_kv_pool_pages_for when o->n_pages is 0) and allocates the pool, zeroed. */
int pd_kv_pool_init(struct pd_kv_pool *pool, struct pd_backend *be,
                    const struct pd_kv_pool_opts *o);
void pd_kv_pool_free(struct pd_kv_pool *pool);

/* PD_OK when every pages[i] is in [0, n_pages); else PD_ERANGE naming the first bad entry. */
int pd_kv_pool_check_pages(const struct pd_kv_pool *pool, const int32_t *pages, int n);

/* Device address of layer's K (which = 0) or V (which = 1) block inside page. */
void *pd_kv_pool_block(const struct pd_kv_pool *pool, int32_t page, int layer, int which);

#endif
