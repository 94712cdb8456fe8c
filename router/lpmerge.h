/*
 * lpmerge.h — prompt (input) logprobs in PD mode: only the prefill daemon ran the prompt, so
 * only its answer carries them; the router puts them into the decode's answer before the client
 * sees it, as SGLang's PD router merges the prefill's input_token_logprobs into the decode's
 * response.
 *
 *   /generate: meta_info.input_token_logprobs and input_top_logprobs of the prefill's answer
 *     go before whatever the decode's meta_info has under those keys (nothing: decode computes
 *     none), in the whole answer and in every stream chunk (a /generate chunk carries the whole
 *     state so far). Batches and n > 1: the prefill's answer is a list, entry k feeds the
 *     decode's entry k (whole answer) or the chunk whose "index" is k.
 *   /v1/completions with echo + logprobs: the prefill's choices[].logprobs lists (tokens,
 *     token_logprobs, top_logprobs, text_offset: the prompt's tokens, the first one's logprob
 *     null) go before the decode's (the completion's) in the choice of the same index; in a
 *     stream, once per choice, in the first chunk of that choice (the one with the echoed
 *     prompt's text).
 *
 * Pure functions over JSON text: no I/O.
 */
#ifndef PD_ROUTER_LPMERGE_H
#define PD_ROUTER_LPMERGE_H

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

struct pd_router_lpmerge {
    int route;            /* enum pd_router_route */
    struct cJSON *source; /* the prefill's answer, parsed */
    int n_done;
    bool *done; /* [n_done] completions stream: choice k already has the prompt's */
};

/* Parses the prefill's answer (prefill, len bytes). PD_EINVAL: not JSON. */
int pd_router_lpmerge_init(struct pd_router_lpmerge *m, int route, const char *prefill, size_t len);
void pd_router_lpmerge_free(struct pd_router_lpmerge *m);

/* The decode's whole answer with the prompt's logprobs merged in: *out (pd_free, *out_len
 * bytes, NUL-terminated). PD_EINVAL (not JSON), PD_ENOMEM. */
int pd_router_lpmerge_body(struct pd_router_lpmerge *m, const char *decode, size_t len, char **out,
                           size_t *out_len);

/* One stream event's data (the JSON after "data: "), merged likewise; data that is not a JSON
 * object ("[DONE]") comes back unchanged. */
int pd_router_lpmerge_event(struct pd_router_lpmerge *m, const char *data, size_t len, char **out,
                            size_t *out_len);

#endif
