/* The done notice's wire format (common/xfer.h): every field survives a round trip, the first
 * token's top logprobs included; a notice without them (an older sender's) still decodes; a
 * length that disagrees with the error text and the top count is refused, never trusted. */
#include "pd_test.h"

#include "common/xfer.h"

static void test_round_trip_with_top(void) {
    struct pd_xfer_notice n = {.room = 0x7fffffffffffffffull,
                               .status = PD_OK,
                               .first_token = 812,
                               .first_logprob = -0.25f,
                               .cached_tokens = 48,
                               .data_bytes = 123456789,
                               .sender_us = {17, 4000000, 0xffffffffu},
                               .n_top = 3,
                               .top_ids = {812, 7, 1023},
                               .top_logprobs = {-0.25f, -1.5f, -9.75f}};
    snprintf(n.error, sizeof(n.error), "%s", "");
    uint8_t buf[1024];
    size_t len = pd_xfer_notice_encode(&n, 99, buf, sizeof(buf));
    CHECK_INT(len, PD_XFER_NOTICE_WIRE_MIN + 1 + 3 * 8);
    struct pd_xfer_notice d;
    uint64_t sender = 0;
    CHECK_OK(pd_xfer_notice_decode(buf, len, &d, &sender));
    CHECK_INT(sender, 99);
    CHECK(d.room == n.room);
    CHECK_INT(d.first_token, 812);
    CHECK(d.first_logprob == -0.25f);
    CHECK_INT(d.cached_tokens, 48);
    CHECK_INT(d.data_bytes, 123456789);
    for (int k = 0; k < PD_XFER_NOTICE_STAGES; k++)
        CHECK_INT(d.sender_us[k], n.sender_us[k]);
    CHECK_INT(d.n_top, 3);
    for (int k = 0; k < 3; k++) {
        CHECK_INT(d.top_ids[k], n.top_ids[k]);
        CHECK(d.top_logprobs[k] == n.top_logprobs[k]);
    }
    /* the buffer must hold the top logprobs too */
    CHECK_INT(pd_xfer_notice_encode(&n, 99, buf, len - 1), 0);
    /* a truncated or padded top section is refused */
    CHECK_ERR(pd_xfer_notice_decode(buf, len - 1, &d, &sender), PD_EFORMAT, "top logprobs");
    buf[PD_XFER_NOTICE_WIRE_MIN] = PD_XFER_NOTICE_TOP_MAX + 1;
    CHECK_ERR(pd_xfer_notice_decode(buf, len, &d, &sender), PD_EFORMAT, "top logprobs");
}

static void test_failed_notice_without_top(void) {
    struct pd_xfer_notice n = {.room = 5, .status = PD_ECANCELED, .first_token = -1};
    snprintf(n.error, sizeof(n.error), "%s", "client went away");
    uint8_t buf[1024];
    size_t len = pd_xfer_notice_encode(&n, 1, buf, sizeof(buf));
    CHECK_INT(len, PD_XFER_NOTICE_WIRE_MIN + strlen("client went away"));
    struct pd_xfer_notice d;
    uint64_t sender;
    CHECK_OK(pd_xfer_notice_decode(buf, len, &d, &sender));
    CHECK_INT(d.status, PD_ECANCELED);
    CHECK_INT(d.n_top, 0);
    CHECK_STR(d.error, "client went away");
    /* a notice of the layout before sender_us (magic 0x5044) is refused, never misread */
    buf[0] = 0x44;
    buf[1] = 0x50;
    CHECK_ERR(pd_xfer_notice_decode(buf, len, &d, &sender), PD_EFORMAT, "magic");
}

static void put_answer_status(uint8_t *buf, int32_t v) {
    for (int i = 0; i < 4; i++)
        buf[18 + i] = (uint8_t)((uint32_t)v >> (8 * i));
}

/* Calls and answers over a pair's endpoints (xfer_call.c): round trips, and every malformed form
 * refused by name. */
static void test_call_and_answer_wire(void) {
    uint8_t body[300], buf[1024];
    for (size_t i = 0; i < sizeof(body); i++)
        body[i] = (uint8_t)(i * 7 + 1);
    struct pd_xfer_ctl c = {
        .sender_id = 0x1122334455667788ull, .call_id = 42, .method = 1, .body = body, .len = 300};
    size_t len = pd_xfer_ctl_encode(&c, false, buf, sizeof(buf));
    CHECK(len > 300);
    CHECK_INT(pd_xfer_ctl_encode(&c, false, buf, len - 1), 0); /* must hold the whole body */
    struct pd_xfer_ctl d;
    CHECK_OK(pd_xfer_ctl_decode(buf, len, false, &d));
    CHECK(d.sender_id == c.sender_id && d.call_id == 42 && d.method == 1 && !d.answer);
    CHECK_INT(d.len, 300);
    CHECK(memcmp(d.body, body, 300) == 0);
    /* a call is not an answer, and no prefix of it decodes */
    CHECK_ERR(pd_xfer_ctl_decode(buf, len, true, &d), PD_EFORMAT, "magic");
    CHECK_ERR(pd_xfer_ctl_decode(buf, 21, false, &d), PD_EFORMAT, "shorter");

    struct pd_xfer_ctl a = {.sender_id = 7, .call_id = 43, .status = PD_EMISMATCH};
    snprintf(a.text, sizeof(a.text), "%s", "Transfer: FAILED_PRECONDITION: layout mismatch");
    len = pd_xfer_ctl_encode(&a, true, buf, sizeof(buf));
    CHECK_OK(pd_xfer_ctl_decode(buf, len, true, &d));
    CHECK(d.call_id == 43 && d.status == PD_EMISMATCH && d.len == 0);
    CHECK_STR(d.text, "Transfer: FAILED_PRECONDITION: layout mismatch");
    /* a text that runs past the message is refused; an unknown failure stays a failure */
    CHECK_ERR(pd_xfer_ctl_decode(buf, 30, true, &d), PD_EFORMAT, "text");
    put_answer_status(buf, 12345);
    CHECK_OK(pd_xfer_ctl_decode(buf, len, true, &d));
    CHECK_INT(d.status, PD_EPEER);
    /* an answer with a reply: the bytes after the text */
    a.status = PD_OK;
    a.text[0] = '\0';
    a.body = body;
    a.len = 5;
    len = pd_xfer_ctl_encode(&a, true, buf, sizeof(buf));
    CHECK_OK(pd_xfer_ctl_decode(buf, len, true, &d));
    CHECK(d.status == PD_OK && d.len == 5 && memcmp(d.body, body, 5) == 0);
}

PD_TEST_MAIN(PD_TEST(test_round_trip_with_top), PD_TEST(test_failed_notice_without_top),
             PD_TEST(test_call_and_answer_wire))
