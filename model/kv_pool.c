/*
 * kv_pool.c — sizing and allocation of the page-major KV cache; page-list bounds checks.
 * Holds no per-request state; allocation happens once, at init.
 */
#include "model/kv_pool.h"
#include "common/base/status.h"

#include <string.h>

size_t pd_kv_pool_page_bytes(const struct pd_kv_pool_opts *o) {
    return (size_t)o->n_layers * 2 * (size_t)o->page_size * (size_t)o->kv_heads *
           (size_t)o->head_dim * pd_dtype_size(o->dtype);
}

static int check_opts(const struct pd_kv_pool_opts *o) {
    if (o->n_layers < 1 || o->kv_heads < 1 || o->head_dim < 1 || o->page_size < 1)
        return pd_errorf(PD_EINVAL, "kv pool: layers %d, kv heads %d, head dim %d, page size %d",
                         o->n_layers, o->kv_heads, o->head_dim, o->page_size);
    if (o->n_pages < 0 || o->n_pages > INT32_MAX)
        return pd_errorf(PD_ERANGE, "kv pool of %lld pages", (long long)o->n_pages);
    if (o->dtype != PD_DTYPE_F32 && o->dtype != PD_DTYPE_BF16 && o->dtype != PD_DTYPE_F16 &&
        o->dtype != PD_DTYPE_F8E4M3 && o->dtype != PD_DTYPE_F8E5M2)
        return pd_errorf(PD_EINVAL, "kv pool dtype %d", (int)o->dtype);
    return PD_OK;
}

int pd_kv_pool_pages_for(const struct pd_kv_pool_opts *o, size_t total, size_t avail,
                         int64_t *n_pages) {
    int rc = check_opts(o);
    if (rc)
        return rc;
    if (!(o->mem_fraction_static > 0 && o->mem_fraction_static <= 1))
        return pd_errorf(PD_ERANGE, "--mem-fraction-static %g: must be in (0, 1]",
                         o->mem_fraction_static);
    double reserved = (double)total * (1.0 - o->mem_fraction_static);
    double rest = (double)avail - reserved;
    size_t pb = pd_kv_pool_page_bytes(o);
    double pages = rest > 0 ? rest / (double)pb : 0;
    if (pages < 1)
        return pd_errorf(PD_ENOMEM,
                         "kv pool: %.1f MiB free, %.1f MiB kept outside --mem-fraction-static %g, "
                         "not enough for one %.2f MiB page; raise the fraction or free memory",
                         (double)avail / 1048576.0, reserved / 1048576.0, o->mem_fraction_static,
                         (double)pb / 1048576.0);
    *n_pages = pages > INT32_MAX ? INT32_MAX : (int64_t)pages;
    return PD_OK;
}

int pd_kv_pool_init(struct pd_kv_pool *pool, struct pd_backend *be,
                    const struct pd_kv_pool_opts *o) {
    memset(pool, 0, sizeof(*pool));
    int rc = check_opts(o);
    if (rc)
        return rc;
    int64_t n = o->n_pages;
    if (n == 0) {
        size_t total, avail;
        if ((rc = pd_backend_mem_info(be, &total, &avail)) != PD_OK ||
            (rc = pd_kv_pool_pages_for(o, total, avail, &n)) != PD_OK)
            return pd_error_wrap(rc, "sizing the kv pool");
    }
    size_t pb = pd_kv_pool_page_bytes(o);
    if ((size_t)n > SIZE_MAX / pb)
        return pd_errorf(PD_ENOMEM, "kv pool of %lld pages overflows", (long long)n);
    void *base;
    if ((rc = pd_backend_alloc(be, (size_t)n * pb, &base)) != PD_OK)
        return pd_error_wrap(rc, "allocating the kv pool (%lld pages of %zu bytes)", (long long)n,
                             pb);
    /* A pool of a size the operator gave is theirs from the start: no request pays its first
     * touch (a fault per 4 KiB of every prompt received while the pool was cold, about a tenth of
     * decode's time on the tiny model). Derived from --mem-fraction-static it may be far more
     * than the load ever uses, and a second daemon on the machine sizes its own from what is
     * still free: its pages are backed as they are first used. */
    if (o->n_pages > 0)
        pd_backend_make_resident(be, base, (size_t)n * pb);
    pool->be = be;
    pool->layout = (struct pd_kv_layout){
        .base = base,
        .n_pages = n,
        .n_layers = o->n_layers,
        .page_size = o->page_size,
        .kv_heads = o->kv_heads,
        .head_dim = o->head_dim,
        .dtype = o->dtype,
        .page_bytes = pb,
    };
    return PD_OK;
}

void pd_kv_pool_free(struct pd_kv_pool *pool) {
    if (!pool || !pool->be)
        return;
    pd_backend_release(pool->be, pool->layout.base);
    memset(pool, 0, sizeof(*pool));
}

int pd_kv_pool_check_pages(const struct pd_kv_pool *pool, const int32_t *pages, int n) {
    for (int i = 0; i < n; i++)
        if (pages[i] < 0 || pages[i] >= pool->layout.n_pages)
            return pd_errorf(PD_ERANGE,
                             "page index %d (entry %d) outside the kv pool of %lld pages",
                             (int)pages[i], i, (long long)pool->layout.n_pages);
    return PD_OK;
}

void *pd_kv_pool_block(const struct pd_kv_pool *pool, int32_t page, int layer, int which) {
    const struct pd_kv_layout *l = &pool->layout;
    PD_ASSERT(page >= 0 && page < l->n_pages && layer >= 0 && layer < l->n_layers);
    size_t plane = l->page_bytes / ((size_t)l->n_layers * 2);
    return (char *)l->base + (size_t)page * l->page_bytes + ((size_t)layer * 2 + which) * plane;
}
