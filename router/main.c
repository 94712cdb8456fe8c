/*
 * main.c — pdserve-router: parses the command line, runs the router on the default libuv loop,
 * and stops on SIGTERM/SIGINT: no new connections, in-flight requests may finish for
 * --shutdown-timeout seconds, then the rest are aborted on their workers; the loop runs out once
 * every handle is closed and the process exits 0. A second signal aborts what is left at once.
 */
#include "router/config.h"
#include "router/router.h"

#include "common/base/log.h"
#include "common/base/status.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static struct pd_router_config g_cfg;
static struct pd_router *g_router;
static uv_signal_t g_sigint, g_sigterm;

static void on_router_done(struct pd_router *rt, void *ud) {
    (void)rt;
    (void)ud;
    uv_close((uv_handle_t *)&g_sigint, NULL);
    uv_close((uv_handle_t *)&g_sigterm, NULL);
}

static void on_signal(uv_signal_t *s, int signum) {
    (void)s;
    pd_info("signal %d: shutting down", signum);
    pd_router_shutdown(g_router, (uint64_t)g_cfg.shutdown_timeout_secs * 1000, on_router_done,
                       NULL);
}

int main(int argc, char **argv) {
    pd_log_set_name("router");
    signal(SIGPIPE, SIG_IGN);
    int rc = pd_router_config_parse(&g_cfg, argc, argv);
    if (rc) {
        fprintf(stderr, "pdserve-router: %s\n(see pdserve-router --help)\n", pd_error_msg());
        pd_router_config_free(&g_cfg);
        return 2;
    }
    if (g_cfg.help) {
        pd_router_config_usage(&g_cfg, stdout);
        pd_router_config_free(&g_cfg);
        return 0;
    }
    pd_log_set_level((enum pd_log_level)g_cfg.log_level);
    uv_loop_t *loop = uv_default_loop();
    rc = pd_router_new(loop, &g_cfg, &g_router);
    if (rc) {
        pd_error("starting: %s", pd_error_msg());
        return 1; /* the router holds loop handles; the process ends here */
    }
    pd_info("listening on %s://%s:%d (%d prefill, %d decode workers, %d prefill and %d decode "
            "DNS names, policy %s, prefill %s, decode %s)",
            pd_tls_flags_serving(&g_cfg.tls) ? "https" : "http", g_cfg.host,
            pd_router_port(g_router), g_cfg.n_prefill, g_cfg.n_decode, g_cfg.n_prefill_dns,
            g_cfg.n_decode_dns, pd_router_policy_names[g_cfg.policy],
            pd_router_policy_name(g_cfg.prefill_policy),
            pd_router_policy_name(g_cfg.decode_policy));
    uv_signal_init(loop, &g_sigint);
    uv_signal_init(loop, &g_sigterm);
    uv_signal_start(&g_sigint, on_signal, SIGINT);
    uv_signal_start(&g_sigterm, on_signal, SIGTERM);
    uv_run(loop, UV_RUN_DEFAULT);
    pd_router_free(g_router);
    pd_router_config_free(&g_cfg);
    rc = uv_loop_close(loop);
    if (rc)
        pd_warn("uv_loop_close: %s (a handle was left open)", uv_strerror(rc));
    pd_info("stopped");
    return 0;
}
