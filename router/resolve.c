/*
 * resolve.c — one asynchronous lookup of a discovery name (see resolve.h).
 *
 * System resolver: uv_getaddrinfo with the family as a hint; EAI_NONAME/EAI_NODATA are the
 * authoritative "no such name / no addresses", every other error a failed lookup.
 * --dns-server: libresolv with a private res_state per lookup (res_ninit, then the one server put
 * in its nameserver list), res_nsearch for A and/or AAAA in a libuv pool thread, so a slow or
 * dead server never stalls the loop; h_errno HOST_NOT_FOUND/NO_DATA are authoritative, anything
 * else (TRY_AGAIN: timeout or SERVFAIL) a failure, and one failed family fails the lookup so that
 * a half answer never drains the other half. libresolv comes with glibc (libc6-dev): no package
 * to add, and nothing runs on the loop thread but the callback.
 * The pool thread allocates only the answer buffer; at most MAX_ADDRS addresses are kept
 * (logged when cut).
 */

#include "router/resolve.h"

#include "router/config.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_ADDRS 256
#define ANSWER_BYTES 65536 /* a TCP-sized answer */

struct pd_router_resolve {
    uv_loop_t *loop;
    union {
        uv_getaddrinfo_t gai;
        uv_work_t work;
    } req;
    bool use_server;
    bool cancelled;
    pd_router_resolve_fn cb;
    void *ud;
    int family;
    char server[16];
    int server_port;
    /* result */
    int status;
    bool truncated;
    char error[200];
    int n;
    char addrs[MAX_ADDRS][INET6_ADDRSTRLEN];
    const char *ptrs[MAX_ADDRS];
    char name[]; /* what to resolve */
};

static int cmp_addr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void add_addr(struct pd_router_resolve *r, int af, const void *bin) {
    char s[INET6_ADDRSTRLEN];
    if (!inet_ntop(af, bin, s, sizeof(s)))
        return;
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->addrs[i], s) == 0)
            return;
    if (r->n == MAX_ADDRS) {
        r->truncated = true;
        return;
    }
    memcpy(r->addrs[r->n++], s, sizeof(s));
}

/* On the loop thread: sort, call back, free. */
static void finish(struct pd_router_resolve *r) {
    if (!r->cancelled) {
        for (int i = 0; i < r->n; i++)
            r->ptrs[i] = r->addrs[i];
        qsort(r->ptrs, (size_t)r->n, sizeof(r->ptrs[0]), cmp_addr);
        if (r->truncated)
            pd_warn("dns %s: more than %d addresses; using the first %d", r->name, MAX_ADDRS,
                    MAX_ADDRS);
        struct pd_router_resolve_result res = {
            .status = r->status, .addrs = r->ptrs, .n = r->n, .error = r->error};
        r->cb(r->ud, &res);
    }
    pd_free(r);
}

/* ---------------------------------------------------------------- system resolver */

static void on_getaddrinfo(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
    struct pd_router_resolve *r = req->data;
    if (status == 0) {
        for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            if (ai->ai_family == AF_INET)
                add_addr(r, AF_INET, &((const struct sockaddr_in *)ai->ai_addr)->sin_addr);
            else if (ai->ai_family == AF_INET6)
                add_addr(r, AF_INET6, &((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
        }
    } else if (status != UV_EAI_NONAME && status != UV_EAI_NODATA) {
        r->status = PD_EIO;
        snprintf(r->error, sizeof(r->error), "getaddrinfo: %s", uv_strerror(status));
    }
    uv_freeaddrinfo(res);
    finish(r);
}

/* ---------------------------------------------------------------- libresolv, pool thread */

/* One res_nsearch for type; PD_OK with the records added, PD_OK with none (authoritative), or
 * PD_EIO with r->error set. */
static int query_type(struct pd_router_resolve *r, res_state st, int type, unsigned char *ans) {
    int len = res_nsearch(st, r->name, ns_c_in, type, ans, ANSWER_BYTES);
    if (len < 0) {
        int h = st->res_h_errno;
        if (h == HOST_NOT_FOUND || h == NO_DATA)
            return PD_OK;
        snprintf(r->error, sizeof(r->error), "%s query to %s:%d: %s", type == ns_t_a ? "A" : "AAAA",
                 r->server, r->server_port,
                 h == TRY_AGAIN ? "no answer (timeout or server failure)" : hstrerror(h));
        return PD_EIO;
    }
    ns_msg msg;
    if (ns_initparse(ans, len, &msg) < 0) {
        snprintf(r->error, sizeof(r->error), "%s answer from %s:%d does not parse",
                 type == ns_t_a ? "A" : "AAAA", r->server, r->server_port);
        return PD_EIO;
    }
    int count = ns_msg_count(msg, ns_s_an);
    for (int i = 0; i < count; i++) {
        ns_rr rr;
        if (ns_parserr(&msg, ns_s_an, i, &rr) < 0)
            continue;
        if (ns_rr_type(rr) == ns_t_a && ns_rr_rdlen(rr) == 4)
            add_addr(r, AF_INET, ns_rr_rdata(rr));
        else if (ns_rr_type(rr) == ns_t_aaaa && ns_rr_rdlen(rr) == 16)
            add_addr(r, AF_INET6, ns_rr_rdata(rr));
    }
    return PD_OK;
}

static void on_work(uv_work_t *w) {
    struct pd_router_resolve *r = w->data;
    unsigned char in6[16], in4[4];
    /* an address literal needs no server */
    if (inet_pton(AF_INET, r->name, in4) == 1) {
        if (r->family != PD_ROUTER_DNS_FAMILY_IPV6)
            add_addr(r, AF_INET, in4);
        return;
    }
    if (inet_pton(AF_INET6, r->name, in6) == 1) {
        if (r->family != PD_ROUTER_DNS_FAMILY_IPV4)
            add_addr(r, AF_INET6, in6);
        return;
    }
    unsigned char *ans = malloc(ANSWER_BYTES); /* not pd_malloc: its failure hook is per test */
    struct __res_state st;
    memset(&st, 0, sizeof(st));
    if (!ans || res_ninit(&st) != 0) {
        r->status = PD_EIO;
        snprintf(r->error, sizeof(r->error), "%s", ans ? "res_ninit failed" : "out of memory");
        free(ans);
        return;
    }
    st.nscount = 1;
    memset(&st.nsaddr_list[0], 0, sizeof(st.nsaddr_list[0]));
    st.nsaddr_list[0].sin_family = AF_INET;
    st.nsaddr_list[0].sin_port = htons((uint16_t)r->server_port);
    inet_pton(AF_INET, r->server, &st.nsaddr_list[0].sin_addr);
    st.retrans = 1; /* seconds per try; a refresh comes every few seconds anyway */
    st.retry = 2;
    int rc = PD_OK;
    if (r->family != PD_ROUTER_DNS_FAMILY_IPV6)
        rc = query_type(r, &st, ns_t_a, ans);
    if (rc == PD_OK && r->family != PD_ROUTER_DNS_FAMILY_IPV4)
        rc = query_type(r, &st, ns_t_aaaa, ans);
    if (rc) {
        r->status = rc;
        r->n = 0;
    }
    res_nclose(&st);
    free(ans);
}

static void on_work_done(uv_work_t *w, int status) {
    struct pd_router_resolve *r = w->data;
    if (status == UV_ECANCELED) {
        r->status = PD_ECANCELED;
        snprintf(r->error, sizeof(r->error), "cancelled");
    }
    finish(r);
}

/* ---------------------------------------------------------------- API */

int pd_router_resolve_start(uv_loop_t *loop, const char *name,
                            const struct pd_router_resolve_opts *o, pd_router_resolve_fn cb,
                            void *ud, struct pd_router_resolve **out) {
    size_t nl = strlen(name);
    struct pd_router_resolve *r = pd_calloc(1, sizeof(*r) + nl + 1);
    if (!r)
        return pd_errorf(PD_ENOMEM, "resolving %s", name);
    memcpy(r->name, name, nl + 1);
    r->loop = loop;
    r->cb = cb;
    r->ud = ud;
    r->family = o->family;
    r->use_server = o->server != NULL;
    int rc;
    if (r->use_server) {
        snprintf(r->server, sizeof(r->server), "%s", o->server);
        r->server_port = o->server_port;
        r->req.work.data = r;
        rc = uv_queue_work(loop, &r->req.work, on_work, on_work_done);
    } else {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
        hints.ai_family = o->family == PD_ROUTER_DNS_FAMILY_IPV4   ? AF_INET
                          : o->family == PD_ROUTER_DNS_FAMILY_IPV6 ? AF_INET6
                                                                   : AF_UNSPEC;
        r->req.gai.data = r;
        rc = uv_getaddrinfo(loop, &r->req.gai, on_getaddrinfo, r->name, NULL, &hints);
    }
    if (rc) {
        pd_free(r);
        return pd_errorf(PD_EIO, "resolving %s: %s", name, uv_strerror(rc));
    }
    *out = r;
    return PD_OK;
}

void pd_router_resolve_cancel(struct pd_router_resolve *r) {
    if (!r)
        return;
    r->cancelled = true;
    /* succeeds only while still queued; a running lookup ends on its own and frees itself */
    uv_cancel(r->use_server ? (uv_req_t *)&r->req.work : (uv_req_t *)&r->req.gai);
}
