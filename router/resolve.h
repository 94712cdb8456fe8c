/*
 * resolve.h — asynchronous name → addresses for router discovery, off the loop thread: the
 * system resolver through uv_getaddrinfo (/etc/hosts, /etc/resolv.conf and its search domains, as
 * in a pod), or, with a server given, A/AAAA queries sent to that server by glibc's libresolv
 * (res_nsearch in a libuv pool thread, answers parsed with ns_parserr).
 *
 * The result tells an authoritative "no addresses" (NXDOMAIN, or no records of the asked
 * families: status PD_OK with n == 0) apart from a lookup that failed (timeout, SERVFAIL, no
 * server: status != PD_OK), because the router drains on the first and keeps its workers on the
 * second. Addresses are numeric strings (inet_ntop), sorted, without duplicates.
 * Owner: the resolution owns itself; it is freed after its callback, or after cancel once the
 * pool thread is done with it.
 */
#ifndef PD_ROUTER_RESOLVE_H
#define PD_ROUTER_RESOLVE_H

#include <uv.h>

struct pd_router_resolve;

struct pd_router_resolve_opts {
    int family;         /* enum pd_router_dns_family */
    const char *server; /* IPv4 literal of the DNS server; NULL = the system resolver */
    int server_port;    /* with server */
};

struct pd_router_resolve_result {
    int status;               /* PD_OK: an answer (n may be 0); else the lookup failed */
    const char *const *addrs; /* [n] numeric addresses; valid during the callback */
    int n;
    const char *error; /* what failed, "" on PD_OK */
};

typedef void (*pd_router_resolve_fn)(void *ud, const struct pd_router_resolve_result *r);

/* Starts resolving name; cb runs on the loop thread once, unless cancelled first. */
int pd_router_resolve_start(uv_loop_t *loop, const char *name,
                            const struct pd_router_resolve_opts *opts, pd_router_resolve_fn cb,
                            void *ud, struct pd_router_resolve **out);
/* The callback will not run. NULL is accepted. */
void pd_router_resolve_cancel(struct pd_router_resolve *r);

#endif
