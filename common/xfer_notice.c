/*
 * xfer_notice.c — the notice a sender ends a room with, on the wire: little-endian fields,
 * a magic and version, the error text and the top-n entries (pd_xfer_notice_encode/decode).
 */
#include "common/xfer_internal.h"

/* ---- notice wire format ---- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
void pd__xfer_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
void pd__xfer_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
uint32_t pd__xfer_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
uint64_t pd__xfer_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Layout: magic u16 | sender_id u64 | room u64 | status i32 | first_token i32 | logprob f32 |
 * cached_tokens u32 | error_len u16 | data_bytes u64 | sender_us 3 x u32 | error bytes (no NUL)
 * | when n_top > 0: n_top u8 | n_top x (id i32 | logprob f32). The magic names the layout: a
 * notice of another one (0x5044 had no sender_us) is refused, never misread. */
#define NOTICE_MAGIC 0x5145u

size_t pd_xfer_notice_encode(const struct pd_xfer_notice *n, uint64_t sender_id, uint8_t *buf,
                             size_t cap) {
    size_t elen = strnlen(n->error, PD_XFER_ERROR_TEXT_MAX);
    uint32_t n_top = n->n_top < PD_XFER_NOTICE_TOP_MAX ? n->n_top : PD_XFER_NOTICE_TOP_MAX;
    size_t tlen = n_top ? 1 + 8 * (size_t)n_top : 0;
    if (cap < PD_XFER_NOTICE_WIRE_MIN + elen + tlen)
        return 0;
    uint32_t lp;
    memcpy(&lp, &n->first_logprob, sizeof(lp));
    put_u16(buf, NOTICE_MAGIC);
    pd__xfer_put_u64(buf + 2, sender_id);
    pd__xfer_put_u64(buf + 10, n->room);
    pd__xfer_put_u32(buf + 18, (uint32_t)n->status);
    pd__xfer_put_u32(buf + 22, (uint32_t)n->first_token);
    pd__xfer_put_u32(buf + 26, lp);
    pd__xfer_put_u32(buf + 30, n->cached_tokens);
    put_u16(buf + 34, (uint16_t)elen);
    pd__xfer_put_u64(buf + 36, n->data_bytes);
    for (int k = 0; k < PD_XFER_NOTICE_STAGES; k++)
        pd__xfer_put_u32(buf + 44 + 4 * k, n->sender_us[k]);
    memcpy(buf + PD_XFER_NOTICE_WIRE_MIN, n->error, elen);
    uint8_t *t = buf + PD_XFER_NOTICE_WIRE_MIN + elen;
    if (n_top) {
        *t++ = (uint8_t)n_top;
        for (uint32_t k = 0; k < n_top; k++, t += 8) {
            uint32_t v;
            memcpy(&v, &n->top_logprobs[k], sizeof(v));
            pd__xfer_put_u32(t, (uint32_t)n->top_ids[k]);
            pd__xfer_put_u32(t + 4, v);
        }
    }
    return PD_XFER_NOTICE_WIRE_MIN + elen + tlen;
}

int pd_xfer_notice_decode(const void *buf, size_t len, struct pd_xfer_notice *n,
                          uint64_t *sender_id) {
    const uint8_t *p = buf;
    if (len < PD_XFER_NOTICE_WIRE_MIN)
        return pd_errorf(PD_EFORMAT, "room notice of %zu bytes, shorter than %d", len,
                         PD_XFER_NOTICE_WIRE_MIN);
    if (get_u16(p) != NOTICE_MAGIC)
        return pd_errorf(PD_EFORMAT, "room notice with bad magic 0x%04x", get_u16(p));
    size_t elen = get_u16(p + 34);
    size_t base = PD_XFER_NOTICE_WIRE_MIN + elen;
    uint32_t n_top = len > base ? p[base] : 0;
    if (elen > PD_XFER_ERROR_TEXT_MAX ||
        (len != base &&
         (n_top == 0 || n_top > PD_XFER_NOTICE_TOP_MAX || len != base + 1 + 8 * (size_t)n_top)))
        return pd_errorf(PD_EFORMAT,
                         "room notice length %zu disagrees with its text length %zu and %u top "
                         "logprobs",
                         len, elen, n_top);
    memset(n, 0, sizeof(*n));
    *sender_id = pd__xfer_get_u64(p + 2);
    n->room = pd__xfer_get_u64(p + 10);
    n->status = (int32_t)pd__xfer_get_u32(p + 18);
    n->first_token = (int32_t)pd__xfer_get_u32(p + 22);
    uint32_t lp = pd__xfer_get_u32(p + 26);
    memcpy(&n->first_logprob, &lp, sizeof(lp));
    n->cached_tokens = pd__xfer_get_u32(p + 30);
    n->data_bytes = pd__xfer_get_u64(p + 36);
    for (int k = 0; k < PD_XFER_NOTICE_STAGES; k++)
        n->sender_us[k] = pd__xfer_get_u32(p + 44 + 4 * k);
    memcpy(n->error, p + PD_XFER_NOTICE_WIRE_MIN, elen);
    n->error[elen] = '\0';
    n->n_top = n_top;
    for (uint32_t k = 0; k < n_top; k++) {
        const uint8_t *t = p + base + 1 + 8 * k;
        uint32_t v = pd__xfer_get_u32(t + 4);
        n->top_ids[k] = (int32_t)pd__xfer_get_u32(t);
        memcpy(&n->top_logprobs[k], &v, sizeof(v));
    }
    if (n->status > 0 || n->status < PD_EINTERNAL)
        n->status = PD_EPEER; /* an unknown failure is still a failure */
    return PD_OK;
}
