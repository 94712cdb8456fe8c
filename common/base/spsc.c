/*
 * spsc.c — the bounded SPSC ring. head and tail count records modulo 2^32 (they never wrap the
 * ring's index space because cap <= 2^31); tail - head is the fill level.
 */
#include "common/base/spsc.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <string.h>

int pd_spsc_init(struct pd_spsc *q, uint32_t min_records, size_t rec_size) {
    memset(q, 0, sizeof(*q));
    if (min_records == 0 || min_records > (1u << 30) || rec_size == 0)
        return pd_errorf(PD_EINVAL, "spsc queue: %u records of %zu bytes", min_records, rec_size);
    uint32_t cap = 2;
    while (cap < min_records)
        cap <<= 1;
    q->buf = pd_calloc(cap, rec_size);
    if (!q->buf)
        return pd_error_wrap(PD_ENOMEM, "spsc queue of %u records", cap);
    q->rec_size = rec_size;
    q->mask = cap - 1;
    atomic_init(&q->head, 0);
    atomic_init(&q->tail, 0);
    return PD_OK;
}

void pd_spsc_free(struct pd_spsc *q) {
    pd_free(q->buf);
    q->buf = NULL;
}

int pd_spsc_push(struct pd_spsc *q, const void *rec) {
    uint32_t tail = (uint32_t)atomic_load_explicit(&q->tail, memory_order_relaxed);
    uint32_t head = (uint32_t)atomic_load_explicit(&q->head, memory_order_acquire);
    if (tail - head > q->mask)
        return PD_EFULL;
    memcpy(q->buf + (size_t)(tail & q->mask) * q->rec_size, rec, q->rec_size);
    atomic_store_explicit(&q->tail, tail + 1, memory_order_release);
    return PD_OK;
}

int pd_spsc_pop(struct pd_spsc *q, void *rec) {
    uint32_t head = (uint32_t)atomic_load_explicit(&q->head, memory_order_relaxed);
    uint32_t tail = (uint32_t)atomic_load_explicit(&q->tail, memory_order_acquire);
    if (head == tail)
        return PD_EAGAIN;
    memcpy(rec, q->buf + (size_t)(head & q->mask) * q->rec_size, q->rec_size);
    atomic_store_explicit(&q->head, head + 1, memory_order_release);
    return PD_OK;
}

uint32_t pd_spsc_count(const struct pd_spsc *q) {
    uint32_t tail = (uint32_t)atomic_load_explicit(&q->tail, memory_order_acquire);
    uint32_t head = (uint32_t)atomic_load_explicit(&q->head, memory_order_acquire);
    return tail - head;
}

uint32_t pd_spsc_capacity(const struct pd_spsc *q) {
    return q->mask + 1;
}
