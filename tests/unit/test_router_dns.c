/* Router DNS discovery, the pure parts: NAME:PORT[:BOOTSTRAP_PORT] (names, bracketed IPv6, bad
 * ports, empty names, URLs given by mistake), --dns-server, worker URLs for resolved addresses,
 * the answer-to-registry plan (add, keep, drain, revive, remove; duplicates; empty answers), and
 * the command line combining --prefill-dns/--decode-dns with static workers. */
#include "pd_test.h"

#include "router/config.h"
#include "router/discovery.h"

#include <stdarg.h>

static void test_spec_forms(void) {
    struct pd_router_dns_spec s;
    CHECK_OK(
        pd_router_dns_spec_parse("--prefill-dns", "pf.ns.svc.cluster.local:8000:8998", true, &s));
    CHECK_STR(s.name, "pf.ns.svc.cluster.local");
    CHECK_INT(s.port, 8000);
    CHECK_INT(s.bootstrap_port, 8998);
    pd_router_dns_spec_free(&s);
    CHECK_OK(pd_router_dns_spec_parse("--prefill-dns", "pf:8000", true, &s));
    CHECK_STR(s.name, "pf");
    CHECK_INT(s.bootstrap_port, PD_ROUTER_BOOTSTRAP_PORT_NULL);
    pd_router_dns_spec_free(&s);
    CHECK_OK(pd_router_dns_spec_parse("--prefill-dns", "pf:8000:none", true, &s));
    CHECK_INT(s.bootstrap_port, PD_ROUTER_BOOTSTRAP_PORT_NULL);
    pd_router_dns_spec_free(&s);
    CHECK_OK(pd_router_dns_spec_parse("--decode-dns", "decode_svc-1:65535", false, &s));
    CHECK_STR(s.name, "decode_svc-1");
    CHECK_INT(s.port, 65535);
    pd_router_dns_spec_free(&s);
    /* address literals: IPv4 as is, IPv6 in brackets (brackets dropped from the name) */
    CHECK_OK(pd_router_dns_spec_parse("--decode-dns", "10.1.2.3:1", false, &s));
    CHECK_STR(s.name, "10.1.2.3");
    CHECK_INT(s.port, 1);
    pd_router_dns_spec_free(&s);
    CHECK_OK(pd_router_dns_spec_parse("--prefill-dns", "[fd00::1]:8000:8998", true, &s));
    CHECK_STR(s.name, "fd00::1");
    CHECK_INT(s.port, 8000);
    CHECK_INT(s.bootstrap_port, 8998);
    pd_router_dns_spec_free(&s);
    CHECK_OK(pd_router_dns_spec_parse("--decode-dns", "[::1]:30000", false, &s));
    CHECK_STR(s.name, "::1");
    pd_router_dns_spec_free(&s);
    pd_router_dns_spec_free(NULL);
}

static void test_spec_errors(void) {
    struct pd_router_dns_spec s;
    const char *f = "--prefill-dns";
    CHECK_ERR(pd_router_dns_spec_parse(f, ":8000", true, &s), PD_EINVAL, "empty NAME");
    CHECK_ERR(pd_router_dns_spec_parse(f, "", true, &s), PD_EINVAL, "empty NAME");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf", true, &s), PD_EINVAL, "PORT missing");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:", true, &s), PD_EINVAL, "PORT must be 1..65535");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:0", true, &s), PD_EINVAL, "PORT must be 1..65535");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:65536", true, &s), PD_EINVAL,
              "PORT must be 1..65535");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:-1", true, &s), PD_EINVAL, "PORT must be 1..65535");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:80x", true, &s), PD_EINVAL, "PORT must be 1..65535");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:99999999999999999999", true, &s), PD_EINVAL,
              "PORT must be 1..65535");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:8000:0", true, &s), PD_EINVAL,
              "BOOTSTRAP_PORT must be 1..65535 or none");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:8000:", true, &s), PD_EINVAL,
              "BOOTSTRAP_PORT must be 1..65535 or none");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf:8000:8998:1", true, &s), PD_EINVAL,
              "BOOTSTRAP_PORT must be 1..65535 or none");
    CHECK_ERR(pd_router_dns_spec_parse("--decode-dns", "dc:8000:8998", false, &s), PD_EINVAL,
              "--decode-dns 'dc:8000:8998': takes NAME:PORT");
    CHECK_ERR(pd_router_dns_spec_parse(f, "http://pf:8000", true, &s), PD_EINVAL, "not a URL");
    CHECK_ERR(pd_router_dns_spec_parse(f, "pf/x:8000", true, &s), PD_EINVAL, "letters, digits");
    CHECK_ERR(pd_router_dns_spec_parse(f, "p f:8000", true, &s), PD_EINVAL, "letters, digits");
    /* IPv6 without brackets, broken brackets, something else in them */
    CHECK_ERR(pd_router_dns_spec_parse(f, "fd00::1:8000", true, &s), PD_EINVAL,
              "IPv6 address goes in brackets");
    CHECK_ERR(pd_router_dns_spec_parse(f, "::1:8000", true, &s), PD_EINVAL,
              "IPv6 address goes in brackets");
    CHECK_ERR(pd_router_dns_spec_parse(f, "fd00:0:0:1:8000", true, &s), PD_EINVAL,
              "IPv6 address goes in brackets");
    CHECK_ERR(pd_router_dns_spec_parse(f, "[fd00::1:8000", true, &s), PD_EINVAL, "unterminated");
    CHECK_ERR(pd_router_dns_spec_parse(f, "[]:8000", true, &s), PD_EINVAL, "empty");
    CHECK_ERR(pd_router_dns_spec_parse(f, "[pf]:8000", true, &s), PD_EINVAL,
              "is not an IPv6 address");
    CHECK_ERR(pd_router_dns_spec_parse(f, "[fd00::1]8000", true, &s), PD_EINVAL, "PORT missing");
    char longname[300];
    memset(longname, 'a', 254);
    strcpy(longname + 254, ":80");
    CHECK_ERR(pd_router_dns_spec_parse(f, longname, true, &s), PD_EINVAL, "longer than 253");
}

static void test_server_and_url(void) {
    char addr[16], url[80];
    int port;
    CHECK_OK(pd_router_dns_server_parse("127.0.0.1:5353", addr, &port));
    CHECK_STR(addr, "127.0.0.1");
    CHECK_INT(port, 5353);
    CHECK_OK(pd_router_dns_server_parse("10.96.0.10", addr, &port));
    CHECK_STR(addr, "10.96.0.10");
    CHECK_INT(port, 53);
    CHECK_ERR(pd_router_dns_server_parse("kube-dns:53", addr, &port), PD_EINVAL,
              "is not an IPv4 address");
    CHECK_ERR(pd_router_dns_server_parse("127.0.0.1:0", addr, &port), PD_EINVAL, "PORT");
    CHECK_ERR(pd_router_dns_server_parse(":53", addr, &port), PD_EINVAL, "IPv4");
    CHECK_OK(pd_router_dns_worker_url("10.0.0.7", 8000, url, sizeof(url)));
    CHECK_STR(url, "http://10.0.0.7:8000");
    CHECK_OK(pd_router_dns_worker_url("fd00::7", 8000, url, sizeof(url)));
    CHECK_STR(url, "http://[fd00::7]:8000");
    CHECK_ERR(pd_router_dns_worker_url("fd00::7", 8000, url, 10), PD_ERANGE, "too long");
}

/* Runs the plan and checks steps (one letter per known worker: K keep, D drain, R revive,
 * X remove) and adds (one letter per answer: + add, . not). */
static void plan_case(const struct pd_router_dns_known *known, int nk, const char *const *answer,
                      int na, const char *want_steps, const char *want_adds, int line) {
    enum pd_router_dns_step steps[16];
    bool add[16];
    char got_s[17] = {0}, got_a[17] = {0};
    int n_add = pd_router_dns_plan(known, nk, answer, na, steps, add);
    int count = 0;
    for (int i = 0; i < nk; i++)
        got_s[i] = "KDRX"[steps[i]];
    for (int i = 0; i < na; i++) {
        got_a[i] = add[i] ? '+' : '.';
        count += add[i];
    }
    if (strcmp(got_s, want_steps) || strcmp(got_a, want_adds))
        fprintf(stderr, "line %d: steps %s adds %s, want %s %s\n", line, got_s, got_a, want_steps,
                want_adds);
    CHECK_STR(got_s, want_steps);
    CHECK_STR(got_a, want_adds);
    CHECK_INT(n_add, count);
}

static void test_plan(void) {
    const char *none[1] = {NULL};
    /* first answer: everything is new; duplicates in an answer count once */
    const char *a1[] = {"10.0.0.1", "10.0.0.2", "10.0.0.1", "fd00::1"};
    plan_case(NULL, 0, a1, 4, "", "++.+", __LINE__);
    /* the same answer again: nothing changes */
    struct pd_router_dns_known k1[] = {{"10.0.0.1", false, 3}, {"10.0.0.2", false, 0}};
    const char *a2[] = {"10.0.0.2", "10.0.0.1"};
    plan_case(k1, 2, a2, 2, "KK", "..", __LINE__);
    /* one gone with requests in flight drains, one gone idle is removed, one new is added */
    const char *a3[] = {"10.0.0.3"};
    plan_case(k1, 2, a3, 1, "DX", "+", __LINE__);
    /* a draining worker: still gone → keeps draining while busy, removed when idle; back in the
     * answer → revived, not added twice */
    struct pd_router_dns_known k2[] = {
        {"10.0.0.1", true, 2}, {"10.0.0.2", true, 0}, {"10.0.0.3", true, 1}};
    const char *a4[] = {"10.0.0.3", "10.0.0.4"};
    plan_case(k2, 3, a4, 2, "KXR", ".+", __LINE__);
    /* an empty answer drains everything that is busy, removes the rest, adds nothing */
    struct pd_router_dns_known k3[] = {{"10.0.0.1", false, 1}, {"::1", false, 0}};
    plan_case(k3, 2, none, 0, "DX", "", __LINE__);
    /* addresses compare exactly: ::1 is not 0::1 (answers come canonical from inet_ntop) */
    struct pd_router_dns_known k4[] = {{"::1", false, 0}};
    const char *a5[] = {"::1", "127.0.0.1"};
    plan_case(k4, 1, a5, 2, "K", ".+", __LINE__);
}

static int parse(struct pd_router_config *cfg, ...) {
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"pdserve-router";
    va_list ap;
    va_start(ap, cfg);
    for (char *a = va_arg(ap, char *); a; a = va_arg(ap, char *))
        argv[argc++] = a;
    va_end(ap);
    return pd_router_config_parse(cfg, argc, argv);
}

static void test_command_line(void) {
    struct pd_router_config c;
    /* the chart's line */
    CHECK_OK(parse(&c, "--pd-disaggregation", "--prefill-dns",
                   "pdserve-prefill.default.svc.cluster.local:8000:8998", "--decode-dns",
                   "pdserve-decode:8000", "--dns-refresh-secs", "5", "--host", "0.0.0.0", "--port",
                   "8000", NULL));
    CHECK_INT(c.n_prefill, 0);
    CHECK_INT(c.n_decode, 0);
    CHECK_INT(c.n_prefill_dns, 1);
    CHECK_STR(c.prefill_dns[0].name, "pdserve-prefill.default.svc.cluster.local");
    CHECK_INT(c.prefill_dns[0].port, 8000);
    CHECK_INT(c.prefill_dns[0].bootstrap_port, 8998);
    CHECK_INT(c.n_decode_dns, 1);
    CHECK_STR(c.decode_dns[0].name, "pdserve-decode");
    CHECK_DBL(c.dns_refresh_secs, 5, 0);
    CHECK(c.dns_server == NULL);
    CHECK_INT(c.dns_family, PD_ROUTER_DNS_FAMILY_ANY);
    pd_router_config_free(&c);
    /* repeatable, both spellings, mixed with static workers; the other DNS flags */
    CHECK_OK(parse(&c, "--prefill", "http://10.0.0.1:30000", "9000", "--prefill-dns=a:1:2",
                   "--prefill-dns", "b:3", "--decode-dns", "c:4", "--decode", "http://d:5",
                   "--dns-server", "127.0.0.1:5353", "--dns-family", "ipv6", "--dns-refresh-secs",
                   "0.5", NULL));
    CHECK_INT(c.n_prefill, 1);
    CHECK_INT(c.prefill[0].bootstrap_port, 9000);
    CHECK_INT(c.n_prefill_dns, 2);
    CHECK_STR(c.prefill_dns[1].name, "b");
    CHECK_INT(c.prefill_dns[0].bootstrap_port, 2);
    CHECK_INT(c.n_decode_dns, 1);
    CHECK_INT(c.n_decode, 1);
    CHECK_STR(c.dns_server_addr, "127.0.0.1");
    CHECK_INT(c.dns_server_port, 5353);
    CHECK_INT(c.dns_family, PD_ROUTER_DNS_FAMILY_IPV6);
    CHECK_DBL(c.dns_refresh_secs, 0.5, 1e-12);
    pd_router_config_free(&c);
    /* a DNS name is enough for either role */
    CHECK_OK(parse(&c, "--prefill", "http://a:1", "--decode-dns", "dc:2", NULL));
    pd_router_config_free(&c);
    /* errors name the flag */
    CHECK_ERR(parse(&c, "--prefill-dns", "pf:1", NULL), PD_EINVAL, "(or --decode-dns NAME:PORT)");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--decode-dns", "dc:1", NULL), PD_EINVAL,
              "(or --prefill-dns NAME:PORT[:BOOTSTRAP_PORT])");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill-dns", "--decode-dns", "dc:1", NULL), PD_EINVAL,
              "--prefill-dns needs a value");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill-dns", "pf:1", "--decode-dns", "dc:1:2", NULL), PD_EINVAL,
              "--decode-dns 'dc:1:2'");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill-dns", "pf:1", "--decode-dns", "dc:1", "--dns-server",
                    "dns.local", NULL),
              PD_EINVAL, "--dns-server 'dns.local'");
    pd_router_config_free(&c);
    CHECK_ERR(
        parse(&c, "--prefill-dns", "pf:1", "--decode-dns", "dc:1", "--dns-family", "ip4", NULL),
        PD_EINVAL, "--dns-family");
    pd_router_config_free(&c);
    CHECK_ERR(
        parse(&c, "--prefill-dns", "pf:1", "--decode-dns", "dc:1", "--dns-refresh-secs", "0", NULL),
        PD_EINVAL, "--dns-refresh-secs");
    pd_router_config_free(&c);
}

static void test_help(void) {
    struct pd_router_config c;
    CHECK_OK(parse(&c, "--help", NULL));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    pd_router_config_usage(&c, f);
    fclose(f);
    static const char *const want[] = {
        "--prefill-dns", "NAME:PORT[:BOOTSTRAP_PORT]", "--decode-dns", "--dns-refresh-secs",
        "--dns-server",  "bypass resolv.conf",         "--dns-family"};
    for (size_t i = 0; i < PD_ARRAY_LEN(want); i++) {
        if (!strstr(text, want[i]))
            fprintf(stderr, "--help lacks %s\n", want[i]);
        CHECK(strstr(text, want[i]) != NULL);
    }
    free(text);
    pd_router_config_free(&c);
}

PD_TEST_MAIN(PD_TEST(test_spec_forms), PD_TEST(test_spec_errors), PD_TEST(test_server_and_url),
             PD_TEST(test_plan), PD_TEST(test_command_line), PD_TEST(test_help))
