/* libFuzzer target: the router's merge of a prefill's prompt logprobs into a decode's answer
 * (router/lpmerge.c): both are worker responses, parsed as JSON / SSE event data. Byte 0 picks
 * the route; the rest is "<prefill answer>\0<decode answer or events>", the events cut at
 * '\n' as the SSE reader hands them over. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/base/alloc.h"
#include "router/body.h"
#include "router/lpmerge.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    int route = data[0] % 3;
    const char *p = (const char *)data + 1;
    size_t len = size - 1;
    const char *sep = memchr(p, '\0', len);
    size_t pre_len = sep ? (size_t)(sep - p) : len;
    const char *dec = sep ? sep + 1 : p + len;
    size_t dec_len = len - pre_len - (sep ? 1 : 0);

    struct pd_router_lpmerge m;
    if (pd_router_lpmerge_init(&m, route, p, pre_len) != 0)
        return 0;
    char *out = NULL;
    size_t out_len = 0;
    if (pd_router_lpmerge_body(&m, dec, dec_len, &out, &out_len) == 0)
        pd_free(out);
    /* the same bytes as a stream: one event per line */
    const char *ev = dec, *end = dec + dec_len;
    while (ev < end) {
        const char *nl = memchr(ev, '\n', (size_t)(end - ev));
        size_t ev_len = nl ? (size_t)(nl - ev) : (size_t)(end - ev);
        if (pd_router_lpmerge_event(&m, ev, ev_len, &out, &out_len) == 0)
            pd_free(out);
        ev += ev_len + 1;
    }
    pd_router_lpmerge_free(&m);
    return 0;
}
