/*
 * devmem_cuda.c — model/devmem.h on the CUDA runtime: one non-blocking stream of its own for
 * the KV transfer's copies (so they overlap the model's stream), events without timing, and
 * page-locked host memory for the staging ring. Joins the build as the backend does: the
 * registry (model/backend_reg.c) names pd__devmem_cuda_new in its cuda entry.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "common/base/alloc.h"
#include "kernels/backend_cuda.h"
#include "model/devmem.h"
#include "common/base/status.h"
#include "kernels/kernels.h"

struct cuda_devmem {
    struct pd_devmem base;
    int dev;
    cudaStream_t stream;
    bool own_opened; /* ipc_open was given a handle of this process */
};

static int select_dev(struct cuda_devmem *c) {
    return pd__cuda_status(cudaSetDevice(c->dev), "selecting the transfer's GPU");
}

static void cd_free(struct pd_devmem *d) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    select_dev(c);
    cudaStreamSynchronize(c->stream);
    cudaStreamDestroy(c->stream);
    pd_free(c);
}

static int cd_copy_async(struct pd_devmem *d, void *dst, const void *src, size_t bytes) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    int rc = select_dev(c);
    return rc ? rc
              : pd__cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream),
                                "enqueueing a KV transfer copy");
}

/* Pool (device) ↔ staging ring (pinned host), rows of a run regrouped by kv heads: one
 * cudaMemcpy2DAsync; cudaMemcpyDefault lets unified addressing tell the direction, as above. */
static int cd_copy2d_async(struct pd_devmem *d, void *dst, size_t dpitch, const void *src,
                           size_t spitch, size_t width, size_t height) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    int rc = select_dev(c);
    return rc ? rc
              : pd__cuda_status(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                                  cudaMemcpyDefault, c->stream),
                                "enqueueing a KV transfer copy (2-D, heads regrouped)");
}

static int cd_copy(struct pd_devmem *d, void *dst, const void *src, size_t bytes) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    int rc = select_dev(c);
    if (!rc)
        rc = pd__cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream),
                             "copying KV pages");
    return rc ? rc : pd__cuda_status(cudaStreamSynchronize(c->stream), "copying KV pages");
}

/* struct pd_devmem_event stays opaque here: a cudaEvent_t is what the handle points to. The
 * event belongs to the current device when made, and cudaEventRecord refuses an event of
 * another device than the stream's: the transfer threads calling this never selected ours
 * (GPU 0 by default), so with --base-gpu-id or a tp rank > 0 every record would fail. Likewise
 * every call that enqueues selects the device first. */
static int cd_event_new(struct pd_devmem *d, struct pd_devmem_event **out) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    int rc = select_dev(c);
    if (rc)
        return rc;
    cudaEvent_t *ev = pd_malloc(sizeof(*ev));
    if (!ev)
        return pd_error_wrap(PD_ENOMEM, "creating a copy event");
    rc = pd__cuda_status(cudaEventCreateWithFlags(ev, cudaEventDisableTiming),
                         "creating a copy event");
    if (rc) {
        pd_free(ev);
        return rc;
    }
    *out = (struct pd_devmem_event *)ev;
    return PD_OK;
}

static void cd_event_free(struct pd_devmem *d, struct pd_devmem_event *e) {
    (void)d;
    cudaEvent_t *ev = (cudaEvent_t *)e;
    cudaEventDestroy(*ev);
    pd_free(ev);
}

static int cd_event_record(struct pd_devmem *d, struct pd_devmem_event *e) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    int rc = select_dev(c);
    return rc ? rc
              : pd__cuda_status(cudaEventRecord(*(cudaEvent_t *)e, c->stream),
                                "recording a copy event");
}

static int cd_event_query(struct pd_devmem *d, struct pd_devmem_event *e) {
    (void)d;
    cudaError_t err = cudaEventQuery(*(cudaEvent_t *)e);
    if (err == cudaSuccess)
        return 1;
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    return pd__cuda_status(err, "waiting for a KV transfer copy");
}

static int cd_host_alloc(struct pd_devmem *d, size_t bytes, void **out) {
    (void)d;
    *out = NULL;
    int rc = pd__cuda_status(cudaHostAlloc(out, bytes, cudaHostAllocPortable),
                             "allocating the pinned staging ring");
    if (rc)
        return pd_error_wrap(rc, "%zu bytes", bytes);
    memset(*out, 0, bytes);
    return PD_OK;
}

static void cd_host_free(struct pd_devmem *d, void *p) {
    (void)d;
    cudaFreeHost(p);
}

static int cd_sync(struct pd_devmem *d) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    int rc = select_dev(c);
    return rc ? rc
              : pd__cuda_status(cudaStreamSynchronize(c->stream), "waiting for KV transfer copies");
}

/* fn runs on the runtime's callback thread once the stream reached it: after every copy
 * enqueued before it. It holds the stream only while it runs (xfer.c's: one
 * ucp_worker_signal). */
static int cd_notify(struct pd_devmem *d, pd_devmem_done_fn fn, void *arg) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    int rc = select_dev(c);
    return rc ? rc
              : pd__cuda_status(cudaLaunchHostFunc(c->stream, fn, arg),
                                "asking to be told when the KV transfer copies are done");
}

/* The handle: our boot id (IPC works between processes of one node only), pid and the address
 * (a handle opened in the process that made it is the address itself: CUDA refuses to open its
 * own handles), then the cudaIpcMemHandle_t. base must be the start of its cudaMalloc
 * allocation (the KV pool is one pd_backend_alloc), which is what cudaIpcOpenMemHandle maps. */
#define BOOT_ID_LEN 36
#define HANDLE_LEN (BOOT_ID_LEN + 4 + 8 + sizeof(cudaIpcMemHandle_t))
_Static_assert(HANDLE_LEN <= PD_DEVMEM_IPC_MAX, "ipc handle");

static void boot_id(char out[BOOT_ID_LEN]) {
    memset(out, 0, BOOT_ID_LEN);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        size_t n = fread(out, 1, BOOT_ID_LEN, f);
        (void)n;
        fclose(f);
    }
}

static int cd_ipc_export(struct pd_devmem *d, void *base, uint8_t *handle, size_t *len) {
    (void)d;
    cudaIpcMemHandle_t h;
    int rc = pd__cuda_status(cudaIpcGetMemHandle(&h, base), "exporting the KV pool (CUDA IPC)");
    if (rc)
        return rc;
    uint32_t pid = (uint32_t)getpid();
    uint64_t addr = (uint64_t)(uintptr_t)base;
    boot_id((char *)handle);
    memcpy(handle + BOOT_ID_LEN, &pid, 4);
    memcpy(handle + BOOT_ID_LEN + 4, &addr, 8);
    memcpy(handle + BOOT_ID_LEN + 12, &h, sizeof(h));
    *len = HANDLE_LEN;
    return PD_OK;
}

static int cd_ipc_open(struct pd_devmem *d, const uint8_t *handle, size_t len, void **base) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    cudaIpcMemHandle_t h;
    if (len != HANDLE_LEN)
        return pd_errorf(PD_EUNSUPPORTED, "not a CUDA IPC handle (%zu bytes)", len);
    char mine[BOOT_ID_LEN];
    boot_id(mine);
    if (memcmp(mine, handle, BOOT_ID_LEN) != 0)
        return pd_errorf(PD_EUNSUPPORTED, "the peer's KV pool is on another node (CUDA IPC "
                                          "works within one)");
    uint32_t pid;
    uint64_t addr;
    memcpy(&pid, handle + BOOT_ID_LEN, 4);
    memcpy(&addr, handle + BOOT_ID_LEN + 4, 8);
    if (pid == (uint32_t)getpid()) { /* our own pool (benchmarks of two engines in one process) */
        *base = (void *)(uintptr_t)addr;
        c->own_opened = true;
        return PD_OK;
    }
    memcpy(&h, handle + BOOT_ID_LEN + 12, sizeof(h));
    int rc = select_dev(c);
    if (!rc)
        rc = pd__cuda_status(cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess),
                             "opening the peer's KV pool (CUDA IPC)");
    if (rc)
        (void)cudaGetLastError();
    return rc;
}

static void cd_ipc_close(struct pd_devmem *d, void *base) {
    struct cuda_devmem *c = (struct cuda_devmem *)d;
    if (c->own_opened) /* our own address: nothing was mapped */
        return;
    cudaIpcCloseMemHandle(base);
}

static const struct pd_devmem_ops cuda_devmem_ops = {
    .free = cd_free,
    .copy_async = cd_copy_async,
    .copy2d_async = cd_copy2d_async,
    .copy = cd_copy,
    .event_new = cd_event_new,
    .event_free = cd_event_free,
    .event_record = cd_event_record,
    .event_query = cd_event_query,
    .host_alloc = cd_host_alloc,
    .host_free = cd_host_free,
    .sync = cd_sync,
    .notify = cd_notify,
    .ipc_export = cd_ipc_export,
    .ipc_open = cd_ipc_open,
    .ipc_close = cd_ipc_close,
};

int pd__devmem_cuda_new(const struct pd_devmem_opts *o, struct pd_devmem **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return pd_errorf(PD_EUNSUPPORTED, "GPU page transfer: no CUDA device (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "the driver lists none");
    if (o->device_index < 0 || o->device_index >= n)
        return pd_errorf(PD_ERANGE, "GPU page transfer: device %d of %d", o->device_index, n);
    struct cuda_devmem *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return PD_ENOMEM;
    c->base.ops = &cuda_devmem_ops;
    c->dev = o->device_index;
    int rc;
    if ((rc = select_dev(c)) ||
        (rc = pd__cuda_status(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                              "creating the transfer stream"))) {
        pd_free(c);
        return rc;
    }
    snprintf(c->base.name, sizeof(c->base.name), "cuda:%d", c->dev);
    *out = &c->base;
    return PD_OK;
}
