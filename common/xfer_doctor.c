/*
 * xfer_doctor.c — the transfer engine's self-check at daemon start (xfer.h pd_xfer_doctor_run):
 * which lanes UCX picks on this host and what one page and one room move at over them, the way
 * the engine moves pages (puts on a hardware RMA lane, active messages of one eager fragment
 * each on a software one).
 *
 * Two workers of their own (the engine's worker, its handlers and its uv handles are left
 * alone) on the engine's UCX context, one endpoint between them: UCX then wires the same
 * transports it would between two processes of this host (shared memory, the RDMA device's
 * loopback, or tcp under UCX_TLS=tcp). Data goes from a host buffer into a second one mapped on
 * the context, so the pool is never touched. Everything is bounded in time: a check that does
 * not complete says so and the daemon starts anyway. With an RDMA device in use the same room
 * is timed over tcp too, and an RDMA lane slower than tcp is a warning (a cable, a port at the
 * wrong speed, UCX falling back to a slow path).
 */
#include "common/xfer_internal.h"

#include <math.h>
#include <time.h>

#define DOCTOR_REPS 5               /* timings per size; the median is reported */
#define DOCTOR_ROOM_PAGES 64        /* a room: this many pages ... */
#define DOCTOR_ROOM_MAX (16u << 20) /* ... but at most this many bytes */
#define DOCTOR_WAIT_S 2.0           /* one timing at most; then the check gives up */
#define DOCTOR_AM_ID 0x5046u

struct selftest {
    ucp_worker_h wa, wb; /* sender, receiver */
    ucp_ep_h ep;         /* wa → wb */
    ucp_mem_h memh;      /* dst, mapped on the context */
    ucp_rkey_h rkey;
    char *src, *dst;
    uint64_t *hdrs; /* message k's header: its offset (UCX may read it until the send completes) */
    size_t bytes;   /* of src and dst */
    bool am;        /* pages as active messages (no hardware RMA lane) */
    size_t chunk;   /* page data per message */
    size_t got;     /* receiver: bytes of messages in */
    bool bad;       /* receiver: a message it could not place */
    char lanes[112];
};

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress(struct selftest *t) {
    ucp_worker_progress(t->wa);
    ucp_worker_progress(t->wb);
}

/* The receiver's side of a message: page data at the offset its header names, as the engine's
 * receiver copies it into a room's page. */
static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param) {
    struct selftest *t = arg;
    uint64_t off = 0;
    if (header_length != sizeof(off) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        t->bad = true;
        return UCS_OK;
    }
    memcpy(&off, header, sizeof(off));
    if (off > t->bytes || length > t->bytes - off) {
        t->bad = true;
        return UCS_OK;
    }
    memcpy(t->dst + off, data, length);
    t->got += length;
    return UCS_OK;
}

/* Posts without tracking: a request UCX returns is handed back at once (it is freed when it
 * completes); completion is seen by the flush or by the receiver's count. */
static int posted(ucs_status_ptr_t req, const char *what) {
    if (UCS_PTR_IS_ERR(req))
        return pd__ucs_error(UCS_PTR_STATUS(req), what);
    if (req)
        ucp_request_free(req);
    return PD_OK;
}

/* Moves bytes (<= t->bytes) from src to dst as the engine would, and waits until they are
 * there; the seconds it took, or -1 (pd_error set) when it failed or took over DOCTOR_WAIT_S. */
static double move(struct selftest *t, size_t bytes, size_t max_put) {
    double t0 = mono_s();
    int rc = PD_OK;
    t->got = 0;
    if (t->am) {
        for (size_t off = 0; off < bytes && !rc; off += t->chunk) {
            size_t n = bytes - off < t->chunk ? bytes - off : t->chunk;
            uint64_t *hdr = &t->hdrs[off / t->chunk];
            *hdr = off;
            ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                       .flags = UCP_AM_SEND_FLAG_EAGER};
            rc = posted(
                ucp_am_send_nbx(t->ep, DOCTOR_AM_ID, hdr, sizeof(*hdr), t->src + off, n, &prm),
                "self-test message");
        }
        while (!rc && t->got < bytes && !t->bad && mono_s() - t0 < DOCTOR_WAIT_S)
            progress(t);
        if (!rc && t->bad)
            rc = pd_errorf(PD_EIO, "self-test: a message the receiver could not place");
        else if (!rc && t->got < bytes)
            rc = pd_errorf(PD_ETIMEDOUT, "self-test: %zu of %zu bytes arrived within %.0f s",
                           t->got, bytes, DOCTOR_WAIT_S);
    } else {
        for (size_t off = 0; off < bytes && !rc; off += max_put) {
            size_t n = bytes - off < max_put ? bytes - off : max_put;
            ucp_request_param_t prm = {.op_attr_mask = 0};
            rc = posted(ucp_put_nbx(t->ep, t->src + off, n, (uint64_t)(uintptr_t)(t->dst + off),
                                    t->rkey, &prm),
                        "self-test put");
        }
        if (!rc) {
            ucp_request_param_t prm = {.op_attr_mask = 0};
            ucs_status_ptr_t req = ucp_ep_flush_nbx(t->ep, &prm);
            if (UCS_PTR_IS_ERR(req)) {
                rc = pd__ucs_error(UCS_PTR_STATUS(req), "self-test flush");
            } else if (req) {
                ucs_status_t st;
                while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS &&
                       mono_s() - t0 < DOCTOR_WAIT_S)
                    progress(t);
                ucp_request_free(req);
                if (st == UCS_INPROGRESS)
                    rc = pd_errorf(PD_ETIMEDOUT, "self-test: puts not flushed within %.0f s",
                                   DOCTOR_WAIT_S);
                else if (st != UCS_OK)
                    rc = pd__ucs_error(st, "self-test flush");
            }
        }
    }
    return rc ? -1.0 : mono_s() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* *gbps: the median of DOCTOR_REPS moves of bytes. Every byte of the last move is checked. */
static int timed(struct selftest *t, size_t bytes, size_t max_put, double *gbps) {
    double s[DOCTOR_REPS];
    for (int i = 0; i < DOCTOR_REPS; i++) {
        t->src[0] = (char)(i + 1); /* each move different from the last */
        memset(t->dst, 0, bytes);
        if ((s[i] = move(t, bytes, max_put)) < 0)
            return PD_EIO;
    }
    if (memcmp(t->src, t->dst, bytes) != 0)
        return pd_errorf(PD_EIO, "self-test: the bytes that arrived differ from those sent");
    qsort(s, DOCTOR_REPS, sizeof(s[0]), cmp_double);
    double mid = s[DOCTOR_REPS / 2];
    *gbps = (double)bytes / (mid > 1e-9 ? mid : 1e-9) / 1e9; /* a clock tick at least */
    return PD_OK;
}

static void selftest_close(ucp_context_h ctx, struct selftest *t) {
    if (t->rkey)
        ucp_rkey_destroy(t->rkey);
    if (t->ep) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t req = ucp_ep_close_nbx(t->ep, &prm);
        if (req && !UCS_PTR_IS_ERR(req)) {
            double t0 = mono_s();
            while (ucp_request_check_status(req) == UCS_INPROGRESS && mono_s() - t0 < 1.0)
                progress(t);
            ucp_request_free(req);
        }
    }
    if (t->memh)
        ucp_mem_unmap(ctx, t->memh);
    if (t->wb)
        ucp_worker_destroy(t->wb);
    if (t->wa)
        ucp_worker_destroy(t->wa);
    pd_free(t->src);
    pd_free(t->hdrs);
}

/* One self-test on ctx: lanes, then the page's and the room's GB/s. PD_OK with what it found,
 * or the first failure (what was measured before it stays in out). */
static int selftest_run(const pd_xfer_t *x, ucp_context_h ctx, size_t page_bytes, size_t room_bytes,
                        char *lanes, size_t lanes_cap, bool *am, double *page_gbps,
                        double *room_gbps) {
    struct selftest t = {.bytes = room_bytes};
    int rc = PD_OK;
    ucs_status_t st;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(ctx, &wp, &t.wa)) != UCS_OK ||
        (st = ucp_worker_create(ctx, &wp, &t.wb)) != UCS_OK) {
        rc = pd__ucs_error(st, "self-test workers");
        goto out;
    }
    ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = DOCTOR_AM_ID,
                                 .cb = on_am,
                                 .arg = &t};
    if ((st = ucp_worker_set_am_recv_handler(t.wb, &ap)) != UCS_OK) {
        rc = pd__ucs_error(st, "self-test handler");
        goto out;
    }
    ucp_address_t *addr;
    size_t addr_len;
    if ((st = ucp_worker_get_address(t.wb, &addr, &addr_len)) != UCS_OK) {
        rc = pd__ucs_error(st, "self-test address");
        goto out;
    }
    /* as the engine's endpoints to peers are made, so UCX picks the same lanes */
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    st = ucp_ep_create(t.wa, &ep, &t.ep);
    ucp_worker_release_address(t.wb, addr);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "self-test endpoint");
        goto out;
    }
    ucp_mem_map_params_t mp = {.field_mask =
                                   UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                               .length = room_bytes,
                               .flags = UCP_MEM_MAP_ALLOCATE};
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    void *rkey_buf = NULL;
    size_t rkey_len = 0;
    if ((st = ucp_mem_map(ctx, &mp, &t.memh)) != UCS_OK ||
        (st = ucp_mem_query(t.memh, &ma)) != UCS_OK ||
        (st = ucp_rkey_pack(ctx, t.memh, &rkey_buf, &rkey_len)) != UCS_OK) {
        rc = pd__ucs_error(st, "self-test memory");
        goto out;
    }
    t.dst = ma.address;
    st = ucp_ep_rkey_unpack(t.ep, rkey_buf, &t.rkey);
    ucp_rkey_buffer_release(rkey_buf);
    if (st != UCS_OK) {
        rc = pd__ucs_error(st, "self-test rkey");
        goto out;
    }
    if (!(t.src = pd_malloc(room_bytes)) ||
        !(t.hdrs = pd_calloc(room_bytes / AM_CHUNK_MIN + 1, sizeof(*t.hdrs)))) {
        rc = pd_error_wrap(PD_ENOMEM, "self-test buffer of %zu bytes", room_bytes);
        goto out;
    }
    for (size_t i = 0; i < room_bytes; i++)
        t.src[i] = (char)(i * 131u >> 3);
    /* the first message wires the endpoint up; then its lanes are known */
    t.am = true;
    t.chunk = AM_CHUNK_MIN;
    if (move(&t, t.chunk < room_bytes ? t.chunk : room_bytes, x->cfg.max_put_bytes) < 0) {
        rc = pd_error_wrap(PD_EIO, "self-test wire-up");
        goto out;
    }
    size_t eager_max;
    bool hw_rma;
    pd__xfer_ep_lanes(t.ep, lanes, lanes_cap, &eager_max, &hw_rma);
    enum pd_xfer_data_path dp = x->cfg.data_path;
    t.am = dp == PD_XFER_DATA_AM || (dp == PD_XFER_DATA_AUTO && !hw_rma);
    t.chunk = pd__xfer_am_chunk(x, eager_max);
    *am = t.am;
    if ((rc = timed(&t, page_bytes, x->cfg.max_put_bytes, page_gbps)) == PD_OK)
        rc = timed(&t, room_bytes, x->cfg.max_put_bytes, room_gbps);
out:
    selftest_close(ctx, &t);
    return rc;
}

int pd_xfer_doctor_run(pd_xfer_t *x, size_t page_bytes, struct pd_xfer_doctor *out) {
    memset(out, 0, sizeof(*out));
    double t0 = mono_s();
    snprintf(out->ucx_version, sizeof(out->ucx_version), "%s", ucp_get_version_string());
    if (page_bytes == 0)
        page_bytes = x->page_bytes ? x->page_bytes : 4096;
    size_t room = page_bytes * DOCTOR_ROOM_PAGES;
    if (page_bytes > DOCTOR_ROOM_MAX)
        room = page_bytes;
    else if (room > DOCTOR_ROOM_MAX)
        room = DOCTOR_ROOM_MAX / page_bytes * page_bytes;
    out->page_bytes = page_bytes;
    out->room_bytes = room;
    bool am = false;
    int rc = selftest_run(x, x->ctx, page_bytes, room, out->lanes, sizeof(out->lanes), &am,
                          &out->page_gbps, &out->room_gbps);
    out->path = am ? "am" : "put";
    if (rc)
        snprintf(out->error, sizeof(out->error), "%s", pd_error_msg());
    if (x->rdma && !rc) {
        /* the same room over tcp, for the comparison an RDMA lane must win */
        ucp_config_t *cfg;
        ucp_context_h tcp = NULL;
        ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                               .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
        if (ucp_config_read(NULL, NULL, &cfg) == UCS_OK) {
            if (ucp_config_modify(cfg, "TLS", "tcp") == UCS_OK &&
                ucp_config_modify(cfg, "NET_DEVICES", "all") == UCS_OK &&
                ucp_init(&params, cfg, &tcp) != UCS_OK)
                tcp = NULL;
            ucp_config_release(cfg);
        }
        double page_tcp = 0;
        bool am_tcp;
        if (!tcp || selftest_run(x, tcp, page_bytes, room, out->tcp_lanes, sizeof(out->tcp_lanes),
                                 &am_tcp, &page_tcp, &out->tcp_room_gbps) != PD_OK)
            snprintf(out->warning, sizeof(out->warning),
                     "could not time tcp beside the RDMA lane%s%s", tcp ? ": " : "",
                     tcp ? pd_error_msg() : "");
        else if (out->tcp_room_gbps > out->room_gbps)
            snprintf(out->warning, sizeof(out->warning),
                     "the RDMA lane (%s, %.2f GB/s) is slower than tcp (%.2f GB/s): check the "
                     "device, its port speed and UCX_NET_DEVICES",
                     out->lanes, out->room_gbps, out->tcp_room_gbps);
        if (tcp)
            ucp_cleanup(tcp);
    }
    out->ms = (mono_s() - t0) * 1e3;
    return rc;
}
