/*
 * api_render.c — the HTTP user plane's answers (API.md): /generate, completions and chat (final
 * bodies and stream chunks, usage), and the info endpoints (models, server_info, model_info,
 * loads). Rendering builds a cJSON tree and prints it unformatted; cJSON allocates with malloc,
 * which pd_free releases, so callers free every rendered body with pd_free. Parsing is api.c.
 */
#include "common/api.h"

#include "common/base/alloc.h"
#include "common/base/json_keys.h"
#include "model/jinja/chat_template.h"
#include "common/server_args.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- responses */

/* A JSON string literal of s[0..len) as cJSON would print it, NUL bytes included ("\u0000"). */
static char *json_string_literal(const char *s, size_t len) {
    char *out = pd_malloc(len * 6 + 3), *o = out;
    if (!out)
        return NULL;
    *o++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            o += sprintf(o, "\\u%04x", c);
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = '\0';
    return out;
}

/* Generated text may hold NUL bytes (a byte-level token for 0x00): cJSON strings end at the
 * first NUL, so such text goes in as a raw literal with the NUL escaped. */
static cJSON *add_text(cJSON *obj, const char *key, const char *s, size_t len) {
    if (len && memchr(s, 0, len)) {
        char *lit = json_string_literal(s, len);
        cJSON *v = lit ? cJSON_AddRawToObject(obj, key, lit) : NULL;
        pd_free(lit);
        return v;
    }
    char small[256];
    char *tmp = len < sizeof(small) ? small : pd_malloc(len + 1);
    if (!tmp)
        return NULL;
    if (len)
        memcpy(tmp, s, len);
    tmp[len] = '\0';
    cJSON *v = cJSON_AddStringToObject(obj, key, tmp);
    if (tmp != small)
        pd_free(tmp);
    return v;
}

/* key: [v0,v1,...] printed here, not by cJSON: cJSON prints every number through "%1.15g" and
 * reads it back with sscanf, a microsecond each, and a /generate stream sends all output ids so
 * far with every token, so a long stream's ids cost the loop thread O(n^2) of that. */
static cJSON *add_int_array(cJSON *obj, const char *key, const int32_t *v, int n) {
    char small[512];
    size_t cap = (size_t)(n > 0 ? n : 0) * 12 + 3;
    char *buf = cap <= sizeof(small) ? small : pd_malloc(cap), *o = buf;
    if (!buf)
        return NULL;
    *o++ = '[';
    for (int i = 0; i < n; i++) {
        if (i)
            *o++ = ',';
        int64_t x = v[i];
        if (x < 0) {
            *o++ = '-';
            x = -x;
        }
        o += pd_json_u64((uint64_t)x, o); /* its NUL is overwritten by what follows */
    }
    *o++ = ']';
    *o = '\0';
    cJSON *a = cJSON_AddRawToObject(obj, key, buf);
    if (buf != small)
        pd_free(buf);
    return a;
}

/* matched_stop's bytes: its length when the daemon gave one (it may hold NUL), else strlen. */
static size_t stop_len(const struct pd_api_result *res) {
    return res->matched_stop_len ? res->matched_stop_len : strlen(res->matched_stop);
}

static const char *finish_str(enum pd_api_finish f) {
    switch (f) {
    case PD_API_FINISH_STOP: return "stop";
    case PD_API_FINISH_LENGTH: return "length";
    case PD_API_FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

static void add_finish_reason(cJSON *obj, const char *key, enum pd_api_finish f) {
    const char *s = finish_str(f);
    if (s)
        cJSON_AddStringToObject(obj, key, s);
    else
        cJSON_AddNullToObject(obj, key);
}

/* Token text for logprobs; invalid UTF-8 (a token that is half a character) becomes U+FFFD so
 * the JSON stays valid; raw bytes go to *raw (for chat's "bytes"). */
struct tok_text {
    char raw[256];
    size_t raw_len;
    char text[256 * 3 + 1];
};

static void token_text(const struct pd_api_result *res, int32_t id, struct tok_text *t) {
    t->raw_len = 0;
    if (res->token_text) {
        size_t n = res->token_text(res->token_text_ud, id, t->raw, sizeof(t->raw));
        t->raw_len = n < sizeof(t->raw) ? n : sizeof(t->raw);
    } else {
        t->raw_len = (size_t)snprintf(t->raw, sizeof(t->raw), "<%d>", (int)id);
    }
    size_t o = 0, i = 0;
    while (i < t->raw_len) {
        size_t badpos;
        if (pd_api_utf8_valid(t->raw + i, t->raw_len - i, &badpos)) {
            memcpy(t->text + o, t->raw + i, t->raw_len - i);
            o += t->raw_len - i;
            break;
        }
        memcpy(t->text + o, t->raw + i, badpos);
        o += badpos;
        memcpy(t->text + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += badpos + 1;
    }
    t->text[o] = '\0';
}

static cJSON *usage_json(const struct pd_api_result *res) {
    cJSON *u = cJSON_CreateObject();
    if (!u)
        return NULL;
    cJSON_AddNumberToObject(u, "prompt_tokens", res->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", res->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", res->prompt_tokens + res->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (d)
        cJSON_AddNumberToObject(d, "cached_tokens", res->cached_tokens);
    return u;
}

/* A logprob as JSON: NAN (the first prompt token's: nothing predicts it) is null. */
static cJSON *logprob_json(float lp) {
    return isnan(lp) ? cJSON_CreateNull() : cJSON_CreateNumber(lp);
}

/* SGLang's [logprob, token_id, null] triples (top: per position a list of them; null for the
 * first prompt token, which has no distribution). */
static cJSON *sglang_logprobs(const struct pd_sample *samples, int n, bool top) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n; i++) {
        const struct pd_sample *s = &samples[i];
        if (top && isnan(s->logprob)) {
            cJSON_AddItemToArray(arr, cJSON_CreateNull());
            continue;
        }
        if (!top) {
            cJSON *t = cJSON_CreateArray();
            cJSON_AddItemToArray(arr, t);
            cJSON_AddItemToArray(t, logprob_json(s->logprob));
            cJSON_AddItemToArray(t, cJSON_CreateNumber(s->token));
            cJSON_AddItemToArray(t, cJSON_CreateNull());
            continue;
        }
        cJSON *pos = cJSON_CreateArray();
        cJSON_AddItemToArray(arr, pos);
        for (int k = 0; k < s->n_top; k++) {
            cJSON *t = cJSON_CreateArray();
            cJSON_AddItemToArray(pos, t);
            cJSON_AddItemToArray(t, cJSON_CreateNumber(s->top_logprobs[k]));
            cJSON_AddItemToArray(t, cJSON_CreateNumber(s->top_ids[k]));
            cJSON_AddItemToArray(t, cJSON_CreateNull());
        }
    }
    return arr;
}

int pd_api_render_generate(const struct pd_api_request *r, const struct pd_api_result *res,
                           char **out) {
    cJSON *root = cJSON_CreateObject();
    if (!root || !add_text(root, "text", res->text ? res->text : "", res->text_len))
        goto fail;
    if (!add_int_array(root, "output_ids", res->output_ids, res->n_output_ids))
        goto fail;
    cJSON *mi = cJSON_AddObjectToObject(root, "meta_info");
    if (!mi)
        goto fail;
    cJSON_AddStringToObject(mi, "id", res->id ? res->id : "");
    if (res->finish == PD_API_FINISH_NONE) {
        cJSON_AddNullToObject(mi, "finish_reason");
    } else {
        cJSON *fr = cJSON_AddObjectToObject(mi, "finish_reason");
        if (!fr)
            goto fail;
        cJSON_AddStringToObject(fr, "type", finish_str(res->finish));
        if (res->finish == PD_API_FINISH_STOP) {
            if (res->matched_stop)
                add_text(fr, "matched", res->matched_stop, stop_len(res));
            else if (res->matched_token >= 0)
                cJSON_AddNumberToObject(fr, "matched", res->matched_token);
            else
                cJSON_AddNullToObject(fr, "matched");
        } else if (res->finish == PD_API_FINISH_LENGTH) {
            cJSON_AddNumberToObject(fr, "length", res->completion_tokens);
        } else {
            cJSON_AddStringToObject(fr, "message",
                                    res->abort_message ? res->abort_message : "aborted");
        }
    }
    cJSON_AddNumberToObject(mi, "prompt_tokens", res->prompt_tokens);
    cJSON_AddNumberToObject(mi, "completion_tokens", res->completion_tokens);
    cJSON_AddNumberToObject(mi, "cached_tokens", res->cached_tokens);
    cJSON_AddNumberToObject(mi, "e2e_latency", res->e2e_latency);
    if (res->has_index)
        cJSON_AddNumberToObject(root, "index", res->index);
    if (r->return_logprob) {
        if (res->input_logprobs) {
            cJSON_AddItemToObject(
                mi, "input_token_logprobs",
                sglang_logprobs(res->input_logprobs, res->n_input_logprobs, false));
            if (r->sampling.n_logprobs > 0)
                cJSON_AddItemToObject(
                    mi, "input_top_logprobs",
                    sglang_logprobs(res->input_logprobs, res->n_input_logprobs, true));
        }
        cJSON_AddItemToObject(mi, "output_token_logprobs",
                              sglang_logprobs(res->logprobs, res->n_logprobs, false));
        if (r->sampling.n_logprobs > 0)
            cJSON_AddItemToObject(mi, "output_top_logprobs",
                                  sglang_logprobs(res->logprobs, res->n_logprobs, true));
    }
    return pd_api_json_print(root, out);
fail:
    cJSON_Delete(root);
    return pd_api_json_print(NULL, out);
}

/* OpenAI completions logprobs: {tokens, token_logprobs, top_logprobs[{tok: lp}], text_offset} */
static cJSON *completion_logprobs(const struct pd_api_request *r, const struct pd_api_result *res) {
    if (!r->return_logprob)
        return cJSON_CreateNull();
    cJSON *lp = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(lp, "text_offset");
    if (!off)
        return lp;
    struct tok_text *t = pd_malloc(sizeof(*t));
    if (!t)
        return lp;
    /* echo: the prompt's tokens first (offsets from 0, the first one's logprob and top null as
     * vLLM gives them), then the completion's from logprob_offset */
    int offset = 0;
    int n_in = res->input_logprobs ? res->n_input_logprobs : 0;
    for (int j = 0; j < n_in + res->n_logprobs; j++) {
        const struct pd_sample *s = j < n_in ? &res->input_logprobs[j] : &res->logprobs[j - n_in];
        if (j == n_in)
            offset = res->logprob_offset;
        token_text(res, s->token, t);
        cJSON_AddItemToArray(toks, cJSON_CreateString(t->text));
        cJSON_AddItemToArray(tlp, logprob_json(s->logprob));
        cJSON_AddItemToArray(off, cJSON_CreateNumber(offset));
        offset += (int)t->raw_len;
        if (isnan(s->logprob)) {
            cJSON_AddItemToArray(top, cJSON_CreateNull());
            continue;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(top, m);
        for (int k = 0; m && k < s->n_top; k++) {
            token_text(res, s->top_ids[k], t);
            cJSON_AddNumberToObject(m, t->text, s->top_logprobs[k]);
        }
    }
    pd_free(t);
    return lp;
}

static cJSON *bytes_json(const struct tok_text *t) {
    cJSON *b = cJSON_CreateArray();
    for (size_t i = 0; b && i < t->raw_len; i++)
        cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)t->raw[i]));
    return b;
}

/* OpenAI chat logprobs: {content: [{token, logprob, bytes, top_logprobs: [...]}]} */
static cJSON *chat_logprobs(const struct pd_api_request *r, const struct pd_api_result *res) {
    if (!r->return_logprob)
        return cJSON_CreateNull();
    cJSON *lp = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(lp, "content");
    struct tok_text *t = content ? pd_malloc(sizeof(*t)) : NULL;
    if (!t)
        return lp;
    for (int i = 0; i < res->n_logprobs; i++) {
        const struct pd_sample *s = &res->logprobs[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(content, c);
        token_text(res, s->token, t);
        cJSON_AddStringToObject(c, "token", t->text);
        cJSON_AddNumberToObject(c, "logprob", s->logprob);
        cJSON_AddItemToObject(c, "bytes", bytes_json(t));
        cJSON *top = cJSON_AddArrayToObject(c, "top_logprobs");
        for (int k = 0; top && k < s->n_top && k < r->sampling.n_logprobs; k++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToArray(top, o);
            token_text(res, s->top_ids[k], t);
            cJSON_AddStringToObject(o, "token", t->text);
            cJSON_AddNumberToObject(o, "logprob", s->top_logprobs[k]);
            cJSON_AddItemToObject(o, "bytes", bytes_json(t));
        }
    }
    pd_free(t);
    return lp;
}

static cJSON *openai_head(const struct pd_api_result *res, const char *object) {
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON_AddStringToObject(root, "id", res->id ? res->id : "");
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)res->created);
    cJSON_AddStringToObject(root, "model", res->model ? res->model : "");
    return root;
}

/* OpenAI has no "abort" finish reason; an aborted request that still renders a body says
 * "stop" (errors travel as error objects, not as choices). */
static enum pd_api_finish openai_finish(enum pd_api_finish f) {
    return f == PD_API_FINISH_ABORT ? PD_API_FINISH_STOP : f;
}

static int render_openai(const struct pd_api_request *r, const struct pd_api_result *res,
                         bool chunk, bool first, char **out) {
    bool chat = r->kind == PD_API_CHAT;
    const char *object =
        chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    cJSON *root = openai_head(res, object);
    cJSON *choices = root ? cJSON_AddArrayToObject(root, "choices") : NULL;
    cJSON *c = cJSON_CreateObject();
    if (!choices || !c || !cJSON_AddItemToArray(choices, c)) {
        cJSON_Delete(c);
        goto fail;
    }
    cJSON_AddNumberToObject(c, "index", res->index);
    const char *text = res->text ? res->text : "";
    if (!chat) {
        if (!add_text(c, "text", text, res->text_len))
            goto fail;
        cJSON_AddItemToObject(c, "logprobs", completion_logprobs(r, res));
    } else {
        cJSON *msg = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (!msg)
            goto fail;
        if (!chunk || first)
            cJSON_AddStringToObject(msg, "role", "assistant");
        if (!add_text(msg, "content", text, res->text_len))
            goto fail;
        cJSON_AddItemToObject(c, "logprobs", chat_logprobs(r, res));
    }
    add_finish_reason(c, "finish_reason", openai_finish(res->finish));
    if (!chunk) {
        if (res->finish == PD_API_FINISH_STOP && res->matched_stop)
            add_text(c, "matched_stop", res->matched_stop, stop_len(res));
        else if (res->finish == PD_API_FINISH_STOP && res->matched_token >= 0)
            cJSON_AddNumberToObject(c, "matched_stop", res->matched_token);
        cJSON_AddItemToObject(root, "usage", usage_json(res));
    } else if (r->include_usage) {
        cJSON_AddNullToObject(root, "usage");
    }
    return pd_api_json_print(root, out);
fail:
    cJSON_Delete(root);
    return pd_api_json_print(NULL, out);
}

int pd_api_render_completion(const struct pd_api_request *r, const struct pd_api_result *res,
                             char **out) {
    return render_openai(r, res, false, false, out);
}

int pd_api_render_chat(const struct pd_api_request *r, const struct pd_api_result *res,
                       char **out) {
    return render_openai(r, res, false, false, out);
}

int pd_api_render_completion_chunk(const struct pd_api_request *r, const struct pd_api_result *res,
                                   char **out) {
    return render_openai(r, res, true, false, out);
}

int pd_api_render_chat_chunk(const struct pd_api_request *r, const struct pd_api_result *res,
                             bool first, char **out) {
    return render_openai(r, res, true, first, out);
}

int pd_api_render_usage_chunk(const struct pd_api_request *r, const struct pd_api_result *res,
                              char **out) {
    cJSON *root =
        openai_head(res, r->kind == PD_API_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!root || !cJSON_AddArrayToObject(root, "choices")) {
        cJSON_Delete(root);
        return pd_api_json_print(NULL, out);
    }
    cJSON_AddItemToObject(root, "usage", usage_json(res));
    return pd_api_json_print(root, out);
}

/* ---------------------------------------------------------------- info endpoints */

int pd_api_render_models(const char *served_model_name, const char *model_path, int64_t created,
                         int max_model_len, char **out) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    if (!data || !m || !cJSON_AddItemToArray(data, m)) {
        cJSON_Delete(m);
        cJSON_Delete(root);
        return pd_api_json_print(NULL, out);
    }
    cJSON_AddStringToObject(m, "id", served_model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "sglang");
    cJSON_AddStringToObject(m, "root", model_path ? model_path : served_model_name);
    cJSON_AddNumberToObject(m, "max_model_len", max_model_len);
    return pd_api_json_print(root, out);
}

static void add_str_or_null(cJSON *o, const char *k, const char *v) {
    if (v)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

int pd_api_render_server_info(const struct pd_server_args *a, const struct pd_api_runtime_info *rt,
                              char **out) {
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return pd_api_json_print(NULL, out);
    add_str_or_null(root, "model_path", a->model_path);
    add_str_or_null(root, "tokenizer_path", a->tokenizer_path);
    add_str_or_null(root, "served_model_name", a->served_model_name);
    add_str_or_null(root, "host", a->host);
    cJSON_AddNumberToObject(root, "port", a->port);
    cJSON_AddNumberToObject(root, "tp_size", a->tp_size);
    cJSON_AddNumberToObject(root, "dp_size", 1);
    cJSON_AddStringToObject(root, "disaggregation_mode",
                            pd_disagg_mode_names[a->disaggregation_mode]);
    cJSON_AddNumberToObject(root, "disaggregation_bootstrap_port",
                            a->disaggregation_bootstrap_port);
    add_str_or_null(root, "disaggregation_ib_device", a->disaggregation_ib_device);
    cJSON_AddStringToObject(root, "disaggregation_transfer_backend", "ucx");
    cJSON_AddNumberToObject(root, "context_length",
                            rt->context_length ? rt->context_length : a->context_length);
    cJSON_AddNumberToObject(root, "max_total_tokens",
                            rt->max_total_tokens ? rt->max_total_tokens : a->max_total_tokens);
    cJSON_AddNumberToObject(root, "max_running_requests", a->max_running_requests);
    cJSON_AddNumberToObject(root, "max_queued_requests", a->max_queued_requests);
    cJSON_AddNumberToObject(root, "max_prefill_tokens", a->max_prefill_tokens);
    cJSON_AddNumberToObject(root, "chunked_prefill_size", a->chunked_prefill_size);
    cJSON_AddNumberToObject(root, "page_size", a->page_size);
    cJSON_AddNumberToObject(root, "mem_fraction_static", a->mem_fraction_static);
    cJSON_AddStringToObject(root, "device", pd_device_names[a->device]);
    cJSON_AddNumberToObject(root, "base_gpu_id", a->base_gpu_id);
    cJSON_AddNumberToObject(root, "threads", a->threads);
    cJSON_AddStringToObject(root, "log_level", pd_log_level_names[a->log_level]);
    cJSON_AddBoolToObject(root, "disable_radix_cache", a->disable_prefix_cache);
    cJSON_AddNumberToObject(root, "random_seed", (double)a->random_seed);
    add_str_or_null(root, "version", rt->version);
    add_str_or_null(root, "backend", rt->backend);
    add_str_or_null(root, "transfer_transport", rt->transport);
    cJSON *pool = cJSON_AddObjectToObject(root, "kv_pool");
    if (pool) {
        cJSON_AddNumberToObject(pool, "num_pages", rt->num_pages);
        cJSON_AddNumberToObject(pool, "free_pages", rt->free_pages);
        cJSON_AddNumberToObject(pool, "used_pages", rt->num_pages - rt->free_pages);
        cJSON_AddNumberToObject(pool, "page_size", a->page_size);
    }
    cJSON *states = cJSON_AddArrayToObject(root, "internal_states");
    cJSON *st = cJSON_CreateObject();
    if (!states || !st || !cJSON_AddItemToArray(states, st)) {
        cJSON_Delete(st);
        cJSON_Delete(root);
        return pd_api_json_print(NULL, out);
    }
    cJSON_AddNumberToObject(st, "last_gen_throughput", rt->last_gen_throughput);
    cJSON_AddNumberToObject(st, "num_pages", rt->num_pages);
    cJSON_AddNumberToObject(st, "free_pages", rt->free_pages);
    if (rt->extra && cJSON_IsObject(rt->extra)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, rt->extra) {
            cJSON_DeleteItemFromObjectCaseSensitive(root, it->string);
            cJSON_AddItemToObject(root, it->string, cJSON_Duplicate(it, true));
        }
    }
    return pd_api_json_print(root, out);
}

int pd_api_render_model_info(const char *model_path, const char *tokenizer_path,
                             const char *model_type, const char *const *architectures,
                             int n_architectures, char **out) {
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return pd_api_json_print(NULL, out);
    add_str_or_null(root, "model_path", model_path);
    add_str_or_null(root, "tokenizer_path", tokenizer_path ? tokenizer_path : model_path);
    cJSON_AddBoolToObject(root, "is_generation", true);
    add_str_or_null(root, "model_type", model_type);
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    for (int i = 0; arch && i < n_architectures; i++)
        cJSON_AddItemToArray(arch, cJSON_CreateString(architectures[i]));
    return pd_api_json_print(root, out);
}

int pd_api_render_get_load(int load, bool local_prefill, char **out) {
    cJSON *root = cJSON_CreateObject();
    if (root)
        cJSON_AddNumberToObject(root, "load", load);
    if (root && local_prefill)
        cJSON_AddTrueToObject(root, "local_prefill");
    return pd_api_json_print(root, out);
}

int pd_api_render_loads(const struct pd_api_rank_load *ranks, int n_ranks, const char *timestamp,
                        char **out) {
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return pd_api_json_print(NULL, out);
    add_str_or_null(root, "timestamp", timestamp);
    cJSON_AddNumberToObject(root, "dp_rank_count", n_ranks);
    cJSON *loads = cJSON_AddArrayToObject(root, "loads");
    long long running = 0, waiting = 0;
    double usage_sum = 0;
    for (int i = 0; loads && i < n_ranks; i++) {
        const struct pd_api_rank_load *l = &ranks[i];
        double usage = l->max_total_num_tokens > 0
                           ? (double)l->num_used_tokens / (double)l->max_total_num_tokens
                           : 0.0;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(loads, o);
        cJSON_AddNumberToObject(o, "dp_rank", i);
        cJSON_AddNumberToObject(o, "num_running_reqs", l->num_running_reqs);
        cJSON_AddNumberToObject(o, "num_waiting_reqs", l->num_waiting_reqs);
        cJSON_AddNumberToObject(o, "num_total_reqs", l->num_running_reqs + l->num_waiting_reqs);
        cJSON_AddNumberToObject(o, "num_used_tokens", (double)l->num_used_tokens);
        cJSON_AddNumberToObject(o, "max_total_num_tokens", (double)l->max_total_num_tokens);
        cJSON_AddNumberToObject(o, "token_usage", usage);
        running += l->num_running_reqs;
        waiting += l->num_waiting_reqs;
        usage_sum += usage;
    }
    cJSON *agg = cJSON_AddObjectToObject(root, "aggregate");
    if (agg) {
        cJSON_AddNumberToObject(agg, "total_running_reqs", (double)running);
        cJSON_AddNumberToObject(agg, "total_waiting_reqs", (double)waiting);
        cJSON_AddNumberToObject(agg, "total_reqs", (double)(running + waiting));
        cJSON_AddNumberToObject(agg, "avg_token_usage", n_ranks ? usage_sum / n_ranks : 0.0);
    }
    return pd_api_json_print(root, out);
}
