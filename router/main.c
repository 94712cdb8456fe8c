/*
 * main.c — pdserve-router: parses the command line, starts the router on a libuv loop, and stops
 * on SIGINT/SIGTERM: no new connections, in-flight requests aborted on their workers and
 * answered with an error, then exit 0 once the aborts went out (at most ~2 s). The router and
 * its HTTP server live until the process exits.
 */
#include "router/config.h"
#include "router/router.h"

#include "common/log.h"
#include "common/status.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static struct pd_router_config g_cfg;
static struct pd_router *g_router; /* process lifetime */
static uv_signal_t g_sigint, g_sigterm;
static uv_timer_t g_stop_timer;

static void on_stop_timer(uv_timer_t *t) {
    uv_stop(t->loop);
}

static void on_signal(uv_signal_t *s, int signum) {
    pd_info("signal %d: shutting down", signum);
    uv_signal_stop(&g_sigint);
    uv_signal_stop(&g_sigterm);
    pd_router_shutdown(g_router);
    /* let the abort requests and error answers go out */
    uv_timer_init(s->loop, &g_stop_timer);
    uv_timer_start(&g_stop_timer, on_stop_timer, 300, 0);
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
        return 1;
    }
    pd_info("listening on http://%s:%d (%d prefill, %d decode workers, policy %s)", g_cfg.host,
            pd_router_port(g_router), g_cfg.n_prefill, g_cfg.n_decode,
            pd_router_policy_names[g_cfg.policy]);
    uv_signal_init(loop, &g_sigint);
    uv_signal_init(loop, &g_sigterm);
    uv_signal_start(&g_sigint, on_signal, SIGINT);
    uv_signal_start(&g_sigterm, on_signal, SIGTERM);
    uv_run(loop, UV_RUN_DEFAULT);
    pd_info("stopped");
    return 0;
}
