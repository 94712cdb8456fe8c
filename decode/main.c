/*
 * main.c — pdserve-decode: the decode daemon of prefill/decode disaggregation (DESIGN.md §2),
 * or a colocated server with --disaggregation-mode null. The daemon's body is common/daemon.c;
 * what makes it the decode is its role (decode/role.c: the bootstrap clients, the receiver's
 * done notice, streaming the output; decode/engine_decode.c and decode/engine_coloc.c: the
 * prealloc, transfer and running queues, or the colocated steps, on the compute thread).
 */
#include "decode/role.h"

int main(int argc, char **argv) {
    return pd_daemon_main(&pd_decode_role, argc, argv);
}
