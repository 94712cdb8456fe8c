/*
 * devmem.h — the device-memory operations the KV transfer needs when the pool lives on a GPU
 * and UCX cannot touch GPU memory (DESIGN.md §3, §6): copies on one dedicated transfer stream,
 * events that say when the copies enqueued before them are done, and pinned host memory for the
 * staging ring. model/ and common/ stay free of CUDA headers: kernels/devmem_cuda.c implements
 * this with the CUDA runtime (named, like the backend, by the registry: model/backend_reg.c), and
 * devmem.c with plain host memory, so the transfer's ordering logic runs and is tested on
 * machines with no GPU.
 *
 * Invariants: copy_async calls execute in the order they were enqueued; an event recorded after
 * a copy is done only once that copy (and every earlier one) is complete. All calls come from
 * one thread (the daemon's loop).
 */
#ifndef PD_DEVMEM_H
#define PD_DEVMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pd_devmem_kind {
    PD_DEVMEM_HOST = 0, /* "device" memory is host memory: tests and CPU machines */
    PD_DEVMEM_CUDA = 1,
};

struct pd_devmem_opts {
    enum pd_devmem_kind kind;
    int device_index; /* cuda: the GPU the pool lives on */
    /* host: copies are queued and run only at every second event query, so a consumer that reads a
     * destination before its event reports done sees stale bytes (tests of the ordering). */
    bool host_deferred;
    /* host, deferred: the copies an event query runs go last-first, so copies finish out of
     * order, as parallel copy engines would let them (only an event says that they are done;
     * copies of one batch never overlap in their destination in the transfer's use) */
    bool host_reverse;
};

struct pd_devmem;
struct pd_devmem_event;

/* PD_EUNSUPPORTED for cuda when the CUDA build is absent or no device is usable. Defined by the
 * registry (model/backend_reg.c), which knows the implementations of this build. */
int pd_devmem_new(const struct pd_devmem_opts *o, struct pd_devmem **out);
void pd_devmem_free(struct pd_devmem *d); /* waits for enqueued copies; accepts NULL */
const char *pd_devmem_name(const struct pd_devmem *d);

/* Enqueues a copy of bytes (device↔host, device→device): dst and src stay valid and untouched
 * until an event recorded after it reports done. */
int pd_devmem_copy_async(struct pd_devmem *d, void *dst, const void *src, size_t bytes);
/* Enqueues a 2-D copy: height rows of width bytes, row i from src + i * spitch to
 * dst + i * dpitch (width <= both pitches; pitches in bytes). As copy_async for the rest: one
 * copy for the events' order. Moves a run of KV pages between pools whose shards hold different
 * kv heads (heterogeneous tensor parallelism: xfer.h). */
int pd_devmem_copy2d_async(struct pd_devmem *d, void *dst, size_t dpitch, const void *src,
                           size_t spitch, size_t width, size_t height);
/* Copies now and returns when the bytes are at dst (src may be reused right away). */
int pd_devmem_copy(struct pd_devmem *d, void *dst, const void *src, size_t bytes);

int pd_devmem_event_new(struct pd_devmem *d, struct pd_devmem_event **out);
void pd_devmem_event_free(struct pd_devmem *d, struct pd_devmem_event *e);
/* Marks the copies enqueued so far. */
int pd_devmem_event_record(struct pd_devmem *d, struct pd_devmem_event *e);
/* 1 when everything before the last record is done (or never recorded), 0 while pending,
 * else a PD_E* status (negative). */
int pd_devmem_event_query(struct pd_devmem *d, struct pd_devmem_event *e);

/* Waits until every copy enqueued so far is done. */
int pd_devmem_sync(struct pd_devmem *d);

/* Calls fn(arg) once every copy enqueued so far is done, on whichever thread learns it (cuda: the
 * runtime's callback thread, a host function on the transfer stream; host: the thread that runs
 * the copies, at once when they are not deferred), so a loop that polls its events can sleep
 * until then instead of waking on a timer. fn must be quick, thread-safe and must not call
 * devmem; arg stays valid until pd_devmem_sync (or free) returned. */
typedef void (*pd_devmem_done_fn)(void *arg);
int pd_devmem_notify(struct pd_devmem *d, pd_devmem_done_fn fn, void *arg);

/* Same-node export of a device buffer to another process (CUDA IPC: cudaIpcGetMemHandle of
 * the allocation holding base). handle gets at most PD_DEVMEM_IPC_MAX bytes; *len its size.
 * The host implementation exports within its own process only (tests of the IPC data path). */
#define PD_DEVMEM_IPC_MAX 128
int pd_devmem_ipc_export(struct pd_devmem *d, void *base, uint8_t *handle, size_t *len);
/* Maps a peer's exported buffer: *base is its start in our address space, valid until
 * pd_devmem_ipc_close. PD_EUNSUPPORTED when the handle is from another node or process kind. */
int pd_devmem_ipc_open(struct pd_devmem *d, const uint8_t *handle, size_t len, void **base);
void pd_devmem_ipc_close(struct pd_devmem *d, void *base);

/* Tests: while a deferred host devmem is stalled, event queries run no copies (they report
 * pending; sync and free still run them all), so a test can hold copies in flight across loop
 * turns. PD_EINVAL for any other devmem. */
int pd_devmem_host_stall(struct pd_devmem *d, bool stall);

/* Page-locked host memory (staging ring); zeroed. */
int pd_devmem_host_alloc(struct pd_devmem *d, size_t bytes, void **out);
void pd_devmem_host_free(struct pd_devmem *d, void *p);

/* ---- the implementation table (devmem.c dispatches; its host one, kernels/devmem_cuda.c) ---- */
struct pd_devmem_ops {
    void (*free)(struct pd_devmem *d);
    int (*copy_async)(struct pd_devmem *d, void *dst, const void *src, size_t bytes);
    int (*copy2d_async)(struct pd_devmem *d, void *dst, size_t dpitch, const void *src,
                        size_t spitch, size_t width, size_t height);
    int (*copy)(struct pd_devmem *d, void *dst, const void *src, size_t bytes);
    int (*event_new)(struct pd_devmem *d, struct pd_devmem_event **out);
    void (*event_free)(struct pd_devmem *d, struct pd_devmem_event *e);
    int (*event_record)(struct pd_devmem *d, struct pd_devmem_event *e);
    int (*event_query)(struct pd_devmem *d, struct pd_devmem_event *e);
    int (*host_alloc)(struct pd_devmem *d, size_t bytes, void **out);
    void (*host_free)(struct pd_devmem *d, void *p);
    int (*sync)(struct pd_devmem *d);
    int (*notify)(struct pd_devmem *d, pd_devmem_done_fn fn, void *arg);
    int (*ipc_export)(struct pd_devmem *d, void *base, uint8_t *handle, size_t *len);
    int (*ipc_open)(struct pd_devmem *d, const uint8_t *handle, size_t len, void **base);
    void (*ipc_close)(struct pd_devmem *d, void *base);
    int (*host_stall)(struct pd_devmem *d, bool stall); /* host only; NULL elsewhere */
};

struct pd_devmem {
    const struct pd_devmem_ops *ops;
    char name[64];
};

/* The host implementation (devmem.c); the cuda one is kernels/backend_cuda.h's. */
int pd__devmem_host_new(const struct pd_devmem_opts *o, struct pd_devmem **out);

#endif
