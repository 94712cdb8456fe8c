/*
 * body.h — what the router adds to a generation body before sending it to a prefill and a decode
 * worker: bootstrap_host, bootstrap_port, bootstrap_room (fresh, uniform in [0, 2^63)) and, when
 * the client gave none, rid = the room in decimal, so that the router can later abort the request
 * on either worker with POST /abort_request {"rid": ...}. With a batch (/generate `text` list or
 * `input_ids` list of lists, /v1/completions `prompt` list of strings or of token lists) every
 * field is an array with one entry per prompt. With `n` > 1 (and a batch) the daemons fan the body
 * out into prompts x n sub-requests (common/api.h pd_api_split), so the arrays get one entry per
 * sub-request, prompt-major (SGLang's bootstrap_room list convention); n outside [1, max_n]
 * (--max-n) or more than 1024 sub-requests is refused.
 *
 * The client's bytes are kept: the fields are spliced in after the opening brace, so numbers the
 * router never reads (a 64-bit seed, say) are not rounded through a double. Only when the client
 * itself sent bootstrap_* fields is the body re-serialised without them (the router owns them).
 */
#ifndef PD_ROUTER_BODY_H
#define PD_ROUTER_BODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "router/policy.h"

#include <cjson/cJSON.h>

enum pd_router_route {
    PD_ROUTER_ROUTE_GENERATE = 0, /* POST /generate */
    PD_ROUTER_ROUTE_COMPLETIONS,  /* POST /v1/completions */
    PD_ROUTER_ROUTE_CHAT,         /* POST /v1/chat/completions */
};

struct pd_router_body_info {
    int n;               /* sub-requests: 1, or prompts x samples */
    int samples;         /* n of the request (samples per prompt) */
    bool batch;          /* the fields went in as arrays (a batch, or n > 1) */
    bool stream;         /* "stream": true */
    bool rid_added;      /* rid came from the router (= room), not the client */
    bool input_logprobs; /* prompt logprobs asked for (/generate return_logprob with a
                            logprob_start_len >= 0, completions echo + logprobs): the prefill
                            computes them, its answer is merged into decode's (lpmerge.h) */
    uint64_t *rooms;     /* [n] owned */
    char **rids;         /* [n] owned NUL-terminated strings, as sent */
};

/* Rewrites body (len bytes, any JSON) for the prefill at bootstrap_host:bootstrap_port
 * (PD_ROUTER_BOOTSTRAP_PORT_NULL → null); bootstrap_host NULL: for a decode alone (local
 * prefill): no bootstrap fields (a client's own are dropped), the rid still added. *out (*out_len
 * bytes, NUL-terminated) and info are owned by the caller (pd_free, pd_router_body_info_free).
 * max_n: the most samples per prompt (0 = PD_API_MAX_N). Errors: PD_EINVAL (not a JSON object, rid
 * of the wrong type or length, empty batch, n out of range), message for a 400. */
int pd_router_body_rewrite(int route, int max_n, const char *body, size_t len,
                           const char *bootstrap_host, int bootstrap_port,
                           struct pd_router_rng *rng, char **out, size_t *out_len,
                           struct pd_router_body_info *info);
/* The same on body already parsed (root: cJSON_ParseWithLength of it; NULL when it is not valid
 * JSON), so a router that also sizes the prompt parses the body once. root may lose the client's
 * bootstrap fields; it stays the caller's. */
int pd_router_body_rewrite_parsed(int route, int max_n, const char *body, size_t len, cJSON *root,
                                  const char *bootstrap_host, int bootstrap_port,
                                  struct pd_router_rng *rng, char **out, size_t *out_len,
                                  struct pd_router_body_info *info);
void pd_router_body_info_free(struct pd_router_body_info *info);

/* A prompt's size as the router can tell without a tokenizer, for --local-prefill-max-tokens
 * (prompt_size.h turns it into tokens): token ids counted, plus PD_ROUTER_CHAT_MESSAGE_TOKENS a
 * chat message for its template; and the bytes of its text (a string prompt, chat messages' text
 * parts). PD_EINVAL (nothing set, no message) when the body is not one prompt of one sample (a
 * batch, n > 1), carries images (chat parts other than text, /generate image_data: only the
 * prefill encodes them) or is not a JSON object with a prompt (root: the body as cJSON parsed
 * it, NULL when it is not valid JSON): such a request takes the PD path. */
struct pd_router_prompt_size {
    long id_tokens;
    size_t text_bytes;
};
#define PD_ROUTER_CHAT_MESSAGE_TOKENS 8
int pd_router_body_prompt_size(int route, const cJSON *root, struct pd_router_prompt_size *out);

/* {"rid":"..."} for /abort_request; caller pd_frees. NULL on allocation failure. */
char *pd_router_abort_body(const char *rid);

#endif
