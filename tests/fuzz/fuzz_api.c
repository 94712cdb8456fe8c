/* libFuzzer target: the HTTP API bodies (common/api.c) as a daemon gets them. Byte 0 picks the
 * endpoint (/generate, /v1/completions, /v1/chat/completions) and disaggregated mode; the rest is
 * the body. Parse + validate, and on success the helpers a daemon then calls on the request
 * (stop-string search, length and token-id checks); also the batch / n fan-out split and, for a
 * split body, the parse of every sub-request. Any error is fine; a crash, leak or UB is not. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_parsed(struct pd_api_request *r, const char *body, size_t len) {
    struct pd_api_error e = {0};
    size_t at = 0;
    /* generated text: the body itself, grown from half of it */
    (void)pd_api_find_stop(r, body, len, len / 2, &at);
    (void)pd_api_wants_input_logprobs(r, 7);
    (void)pd_api_check_token_ids(r, 1000, &e);
    (void)pd_api_check_length(r, 7, 64, &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    enum pd_api_kind kind = (enum pd_api_kind)(data[0] % 3);
    struct pd_api_config cfg = {
        .served_model_name = (data[0] & 4) ? "tiny" : NULL,
        .model_path = "/models/tiny",
        .disaggregated = (data[0] & 8) != 0,
        .context_length = (data[0] & 16) ? 64 : 0,
    };
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    struct pd_api_request r;
    struct pd_api_error e = {0};
    int rc = pd_api_parse(kind, body, len, &cfg, &r, &e);
    if (rc == 0) {
        check_parsed(&r, body, len);
        pd_api_request_free(&r);
    }

    struct pd_api_split s;
    struct pd_api_error se = {0};
    if (pd_api_split(kind, body, len, &cfg, &s, &se) == 0) {
        if (s.root) { /* the daemons' one parse answers as pd_api_parse does */
            struct pd_api_request t;
            struct pd_api_error te = {0};
            int trc = pd_api_parse_tree(kind, body, len, s.root, &cfg, &t, &te);
            s.root = NULL;
            if (trc != rc || te.status != e.status || strcmp(te.message, e.message) != 0)
                abort();
            if (trc == 0)
                pd_api_request_free(&t);
        }
        for (int k = 0; s.bodies && k < s.count; k++) {
            struct pd_api_request sub;
            struct pd_api_error sub_e = {0};
            if (pd_api_parse(kind, s.bodies[k], strlen(s.bodies[k]), &cfg, &sub, &sub_e) == 0)
                pd_api_request_free(&sub);
        }
        pd_api_split_free(&s);
    }
    return 0;
}
