/*
 * config.h — pdserve-router's command line: the sglang-router flag shape
 * (`--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL --policy ...`).
 *
 * --prefill takes an optional second positional value and both --prefill and --decode repeat,
 * which the shared parser (common/base/flags.h, one value per flag, each flag once) does not do; a
 * pre-pass here lifts them out of argv and hands the rest to pd_flags_parse. Worker URLs are
 * parsed once here (scheme, host, port) so the request path never re-parses them.
 * Strings point into argv or into the config's own copies; pd_router_config_free releases them.
 */
#ifndef PD_ROUTER_CONFIG_H
#define PD_ROUTER_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "common/base/flags.h"
#include "common/base/tls.h"
#include "router/breaker.h"
#include "router/policy.h"

enum pd_router_policy {
    PD_ROUTER_POLICY_ROUND_ROBIN = 0,
    PD_ROUTER_POLICY_RANDOM = 1,
    PD_ROUTER_POLICY_POWER_OF_TWO = 2,
    PD_ROUTER_POLICY_CACHE_AWARE = 3, /* prefix tree + load (policy.h, cache_tree.h) */
    /* not a --policy value: decode's choice when --decode-policy is not given */
    PD_ROUTER_POLICY_LEAST_LOAD = 4,
};
extern const char *const pd_router_policy_names[]; /* NULL-terminated, enum order, no least_load */
/* A role policy's name: pd_router_policy_names, or "least_load". */
const char *pd_router_policy_name(int policy);

#define PD_ROUTER_BOOTSTRAP_PORT_DEFAULT 8998
#define PD_ROUTER_BOOTSTRAP_PORT_NULL (-1) /* "none": the body carries null = the default */

struct pd_router_worker_spec {
    char *url;          /* "http[s]://host:port", no trailing slash; owned */
    char *host;         /* "host" without brackets; owned */
    int port;           /* HTTP port */
    int bootstrap_port; /* prefill only; PD_ROUTER_BOOTSTRAP_PORT_NULL when not given */
};

/* --prefill-dns / --decode-dns NAME:PORT[:BOOTSTRAP_PORT]: every address NAME resolves to is a
 * worker at http://ADDR:PORT (discovery.h, router.c). */
struct pd_router_dns_spec {
    char *name;         /* host name or address literal, no brackets; owned */
    int port;           /* HTTP port */
    int bootstrap_port; /* prefill only; PD_ROUTER_BOOTSTRAP_PORT_NULL when not given */
};

enum pd_router_dns_family {
    PD_ROUTER_DNS_FAMILY_ANY = 0,
    PD_ROUTER_DNS_FAMILY_IPV4 = 1,
    PD_ROUTER_DNS_FAMILY_IPV6 = 2,
};
extern const char *const pd_router_dns_family_names[]; /* NULL-terminated, enum order */

struct pd_router_config {
    struct pd_router_worker_spec *prefill; /* [n_prefill] owned */
    int n_prefill;
    struct pd_router_worker_spec *decode; /* [n_decode] owned */
    int n_decode;
    struct pd_router_dns_spec *prefill_dns; /* [n_prefill_dns] owned */
    int n_prefill_dns;
    struct pd_router_dns_spec *decode_dns; /* [n_decode_dns] owned */
    int n_decode_dns;
    double dns_refresh_secs;  /* re-resolve period */
    const char *dns_server;   /* --dns-server as given; NULL = the system resolver */
    char dns_server_addr[16]; /* parsed: IPv4 literal */
    int dns_server_port;
    int dns_family; /* enum pd_router_dns_family */
    bool pd_disaggregation;
    int policy; /* enum pd_router_policy */
    /* --prefill-policy (default --policy) and --decode-policy (default least load): what each
     * role's choice runs, as sglang-router's PD mode has them */
    int prefill_policy, decode_policy;
    const char *prefill_policy_arg, *decode_policy_arg; /* as given; NULL when not */
    /* --cache-threshold, --balance-*-threshold, --eviction-interval-secs, --max-tree-size:
     * cache_aware's settings, sglang-router's defaults */
    struct pd_router_cache_aware ca;
    const char *host;
    int port;
    const char *api_key; /* NULL = no check */
    /* --ssl-certfile/--ssl-keyfile: the router's own listener over HTTPS; --ssl-ca-certs: what
     * https:// workers' certificates must chain to (NULL: the system's roots) */
    struct pd_tls_flags tls;
    int request_timeout_secs;
    int max_concurrent_requests;
    double health_check_interval_secs; /* /health and /get_load poll period */
    int health_failure_threshold;      /* consecutive timed-out /health polls before a worker
                                        * leaves rotation */
    double worker_unresponsive_secs;   /* /health silent this long: its requests are given up;
                                        * 0 = never */
    int shutdown_timeout_secs;         /* SIGTERM: how long in-flight requests may finish */
    int stream_buffer_bytes; /* decode stream held for a slow client before pausing decode */
    /* sglang-router's reliability flags: --cb-* (breaker.h; disabled = --disable-circuit-breaker)
     * and --retry-* (attempts per request counting the first; backoff between them) */
    struct pd_router_cb_config cb;
    int retry_max_retries;
    bool disable_retries;
    struct pd_router_backoff backoff;
    int log_level;

    /* limits: generation requests in flight per client IP address (0 = unlimited), samples per
     * prompt (n) */
    int max_concurrent_requests_per_client;
    int max_n;
    /* a request whose prompt is estimated at most this many tokens (beyond what the cache_aware
     * decode policy matched for the picked decode) goes to a decode alone, which prefills it
     * itself (--local-prefill-max-tokens; 0 = every request takes the PD path) */
    int local_prefill_max_tokens;

    bool help; /* --help given: print pd_router_config_usage, exit 0 */
    struct pd_flagset fs;
};

/* Parses argv into cfg (initialised here). PD_OK, or PD_EINVAL with pd_error_msg() saying which
 * argument is wrong. On --help returns PD_OK with cfg->help set and checks nothing else. */
int pd_router_config_parse(struct pd_router_config *cfg, int argc, char **argv);
void pd_router_config_usage(const struct pd_router_config *cfg, FILE *out);
void pd_router_config_free(struct pd_router_config *cfg);

/* "http://host:port[/]" or "https://host:port[/]" → spec fields (url, host, port; 80 or 443
 * when absent). Other schemes, paths and queries are refused. */
int pd_router_url_parse(const char *url, struct pd_router_worker_spec *out);

/* The form two URLs of one worker share: scheme and host in lower case, an IP address in its
 * canonical text (inet_ntop), the port always written (80, or 443 for https, when absent), no
 * trailing slash — "http://LOCALHOST:80/" and "http://localhost" give "http://localhost:80",
 * "http://[::0:1]:8000" and "http://[::1]:8000/" give "http://[::1]:8000". PD_EINVAL when url
 * does not parse, PD_ERANGE when buf is too small. Names are not resolved. */
int pd_router_url_normalize(const char *url, char *buf, size_t size);

#endif
