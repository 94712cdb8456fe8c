/*
 * discovery.c — NAME:PORT[:BOOTSTRAP_PORT] parsing, worker URLs for resolved addresses and the
 * answer-to-registry plan (see discovery.h). Pure: no I/O, no clock, no allocation but the
 * parsed name.
 */
#include "router/discovery.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DNS_NAME_MAX 253 /* RFC 1035, without the trailing dot */

/* "1".."65535" → port. */
static bool parse_port(const char *s, size_t n, int *out) {
    char buf[8];
    if (n == 0 || n >= sizeof(buf))
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)buf[i]))
            return false;
    long p = strtol(buf, NULL, 10);
    if (p < 1 || p > 65535)
        return false;
    *out = (int)p;
    return true;
}

int pd_router_dns_spec_parse(const char *flag, const char *v, bool prefill,
                             struct pd_router_dns_spec *out) {
    const char *shape = prefill ? "NAME:PORT[:BOOTSTRAP_PORT]" : "NAME:PORT";
    memset(out, 0, sizeof(*out));
    out->bootstrap_port = PD_ROUTER_BOOTSTRAP_PORT_NULL;
    if (strstr(v, "://"))
        return pd_errorf(PD_EINVAL, "%s '%s': takes %s, not a URL (e.g. %s)", flag, v, shape,
                         prefill ? "prefill.default.svc.cluster.local:8000:8998"
                                 : "decode.default.svc.cluster.local:8000");
    const char *name = v, *name_end, *rest;
    if (*v == '[') { /* [v6]:PORT */
        name = v + 1;
        name_end = strchr(name, ']');
        if (!name_end)
            return pd_errorf(PD_EINVAL, "%s '%s': unterminated [IPv6 address]", flag, v);
        rest = name_end + 1;
        char lit[64];
        size_t n = (size_t)(name_end - name);
        struct in6_addr a6;
        if (n == 0 || n >= sizeof(lit))
            return pd_errorf(PD_EINVAL, "%s '%s': empty or overlong [IPv6 address]", flag, v);
        memcpy(lit, name, n);
        lit[n] = '\0';
        if (inet_pton(AF_INET6, lit, &a6) != 1)
            return pd_errorf(PD_EINVAL, "%s '%s': '%s' in brackets is not an IPv6 address", flag, v,
                             lit);
    } else {
        name_end = name + strcspn(name, ":");
        rest = name_end;
        int colons = 0;
        bool hex = true; /* what precedes the first ':' could start an IPv6 address */
        for (const char *c = v; *c; c++)
            colons += *c == ':';
        for (const char *c = v; c < name_end; c++)
            hex = hex && isxdigit((unsigned char)*c);
        if ((colons > 2 && hex) || strstr(v, "::"))
            return pd_errorf(PD_EINVAL, "%s '%s': an IPv6 address goes in brackets: [fd00::1]:PORT",
                             flag, v);
    }
    size_t name_len = (size_t)(name_end - name);
    if (name_len == 0)
        return pd_errorf(PD_EINVAL, "%s '%s': empty NAME; takes %s", flag, v, shape);
    if (name_len > DNS_NAME_MAX)
        return pd_errorf(PD_EINVAL, "%s '%s': NAME longer than %d characters", flag, v,
                         DNS_NAME_MAX);
    if (*v != '[') {
        for (const char *c = name; c < name_end; c++)
            if (!isalnum((unsigned char)*c) && *c != '-' && *c != '.' && *c != '_')
                return pd_errorf(PD_EINVAL,
                                 "%s '%s': NAME may hold letters, digits, '-', '.' and '_' only",
                                 flag, v);
    }
    if (*rest != ':')
        return pd_errorf(PD_EINVAL, "%s '%s': PORT missing; takes %s", flag, v, shape);
    const char *port = rest + 1;
    const char *port_end = port + strcspn(port, ":");
    if (!parse_port(port, (size_t)(port_end - port), &out->port))
        return pd_errorf(PD_EINVAL, "%s '%s': PORT must be 1..65535", flag, v);
    if (*port_end == ':') {
        const char *b = port_end + 1;
        if (!prefill)
            return pd_errorf(PD_EINVAL,
                             "%s '%s': takes NAME:PORT (a bootstrap port is for --prefill-dns)",
                             flag, v);
        if (strcmp(b, "none") == 0 || strcmp(b, "null") == 0)
            out->bootstrap_port = PD_ROUTER_BOOTSTRAP_PORT_NULL;
        else if (!parse_port(b, strlen(b), &out->bootstrap_port))
            return pd_errorf(PD_EINVAL, "%s '%s': BOOTSTRAP_PORT must be 1..65535 or none", flag,
                             v);
    }
    out->name = pd_strndup(name, name_len);
    if (!out->name)
        return pd_errorf(PD_ENOMEM, "%s: copying the name", flag);
    return PD_OK;
}

void pd_router_dns_spec_free(struct pd_router_dns_spec *spec) {
    if (!spec)
        return;
    pd_free(spec->name);
    spec->name = NULL;
}

int pd_router_dns_server_parse(const char *v, char addr[16], int *port) {
    const char *colon = strchr(v, ':');
    size_t n = colon ? (size_t)(colon - v) : strlen(v);
    char lit[16];
    struct in_addr a4;
    if (n == 0 || n >= sizeof(lit))
        return pd_errorf(PD_EINVAL, "--dns-server '%s': takes an IPv4 address, A.B.C.D[:PORT]", v);
    memcpy(lit, v, n);
    lit[n] = '\0';
    if (inet_pton(AF_INET, lit, &a4) != 1)
        return pd_errorf(PD_EINVAL,
                         "--dns-server '%s': '%s' is not an IPv4 address (A.B.C.D[:PORT])", v, lit);
    *port = 53;
    if (colon && !parse_port(colon + 1, strlen(colon + 1), port))
        return pd_errorf(PD_EINVAL, "--dns-server '%s': PORT must be 1..65535", v);
    memcpy(addr, lit, n + 1);
    return PD_OK;
}

int pd_router_dns_worker_url(const char *addr, int port, char *buf, size_t size) {
    bool v6 = strchr(addr, ':') != NULL;
    int n = snprintf(buf, size, v6 ? "http://[%s]:%d" : "http://%s:%d", addr, port);
    if (n < 0 || (size_t)n >= size)
        return pd_errorf(PD_ERANGE, "worker URL for %s:%d too long", addr, port);
    return PD_OK;
}

int pd_router_dns_plan(const struct pd_router_dns_known *known, int n_known,
                       const char *const *answer, int n_answer, enum pd_router_dns_step *steps,
                       bool *add) {
    for (int k = 0; k < n_known; k++) {
        bool listed = false;
        for (int a = 0; a < n_answer && !listed; a++)
            listed = strcmp(known[k].addr, answer[a]) == 0;
        if (listed)
            steps[k] = known[k].draining ? PD_ROUTER_DNS_REVIVE : PD_ROUTER_DNS_KEEP;
        else if (known[k].inflight > 0)
            steps[k] = known[k].draining ? PD_ROUTER_DNS_KEEP : PD_ROUTER_DNS_DRAIN;
        else
            steps[k] = PD_ROUTER_DNS_REMOVE;
    }
    int n_add = 0;
    for (int a = 0; a < n_answer; a++) {
        bool seen = false;
        for (int k = 0; k < n_known && !seen; k++)
            seen = strcmp(known[k].addr, answer[a]) == 0;
        for (int b = 0; b < a && !seen; b++)
            seen = strcmp(answer[b], answer[a]) == 0;
        add[a] = !seen;
        n_add += !seen;
    }
    return n_add;
}
