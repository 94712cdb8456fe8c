/*
 * spsc.h — a bounded single-producer/single-consumer ring of fixed-size records: the only channel
 * between a daemon's loop thread and its compute thread (DESIGN.md §2a). One thread pushes, one
 * thread pops; head and tail are C11 atomics (release on publish, acquire on read), so a record
 * and everything it points to that was written before the push is visible to the consumer after
 * the pop. No locks, no allocation after init; the capacity is fixed at init (a power of two).
 * Wakeups are not here: the caller pairs a push with uv_async_send or a condition variable.
 */
#ifndef PD_SPSC_H
#define PD_SPSC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pd_spsc {
    unsigned char *buf;                     /* [cap][rec_size] */
    size_t rec_size;                        /* bytes per record */
    uint32_t mask;                          /* cap - 1 */
    _Alignas(64) atomic_uint_fast32_t head; /* next record to pop (consumer writes) */
    _Alignas(64) atomic_uint_fast32_t tail; /* next free record (producer writes) */
};

/* A ring of at least min_records records (rounded up to a power of two) of rec_size bytes.
 * PD_EINVAL, PD_ENOMEM. */
int pd_spsc_init(struct pd_spsc *q, uint32_t min_records, size_t rec_size);
void pd_spsc_free(struct pd_spsc *q);

/* Producer: copies rec in. PD_EFULL (nothing copied) when the ring is full. */
int pd_spsc_push(struct pd_spsc *q, const void *rec);
/* Consumer: copies the oldest record out. PD_EAGAIN when empty. */
int pd_spsc_pop(struct pd_spsc *q, void *rec);
/* Records queued now (exact for either side's own view; approximate for a third thread). */
uint32_t pd_spsc_count(const struct pd_spsc *q);
uint32_t pd_spsc_capacity(const struct pd_spsc *q);

#endif
