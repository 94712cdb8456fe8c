/*
 * discovery.h — the pure half of DNS discovery (--prefill-dns / --decode-dns): parsing
 * NAME:PORT[:BOOTSTRAP_PORT], the worker URL for a resolved address, and the plan that turns one
 * DNS answer into registry steps (add, keep, drain, revive, remove). No I/O, no clock: the router
 * (router.c) resolves names (resolve.h) and applies the plan; tests drive the plan directly.
 *
 * Addresses are compared as the numeric strings inet_ntop writes, which are canonical for both
 * families, so "::1" from one answer equals "::1" from the next.
 */
#ifndef PD_ROUTER_DISCOVERY_H
#define PD_ROUTER_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "router/config.h"

/* "svc.ns.svc.cluster.local:8000:8998", "[fd00::1]:8000", "localhost:30000" → spec (name owned).
 * A third field (the bootstrap port, or "none") only when prefill is true. PD_EINVAL with a
 * message naming flag_name and what is wrong. */
int pd_router_dns_spec_parse(const char *flag_name, const char *value, bool prefill,
                             struct pd_router_dns_spec *out);
void pd_router_dns_spec_free(struct pd_router_dns_spec *spec);

/* "A.B.C.D[:PORT]" (PORT default 53) → out->dns_server_addr / dns_server_port. */
int pd_router_dns_server_parse(const char *value, char addr[16], int *port);

/* "http://ADDR:PORT", IPv6 addresses in brackets. PD_ERANGE when it does not fit. */
int pd_router_dns_worker_url(const char *addr, int port, char *buf, size_t size);

/* A worker that one DNS name brought in, as the plan sees it. */
struct pd_router_dns_known {
    const char *addr; /* numeric */
    bool draining;    /* out of rotation, waiting for its in-flight requests */
    int64_t inflight; /* router calls on it now */
};

enum pd_router_dns_step {
    PD_ROUTER_DNS_KEEP,   /* in the answer and active; or draining, not in it, calls in flight */
    PD_ROUTER_DNS_DRAIN,  /* active, gone from the answer, calls in flight: no new requests */
    PD_ROUTER_DNS_REVIVE, /* draining, back in the answer: active again (re-checked first) */
    PD_ROUTER_DNS_REMOVE, /* gone from the answer and nothing in flight: leave the registry */
};

/* One answer (addresses, duplicates allowed) against the workers that name holds now. Fills
 * steps[n_known] and add[n_answer] (true for an address that needs a new worker: in no known
 * entry and not an earlier duplicate); returns how many adds. */
int pd_router_dns_plan(const struct pd_router_dns_known *known, int n_known,
                       const char *const *answer, int n_answer, enum pd_router_dns_step *steps,
                       bool *add);

#endif
