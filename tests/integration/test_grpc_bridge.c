/*
 * test_grpc_bridge.c — the gRPC bridge's client against its own server on 127.0.0.1: which
 * connection a channel holds (pd_grpc_channel_connection). The decode trusts its Transfers to a
 * pairing's UCX endpoint only while the gRPC connection the pairing was made over lasts
 * (decode/bootstrap_client.c over_ucx), so a server that went away and came back on the same
 * address must show as a different connection, and one that stayed as the same.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/grpc_bridge.h"
#include "pd_test.h"

#define METHOD "/pdserve.v1.Test/Echo"

static uv_loop_t loop;
static int served; /* calls the current server answered */
static int replies, last_status;

static void serve(void *ctx, const char *method, const char *peer, const uint8_t *req,
                  size_t req_len, struct pd_grpc_answer *ans) {
    (void)ctx;
    (void)method;
    (void)peer;
    served++;
    ans->code = PD_GRPC_OK;
    ans->reply = req;
    ans->reply_len = req_len;
}

static void on_reply(void *ctx, int status, const uint8_t *reply, size_t len) {
    (void)ctx;
    (void)reply;
    (void)len;
    last_status = status;
    replies++;
}

static uint64_t ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Runs the loop until cond() holds or ms pass; returns whether it held. */
static bool run_until(bool (*cond)(void), int ms) {
    uint64_t end = ms_now() + (uint64_t)ms;
    while (!cond()) {
        if (ms_now() > end)
            return false;
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    return true;
}

static int want_replies;
static bool replied(void) {
    return replies >= want_replies;
}

static pd_grpc_channel_t *ch;
static bool disconnected(void) {
    return pd_grpc_channel_connection(ch) == 0;
}

static bool call_ok(void) {
    want_replies = replies + 1;
    if (pd_grpc_call(ch, METHOD, (const uint8_t *)"hi", 2, 5000, on_reply, NULL) != PD_OK)
        return false;
    return run_until(replied, 10000) && last_status == PD_OK;
}

static void test_connection_numbers(void) {
    CHECK_OK(uv_loop_init(&loop));
    pd_grpc_bridge_t *b = NULL;
    CHECK_OK(pd_grpc_bridge_new(&loop, &b));
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", pd_test_free_port());
    pd_grpc_server_t *s = NULL;
    CHECK_OK(pd_grpc_server_new(b, addr, NULL, serve, NULL, &s));
    CHECK_OK(pd_grpc_channel_new(b, addr, NULL, &ch));

    CHECK_INT(pd_grpc_channel_connection(ch), 0); /* a channel connects only for a call */
    CHECK(call_ok());
    uint64_t first = pd_grpc_channel_connection(ch);
    CHECK(first != 0);
    CHECK(call_ok());
    CHECK_INT(pd_grpc_channel_connection(ch), first); /* the same connection serves on */
    CHECK_INT(served, 2);

    /* the server goes away: the channel holds no connection once gRPC has read that */
    pd_grpc_server_free(s);
    CHECK(run_until(disconnected, 10000));
    /* another server on the same address: the next call connects to it, as a new connection */
    CHECK_OK(pd_grpc_server_new(b, addr, NULL, serve, NULL, &s));
    served = 0;
    CHECK(call_ok());
    CHECK_INT(served, 1);
    uint64_t second = pd_grpc_channel_connection(ch);
    CHECK(second != 0 && second != first);
    CHECK(call_ok());
    CHECK_INT(pd_grpc_channel_connection(ch), second);

    /* and again, without looking while it is down: the call looks before it connects */
    pd_grpc_server_free(s);
    for (uint64_t end = ms_now() + 500; ms_now() < end;) { /* gRPC reads the end; we do not ask */
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    CHECK_OK(pd_grpc_server_new(b, addr, NULL, serve, NULL, &s));
    bool ok = call_ok();
    if (!ok) /* the call went out on the dying connection before gRPC read its end */
        ok = call_ok();
    CHECK(ok);
    uint64_t third = pd_grpc_channel_connection(ch);
    CHECK(third != 0 && third != second && third != first);

    pd_grpc_channel_free(ch);
    pd_grpc_server_free(s);
    pd_grpc_bridge_free(b);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_OK(uv_loop_close(&loop));
}

PD_TEST_MAIN(PD_TEST(test_connection_numbers))
