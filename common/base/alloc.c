/*
 * alloc.c — malloc wrappers with overflow checks, error messages and failure injection.
 * The injection counter is atomic so tests may exercise threaded code with it.
 */
#include "common/base/alloc.h"
#include "common/base/status.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_budget = -1; /* < 0: no injection */
static atomic_long injected = 0;

void pd_alloc_fail_after(long n) {
    atomic_store(&fail_budget, n);
    atomic_store(&injected, 0);
}

long pd_alloc_injected_failures(void) {
    return atomic_load(&injected);
}

static int inject_failure(void) {
    long b = atomic_load(&fail_budget);
    while (b >= 0) {
        if (b == 0) {
            atomic_fetch_add(&injected, 1);
            return 1;
        }
        if (atomic_compare_exchange_weak(&fail_budget, &b, b - 1))
            return 0;
    }
    return 0;
}

void *pd_malloc(size_t bytes) {
    void *p = inject_failure() ? NULL : malloc(bytes ? bytes : 1);
    if (!p)
        pd_errorf(PD_ENOMEM, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *pd_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) {
        pd_errorf(PD_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *p = inject_failure() ? NULL : calloc(count ? count : 1, size ? size : 1);
    if (!p)
        pd_errorf(PD_ENOMEM, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *pd_realloc(void *old, size_t bytes) {
    void *p = inject_failure() ? NULL : realloc(old, bytes ? bytes : 1);
    if (!p)
        pd_errorf(PD_ENOMEM, "out of memory growing a block to %zu bytes", bytes);
    return p;
}

int pd_array_grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap)
        return PD_OK;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return pd_errorf(PD_ENOMEM, "array of %zu elements is too large", need);
        ncap *= 2;
    }
    if (size && ncap > SIZE_MAX / size)
        return pd_errorf(PD_ENOMEM, "array of %zu x %zu bytes overflows", ncap, size);
    void *np = pd_realloc(*p, ncap * size);
    if (!np)
        return PD_ENOMEM;
    *p = np;
    *cap = ncap;
    return PD_OK;
}

char *pd_strndup(const char *s, size_t n) {
    char *p = pd_malloc(n + 1);
    if (!p)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *pd_strdup(const char *s) {
    return pd_strndup(s, strlen(s));
}

void pd_free(void *p) {
    free(p);
}
