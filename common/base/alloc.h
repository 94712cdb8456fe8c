/*
 * alloc.h — checked allocation. Every heap allocation of pdserve goes through these so that
 * (1) a failure is reported as PD_ENOMEM with a message naming what was being allocated, never a
 * silent NULL dereference, and (2) tests can inject failures (STYLE.md rule 6): after
 * pd_alloc_fail_after(n), the (n+1)-th allocation from then on fails.
 *
 * Sizes are in bytes; count*size products are overflow-checked. pd_free accepts NULL.
 */
#ifndef PD_ALLOC_H
#define PD_ALLOC_H

#include <stddef.h>

void *pd_malloc(size_t bytes);
void *pd_calloc(size_t count, size_t size);
/* On failure the old block is untouched and still owned by the caller. */
void *pd_realloc(void *p, size_t bytes);
/* Grows an array to hold at least `need` elements of `size` bytes, doubling. PD_OK or PD_ENOMEM. */
int pd_array_grow(void **p, size_t *cap, size_t need, size_t size);
char *pd_strdup(const char *s);
char *pd_strndup(const char *s, size_t n);
void pd_free(void *p);

/* Test hook: allow n more allocations, then fail every one; n < 0 disables injection. */
void pd_alloc_fail_after(long n);
/* Number of allocations that failed by injection since the last pd_alloc_fail_after. */
long pd_alloc_injected_failures(void);

#endif
