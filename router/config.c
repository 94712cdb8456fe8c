/*
 * config.c — pdserve-router's flags: the pre-pass for the repeatable, two-valued --prefill and the
 * repeatable --decode, --prefill-dns and --decode-dns, then the shared parser for everything else.
 *
 * The pre-pass only removes what it understands; anything else reaches pd_flags_parse unchanged,
 * so unknown flags and stray values get the shared parser's messages. --prefill and --decode are
 * (and the -dns ones) also registered on the flagset (their destinations are never written: the
 * pre-pass consumed them) so that --help documents them next to the other flags.
 */
#include "router/config.h"
#include "router/discovery.h"

#include "common/base/alloc.h"
#include "common/base/api_wire.h"
#include "common/base/http_server.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *const pd_router_policy_names[] = {"round_robin", "random", "power_of_two",
                                              "cache_aware", NULL};
const char *const pd_router_dns_family_names[] = {"any", "ipv4", "ipv6", NULL};

const char *pd_router_policy_name(int policy) {
    return policy == PD_ROUTER_POLICY_LEAST_LOAD ? "least_load" : pd_router_policy_names[policy];
}

/* --prefill-policy / --decode-policy NAME → *out; PD_EINVAL naming the flag otherwise. */
static int role_policy(const char *flag, const char *v, int *out) {
    for (int i = 0; pd_router_policy_names[i]; i++)
        if (strcmp(v, pd_router_policy_names[i]) == 0) {
            *out = i;
            return PD_OK;
        }
    return pd_errorf(PD_EINVAL,
                     "%s: '%s' is not one of round_robin, random, power_of_two, cache_aware", flag,
                     v);
}

/* The length of url's "http://" or "https://" (any case); 0 for another scheme. */
static size_t scheme_len(const char *url, bool *https) {
    *https = strncasecmp(url, "https://", 8) == 0;
    return *https ? 8 : strncasecmp(url, "http://", 7) == 0 ? 7 : 0;
}

int pd_router_url_parse(const char *url, struct pd_router_worker_spec *out) {
    memset(out, 0, sizeof(*out));
    bool https;
    size_t sl = scheme_len(url, &https);
    if (!sl || strncmp(url, https ? "https://" : "http://", sl) != 0)
        return pd_errorf(PD_EINVAL, "worker URL '%s' must start with http:// or https://", url);
    const char *h = url + sl;
    const char *host_end, *rest;
    const char *host = h;
    if (*h == '[') { /* [v6]:port */
        host = h + 1;
        host_end = strchr(host, ']');
        if (!host_end)
            return pd_errorf(PD_EINVAL, "worker URL '%s': unterminated [IPv6 address]", url);
        rest = host_end + 1;
    } else {
        host_end = h + strcspn(h, ":/");
        rest = host_end;
    }
    if (host_end == host)
        return pd_errorf(PD_EINVAL, "worker URL '%s' has no host", url);
    long port = https ? 443 : 80;
    if (*rest == ':') {
        char *end;
        errno = 0;
        port = strtol(rest + 1, &end, 10);
        if (end == rest + 1 || errno || port < 1 || port > 65535)
            return pd_errorf(PD_EINVAL, "worker URL '%s': port must be 1..65535", url);
        rest = end;
    }
    if (*rest == '/')
        rest++;
    if (*rest)
        return pd_errorf(PD_EINVAL, "worker URL '%s' must be %s://host:port with no path", url,
                         https ? "https" : "http");
    size_t url_len = strlen(url);
    while (url_len > sl + 1 && url[url_len - 1] == '/')
        url_len--;
    out->url = pd_strndup(url, url_len);
    out->host = pd_strndup(host, (size_t)(host_end - host));
    out->port = (int)port;
    out->bootstrap_port = PD_ROUTER_BOOTSTRAP_PORT_NULL;
    if (!out->url || !out->host) {
        pd_free(out->url);
        pd_free(out->host);
        memset(out, 0, sizeof(*out));
        return pd_errorf(PD_ENOMEM, "copying worker URL");
    }
    return PD_OK;
}

int pd_router_url_normalize(const char *url, char *buf, size_t size) {
    bool https;
    size_t sl = scheme_len(url, &https);
    if (!sl)
        return pd_errorf(PD_EINVAL, "worker URL '%s' must start with http:// or https://", url);
    const char *scheme = https ? "https" : "http";
    char copy[600];
    if (snprintf(copy, sizeof(copy), "%s://%s", scheme, url + sl) >= (int)sizeof(copy))
        return pd_errorf(PD_ERANGE, "worker URL '%.64s...' is too long", url);
    struct pd_router_worker_spec spec;
    int rc = pd_router_url_parse(copy, &spec);
    if (rc)
        return rc;
    char host[INET6_ADDRSTRLEN + 260];
    unsigned char addr[16];
    bool v6 = inet_pton(AF_INET6, spec.host, addr) == 1;
    if (v6 || inet_pton(AF_INET, spec.host, addr) == 1) {
        inet_ntop(v6 ? AF_INET6 : AF_INET, addr, host, sizeof(host));
    } else {
        snprintf(host, sizeof(host), "%s", spec.host);
        for (char *p = host; *p; p++)
            *p = (char)tolower((unsigned char)*p);
    }
    int n = snprintf(buf, size, v6 ? "%s://[%s]:%d" : "%s://%s:%d", scheme, host, spec.port);
    pd_free(spec.url);
    pd_free(spec.host);
    if (n < 0 || (size_t)n >= size)
        return pd_errorf(PD_ERANGE, "normalized worker URL of '%.64s' does not fit", url);
    return PD_OK;
}

static int add_worker(struct pd_router_worker_spec **list, int *n, const char *url, int bport) {
    struct pd_router_worker_spec spec;
    int rc = pd_router_url_parse(url, &spec);
    if (rc)
        return rc;
    spec.bootstrap_port = bport;
    struct pd_router_worker_spec *grown = pd_realloc(*list, sizeof(spec) * (size_t)(*n + 1));
    if (!grown) {
        pd_free(spec.url);
        pd_free(spec.host);
        return pd_errorf(PD_ENOMEM, "adding worker %s", url);
    }
    grown[*n] = spec;
    *list = grown;
    (*n)++;
    return PD_OK;
}

static int add_dns(const char *flag, struct pd_router_dns_spec **list, int *n, const char *v,
                   bool prefill) {
    struct pd_router_dns_spec spec;
    int rc = pd_router_dns_spec_parse(flag, v, prefill, &spec);
    if (rc)
        return rc;
    struct pd_router_dns_spec *grown = pd_realloc(*list, sizeof(spec) * (size_t)(*n + 1));
    if (!grown) {
        pd_router_dns_spec_free(&spec);
        return pd_errorf(PD_ENOMEM, "adding %s %s", flag, v);
    }
    grown[*n] = spec;
    *list = grown;
    (*n)++;
    return PD_OK;
}

/* "8998" → 8998; "none" / "null" → PD_ROUTER_BOOTSTRAP_PORT_NULL. */
static int parse_bootstrap_port(const char *url, const char *v, int *out) {
    if (strcmp(v, "none") == 0 || strcmp(v, "null") == 0) {
        *out = PD_ROUTER_BOOTSTRAP_PORT_NULL;
        return PD_OK;
    }
    char *end;
    errno = 0;
    long p = strtol(v, &end, 10);
    if (end == v || *end || errno || p < 1 || p > 65535)
        return pd_errorf(PD_EINVAL, "--prefill %s %s: BOOTSTRAP_PORT must be 1..65535 or none", url,
                         v);
    *out = (int)p;
    return PD_OK;
}

/* Value of "--name=v" or "--name v" at argv[*i]; advances *i past it. NULL when absent. */
static const char *flag_value(int argc, char **argv, int *i, const char *name, bool *inline_eq) {
    size_t len = strlen(name);
    const char *a = argv[*i];
    *inline_eq = a[len] == '=';
    if (*inline_eq)
        return a + len + 1;
    if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
        return NULL;
    return argv[++*i];
}

static bool is_flag(const char *a, const char *name) {
    size_t len = strlen(name);
    return strncmp(a, name, len) == 0 && (a[len] == '\0' || a[len] == '=');
}

static int prepass(struct pd_router_config *cfg, int argc, char **argv, char **rest, int *n_rest) {
    *n_rest = 0;
    rest[(*n_rest)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool eq;
        int rc;
        if (is_flag(a, "--prefill")) {
            const char *url = flag_value(argc, argv, &i, "--prefill", &eq);
            if (!url || !*url)
                return pd_errorf(PD_EINVAL,
                                 "--prefill needs a URL: --prefill URL [BOOTSTRAP_PORT]");
            int bport = PD_ROUTER_BOOTSTRAP_PORT_NULL;
            /* the optional second value: whatever follows that is not a flag */
            if (!eq && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                rc = parse_bootstrap_port(url, argv[++i], &bport);
                if (rc)
                    return rc;
            }
            rc = add_worker(&cfg->prefill, &cfg->n_prefill, url, bport);
            if (rc)
                return pd_error_wrap(rc, "--prefill");
        } else if (is_flag(a, "--decode")) {
            const char *url = flag_value(argc, argv, &i, "--decode", &eq);
            if (!url || !*url)
                return pd_errorf(PD_EINVAL, "--decode needs a URL: --decode URL");
            rc = add_worker(&cfg->decode, &cfg->n_decode, url, PD_ROUTER_BOOTSTRAP_PORT_NULL);
            if (rc)
                return pd_error_wrap(rc, "--decode");
        } else if (is_flag(a, "--prefill-dns") || is_flag(a, "--decode-dns")) {
            bool prefill = is_flag(a, "--prefill-dns");
            const char *name = prefill ? "--prefill-dns" : "--decode-dns";
            const char *v = flag_value(argc, argv, &i, name, &eq);
            if (!v || !*v)
                return pd_errorf(PD_EINVAL, "%s needs a value: %s %s", name, name,
                                 prefill ? "NAME:PORT[:BOOTSTRAP_PORT]" : "NAME:PORT");
            rc = prefill ? add_dns(name, &cfg->prefill_dns, &cfg->n_prefill_dns, v, true)
                         : add_dns(name, &cfg->decode_dns, &cfg->n_decode_dns, v, false);
            if (rc)
                return rc;
        } else {
            rest[(*n_rest)++] = argv[i];
        }
    }
    rest[*n_rest] = NULL;
    return PD_OK;
}

static void register_flags(struct pd_router_config *cfg) {
    static const char *doc_only; /* --prefill/--decode are consumed by the pre-pass */
    struct pd_flagset *fs = &cfg->fs;
    pd_flagset_init(fs, "pdserve-router",
                    "Routes each generation request to one prefill and one decode worker "
                    "(prefill/decode disaggregation, the sglang-router protocol): adds "
                    "bootstrap_host/bootstrap_port/bootstrap_room to the body, sends it to both "
                    "at once, streams the decode worker's answer back, drains the prefill's. "
                    "Workers are health-checked; an unreachable one leaves rotation until its "
                    "/health answers 200 again.");
    pd_flag_bool(fs, "--pd-disaggregation", &cfg->pd_disaggregation,
                 "prefill/decode disaggregated routing (the only mode; accepted for "
                 "sglang-router compatibility)");
    pd_flag_string(fs, "--prefill", &doc_only, "URL [BOOTSTRAP_PORT]",
                   "a prefill worker, e.g. http://10.0.0.1:30000 8998 (https:// for a worker "
                   "serving TLS, see --ssl-ca-certs); repeatable; "
                   "BOOTSTRAP_PORT 'none' or absent = null in the body (the worker's default, "
                   "8998)");
    pd_flag_string(fs, "--decode", &doc_only, "URL",
                   "a decode worker, e.g. http://10.0.0.2:30000; repeatable");
    pd_flag_string(fs, "--prefill-dns", &doc_only, "NAME:PORT[:BOOTSTRAP_PORT]",
                   "prefill workers found by DNS: every address NAME resolves to (e.g. a "
                   "Kubernetes headless service, prefill.ns.svc.cluster.local:8000:8998) is a "
                   "worker at http://ADDR:PORT whose bootstrap is ADDR:BOOTSTRAP_PORT; "
                   "re-resolved every --dns-refresh-secs: new addresses join once /health answers, "
                   "vanished ones drain (no new requests, in-flight ones finish). Repeatable; "
                   "combines with --prefill. An authoritative empty answer (NXDOMAIN, no records) "
                   "drains all; a failed lookup keeps the current set");
    pd_flag_string(fs, "--decode-dns", &doc_only, "NAME:PORT",
                   "decode workers found by DNS, as --prefill-dns; repeatable; combines with "
                   "--decode");
    pd_flag_double(fs, "--dns-refresh-secs", &cfg->dns_refresh_secs, "S", 0.05, 86400,
                   "how often --prefill-dns/--decode-dns names are resolved again");
    pd_flag_string(fs, "--dns-server", &cfg->dns_server, "A.B.C.D[:PORT]",
                   "send the A/AAAA queries for --prefill-dns/--decode-dns to this DNS server "
                   "(IPv4, port 53 by default) instead of the system resolver (/etc/hosts, "
                   "/etc/resolv.conf); for tests, or clusters where the router must bypass "
                   "resolv.conf. The search domains of resolv.conf still apply");
    pd_flag_choice(fs, "--dns-family", &cfg->dns_family, pd_router_dns_family_names,
                   "address families taken from DNS answers. any: A and AAAA (a worker that "
                   "does not listen on an address never passes /health and never gets traffic, "
                   "so 'localhost' answering 127.0.0.1 and ::1 works); ipv4/ipv6: one family "
                   "(dual-stack services, where a pod would otherwise count twice)");
    pd_flag_choice(fs, "--policy", &cfg->policy, pd_router_policy_names,
                   "how to pick the prefill worker (unless --prefill-policy says otherwise); "
                   "decode is least load unless --decode-policy says otherwise. cache_aware: the "
                   "worker whose approximate prefix tree of past requests' texts matches this "
                   "one best (past --cache-threshold), else the one with the smallest tree; the "
                   "least loaded while loads are imbalanced (--balance-abs-threshold and "
                   "--balance-rel-threshold)");
    pd_flag_string(fs, "--prefill-policy", &cfg->prefill_policy_arg, "POLICY",
                   "the prefill side's policy (round_robin, random, power_of_two, cache_aware); "
                   "default --policy");
    pd_flag_string(fs, "--decode-policy", &cfg->decode_policy_arg, "POLICY",
                   "the decode side's policy (round_robin, random, power_of_two, cache_aware, "
                   "with its own prefix tree); default: the decode with the fewest requests in "
                   "flight (sglang-router would fall back to --policy; least load is what it "
                   "recommends for decode and what pdserve-router always did)");
    pd_flag_double(fs, "--cache-threshold", &cfg->ca.cache_threshold, "R", 0, 1,
                   "cache_aware: route by prefix match when the best worker's matched part of "
                   "the request's text (a ratio in [0, 1]) is above R; otherwise to the worker "
                   "with the smallest tree");
    pd_flag_int64(fs, "--balance-abs-threshold", &cfg->ca.balance_abs, "N", 0, INT64_MAX / 2,
                  "cache_aware: loads (the router's requests in flight on each worker of the role) "
                  "count as imbalanced when max - min > N and max > min x "
                  "--balance-rel-threshold; then the least loaded worker gets the request "
                  "whatever it matches");
    pd_flag_double(fs, "--balance-rel-threshold", &cfg->ca.balance_rel, "X", 0, 1e9,
                   "cache_aware: the relative half of the imbalance test (max > min x X)");
    pd_flag_double(fs, "--eviction-interval-secs", &cfg->ca.eviction_secs, "S", 0, 86400 * 365,
                   "cache_aware: every S seconds each worker's part of the prefix tree is cut "
                   "down to --max-tree-size, least recently used text first; 0 = never");
    pd_flag_int64(fs, "--max-tree-size", &cfg->ca.max_tree_size, "BYTES", 1, INT64_MAX / 2,
                  "cache_aware: bytes of request text the prefix tree keeps per worker after each "
                  "eviction");
    pd_flag_string(fs, "--host", &cfg->host, "HOST", "address to listen on");
    pd_flag_int(fs, "--port", &cfg->port, "PORT", 0, 65535,
                "port to listen on; 0 = any free port (the log line says which)");
    pd_flag_string(fs, "--api-key", &cfg->api_key, "KEY",
                   "require 'Authorization: Bearer KEY' from clients (not on /health); the "
                   "header is forwarded to the workers, and the router's own calls to them "
                   "(/health, /get_load, /abort_request) send the same key, so workers can "
                   "run with --api-key KEY too");
    pd_tls_flags_register(
        fs, &cfg->tls,
        "PEM certificate chain, the router's certificate first: with --ssl-keyfile the router "
        "is served over HTTPS only (TLS 1.2 or newer); sglang-router's --tls-cert-path",
        "PEM CA certificates that https:// workers' certificates must chain to (their host "
        "name or address checked too); default: the system's roots. sglang-router's "
        "--ca-cert-paths");
    pd_flag_int(fs, "--request-timeout-secs", &cfg->request_timeout_secs, "S", 1, 86400 * 7,
                "whole-request deadline for each upstream request");
    pd_flag_int(fs, "--max-concurrent-requests", &cfg->max_concurrent_requests, "N", 0, 1e7,
                "generation requests in flight before 429; 0 = unlimited");
    pd_flag_int(fs, PD_HTTP_PER_CLIENT_FLAG, &cfg->max_concurrent_requests_per_client, "N", 0, 1e7,
                "generation requests in flight from one client IP address before that address "
                "gets 429 (with Retry-After: 1); 0 = unlimited. Keyed by the TCP peer: clients "
                "behind one NAT, proxy or gateway share one budget, so the default is off");
    pd_flag_int(fs, "--max-n", &cfg->max_n, "N", 1, PD_API_MAX_FANOUT,
                "most samples per prompt a request may ask for (n, sampling_params.n); more is "
                "refused with 400. Give the workers the same --max-n");
    pd_flag_int(fs, "--local-prefill-max-tokens", &cfg->local_prefill_max_tokens, "N", 0, 1 << 20,
                "a generation request of one prompt (n 1) whose prompt is at most N tokens (the "
                "router's estimate without a tokenizer: ids counted, chat messages' text plus 8 a "
                "message, text at the bytes a token learned from the decodes' answers' "
                "prompt_tokens, 4 before the first) goes to a decode alone, which prefills it "
                "itself: no prefill, no KV transfer. Only a decode whose /get_load says "
                "\"local_prefill\": true (pdserve-decode --local-prefill, its default) gets them; "
                "others (SGLang's decodes) get every request on the PD path. With "
                "--decode-policy cache_aware only the part of the prompt the picked decode is "
                "not likely to hold counts (its tree's unmatched share of the text): a "
                "conversation's follow-up turn stays on its decode. Larger, batched or n > 1 "
                "requests take the PD path. 0 = all take the PD path. 256: where the local path "
                "stops paying on 2 CPU cores (docs/routing.md)");
    pd_flag_double(fs, "--health-check-interval-secs", &cfg->health_check_interval_secs, "S", 0.05,
                   3600, "period of the /health and /get_load polls of every worker");
    pd_flag_int(fs, "--health-failure-threshold", &cfg->health_failure_threshold, "N", 1, 1000,
                "consecutive /health polls that time out before a worker leaves rotation (as "
                "sglang-router's flag): one slow answer on a busy worker does not take it out; a "
                "refused connection or an answer other than 200 takes it out at once");
    pd_flag_double(fs, "--worker-unresponsive-secs", &cfg->worker_unresponsive_secs, "S", 0, 86400,
                   "a worker whose /health has gone unanswered (timed out or refused) for S "
                   "seconds is given up: the router's requests on it are aborted on both workers, "
                   "retried on another pair when the client has no byte yet, else ended with an "
                   "error event (a stopped or wedged worker would hold them until "
                   "--request-timeout-secs); 0 = never");
    pd_flag_int(fs, "--shutdown-timeout", &cfg->shutdown_timeout_secs, "S", 0, 86400,
                "on SIGTERM/SIGINT: stop accepting, let in-flight requests finish for up to S "
                "seconds, then abort the rest on their workers (clients get an error) and exit 0; "
                "a second signal aborts the rest at once");
    pd_flag_int(fs, "--stream-buffer-bytes", &cfg->stream_buffer_bytes, "N", 4096, 1 << 30,
                "bytes of a streamed answer the router holds for a client that reads slowly; "
                "past that it stops reading from the decode worker until the client catches up");
    pd_flag_int(fs, "--cb-failure-threshold", &cfg->cb.failure_threshold, "N", 1, 1000000,
                "circuit breaker: consecutive failures of a worker that open its circuit (no new "
                "requests go to it). A failure is a connection error, a 5xx answer, or a decode "
                "reporting that the KV transfer (bootstrap) with that prefill failed — that one "
                "counts against the prefill, not the decode");
    pd_flag_int(fs, "--cb-success-threshold", &cfg->cb.success_threshold, "N", 1, 1000000,
                "circuit breaker: consecutive successes of a half-open worker that close its "
                "circuit again; one failure while half-open opens it again");
    pd_flag_double(fs, "--cb-timeout-duration-secs", &cfg->cb.timeout_s, "S", 0.01, 86400,
                   "circuit breaker: how long a circuit stays open before it turns half-open "
                   "(requests go to the worker again as trials); a worker whose /health comes back "
                   "after failing turns half-open at once");
    pd_flag_double(fs, "--cb-window-duration-secs", &cfg->cb.window_s, "S", 0.01, 86400 * 365,
                   "circuit breaker: failures count as consecutive only while each comes within "
                   "S seconds of the one before");
    pd_flag_bool(fs, "--disable-circuit-breaker", &cfg->cb.disabled,
                 "no circuit breaker: a worker that fails requests but answers /health keeps "
                 "getting its share");
    pd_flag_int(fs, "--retry-max-retries", &cfg->retry_max_retries, "N", 1, 100,
                "attempts per request, counting the first: a request that failed before anything "
                "reached the client (a worker unreachable, a 408/429/5xx answer, a failed KV "
                "transfer) goes to another pair, up to N attempts in all; never once a stream "
                "has sent the client a byte");
    pd_flag_double(fs, "--retry-initial-backoff-ms", &cfg->backoff.initial_ms, "MS", 0, 3600e3,
                   "delay before the first retry");
    pd_flag_double(fs, "--retry-max-backoff-ms", &cfg->backoff.max_ms, "MS", 0, 3600e3,
                   "upper bound of any retry delay");
    pd_flag_double(fs, "--retry-backoff-multiplier", &cfg->backoff.multiplier, "X", 1, 100,
                   "each further retry waits this many times longer");
    pd_flag_double(fs, "--retry-jitter-factor", &cfg->backoff.jitter, "F", 0, 1,
                   "each delay is scaled by a random factor in [1-F, 1+F]");
    pd_flag_bool(fs, "--disable-retries", &cfg->disable_retries,
                 "one attempt per request (as --retry-max-retries 1)");
    pd_flag_log_level(fs, &cfg->log_level);
}

int pd_router_config_parse(struct pd_router_config *cfg, int argc, char **argv) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->policy = PD_ROUTER_POLICY_ROUND_ROBIN;
    /* sglang-router's defaults as its 0.5.x router logs them at start: 0.3, 64, 1.5, 60 s,
     * 2^26 (older releases: 0.5 / 32 / 1.0001 / 60 s / 2^24; some RouterArgs said 120 s) */
    cfg->ca = (struct pd_router_cache_aware){.cache_threshold = 0.3,
                                             .balance_abs = 64,
                                             .balance_rel = 1.5,
                                             .eviction_secs = 60,
                                             .max_tree_size = (int64_t)1 << 26};
    cfg->host = "127.0.0.1";
    cfg->port = 30000;
    cfg->request_timeout_secs = 1800;
    cfg->max_concurrent_requests = 256;
    cfg->max_n = PD_API_MAX_N;
    cfg->health_check_interval_secs = 5;
    cfg->worker_unresponsive_secs = 10;
    cfg->health_failure_threshold = 3;
    cfg->local_prefill_max_tokens = 256;
    cfg->shutdown_timeout_secs = 30;
    cfg->stream_buffer_bytes = 256 << 10;
    cfg->log_level = PD_LOG_INFO;
    cfg->dns_refresh_secs = 5;
    cfg->dns_family = PD_ROUTER_DNS_FAMILY_ANY;
    /* sglang-router's defaults */
    cfg->cb = (struct pd_router_cb_config){
        .failure_threshold = 5, .success_threshold = 2, .timeout_s = 30, .window_s = 60};
    cfg->retry_max_retries = 5;
    cfg->backoff = (struct pd_router_backoff){
        .initial_ms = 50, .max_ms = 30000, .multiplier = 1.5, .jitter = 0.2};
    register_flags(cfg);

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cfg->help = true;
            cfg->fs.help = true;
            return PD_OK;
        }
    }
    char **rest = pd_calloc((size_t)argc + 1, sizeof(char *));
    if (!rest)
        return pd_errorf(PD_ENOMEM, "parsing the command line");
    int n_rest = 0;
    int rc = prepass(cfg, argc, argv, rest, &n_rest);
    if (rc == PD_OK)
        rc = pd_flags_parse(&cfg->fs, n_rest, rest);
    pd_free(rest);
    if (rc)
        return rc;
    if (cfg->n_prefill + cfg->n_prefill_dns == 0)
        return pd_errorf(PD_EINVAL, "at least one --prefill URL [BOOTSTRAP_PORT] is required "
                                    "(or --prefill-dns NAME:PORT[:BOOTSTRAP_PORT])");
    if (cfg->n_decode + cfg->n_decode_dns == 0)
        return pd_errorf(PD_EINVAL,
                         "at least one --decode URL is required (or --decode-dns NAME:PORT)");
    if (cfg->dns_server && (rc = pd_router_dns_server_parse(cfg->dns_server, cfg->dns_server_addr,
                                                            &cfg->dns_server_port)))
        return rc;
    if (cfg->api_key && !*cfg->api_key)
        cfg->api_key = NULL;
    if ((rc = pd_tls_flags_check(&cfg->tls)))
        return rc;
    if (cfg->backoff.max_ms < cfg->backoff.initial_ms)
        return pd_errorf(PD_EINVAL,
                         "--retry-max-backoff-ms %g is below --retry-initial-backoff-ms %g",
                         cfg->backoff.max_ms, cfg->backoff.initial_ms);
    if (cfg->disable_retries)
        cfg->retry_max_retries = 1;
    cfg->prefill_policy = cfg->policy;
    cfg->decode_policy = PD_ROUTER_POLICY_LEAST_LOAD;
    if (cfg->prefill_policy_arg &&
        (rc = role_policy("--prefill-policy", cfg->prefill_policy_arg, &cfg->prefill_policy)))
        return rc;
    if (cfg->decode_policy_arg &&
        (rc = role_policy("--decode-policy", cfg->decode_policy_arg, &cfg->decode_policy)))
        return rc;
    return PD_OK;
}

void pd_router_config_usage(const struct pd_router_config *cfg, FILE *out) {
    pd_flags_usage(&cfg->fs, out);
}

void pd_router_config_free(struct pd_router_config *cfg) {
    if (!cfg)
        return;
    for (int i = 0; i < cfg->n_prefill; i++) {
        pd_free(cfg->prefill[i].url);
        pd_free(cfg->prefill[i].host);
    }
    for (int i = 0; i < cfg->n_decode; i++) {
        pd_free(cfg->decode[i].url);
        pd_free(cfg->decode[i].host);
    }
    pd_free(cfg->prefill);
    pd_free(cfg->decode);
    cfg->prefill = cfg->decode = NULL;
    cfg->n_prefill = cfg->n_decode = 0;
    for (int i = 0; i < cfg->n_prefill_dns; i++)
        pd_router_dns_spec_free(&cfg->prefill_dns[i]);
    for (int i = 0; i < cfg->n_decode_dns; i++)
        pd_router_dns_spec_free(&cfg->decode_dns[i]);
    pd_free(cfg->prefill_dns);
    pd_free(cfg->decode_dns);
    cfg->prefill_dns = cfg->decode_dns = NULL;
    cfg->n_prefill_dns = cfg->n_decode_dns = 0;
}
