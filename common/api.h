/*
 * api.h — the JSON side of the HTTP user plane (API.md): request bodies of SGLang /generate,
 * OpenAI /v1/completions and /v1/chat/completions parsed and validated into one pd_api_request,
 * and every response body (final JSON, SSE chunk, error object, info endpoints) rendered from
 * plain structs. Pure functions: no I/O, no clock, no randomness — the daemon passes ids, times
 * and token texts in — so unit tests pin every field.
 *
 * Validation failures fill a pd_api_error (HTTP status, OpenAI type/param/code, a message that
 * names the field and what is allowed) and return PD_EINVAL; the daemon renders it with
 * pd_api_error_render. Only a failed allocation returns PD_ENOMEM (and a 500 error).
 *
 * pd_api_parse takes one prompt and one sample. A batch (text/prompt as a list of strings,
 * input_ids / prompt as a list of lists) and n > 1 are first cut by pd_api_split into one body per
 * (prompt, sample), SGLang's fan-out: each sub-request has its own rid and bootstrap_room, and the
 * daemon assembles the answers (pd_api_merge). A non-empty logit_bias is refused with a 400.
 * bootstrap_room is read exactly from the body text (a double would round ids above 2^53), and
 * stop strings exactly too (a "\u0000" in one is kept: cJSON strings would end there).
 */
#ifndef PD_API_H
#define PD_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/api_wire.h"
#include "model/sampling.h"

struct pd_chat_template;
struct pd_server_args;

enum pd_api_kind {
    PD_API_GENERATE = 0,    /* POST /generate (SGLang native) */
    PD_API_COMPLETIONS = 1, /* POST /v1/completions */
    PD_API_CHAT = 2,        /* POST /v1/chat/completions */
};

#define PD_API_MAX_STOP 16                  /* stop strings per request */
#define PD_API_MAX_FANOUT_BYTES (64u << 20) /* bytes of all sub-request bodies together */
#define PD_API_DEFAULT_BODY (8u << 20)      /* bytes: default request body limit */
#define PD_API_DEFAULT_BOOTSTRAP_PORT 8998

/* What the daemon accepts; everything the parser needs to know about the server. */
struct pd_api_config {
    const char *served_model_name; /* `model` must equal this (or model_path); NULL: any */
    const char *model_path;        /* also accepted as a model name; may be NULL */
    bool disaggregated;            /* prefill/decode mode: bootstrap_room is required */
    bool bootstrap_optional;       /* ...unless this is set (a decode prefilling locally) */
    int context_length;            /* tokens; 0 = unknown (no default from it) */
    int max_n;                     /* samples per prompt at most (--max-n); 0 = PD_API_MAX_N */
    int max_images;        /* images per request (--limit-mm-per-prompt); 0: the model takes none */
    bool allow_image_urls; /* http(s) image URLs are fetched (--allow-image-urls) */
};

struct pd_api_request {
    enum pd_api_kind kind;
    bool stream;
    bool include_usage; /* stream_options.include_usage (OpenAI streams) */
    char *rid;          /* SGLang rid / nothing: NULL (heap) */
    char *model;        /* as sent, NULL when absent (heap) */

    /* The prompt: text (generate text, completions string prompt; chat: NULL — render the
     * messages with pd_api_render_chat_prompt) or token ids (input_ids, completions [int]). */
    char *text; /* heap, NUL-terminated; text_len bytes */
    size_t text_len;
    int32_t *input_ids; /* heap [n_input_ids]; NULL when the prompt is text */
    int n_input_ids;

    /* Images (chat image_url / image parts, generate image_data), in prompt order: each a
     * data: URL, or (generate) raw base64 of the file; decoded by the daemon (heap strings). */
    char **images;
    int n_images;

    /* chat only: [{"role": str, "content": str}], content parts already joined (owned); a
     * message with images keeps its parts as a list of {"type": "text", "text"} and
     * {"type": "image"}, the form vision-language chat templates iterate. */
    struct cJSON *messages;
    struct cJSON *chat_template_kwargs; /* object or NULL (owned) */
    bool add_generation_prompt;         /* default true */

    struct pd_sampling_params sampling; /* max_new_tokens, temperature, ..., n_logprobs */
    bool max_tokens_given;              /* false: chat defaults to the rest of the context */
    char *stop[PD_API_MAX_STOP];        /* heap strings; may hold NUL bytes: */
    size_t stop_len[PD_API_MAX_STOP];   /* bytes of each (matching is byte-exact) */
    int n_stop;
    int min_tokens;           /* EOS/stop ignored before this many tokens */
    bool skip_special_tokens; /* default true */
    bool no_stop_trim;        /* SGLang: keep the matched stop string in the text */
    bool echo;                /* completions: the answer's text starts with the prompt's */

    bool return_logprob; /* generate return_logprob, completions logprobs != null, chat logprobs */
    int logprob_start_len; /* generate; -1 = none of the prompt; completions echo with
                              logprobs: 0 (every prompt token) */

    char *bootstrap_host; /* heap or NULL */
    int bootstrap_port;   /* PD_API_DEFAULT_BOOTSTRAP_PORT when absent or null */
    bool has_bootstrap_room;
    uint64_t bootstrap_room; /* [0, 2^63) */
};

/* Parses and validates body (len bytes, need not be NUL-terminated) for endpoint kind. On
 * success *out owns its strings (free with pd_api_request_free); on failure *out is left empty
 * and e says why (400/404; 500 for PD_ENOMEM). */
int pd_api_parse(enum pd_api_kind kind, const char *body, size_t len,
                 const struct pd_api_config *cfg, struct pd_api_request *out,
                 struct pd_api_error *e);
/* The same on a body pd_api_split parsed (root: its split's root, taken over and freed here,
 * also on failure; body: the text it was parsed from, UTF-8 already checked). */
int pd_api_parse_tree(enum pd_api_kind kind, const char *body, size_t len, struct cJSON *root,
                      const struct pd_api_config *cfg, struct pd_api_request *out,
                      struct pd_api_error *e);
void pd_api_request_free(struct pd_api_request *r);

/* ---- images (common/api_images.c) ---- */

/* Whether a chat content part is an image ("image_url", or "image" with its data in "image"). */
bool pd__api_is_image_part(const struct cJSON *part);
/* Appends a chat image part's URL to r->images (param names the part in errors); remote URLs
 * are refused, the bytes are not looked at here. PD_EINVAL (400 in e), PD_ENOMEM. */
int pd__api_add_image_part(const struct cJSON *part, const char *param,
                           const struct pd_api_config *cfg, struct pd_api_request *r,
                           struct pd_api_error *e);
/* generate's image_data: a string or a list of them (data: URLs or raw base64). */
int pd__api_parse_image_data(const struct cJSON *root, const struct pd_api_config *cfg,
                             struct pd_api_request *r, struct pd_api_error *e);

/* Stop strings in generated text, byte-exact (either may hold NUL bytes): text[0..len) grew from
 * `before` bytes; the first of r's stop strings (in the request's order) found in the part that
 * could hold a new match. Returns its index and *at = its offset, or -1. */
int pd_api_find_stop(const struct pd_api_request *r, const char *text, size_t len, size_t before,
                     size_t *at);

/* A body cut into sub-requests (SGLang's batch / parallel-sampling fan-out). Sub-request k is
 * prompt k / n, sample k % n (prompt-major, the order of OpenAI's choices). Each body is the
 * client's with the prompt (and per-prompt lists: sampling_params, return_logprob,
 * logprob_start_len, top_logprobs_num) narrowed to that prompt, n removed, and rid /
 * bootstrap_host / bootstrap_port / bootstrap_room taken from entry k of their lists. A rid
 * string (or a list with one rid per prompt when n > 1) becomes "<rid>_<k>" (per prompt:
 * "<rid>_<sample>"), as SGLang names parallel samples. */
struct pd_api_split {
    int count;     /* sub-requests: n_prompts * n */
    int n;         /* samples per prompt, [1, max_n] */
    int n_prompts; /* 1 unless batch */
    bool batch;    /* the prompt was a list: /generate answers a JSON list */
    char **bodies; /* [count] heap JSON; NULL when count is 1 and !batch: use the body as is */
    char *rid;     /* the client's rid when it was one string (heap), else NULL */
    /* count 1 and !batch: the body as parsed, for pd_api_parse_tree (which takes it: set this to
     * NULL then), so that one request is parsed once; NULL otherwise */
    struct cJSON *root;
};
/* Cuts body for kind. A body pd_api_parse would refuse anyway (bad JSON, trailing bytes, wrong
 * types) comes back as count 1 and no bodies nor root, so that its error is pd_api_parse's. 400 for
 * n outside [1, cfg->max_n] (cfg NULL or max_n 0: PD_API_MAX_N), more than PD_API_MAX_FANOUT
 * sub-requests, an empty prompt list, per-prompt lists of the wrong length, or (cfg->disaggregated)
 * a bootstrap_room that is not a list of count rooms when count > 1. */
int pd_api_split(enum pd_api_kind kind, const char *body, size_t len,
                 const struct pd_api_config *cfg, struct pd_api_split *out, struct pd_api_error *e);
void pd_api_split_free(struct pd_api_split *s);

/* Assembles the sub-requests' final bodies (bodies[k] = sub-request k's rendered answer):
 * /generate → a JSON list of them; OpenAI → the first body with every body's choices[0] (index k)
 * and usage summed (prompt and cached tokens once per prompt: k % n == 0; completion tokens all).
 * *out heap. PD_EINVAL when a body is not the JSON it should be, PD_ENOMEM. */
int pd_api_merge(enum pd_api_kind kind, int n, char *const *bodies, int count, char **out);

/* Renders a chat request's messages through the model's template (chat_template_kwargs become
 * template variables). Template errors (raise_exception) are the user's: a 400. *out heap. */
int pd_api_render_chat_prompt(const struct pd_api_request *r, const struct pd_chat_template *t,
                              const char *bos_token, const char *eos_token, char **out,
                              size_t *out_len, struct pd_api_error *e);

/* After tokenizing: refuses a prompt that does not fit the context (the message names both
 * lengths) or prompt + max_new_tokens beyond it, and sets chat's default max_new_tokens to the
 * rest of the context. context_length <= 0 skips the checks. Also refuses a request for prompt
 * logprobs (return_logprob with logprob_start_len inside the prompt): not computed. */
/* The request asks for prompt logprobs (input_token_logprobs, completions echo + logprobs):
 * return_logprob with logprob_start_len inside the n_prompt_tokens prompt. */
bool pd_api_wants_input_logprobs(const struct pd_api_request *r, int n_prompt_tokens);

int pd_api_check_length(struct pd_api_request *r, int n_prompt_tokens, int context_length,
                        struct pd_api_error *e);
/* Every input id and stop token id must be in [0, vocab). */
int pd_api_check_token_ids(const struct pd_api_request *r, int32_t vocab, struct pd_api_error *e);

/* true when s[0..len) is well-formed UTF-8 (no overlongs, surrogates, > U+10FFFF); else false
 * and *bad (may be NULL) = offset of the first bad byte. */
bool pd_api_utf8_valid(const char *s, size_t len, size_t *bad);

/* "<prefix><32 hex digits>" from 128 caller-supplied random bits: "chatcmpl-0123...". */
void pd_api_format_id(char *buf, size_t cap, const char *prefix, uint64_t hi, uint64_t lo);

/* ---- responses ---- */

enum pd_api_finish {
    PD_API_FINISH_NONE = 0, /* still running: finish_reason null */
    PD_API_FINISH_STOP = 1, /* EOS, a stop token or a stop string */
    PD_API_FINISH_LENGTH = 2,
    PD_API_FINISH_ABORT = 3,
};

/* Token id → its text, for logprobs. Writes up to cap bytes into buf, returns the full length. */
typedef size_t (*pd_api_token_text_fn)(void *ud, int32_t id, char *buf, size_t cap);

/* One response (final) or one streamed step. Text semantics: for /generate always the whole
 * output so far (SGLang streams cumulative text); for OpenAI chunks the new delta. */
struct pd_api_result {
    const char *id; /* "chatcmpl-…", "cmpl-…", or the rid for /generate */
    const char *model;
    int64_t created; /* unix seconds */
    const char *text;
    size_t text_len;
    const int32_t *output_ids; /* [n_output_ids]: all output ids so far (generate only) */
    int n_output_ids;
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;
    enum pd_api_finish finish;
    int32_t matched_token;     /* finish STOP on a token: its id; -1 otherwise */
    const char *matched_stop;  /* finish STOP on a stop string: it; NULL otherwise */
    size_t matched_stop_len;   /* its bytes (it may hold NUL) */
    int index;                 /* OpenAI choices[].index; /generate "index" when has_index */
    bool has_index;            /* a batch /generate stream event: SGLang adds "index" */
    const char *abort_message; /* finish ABORT: why */
    double e2e_latency;        /* seconds */
    /* logprobs of the tokens this body covers (generate: all so far; OpenAI chunk: the delta) */
    const struct pd_sample *logprobs; /* [n_logprobs] or NULL */
    int n_logprobs;
    int logprob_offset; /* completions text_offset of the first covered token */
    /* input (prompt) logprobs from logprob_start_len on (generate: every body; completions
     * echo: the body that carries the prompt's text); entry of prompt token 0: logprob NAN,
     * rendered null (nothing predicts it). NULL: none in this body. */
    const struct pd_sample *input_logprobs;
    int n_input_logprobs;
    pd_api_token_text_fn token_text;
    void *token_text_ud;
};

/* /generate body or stream event (finish NONE renders finish_reason null). */
int pd_api_render_generate(const struct pd_api_request *r, const struct pd_api_result *res,
                           char **out);
/* OpenAI non-streamed: text_completion / chat.completion with usage. */
int pd_api_render_completion(const struct pd_api_request *r, const struct pd_api_result *res,
                             char **out);
int pd_api_render_chat(const struct pd_api_request *r, const struct pd_api_result *res, char **out);
/* OpenAI stream chunks. Chat: first carries delta.role "assistant"; finish NONE = null reason.
 * With include_usage every chunk carries "usage": null. */
int pd_api_render_completion_chunk(const struct pd_api_request *r, const struct pd_api_result *res,
                                   char **out);
int pd_api_render_chat_chunk(const struct pd_api_request *r, const struct pd_api_result *res,
                             bool first, char **out);
/* The last chunk when include_usage: "choices": [] and usage. */
int pd_api_render_usage_chunk(const struct pd_api_request *r, const struct pd_api_result *res,
                              char **out);

/* ---- info endpoints ---- */

/* GET /v1/models */
int pd_api_render_models(const char *served_model_name, const char *model_path, int64_t created,
                         int max_model_len, char **out);

/* What only the running daemon knows, for /server_info. */
struct pd_api_runtime_info {
    const char *version;        /* PD_VERSION */
    int context_length;         /* effective */
    int max_total_tokens;       /* effective KV pool size, tokens */
    int num_pages, free_pages;  /* KV page pool */
    const char *transport;      /* "ucx:tcp,sm" / "none" */
    const char *backend;        /* "cpu" / "cuda" */
    double last_gen_throughput; /* tokens/s, for internal_states */
    const struct cJSON *extra;  /* merged into the top level when non-NULL */
};
/* GET /server_info: every effective setting of a, the runtime info, internal_states [{…}]. */
int pd_api_render_server_info(const struct pd_server_args *a, const struct pd_api_runtime_info *rt,
                              char **out);
/* GET /model_info */
int pd_api_render_model_info(const char *model_path, const char *tokenizer_path,
                             const char *model_type, const char *const *architectures,
                             int n_architectures, char **out);
/* GET /get_load: {"load": N}, with "local_prefill": true from a decode that prefills bodies
 * without bootstrap fields itself (--local-prefill): pdserve-router sends short prompts to such
 * a decode alone (--local-prefill-max-tokens), and to no other. */
int pd_api_render_get_load(int load, bool local_prefill, char **out);

struct pd_api_rank_load {
    int num_running_reqs;
    int num_waiting_reqs;
    int64_t num_used_tokens;
    int64_t max_total_num_tokens;
};
/* GET /v1/loads: {"timestamp", "dp_rank_count", "loads":[{dp_rank, num_running_reqs, …,
 * token_usage}], "aggregate":{…}}; timestamp is the caller's ISO-8601 string. */
int pd_api_render_loads(const struct pd_api_rank_load *ranks, int n_ranks, const char *timestamp,
                        char **out);

#endif
