/*
 * test_kv_pool.c — the KV pool's size rule, its page-major addressing, page-list bounds checks
 * what happens when memory is short or an allocation fails, and a pool of a size given being
 * resident from the start.
 */
#include "pd_test.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/base/alloc.h"
#include "model/kv_pool.h"

static struct pd_kv_pool_opts opts(void) {
    return (struct pd_kv_pool_opts){.n_layers = 3,
                                    .kv_heads = 2,
                                    .head_dim = 8,
                                    .page_size = 16,
                                    .dtype = PD_DTYPE_F32,
                                    .n_pages = 10,
                                    .mem_fraction_static = 0.88};
}

static void test_sizing(void) {
    struct pd_kv_pool_opts o = opts();
    CHECK_INT(pd_kv_pool_page_bytes(&o), 3 * 2 * 16 * 2 * 8 * 4);
    o.dtype = PD_DTYPE_BF16;
    CHECK_INT(pd_kv_pool_page_bytes(&o), 3 * 2 * 16 * 2 * 8 * 2);
    /* 100 MiB device, 50 MiB free after weights, 12 MiB kept out: 38 MiB of pages */
    int64_t n = 0;
    size_t mib = 1 << 20, pb = pd_kv_pool_page_bytes(&o);
    CHECK_OK(pd_kv_pool_pages_for(&o, 100 * mib, 50 * mib, &n));
    double want = (50.0 * mib - 100.0 * mib * (1 - 0.88)) / (double)pb;
    CHECK_INT(n, (int64_t)want);
    CHECK_ERR(pd_kv_pool_pages_for(&o, 100 * mib, 10 * mib, &n), PD_ENOMEM, "mem-fraction-static");
    o.mem_fraction_static = 0;
    CHECK_ERR(pd_kv_pool_pages_for(&o, 100 * mib, 50 * mib, &n), PD_ERANGE, "mem-fraction");
}

static void test_layout_and_checks(void) {
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    CHECK_OK(pd_backend_new(&bo, &be));
    struct pd_kv_pool pool;
    struct pd_kv_pool_opts o = opts();
    CHECK_OK(pd_kv_pool_init(&pool, be, &o));
    CHECK_INT(pool.layout.n_pages, 10);
    size_t plane = 16 * 2 * 8 * 4, pb = pd_kv_pool_page_bytes(&o);
    char *base = pool.layout.base;
    /* page-major: page, then layer, then K before V */
    CHECK(pd_kv_pool_block(&pool, 0, 0, 0) == base);
    CHECK(pd_kv_pool_block(&pool, 0, 0, 1) == base + plane);
    CHECK(pd_kv_pool_block(&pool, 0, 2, 1) == base + 5 * plane);
    CHECK(pd_kv_pool_block(&pool, 7, 1, 0) == base + 7 * pb + 2 * plane);
    int32_t good[3] = {0, 9, 4}, bad[3] = {0, 10, 4}, neg[1] = {-1};
    CHECK_OK(pd_kv_pool_check_pages(&pool, good, 3));
    CHECK_ERR(pd_kv_pool_check_pages(&pool, bad, 3), PD_ERANGE, "page index 10 (entry 1)");
    CHECK_ERR(pd_kv_pool_check_pages(&pool, neg, 1), PD_ERANGE, "page index -1");
    pd_kv_pool_free(&pool);
    pd_kv_pool_free(&pool); /* twice is harmless */

    /* sized from memory: a fraction of 1.0 gives (almost) everything free; do not allocate it,
     * only check the rule runs on this machine's numbers */
    size_t total = 0, avail = 0;
    CHECK_OK(pd_backend_mem_info(be, &total, &avail));
    CHECK(total > 0 && avail > 0 && avail <= total);

    pd_alloc_fail_after(0);
    CHECK_ERR(pd_kv_pool_init(&pool, be, &o), PD_ENOMEM, "allocating the kv pool");
    pd_alloc_fail_after(-1);
    o.page_size = 0;
    CHECK_ERR(pd_kv_pool_init(&pool, be, &o), PD_EINVAL, "page size 0");
    pd_backend_free(be);
}

/* A pool of a size given (n_pages > 0) is backed by memory at init: every page of it resident
 * (mincore), still all zeros. */
static void test_resident(void) {
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    CHECK_OK(pd_backend_new(&bo, &be));
    struct pd_kv_pool pool;
    struct pd_kv_pool_opts o = opts();
    size_t pb = pd_kv_pool_page_bytes(&o);
    o.n_pages = (int64_t)((8u << 20) / pb); /* 8 MiB: calloc maps it fresh, untouched */
    CHECK_OK(pd_kv_pool_init(&pool, be, &o));
    size_t bytes = (size_t)o.n_pages * pb, sys = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)pool.layout.base & ~(uintptr_t)(sys - 1);
    size_t span = (uintptr_t)pool.layout.base + bytes - lo;
    size_t n = (span + sys - 1) / sys, missing = 0;
    unsigned char *vec = pd_malloc(n);
    CHECK(vec && mincore((void *)lo, span, vec) == 0);
    for (size_t i = 0; vec && i < n; i++)
        missing += !(vec[i] & 1);
    CHECK_INT(missing, 0);
    pd_free(vec);
    const unsigned char *b = pool.layout.base;
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i += 997)
        nonzero += b[i] != 0;
    CHECK_INT(nonzero, 0);
    pd_kv_pool_free(&pool);
    pd_backend_free(be);
}

/* --kv-cache-dtype: the same memory holds 2x the pages in bf16/f16 and 4x in fp8 as in f32
 * (the pool's pages are all of one size, so the count is the memory over the page bytes). The
 * free memory is not a multiple of any page: the counts are floors, checked exactly. */
static void test_pages_per_dtype(void) {
    struct pd_kv_pool_opts o = opts();
    size_t mib = 1 << 20, total = 1000 * mib, avail = 700 * mib + 12345;
    double rest = (double)avail - (double)total * (1 - 0.88);
    int64_t n32 = 0;
    CHECK_OK(pd_kv_pool_pages_for(&o, total, avail, &n32));
    CHECK_INT(n32, (int64_t)(rest / (3 * 2 * 16 * 2 * 8 * 4)));
    static const struct {
        enum pd_dtype t;
        int times;
    } k[] = {{PD_DTYPE_BF16, 2}, {PD_DTYPE_F16, 2}, {PD_DTYPE_F8E4M3, 4}, {PD_DTYPE_F8E5M2, 4}};
    for (size_t i = 0; i < PD_ARRAY_LEN(k); i++) {
        o.dtype = k[i].t;
        int64_t n = 0;
        CHECK_INT(pd_kv_pool_page_bytes(&o) * (size_t)k[i].times, 3 * 2 * 16 * 2 * 8 * 4);
        CHECK_OK(pd_kv_pool_pages_for(&o, total, avail, &n));
        CHECK_INT(n, (int64_t)(rest * k[i].times / (3 * 2 * 16 * 2 * 8 * 4)));
        /* k x the f32 count, up to the floor of the f32 division (< k pages) */
        CHECK(n >= n32 * k[i].times && n < (n32 + 1) * k[i].times);
    }
    /* an fp8 pool allocates and addresses like the others: one byte an element */
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    CHECK_OK(pd_backend_new(&bo, &be));
    struct pd_kv_pool pool;
    o.dtype = PD_DTYPE_F8E4M3;
    o.n_pages = 10;
    CHECK_OK(pd_kv_pool_init(&pool, be, &o));
    CHECK_INT(pool.layout.page_bytes, 3 * 2 * 16 * 2 * 8);
    CHECK(pd_kv_pool_block(&pool, 7, 1, 1) == (char *)pool.layout.base + 7 * 1536 + 3 * 256);
    pd_kv_pool_free(&pool);
    pd_backend_free(be);
}

PD_TEST_MAIN(PD_TEST(test_sizing), PD_TEST(test_layout_and_checks), PD_TEST(test_resident),
             PD_TEST(test_pages_per_dtype))
