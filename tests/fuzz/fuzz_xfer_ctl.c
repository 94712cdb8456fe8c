/* libFuzzer target: a call or an answer as the transfer engine receives it from a peer over UCX
 * (common/xfer_call.c pd_xfer_ctl_decode; the first byte picks which). A message that decodes
 * must encode again and decode to the same fields and body. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/alloc.h"
#include "common/xfer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    bool answer = data[0] & 1;
    struct pd_xfer_ctl m, m2;
    if (pd_xfer_ctl_decode(data + 1, size - 1, answer, &m) != 0)
        return 0;
    size_t cap = size + 64;
    uint8_t *buf = pd_malloc(cap);
    if (!buf)
        abort();
    size_t len = pd_xfer_ctl_encode(&m, answer, buf, cap);
    if (len == 0 || len > size - 1 || pd_xfer_ctl_decode(buf, len, answer, &m2) != 0 ||
        m2.sender_id != m.sender_id || m2.call_id != m.call_id || m2.method != m.method ||
        m2.status != m.status || strcmp(m2.text, m.text) != 0 || m2.len != m.len ||
        (m.len && memcmp(m2.body, m.body, m.len) != 0))
        abort();
    pd_free(buf);
    return 0;
}
