/* libFuzzer target: what the router does with a client's body before any worker sees it
 * (router/body.c, router/route_text.c) and with a worker's error answer (the breaker's
 * classifier, router/breaker.c). Byte 0 picks the route and the bootstrap port form; the rest is
 * the body. A rewritten body must itself be accepted by a second rewrite (it is still a request).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/base/alloc.h"
#include "common/base/api_wire.h"
#include "router/body.h"
#include "router/breaker.h"
#include "router/config.h"
#include "router/policy.h"
#include "router/route_text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    int route = data[0] % 3;
    int port = (data[0] & 4) ? PD_ROUTER_BOOTSTRAP_PORT_NULL : 8998;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    struct pd_router_rng rng;
    pd_router_rng_seed_with(&rng, 42);
    char *out = NULL;
    size_t out_len = 0;
    struct pd_router_body_info info;
    if (pd_router_body_rewrite(route, PD_API_MAX_N, body, len, "10.0.0.1", port, &rng, &out,
                               &out_len, &info) == 0) {
        char *again = NULL;
        size_t again_len = 0;
        struct pd_router_body_info info2;
        if (pd_router_body_rewrite(route, PD_API_MAX_N, out, out_len, "10.0.0.2", 1, &rng, &again,
                                   &again_len, &info2) != 0)
            abort(); /* the router's own output is a request it must accept again */
        pd_free(again);
        pd_router_body_info_free(&info2);
        for (int k = 0; k < info.n; k++) {
            char *ab = pd_router_abort_body(info.rids[k]);
            pd_free(ab);
        }
        pd_free(out);
        pd_router_body_info_free(&info);
    }

    char *text = NULL;
    size_t text_len = 0;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (pd_router_route_text(route, root, &text, &text_len) == 0)
        pd_free(text);
    cJSON_Delete(root);

    char msg[128];
    (void)pd_router_transfer_failed(body, len, msg, sizeof(msg));
    (void)pd_router_transfer_failed(body, len, NULL, 0);
    return 0;
}
