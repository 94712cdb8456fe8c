/* pdserve-router's command line: the --prefill URL [BOOTSTRAP_PORT] pre-pass (optional second
 * value, repeatable, both spellings), --decode, the shared flags after it, and the messages for
 * a wrong command line. */
#include "pd_test.h"

#include "router/config.h"

#include <stdarg.h>

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

static void test_sglang_router_line(void) {
    struct pd_router_config c;
    CHECK_OK(parse(&c, "--pd-disaggregation", "--prefill", "http://10.0.0.1:30000", "9000",
                   "--prefill", "http://10.0.0.2:30001/", "--decode", "http://10.0.0.3:30002",
                   "--prefill=http://pf3:7", "--decode", "http://[::1]:8080", "--policy",
                   "power_of_two", "--host", "0.0.0.0", "--port", "8000", "--api-key", "sk",
                   "--request-timeout-secs", "60", "--max-concurrent-requests", "7",
                   "--shutdown-timeout", "5", "--stream-buffer-bytes", "65536", NULL));
    CHECK(c.pd_disaggregation);
    CHECK_INT(c.n_prefill, 3);
    CHECK_STR(c.prefill[0].url, "http://10.0.0.1:30000");
    CHECK_STR(c.prefill[0].host, "10.0.0.1");
    CHECK_INT(c.prefill[0].port, 30000);
    CHECK_INT(c.prefill[0].bootstrap_port, 9000);
    CHECK_STR(c.prefill[1].url, "http://10.0.0.2:30001"); /* trailing slash dropped */
    CHECK_INT(c.prefill[1].bootstrap_port, PD_ROUTER_BOOTSTRAP_PORT_NULL);
    CHECK_STR(c.prefill[2].host, "pf3");
    CHECK_INT(c.n_decode, 2);
    CHECK_STR(c.decode[1].host, "::1");
    CHECK_INT(c.decode[1].port, 8080);
    CHECK_INT(c.policy, PD_ROUTER_POLICY_POWER_OF_TWO);
    CHECK_STR(c.host, "0.0.0.0");
    CHECK_INT(c.port, 8000);
    CHECK_STR(c.api_key, "sk");
    CHECK_INT(c.request_timeout_secs, 60);
    CHECK_INT(c.max_concurrent_requests, 7);
    CHECK_INT(c.shutdown_timeout_secs, 5);
    CHECK_INT(c.stream_buffer_bytes, 65536);
    pd_router_config_free(&c);
    /* defaults */
    CHECK_OK(parse(&c, "--prefill", "http://a:1", "--decode", "http://b:2", NULL));
    CHECK_INT(c.shutdown_timeout_secs, 30);
    CHECK_INT(c.stream_buffer_bytes, 256 << 10);
    pd_router_config_free(&c);
}

static void test_bootstrap_port_forms(void) {
    struct pd_router_config c;
    /* "none" = null; a port right before another flag; a port as the last argument */
    CHECK_OK(parse(&c, "--prefill", "http://a:1", "none", "--prefill", "http://b:2", "8998",
                   "--decode", "http://c:3", NULL));
    CHECK_INT(c.prefill[0].bootstrap_port, PD_ROUTER_BOOTSTRAP_PORT_NULL);
    CHECK_INT(c.prefill[1].bootstrap_port, 8998);
    pd_router_config_free(&c);
    CHECK_OK(parse(&c, "--decode", "http://c:3", "--prefill", "http://a:1", "8999", NULL));
    CHECK_INT(c.prefill[0].bootstrap_port, 8999);
    CHECK(c.tls.certfile == NULL && c.tls.ca_certs == NULL); /* no TLS unless asked */
    CHECK_INT(c.policy, PD_ROUTER_POLICY_ROUND_ROBIN);       /* defaults */
    CHECK_INT(c.port, 30000);
    CHECK(c.api_key == NULL);
    pd_router_config_free(&c);
    /* https:// workers: the URL as given (curl speaks TLS to it), 443 when no port */
    CHECK_OK(parse(&c, "--prefill", "https://a", "--decode", "https://b:8443/", "--ssl-ca-certs",
                   "/ca.pem", NULL));
    CHECK_STR(c.prefill[0].url, "https://a");
    CHECK_STR(c.prefill[0].host, "a");
    CHECK_INT(c.prefill[0].port, 443);
    CHECK_STR(c.decode[0].url, "https://b:8443");
    CHECK_INT(c.decode[0].port, 8443);
    CHECK_STR(c.tls.ca_certs, "/ca.pem");
    pd_router_config_free(&c);
}

static void test_errors(void) {
    struct pd_router_config c;
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "99999", "--decode", "http://c:3", NULL),
              PD_EINVAL, "BOOTSTRAP_PORT must be 1..65535 or none");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "--decode", "http://c:3", NULL), PD_EINVAL,
              "--prefill needs a URL");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "ftp://a:1", "--decode", "http://c:3", NULL), PD_EINVAL,
              "must start with http:// or https://");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "https://a:1/v1", "--decode", "http://c:3", NULL), PD_EINVAL,
              "https://host:port with no path");
    pd_router_config_free(&c);
    /* TLS: one of the certificate and its key alone is refused, naming the other */
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "--decode", "http://c:3", "--ssl-certfile",
                    "/x.pem", NULL),
              PD_EINVAL, "needs --ssl-keyfile");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "--decode", "http://c:3", "--ssl-keyfile",
                    "/x.key", NULL),
              PD_EINVAL, "needs --ssl-certfile");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:1/v1", "--decode", "http://c:3", NULL), PD_EINVAL,
              "no path");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:0", "--decode", "http://c:3", NULL), PD_EINVAL,
              "port must be 1..65535");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", NULL), PD_EINVAL, "--decode URL is required");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--decode", "http://a:1", NULL), PD_EINVAL, "--prefill URL");
    pd_router_config_free(&c);
    /* the decode URL takes no second value: the stray one reaches the shared parser */
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "--decode", "http://c:3", "9", NULL), PD_EINVAL,
              "9");
    pd_router_config_free(&c);
    CHECK_ERR(
        parse(&c, "--prefill", "http://a:1", "--decode", "http://c:3", "--policy", "lru", NULL),
        PD_EINVAL, "cache_aware");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "--decode", "http://c:3", "--prefil", "x", NULL),
              PD_EINVAL, "--prefil");
    pd_router_config_free(&c);
}

static void test_help_documents_every_flag(void) {
    struct pd_router_config c;
    CHECK_OK(parse(&c, "--prefill", "--help", NULL)); /* --help wins over a broken line */
    CHECK(c.help);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    pd_router_config_usage(&c, f);
    fclose(f);
    static const char *const flags[] = {"--pd-disaggregation",
                                        "--prefill",
                                        "URL [BOOTSTRAP_PORT]",
                                        "--decode",
                                        "--policy",
                                        "--host",
                                        "--port",
                                        "--api-key",
                                        "--request-timeout-secs",
                                        "--max-concurrent-requests",
                                        "--health-check-interval-secs",
                                        "--shutdown-timeout",
                                        "--stream-buffer-bytes",
                                        "--cb-failure-threshold",
                                        "--cb-success-threshold",
                                        "--cb-timeout-duration-secs",
                                        "--cb-window-duration-secs",
                                        "--disable-circuit-breaker",
                                        "--retry-max-retries",
                                        "--retry-initial-backoff-ms",
                                        "--retry-max-backoff-ms",
                                        "--retry-backoff-multiplier",
                                        "--retry-jitter-factor",
                                        "--disable-retries",
                                        "--log-level"};
    for (size_t i = 0; i < PD_ARRAY_LEN(flags); i++) {
        if (!strstr(text, flags[i]))
            fprintf(stderr, "--help lacks %s\n", flags[i]);
        CHECK(strstr(text, flags[i]) != NULL);
    }
    free(text);
    pd_router_config_free(&c);
}

/* sglang-router's reliability flags: its defaults, values taken, --disable-* and bad bounds. */
static void test_breaker_and_retry_flags(void) {
    struct pd_router_config c;
    CHECK_OK(parse(&c, "--prefill", "http://a:1", "--decode", "http://b:2", NULL));
    CHECK(!c.cb.disabled);
    CHECK_INT(c.cb.failure_threshold, 5);
    CHECK_INT(c.cb.success_threshold, 2);
    CHECK_DBL(c.cb.timeout_s, 30, 0);
    CHECK_DBL(c.cb.window_s, 60, 0);
    CHECK_INT(c.retry_max_retries, 5);
    CHECK_DBL(c.backoff.initial_ms, 50, 0);
    CHECK_DBL(c.backoff.max_ms, 30000, 0);
    CHECK_DBL(c.backoff.multiplier, 1.5, 0);
    CHECK_DBL(c.backoff.jitter, 0.2, 0);
    pd_router_config_free(&c);
    CHECK_OK(parse(&c, "--prefill", "http://a:1", "--decode", "http://b:2",
                   "--cb-failure-threshold", "2", "--cb-success-threshold", "3",
                   "--cb-timeout-duration-secs", "0.5", "--cb-window-duration-secs", "7",
                   "--retry-max-retries", "3", "--retry-initial-backoff-ms", "10",
                   "--retry-max-backoff-ms", "20", "--retry-backoff-multiplier", "2",
                   "--retry-jitter-factor", "0", NULL));
    CHECK_INT(c.cb.failure_threshold, 2);
    CHECK_INT(c.cb.success_threshold, 3);
    CHECK_DBL(c.cb.timeout_s, 0.5, 0);
    CHECK_DBL(c.cb.window_s, 7, 0);
    CHECK_INT(c.retry_max_retries, 3);
    CHECK_DBL(c.backoff.max_ms, 20, 0);
    pd_router_config_free(&c);
    CHECK_OK(parse(&c, "--prefill", "http://a:1", "--decode", "http://b:2",
                   "--disable-circuit-breaker", "--disable-retries", NULL));
    CHECK(c.cb.disabled);
    CHECK_INT(c.retry_max_retries, 1);
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "--decode", "http://b:2",
                    "--cb-failure-threshold", "0", NULL),
              PD_EINVAL, "--cb-failure-threshold");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "--decode", "http://b:2",
                    "--retry-jitter-factor", "1.5", NULL),
              PD_EINVAL, "--retry-jitter-factor");
    pd_router_config_free(&c);
    CHECK_ERR(parse(&c, "--prefill", "http://a:1", "--decode", "http://b:2",
                    "--retry-initial-backoff-ms", "100", "--retry-max-backoff-ms", "50", NULL),
              PD_EINVAL, "below --retry-initial-backoff-ms");
    pd_router_config_free(&c);
}

PD_TEST_MAIN(PD_TEST(test_sglang_router_line), PD_TEST(test_bootstrap_port_forms),
             PD_TEST(test_errors), PD_TEST(test_help_documents_every_flag),
             PD_TEST(test_breaker_and_retry_flags))
