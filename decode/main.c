/*
 * main.c — pdserve-decode: the decode daemon of prefill/decode disaggregation (DESIGN.md §2). Its
 * whole body is common/daemon.c with the decode role (queues, transfer direction and HTTP answer
 * differ by role there); this file only picks the role, so that prefill and decode share code
 * through common/ and never through each other.
 */
#include "common/daemon.h"

int main(int argc, char **argv) {
    return pd_daemon_main(PD_ENGINE_DECODE, argc, argv);
}
