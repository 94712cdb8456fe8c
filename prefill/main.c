/*
 * main.c — pdserve-prefill: the prefill daemon of prefill/decode disaggregation (DESIGN.md §2).
 * The daemon's body is common/daemon.c; what makes it the prefill is its role (prefill/role.c:
 * the bootstrap server, the sender; prefill/engine_prefill.c: the bootstrap, waiting and
 * inflight queues on the compute thread). Prefill and decode share code through common/ and
 * never through each other.
 */
#include "prefill/role.h"

int main(int argc, char **argv) {
    return pd_daemon_main(&pd_prefill_role, argc, argv);
}
