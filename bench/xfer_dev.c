/*
 * xfer_dev.c — pdserve-bench-xfer-dev: KV page transfer rate between two pools on a device, as
 * the daemons move them (pd_xfer_register_device_pool: UCX directly when it takes CUDA memory,
 * else staged through the pinned ring), next to a plain device-to-device copy of the same bytes.
 *
 * One process, two transfer engines (a prefill's and a decode's) on one libuv loop over whatever
 * UCX_TLS says (posix shared memory between the daemons of one node by default), each with its
 * own pool from the backend (cudaMalloc on --device cuda, host memory on cpu). Pages have the
 * qwen2.5-1.5b shape at page size 16 in bf16 (28 layers x K,V x 16 x 2 heads x 128: 448 KiB).
 * Rooms of --room-pages consecutive pages go one after another; a room's time runs from its
 * first send until the receiver's room ended (notice and every byte in). The reference copies
 * the same bytes pool to pool with one copy per room on the transfer stream.
 * Every room's pages are checked byte-exact on the receiver once (first room) per run.
 * --shards N splits the same page bytes over N pools on each side (tensor-parallel ranks,
 * pd_xfer_register_device_pool_shards): a run is then N copies (staged: N device→host copies
 * into one slot) and N streams of messages, so this measures what tensor parallelism costs the
 * transfer at equal bytes. On the staged path the receiver's side (copies host→device through its
 * receive ring, messages kept or waited for while the ring was full) is printed too.
 *
 *   pdserve-bench-xfer-dev [--device cpu|cuda] [--rooms N] [--room-pages N] [--shards N]
 *                          [--no-ipc] [--json FILE]
 * By default the receiver's pool export reaches the sender as decode's Pair carries it, so
 * the same-node path runs (CUDA IPC device copies; the host devmem maps it within the process);
 * --no-ipc measures the UCX path instead (direct or staged through the pinned ring).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "common/base/alloc.h"
#include "model/backend.h"
#include "model/devmem.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "common/xfer.h"

#define PAGE_BYTES ((size_t)28 * 2 * 16 * 2 * 128 * 2)

struct side {
    pd_xfer_t *x;
    pd_xfer_peer_t *peer;
    int ended, failed;
};

static struct side snd, rcv;
static uv_loop_t loop;

static void on_end(void *ctx, uint64_t room, void *user, int status,
                   const struct pd_xfer_notice *n) {
    struct side *s = ctx;
    (void)room;
    (void)user;
    (void)n;
    s->ended++;
    s->failed += status != PD_OK;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "pdserve-bench-xfer-dev: %s: %s\n", what, pd_error_msg());
    exit(1);
}

static bool run_until(const int *v, int want, double secs) {
    double t_end = now_s() + secs;
    while (*v < want && now_s() < t_end)
        uv_run(&loop, UV_RUN_NOWAIT);
    return *v >= want;
}

int main(int argc, char **argv) {
    const char *device = "cpu", *json_path = NULL;
    int rooms = 20;
    uint32_t room_pages = 256;
    int n_shards = 1;
    bool no_ipc = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--rooms") == 0 && i + 1 < argc)
            rooms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--room-pages") == 0 && i + 1 < argc)
            room_pages = (uint32_t)atoi(argv[++i]);
        else if (strcmp(argv[i], "--shards") == 0 && i + 1 < argc)
            n_shards = atoi(argv[++i]);
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json_path = argv[++i];
        else if (strcmp(argv[i], "--no-ipc") == 0)
            no_ipc = true;
        else {
            fprintf(stderr, "usage: pdserve-bench-xfer-dev [--device cpu|cuda] [--rooms N] "
                            "[--room-pages N] [--shards N] [--no-ipc] [--json FILE]\n");
            return 2;
        }
    }
    bool cuda = strcmp(device, "cuda") == 0;
    if ((!cuda && strcmp(device, "cpu") != 0) || rooms < 1 || room_pages < 1 || room_pages > 4096 ||
        n_shards < 1 || n_shards > PD_XFER_SHARDS_MAX || PAGE_BYTES % (size_t)n_shards) {
        fprintf(stderr,
                "pdserve-bench-xfer-dev: --device cpu|cuda, --rooms >= 1, --room-pages 1..4096, "
                "--shards 1..%d dividing a page's %zu bytes\n",
                PD_XFER_SHARDS_MAX, PAGE_BYTES);
        return 2;
    }
    const size_t spb = PAGE_BYTES / (size_t)n_shards; /* one page of one shard */
    pd_log_set_level(PD_LOG_WARNING);
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = cuda ? PD_BACKEND_CUDA : PD_BACKEND_CPU, .threads = 1};
    if (pd_backend_new(&bo, &be))
        die("backend");
    const uint32_t n_pages = 2 * room_pages; /* rooms alternate halves: no page reused at once */
    size_t pool_bytes = spb * n_pages;       /* one shard's pool */
    void *spool[PD_XFER_SHARDS_MAX] = {0}, *rpool[PD_XFER_SHARDS_MAX] = {0};
    for (int k = 0; k < n_shards; k++)
        if (pd_backend_alloc(be, pool_bytes, &spool[k]) ||
            pd_backend_alloc(be, pool_bytes, &rpool[k]))
            die("pools");
    /* [n_shards][pool_bytes]: every shard its own bytes, so one in another's place shows */
    uint8_t *pattern = pd_malloc(pool_bytes * (size_t)n_shards), *back = pd_malloc(pool_bytes);
    if (!pattern || !back)
        die("host buffers");
    for (size_t i = 0; i < pool_bytes * (size_t)n_shards; i++)
        pattern[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int k = 0; k < n_shards; k++)
        if (pd_backend_upload(be, spool[k], pattern + (size_t)k * pool_bytes, pool_bytes))
            die("filling the pool");
    if (pd_backend_sync(be))
        die("filling the pool");

    struct pd_devmem *sdm = NULL, *rdm = NULL;
    struct pd_devmem_opts dmo = {.kind = cuda ? PD_DEVMEM_CUDA : PD_DEVMEM_HOST};
    if (pd_devmem_new(&dmo, &sdm) || pd_devmem_new(&dmo, &rdm))
        die("device memory");
    if (uv_loop_init(&loop))
        return 1;
    struct pd_xfer_config cfg = {.abort_timeout_ms = 3000, .spin = true, .disable_ipc = no_ipc};
    struct pd_xfer_callbacks cs = {.ctx = &snd, .on_room_end = on_end};
    struct pd_xfer_callbacks cr = {.ctx = &rcv, .on_room_end = on_end};
    if (pd_xfer_new(&loop, &cfg, &cs, &snd.x) || pd_xfer_new(&loop, &cfg, &cr, &rcv.x))
        die("transfer engines");
    struct pd_xfer_info xi;
    pd_xfer_get_info(snd.x, &xi);
    if (pd_xfer_register_device_pool_shards(snd.x, spool, n_shards, spb, n_pages, sdm,
                                            xi.cuda_memory) ||
        pd_xfer_register_device_pool_shards(rcv.x, rpool, n_shards, spb, n_pages, rdm,
                                            xi.cuda_memory))
        die("registering the pools");
    struct pd_xfer_peer_info ri; /* what decode's Pair carries */
    pd_xfer_local_peer_info(rcv.x, &ri);
    if (no_ipc) { /* else the sender copies into the mapped pool (every shard's) */
        ri.ipc_handle = NULL;
        ri.ipc_handle_len = 0;
        for (int k = 0; k < n_shards; k++)
            ri.shards[k].ipc_handle_len = 0;
    }
    struct pd_xfer_peer_info si = {.remote_id = pd_xfer_id(snd.x)};
    pd_xfer_local_address(snd.x, &si.worker_addr, &si.worker_addr_len);
    if (pd_xfer_peer_connect(snd.x, &ri, NULL, &snd.peer) ||
        pd_xfer_peer_connect(rcv.x, &si, NULL, &rcv.peer))
        die("pairing");

    uint32_t *pages = pd_malloc(n_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < n_pages; i++)
        pages[i] = i;
    double t_xfer = 0;
    int bad = 0;
    for (int k = 0; k < rooms + 1; k++) { /* room 0 warms up and is checked */
        uint32_t *pg = pages + (k % 2) * room_pages;
        uint64_t room = 100 + (uint64_t)k;
        if (pd_xfer_room_expect(rcv.x, rcv.peer, room, pg, room_pages, NULL) ||
            pd_xfer_room_add(snd.x, snd.peer, room, pg, room_pages, NULL))
            die("opening a room");
        double t0 = now_s();
        struct pd_xfer_notice done = {.first_token = 1};
        if (pd_xfer_room_send(snd.x, room, 0, pg, room_pages) ||
            pd_xfer_room_finish(snd.x, room, &done))
            die("sending");
        if (!run_until(&rcv.ended, k + 1, 60) || !run_until(&snd.ended, k + 1, 60)) {
            fprintf(stderr, "pdserve-bench-xfer-dev: room %d did not end in 60 s\n", k);
            return 1;
        }
        if (k > 0)
            t_xfer += now_s() - t0;
        if (k == 0) {
            size_t off = (size_t)pg[0] * spb, len = (size_t)room_pages * spb;
            for (int s = 0; s < n_shards; s++) {
                if (pd_backend_download(be, back, (char *)rpool[s] + off, len))
                    die("reading the pool back");
                bad += memcmp(back, pattern + (size_t)s * pool_bytes + off, len) != 0;
            }
        }
    }
    if (snd.failed || rcv.failed || bad) {
        fprintf(stderr, "pdserve-bench-xfer-dev: %d/%d rooms failed, pages %s\n", snd.failed,
                rcv.failed, bad ? "differ" : "equal");
        return 1;
    }
    /* the reference: the same bytes pool to pool, one copy per room */
    double room_bytes = (double)room_pages * (double)PAGE_BYTES;
    double t0 = now_s();
    for (int k = 0; k < rooms; k++) {
        size_t off = (size_t)(k % 2) * room_pages * spb;
        for (int s = 0; s < n_shards; s++) /* one copy per shard, as a run of the transfer */
            if (pd_devmem_copy(sdm, (char *)rpool[s] + off, (char *)spool[s] + off,
                               (size_t)room_pages * spb))
                die("copying");
    }
    double t_copy = now_s() - t0;
    double gbs = room_bytes * rooms / t_xfer / 1e9, copy_gbs = room_bytes * rooms / t_copy / 1e9;
    pd_xfer_get_info(snd.x, &xi);
    const char *path = xi.ipc_bytes ? "cuda-ipc" : xi.staged ? "staged" : "direct";
    printf("kv transfer (%s, %s, %d shard%s): %d rooms of %u pages (%.1f MiB): %.2f GB/s; device "
           "copy of the same bytes: %.2f GB/s; ratio %.3f; lane %s\n",
           device, path, n_shards, n_shards == 1 ? "" : "s", rooms, room_pages,
           room_bytes / 1048576.0, gbs, copy_gbs, gbs / copy_gbs, pd_xfer_peer_transport(snd.peer));
    struct pd_xfer_info rxi;
    pd_xfer_get_info(rcv.x, &rxi);
    if (xi.staged && !xi.ipc_bytes)
        printf("receiver: %.1f MiB copied host->device through its ring; ring full: %" PRIu64
               " messages kept, %" PRIu64 " waits\n",
               (double)rxi.recv_staged_bytes / 1048576.0, rxi.recv_held, rxi.recv_waits);
    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f)
            return 1;
        fprintf(f,
                "{\"device\":\"%s\",\"path\":\"%s\",\"lane\":\"%s\",\"shards\":%d,"
                "\"rooms\":%d,\"room_bytes\":%.0f,\"xfer_gbps\":%.3f,\"copy_gbps\":%.3f,"
                "\"ratio\":%.4f,\"recv_held\":%" PRIu64 ",\"recv_waits\":%" PRIu64 "}\n",
                device, path, pd_xfer_peer_transport(snd.peer), n_shards, rooms, room_bytes, gbs,
                copy_gbs, gbs / copy_gbs, rxi.recv_held, rxi.recv_waits);
        fclose(f);
    }
    pd_xfer_free(snd.x);
    pd_xfer_free(rcv.x);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    pd_devmem_free(sdm);
    pd_devmem_free(rdm);
    for (int k = 0; k < n_shards; k++) {
        pd_backend_release(be, spool[k]);
        pd_backend_release(be, rpool[k]);
    }
    pd_backend_free(be);
    pd_free(pages);
    pd_free(pattern);
    pd_free(back);
    return 0;
}
