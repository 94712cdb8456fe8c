/* libFuzzer target: a room notice as the transfer engine receives it from a peer over UCX
 * (common/xfer.c pd_xfer_notice_decode). A notice that decodes must encode again to the same
 * length, and that encoding must decode to the same notice. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/xfer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct pd_xfer_notice n, n2;
    uint64_t sender = 0, sender2 = 0;
    if (pd_xfer_notice_decode(data, size, &n, &sender) != 0)
        return 0;
    uint8_t buf[PD_XFER_NOTICE_WIRE_MIN + PD_XFER_ERROR_TEXT_MAX + 1 + 8 * PD_XFER_NOTICE_TOP_MAX];
    size_t len = pd_xfer_notice_encode(&n, sender, buf, sizeof(buf));
    if (len == 0 || len > sizeof(buf))
        abort();
    if (pd_xfer_notice_decode(buf, len, &n2, &sender2) != 0 || sender2 != sender ||
        n2.room != n.room || n2.status != n.status || n2.n_top != n.n_top ||
        strcmp(n2.error, n.error) != 0)
        abort();
    return 0;
}
