/*
 * api.c — request parsing and validation for the HTTP user plane (API.md), fan-out of batches
 * and n > 1 into sub-requests and the merge of their answers.
 *
 * Parsing is two passes over one cJSON tree: the prompt (text / input_ids / prompt / messages),
 * then the sampling fields, which live in "sampling_params" for /generate and at the top level
 * for the OpenAI endpoints under OpenAI's names (max_tokens, logprobs, ...). Every check names
 * the field as the client spelled it. Unknown fields are ignored, as OpenAI and SGLang do.
 * The whole body is checked for UTF-8 before JSON parsing, so every string that reaches the
 * tokenizer is valid; cJSON itself refuses lone surrogates in \u escapes.
 *
 * Rendering the answers is api_render.c.
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
/* ---------------------------------------------------------------- errors */

static int bad(struct pd_api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(struct pd_api_error *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    snprintf(e->type, sizeof(e->type), "invalid_request_error");
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    e->code[0] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return PD_EINVAL;
}

static int oom(struct pd_api_error *e) {
    pd_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory parsing the request");
    return PD_ENOMEM;
}

/* ---------------------------------------------------------------- small helpers */

bool pd_api_utf8_valid(const char *str, size_t len, size_t *bad_at) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else {
            goto fail;
        }
        if (len - i <= n)
            goto fail;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                goto fail;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            goto fail;
        i += n + 1;
    }
    return true;
fail:
    if (bad_at)
        *bad_at = i;
    return false;
}

void pd_api_format_id(char *buf, size_t cap, const char *prefix, uint64_t hi, uint64_t lo) {
    snprintf(buf, cap, "%s%016llx%016llx", prefix, (unsigned long long)hi, (unsigned long long)lo);
}

/* Field lookups. Each returns PD_OK leaving *dst untouched when the field is absent or null. */
static int get_bool(const cJSON *obj, const char *key, const char *param, bool *dst,
                    struct pd_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return PD_OK;
    if (!cJSON_IsBool(v))
        return bad(e, param, "'%s' must be a boolean, got %s", param, pd_json_kind(v));
    *dst = cJSON_IsTrue(v);
    return PD_OK;
}

static bool is_integer(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

static int get_int(const cJSON *obj, const char *key, const char *param, double lo, double hi,
                   int *dst, bool *given, struct pd_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return PD_OK;
    if (!is_integer(v))
        return bad(e, param, "'%s' must be an integer, got %s", param,
                   cJSON_IsNumber(v) ? "a fractional number" : pd_json_kind(v));
    if (v->valuedouble < lo || v->valuedouble > hi)
        return bad(e, param, "'%s' is %.17g: must be in [%.17g, %.17g]", param, v->valuedouble, lo,
                   hi);
    /* callers with an open range (n, best_of) refuse all but one value next; clamping keeps the
     * conversion of a huge number defined (a double outside int's range is UB to convert) */
    *dst = v->valuedouble >= INT_MAX   ? INT_MAX
           : v->valuedouble <= INT_MIN ? INT_MIN
                                       : (int)v->valuedouble;
    if (given)
        *given = true;
    return PD_OK;
}

/* A number in [lo, hi] (lo excluded when lo_open). */
static int get_float(const cJSON *obj, const char *key, const char *param, double lo, bool lo_open,
                     double hi, float *dst, struct pd_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return PD_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return bad(e, param, "'%s' must be a number, got %s", param, pd_json_kind(v));
    double x = v->valuedouble;
    if ((lo_open ? !(x > lo) : !(x >= lo)) || !(x <= hi)) {
        if (isinf(hi))
            return bad(e, param, "'%s' is %g: must be %s %g", param, x, lo_open ? ">" : ">=", lo);
        return bad(e, param, "'%s' is %g: must be in %c%g, %g]", param, x, lo_open ? '(' : '[', lo,
                   hi);
    }
    *dst = (float)x;
    return PD_OK;
}

static int get_string(const cJSON *obj, const char *key, const char *param, char **dst,
                      struct pd_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return PD_OK;
    if (!cJSON_IsString(v))
        return bad(e, param, "'%s' must be a string, got %s", param, pd_json_kind(v));
    char *s = pd_strdup(v->valuestring);
    if (!s)
        return oom(e);
    pd_free(*dst);
    *dst = s;
    return PD_OK;
}

/* The raw text of a top-level member's value in an already-validated JSON object, so integers
 * beyond 2^53 are read exactly. Keys written with escapes are not recognized. */
static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static const char *skip_string(const char *p, const char *end) {
    for (p++; p < end && *p != '"'; p++)
        if (*p == '\\')
            p++;
    return p < end ? p + 1 : end;
}

static const char *skip_value(const char *p, const char *end) {
    if (p < end && *p == '"')
        return skip_string(p, end);
    int depth = 0;
    while (p < end) {
        char c = *p;
        if (c == '"') {
            p = skip_string(p, end);
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0)
                return p;
            if (--depth == 0)
                return p + 1;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
            return p;
        }
        p++;
    }
    return p;
}

static bool raw_member(const char *body, size_t len, const char *key, const char **val,
                       size_t *val_len) {
    const char *p = body, *end = body + len;
    size_t klen = strlen(key);
    p = skip_ws(p, end);
    if (p >= end || *p != '{')
        return false;
    p++;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"')
            return false;
        const char *k = p + 1;
        p = skip_string(p, end);
        bool match = (size_t)(p - 1 - k) == klen && memcmp(k, key, klen) == 0;
        p = skip_ws(p, end);
        if (p >= end || *p != ':')
            return false;
        p = skip_ws(p + 1, end);
        const char *v = p;
        p = skip_value(p, end);
        if (match) {
            *val = v;
            *val_len = (size_t)(p - v);
            return true;
        }
        p = skip_ws(p, end);
        if (p >= end || *p != ',')
            return false;
        p++;
    }
}

/* ---------------------------------------------------------------- prompt */

static int parse_ids(const cJSON *arr, const char *param, int32_t **ids, int *n,
                     struct pd_api_error *e) {
    int count = cJSON_GetArraySize(arr);
    if (count == 0)
        return bad(e, param, "'%s' must not be empty", param);
    int32_t *v = pd_malloc((size_t)count * sizeof(int32_t));
    if (!v)
        return oom(e);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!is_integer(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX) {
            pd_free(v);
            return bad(e, param, "'%s'[%d] must be a token id (an integer >= 0), got %s", param, i,
                       is_integer(it) ? "a negative or too large number" : pd_json_kind(it));
        }
        v[i++] = (int32_t)it->valuedouble;
    }
    *ids = v;
    *n = count;
    return PD_OK;
}

static int set_text(struct pd_api_request *r, const char *s, struct pd_api_error *e) {
    r->text_len = strlen(s);
    if (!(r->text = pd_strndup(s, r->text_len)))
        return oom(e);
    return PD_OK;
}

static int batch_unsupported(struct pd_api_error *e, const char *param) {
    return bad(e, param,
               "'%s' holds a batch (a list of prompts); batches are not supported: send one "
               "request per prompt",
               param);
}

static int parse_generate_prompt(const cJSON *root, struct pd_api_request *r,
                                 struct pd_api_error *e) {
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
    if (text && cJSON_IsNull(text))
        text = NULL;
    if (ids && cJSON_IsNull(ids))
        ids = NULL;
    if (text && ids)
        return bad(e, "text", "give either 'text' or 'input_ids', not both");
    if (!text && !ids)
        return bad(e, "text", "the request needs 'text' or 'input_ids'");
    if (text) {
        if (cJSON_IsArray(text))
            return batch_unsupported(e, "text");
        if (!cJSON_IsString(text))
            return bad(e, "text", "'text' must be a string, got %s", pd_json_kind(text));
        return set_text(r, text->valuestring, e);
    }
    if (!cJSON_IsArray(ids))
        return bad(e, "input_ids", "'input_ids' must be a list of token ids, got %s",
                   pd_json_kind(ids));
    if (cJSON_IsArray(cJSON_GetArrayItem(ids, 0)))
        return batch_unsupported(e, "input_ids");
    return parse_ids(ids, "input_ids", &r->input_ids, &r->n_input_ids, e);
}

static int parse_completion_prompt(const cJSON *root, struct pd_api_request *r,
                                   struct pd_api_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p || cJSON_IsNull(p))
        return bad(e, "prompt", "the request needs 'prompt'");
    if (cJSON_IsString(p))
        return set_text(r, p->valuestring, e);
    if (!cJSON_IsArray(p))
        return bad(e, "prompt", "'prompt' must be a string or a list of token ids, got %s",
                   pd_json_kind(p));
    const cJSON *first = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(first) || cJSON_IsArray(first))
        return batch_unsupported(e, "prompt");
    return parse_ids(p, "prompt", &r->input_ids, &r->n_input_ids, e);
}

/* A message's content parts with an image among them, as the template's list: {"type":
 * "text", "text"} and {"type": "image"} in order; the images go to r->images. */
static cJSON *image_content(const cJSON *content, const char *param,
                            const struct pd_api_config *cfg, struct pd_api_request *r,
                            struct pd_api_error *e) {
    cJSON *list = cJSON_CreateArray();
    if (!list) {
        oom(e);
        return NULL;
    }
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        char pp[96];
        snprintf(pp, sizeof(pp), "%s[%d]", param, k++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(part, "text");
        cJSON *o = cJSON_CreateObject();
        bool ok = o && cJSON_AddItemToArray(list, o);
        if (!ok) {
            cJSON_Delete(o);
            oom(e);
            goto fail;
        }
        if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
            bad(e, param, "'%s' must be an object with a 'type'", pp);
            goto fail;
        }
        if (pd__api_is_image_part(part)) {
            if (pd__api_add_image_part(part, pp, cfg, r, e) != PD_OK)
                goto fail;
            if (!cJSON_AddStringToObject(o, "type", "image")) {
                oom(e);
                goto fail;
            }
            continue;
        }
        if (strcmp(type->valuestring, "text") != 0) {
            bad(e, param, "'%s' has type '%s'; 'text', 'image_url' and 'image' parts are supported",
                pp, type->valuestring);
            goto fail;
        }
        if (!cJSON_IsString(pt)) {
            bad(e, param, "'%s'.text must be a string", pp);
            goto fail;
        }
        if (!cJSON_AddStringToObject(o, "type", "text") ||
            !cJSON_AddStringToObject(o, "text", pt->valuestring)) {
            oom(e);
            goto fail;
        }
    }
    return list;
fail:
    cJSON_Delete(list);
    return NULL;
}

/* Copies messages as [{"role", "content": string}], joining text parts with "\n" (vLLM's
 * "string" content format); a message with image parts keeps its parts (image_content). */
static int parse_messages(const cJSON *root, const struct pd_api_config *cfg,
                          struct pd_api_request *r, struct pd_api_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs || cJSON_IsNull(msgs))
        return bad(e, "messages", "the request needs 'messages'");
    if (!cJSON_IsArray(msgs))
        return bad(e, "messages", "'messages' must be a list, got %s", pd_json_kind(msgs));
    if (cJSON_GetArraySize(msgs) == 0)
        return bad(e, "messages", "'messages' must not be empty");
    cJSON *out = cJSON_CreateArray();
    char *joined = NULL;
    if (!out)
        return oom(e);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char param[64];
        snprintf(param, sizeof(param), "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            bad(e, param, "'%s' must be an object, got %s", param, pd_json_kind(m));
            goto fail;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) {
            snprintf(param, sizeof(param), "messages[%d].role", i);
            bad(e, param, "'%s' must be a string, got %s", param,
                role ? pd_json_kind(role) : "nothing");
            goto fail;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        snprintf(param, sizeof(param), "messages[%d].content", i);
        const char *text = "";
        cJSON *parts = NULL; /* a message with images: its parts as a list */
        bool has_image = false;
        const cJSON *part;
        if (cJSON_IsArray(content))
            cJSON_ArrayForEach(part, content) has_image |= pd__api_is_image_part(part);
        if (has_image) {
            if (!(parts = image_content(content, param, cfg, r, e)))
                goto fail;
        } else if (cJSON_IsString(content)) {
            text = content->valuestring;
        } else if (cJSON_IsArray(content)) {
            size_t cap = 1, n = 0;
            int k = 0;
            cJSON_ArrayForEach(part, content) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *pt = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
                    bad(e, param, "'%s'[%d] must be an object with a 'type'", param, k);
                    goto fail;
                }
                if (strcmp(type->valuestring, "text") != 0) {
                    bad(e, param, "'%s'[%d] has type '%s'; only 'text' parts are supported", param,
                        k, type->valuestring);
                    goto fail;
                }
                if (!cJSON_IsString(pt)) {
                    bad(e, param, "'%s'[%d].text must be a string", param, k);
                    goto fail;
                }
                size_t tl = strlen(pt->valuestring);
                if (pd_array_grow((void **)&joined, &cap, n + tl + 2, 1) != PD_OK) {
                    oom(e);
                    goto fail;
                }
                if (k > 0)
                    joined[n++] = '\n';
                memcpy(joined + n, pt->valuestring, tl);
                n += tl;
                joined[n] = '\0';
                k++;
            }
            text = joined ? joined : "";
        } else if (content && !cJSON_IsNull(content)) {
            bad(e, param, "'%s' must be a string or a list of text parts, got %s", param,
                pd_json_kind(content));
            goto fail;
        }
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(out, o) ||
            !cJSON_AddStringToObject(o, "role", role->valuestring) ||
            !(parts ? cJSON_AddItemToObject(o, "content", parts)
                    : cJSON_AddStringToObject(o, "content", text) != NULL)) {
            cJSON_Delete(parts);
            oom(e);
            goto fail;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (cJSON_IsString(name) && !cJSON_AddStringToObject(o, "name", name->valuestring)) {
            oom(e);
            goto fail;
        }
        pd_free(joined);
        joined = NULL;
        i++;
    }
    r->messages = out;
    return PD_OK;
fail:
    pd_free(joined);
    cJSON_Delete(out);
    return e->status == 500 ? PD_ENOMEM : PD_EINVAL;
}

/* ---------------------------------------------------------------- sampling */

/* Decodes the JSON string literal at p (already validated by cJSON) into out (at least as many
 * bytes as the literal), keeping the NUL bytes a "\u0000" makes. Returns the decoded length. */
static size_t json_unescape(const char *p, const char *end, char *out) {
    size_t n = 0;
    for (p++; p < end && *p != '"'; p++) {
        if (*p != '\\') {
            out[n++] = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned cp = (unsigned)strtoul((char[5]){p[1], p[2], p[3], p[4], 0}, NULL, 16);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p + 6 < end && p[1] == '\\' && p[2] == 'u') {
                unsigned lo = (unsigned)strtoul((char[5]){p[3], p[4], p[5], p[6], 0}, NULL, 16);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            if (cp < 0x80) {
                out[n++] = (char)cp;
            } else if (cp < 0x800) {
                out[n++] = (char)(0xC0 | (cp >> 6));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                out[n++] = (char)(0xE0 | (cp >> 12));
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                out[n++] = (char)(0xF0 | (cp >> 18));
                out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: out[n++] = *p; break; /* " \\ / */
        }
    }
    return n;
}

/* One stop string from its raw literal (raw_len bytes starting at '"'), NUL bytes kept. */
static int add_stop(struct pd_api_request *r, const char *raw, size_t raw_len, const char *param,
                    struct pd_api_error *e) {
    char *s = pd_malloc(raw_len + 1);
    if (!s)
        return oom(e);
    size_t n = json_unescape(raw, raw + raw_len, s);
    s[n] = '\0';
    if (n == 0) {
        pd_free(s);
        return PD_OK;
    }
    if (r->n_stop == PD_API_MAX_STOP) {
        pd_free(s);
        return bad(e, param, "'%s' has more than %d strings", param, PD_API_MAX_STOP);
    }
    r->stop[r->n_stop] = s;
    r->stop_len[r->n_stop++] = n;
    return PD_OK;
}

/* stop: a string or a list of strings, decoded from the object's raw text (obj_raw, obj_len
 * bytes) so that a "\u0000" inside one stays part of it. */
static int parse_stop(const cJSON *obj, const char *obj_raw, size_t obj_len, const char *param,
                      struct pd_api_request *r, struct pd_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "stop");
    if (!v || cJSON_IsNull(v))
        return PD_OK;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return bad(e, param, "'%s' must be a string or a list of strings, got %s", param,
                   pd_json_kind(v));
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it))
            return bad(e, param, "'%s' must hold strings, got %s", param, pd_json_kind(it));
    }
    const char *raw;
    size_t raw_len;
    if (!obj_raw || !raw_member(obj_raw, obj_len, "stop", &raw, &raw_len))
        return bad(e, param, "'%s' could not be read (a key written with escapes?)", param);
    const char *p = raw, *end = raw + raw_len;
    if (*p == '"')
        return add_stop(r, p, raw_len, param, e);
    for (p = skip_ws(p + 1, end); p < end && *p != ']';) {
        const char *q = skip_value(p, end);
        int rc = add_stop(r, p, (size_t)(q - p), param, e);
        if (rc)
            return rc;
        p = skip_ws(q, end);
        if (p < end && *p == ',')
            p = skip_ws(p + 1, end);
    }
    return PD_OK;
}

static int parse_stop_ids(const cJSON *obj, const char *param, struct pd_sampling_params *sp,
                          struct pd_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "stop_token_ids");
    if (!v || cJSON_IsNull(v))
        return PD_OK;
    if (!cJSON_IsArray(v))
        return bad(e, param, "'%s' must be a list of token ids, got %s", param, pd_json_kind(v));
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!is_integer(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX)
            return bad(e, param, "'%s' must hold token ids (integers >= 0)", param);
        if (sp->n_stop_token_ids == PD_SAMPLING_MAX_STOP_IDS)
            return bad(e, param, "'%s' has more than %d ids", param, PD_SAMPLING_MAX_STOP_IDS);
        sp->stop_token_ids[sp->n_stop_token_ids++] = (int32_t)it->valuedouble;
    }
    return PD_OK;
}

/* OpenAI's logit_bias {"token id": bias in [-100, 100]} into sp (the ids are checked against the
 * vocabulary with the prompt's, pd_api_check_token_ids). */
static int parse_logit_bias(const cJSON *root, struct pd_sampling_params *sp,
                            struct pd_api_error *e) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!lb || cJSON_IsNull(lb))
        return PD_OK;
    if (!cJSON_IsObject(lb))
        return bad(e, "logit_bias", "'logit_bias' must be an object, got %s", pd_json_kind(lb));
    const cJSON *it;
    cJSON_ArrayForEach(it, lb) {
        char *end = NULL;
        errno = 0;
        long id = strtol(it->string, &end, 10);
        if (end == it->string || *end || errno || id < 0 || id > INT32_MAX)
            return bad(e, "logit_bias", "'logit_bias' key \"%.40s\" is not a token id", it->string);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return bad(e, "logit_bias",
                       "'logit_bias' for token %ld must be a number in "
                       "[-100, 100]",
                       id);
        if (sp->n_logit_bias == PD_SAMPLING_MAX_LOGIT_BIAS)
            return bad(e, "logit_bias", "'logit_bias' has more than %d entries",
                       PD_SAMPLING_MAX_LOGIT_BIAS);
        sp->logit_bias_ids[sp->n_logit_bias] = (int32_t)id;
        sp->logit_bias[sp->n_logit_bias++] = (float)it->valuedouble;
    }
    return PD_OK;
}

/* The sampling fields shared by all three endpoints. obj is sampling_params (generate) or the
 * body (OpenAI); pfx is prepended to param names ("sampling_params." or ""). */
static int parse_sampling(const cJSON *obj, const char *obj_raw, size_t obj_len, const char *pfx,
                          struct pd_api_request *r, struct pd_api_error *e) {
    struct pd_sampling_params *sp = &r->sampling;
    char p[96];
#define P(name) (snprintf(p, sizeof(p), "%s%s", pfx, name), p)
    int rc;
    if ((rc = get_float(obj, "temperature", P("temperature"), 0, false, INFINITY, &sp->temperature,
                        e)) ||
        (rc = get_float(obj, "top_p", P("top_p"), 0, true, 1, &sp->top_p, e)) ||
        (rc = get_float(obj, "min_p", P("min_p"), 0, false, 1, &sp->min_p, e)) ||
        (rc = get_float(obj, "frequency_penalty", P("frequency_penalty"), -2, false, 2,
                        &sp->frequency_penalty, e)) ||
        (rc = get_float(obj, "presence_penalty", P("presence_penalty"), -2, false, 2,
                        &sp->presence_penalty, e)) ||
        (rc = get_float(obj, "repetition_penalty", P("repetition_penalty"), 0, true, 2,
                        &sp->repetition_penalty, e)))
        return rc;
    int top_k = sp->top_k;
    if ((rc = get_int(obj, "top_k", P("top_k"), -1, INT32_MAX, &top_k, NULL, e)))
        return rc;
    sp->top_k = top_k < 0 ? 0 : top_k;
    if ((rc = get_bool(obj, "ignore_eos", P("ignore_eos"), &sp->ignore_eos, e)) ||
        (rc = get_bool(obj, "skip_special_tokens", P("skip_special_tokens"),
                       &r->skip_special_tokens, e)) ||
        (rc = get_bool(obj, "no_stop_trim", P("no_stop_trim"), &r->no_stop_trim, e)) ||
        (rc = get_int(obj, "min_tokens", P("min_tokens"), 0, INT32_MAX, &r->min_tokens, NULL, e)) ||
        (rc = parse_stop(obj, obj_raw, obj_len, P("stop"), r, e)) ||
        (rc = parse_stop_ids(obj, P("stop_token_ids"), sp, e)))
        return rc;
    /* SGLang's sampling_params spell it min_new_tokens */
    if (r->kind == PD_API_GENERATE && (rc = get_int(obj, "min_new_tokens", P("min_new_tokens"), 0,
                                                    INT32_MAX, &r->min_tokens, NULL, e)))
        return rc;
    sp->min_new_tokens = r->min_tokens;
    int n = 1;
    if ((rc = get_int(obj, "n", P("n"), -INFINITY, INFINITY, &n, NULL, e)))
        return rc;
    if (n != 1)
        return bad(e, P("n"), "'%s' is %d: only n = 1 is supported", p, n);
    const char *seed_key = r->kind == PD_API_GENERATE ? "sampling_seed" : "seed";
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(obj, seed_key);
    if (seed && !cJSON_IsNull(seed)) {
        /* [-2^63, 2^64): the range whose conversions below are defined (2^64 - 1 rounds up to
         * 2^64 as a double, so the bound is exclusive) */
        if (!is_integer(seed) || !(seed->valuedouble >= -9223372036854775808.0 &&
                                   seed->valuedouble < 18446744073709551616.0))
            return bad(e, P(seed_key), "'%s' must be an integer", p);
        sp->has_seed = true;
        sp->seed = seed->valuedouble < 0 ? (uint64_t)(int64_t)seed->valuedouble
                                         : (uint64_t)seed->valuedouble;
    }
#undef P
    return PD_OK;
}

static int parse_max_tokens(const cJSON *obj, const char *key, const char *param, int min,
                            struct pd_api_request *r, struct pd_api_error *e) {
    return get_int(obj, key, param, min, INT32_MAX, &r->sampling.max_new_tokens,
                   &r->max_tokens_given, e);
}

static int parse_openai(const cJSON *root, const char *body, size_t len, struct pd_api_request *r,
                        struct pd_api_error *e) {
    int rc;
    if ((rc = parse_sampling(root, body, len, "", r, e)))
        return rc;
    if (r->kind == PD_API_CHAT) {
        if ((rc = parse_max_tokens(root, "max_tokens", "max_tokens", 1, r, e)) ||
            (rc =
                 parse_max_tokens(root, "max_completion_tokens", "max_completion_tokens", 1, r, e)))
            return rc;
        bool logprobs = false;
        int top = 0;
        if ((rc = get_bool(root, "logprobs", "logprobs", &logprobs, e)) ||
            (rc = get_int(root, "top_logprobs", "top_logprobs", 0, PD_SAMPLING_MAX_LOGPROBS, &top,
                          NULL, e)))
            return rc;
        if (top > 0 && !logprobs)
            return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r->return_logprob = logprobs;
        r->sampling.n_logprobs = top;
        if ((rc = get_bool(root, "add_generation_prompt", "add_generation_prompt",
                           &r->add_generation_prompt, e)))
            return rc;
        const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
        if (kw && !cJSON_IsNull(kw)) {
            if (!cJSON_IsObject(kw))
                return bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            if (!(r->chat_template_kwargs = cJSON_Duplicate(kw, true)))
                return oom(e);
        }
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0)
            return bad(e, "tools", "'tools' (function calling) is not supported");
    } else {
        /* 0 only with echo (the prompt's logprobs alone: lm-eval's loglikelihood), below */
        if ((rc = parse_max_tokens(root, "max_tokens", "max_tokens", 0, r, e)))
            return rc;
        int lp = -1;
        if ((rc = get_int(root, "logprobs", "logprobs", 0, PD_SAMPLING_MAX_LOGPROBS, &lp, NULL, e)))
            return rc;
        if (lp >= 0) {
            r->return_logprob = true;
            r->sampling.n_logprobs = lp;
        }
        if ((rc = get_bool(root, "echo", "echo", &r->echo, e)))
            return rc;
        if (r->echo && r->return_logprob)
            r->logprob_start_len = 0; /* the prompt's logprobs, then the completion's */
        if (r->max_tokens_given && r->sampling.max_new_tokens == 0 && !r->echo)
            return bad(e, "max_tokens", "'max_tokens' 0 needs 'echo': true (the prompt alone)");
        const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (cJSON_IsString(suffix) && suffix->valuestring[0])
            return bad(e, "suffix", "'suffix' is not supported");
    }
    int best_of = 1;
    if ((rc = get_int(root, "best_of", "best_of", -INFINITY, INFINITY, &best_of, NULL, e)))
        return rc;
    if (best_of != 1)
        return bad(e, "best_of", "'best_of' is %d: only 1 is supported", best_of);
    if ((rc = parse_logit_bias(root, &r->sampling, e)))
        return rc;
    bool stream = false;
    if ((rc = get_bool(root, "stream", "stream", &stream, e)))
        return rc;
    r->stream = stream;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return bad(e, "stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(so, "include_usage", "stream_options.include_usage", &r->include_usage,
                           e)))
            return rc;
    }
    return get_string(root, "rid", "rid", &r->rid, e);
}

static int parse_generate(const cJSON *root, const char *body, size_t len, struct pd_api_request *r,
                          struct pd_api_error *e) {
    int rc;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "sampling_params");
    const char *sp_raw = NULL;
    size_t sp_len = 0;
    if (!raw_member(body, len, "sampling_params", &sp_raw, &sp_len))
        sp_raw = NULL;
    if (sp && !cJSON_IsNull(sp)) {
        if (cJSON_IsArray(sp))
            return batch_unsupported(e, "sampling_params");
        if (!cJSON_IsObject(sp))
            return bad(e, "sampling_params", "'sampling_params' must be an object, got %s",
                       pd_json_kind(sp));
        if ((rc = parse_sampling(sp, sp_raw, sp_len, "sampling_params.", r, e)) ||
            (rc =
                 parse_max_tokens(sp, "max_new_tokens", "sampling_params.max_new_tokens", 0, r, e)))
            return rc;
    }
    if ((rc = get_bool(root, "stream", "stream", &r->stream, e)) ||
        (rc = get_bool(root, "return_logprob", "return_logprob", &r->return_logprob, e)) ||
        (rc = get_int(root, "top_logprobs_num", "top_logprobs_num", 0, PD_SAMPLING_MAX_LOGPROBS,
                      &r->sampling.n_logprobs, NULL, e)) ||
        (rc = get_int(root, "logprob_start_len", "logprob_start_len", -1, INT32_MAX,
                      &r->logprob_start_len, NULL, e)))
        return rc;
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(root, "rid");
    if (cJSON_IsArray(rid))
        return batch_unsupported(e, "rid");
    return get_string(root, "rid", "rid", &r->rid, e);
}

static int parse_bootstrap(const cJSON *root, const char *body, size_t len,
                           const struct pd_api_config *cfg, struct pd_api_request *r,
                           struct pd_api_error *e) {
    int rc;
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(root, "bootstrap_host");
    const cJSON *port = cJSON_GetObjectItemCaseSensitive(root, "bootstrap_port");
    const cJSON *room = cJSON_GetObjectItemCaseSensitive(root, "bootstrap_room");
    if (cJSON_IsArray(host))
        return batch_unsupported(e, "bootstrap_host");
    if (cJSON_IsArray(port))
        return batch_unsupported(e, "bootstrap_port");
    if (cJSON_IsArray(room))
        return batch_unsupported(e, "bootstrap_room");
    if ((rc = get_string(root, "bootstrap_host", "bootstrap_host", &r->bootstrap_host, e)) ||
        (rc = get_int(root, "bootstrap_port", "bootstrap_port", 1, 65535, &r->bootstrap_port, NULL,
                      e)))
        return rc;
    if (room && !cJSON_IsNull(room)) {
        const char *raw;
        size_t n;
        if (!cJSON_IsNumber(room) || !raw_member(body, len, "bootstrap_room", &raw, &n))
            return bad(e, "bootstrap_room", "'bootstrap_room' must be an integer, got %s",
                       pd_json_kind(room));
        if (n > 0 && raw[0] == '-')
            return bad(e, "bootstrap_room", "'bootstrap_room' must be in [0, 2^63), got %.*s",
                       (int)n, raw);
        uint64_t v = 0;
        for (size_t i = 0; i < n; i++) {
            if (raw[i] < '0' || raw[i] > '9')
                return bad(e, "bootstrap_room", "'bootstrap_room' must be an integer, got %.*s",
                           (int)n, raw);
            unsigned d = (unsigned)(raw[i] - '0');
            if (v > (UINT64_MAX >> 1) / 10 || v * 10 + d > (UINT64_MAX >> 1))
                return bad(e, "bootstrap_room", "'bootstrap_room' must be in [0, 2^63), got %.*s",
                           (int)n, raw);
            v = v * 10 + d;
        }
        r->bootstrap_room = v;
        r->has_bootstrap_room = true;
    }
    if (cfg->disaggregated && !cfg->bootstrap_optional && !r->has_bootstrap_room)
        return bad(e, "bootstrap_room",
                   "this server runs disaggregated: the request needs 'bootstrap_room' (and "
                   "'bootstrap_host', 'bootstrap_port'); send it through the router");
    return PD_OK;
}

static int check_model(const cJSON *root, const struct pd_api_config *cfg, struct pd_api_request *r,
                       struct pd_api_error *e) {
    int rc = get_string(root, "model", "model", &r->model, e);
    if (rc || !r->model || !r->model[0] || !cfg->served_model_name)
        return rc;
    if (strcmp(r->model, cfg->served_model_name) == 0 ||
        (cfg->model_path && strcmp(r->model, cfg->model_path) == 0))
        return PD_OK;
    pd_api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                     "The model `%s` does not exist. This server serves `%s`.", r->model,
                     cfg->served_model_name);
    return PD_EINVAL;
}

void pd_api_request_free(struct pd_api_request *r) {
    if (!r)
        return;
    pd_free(r->rid);
    pd_free(r->model);
    pd_free(r->text);
    pd_free(r->input_ids);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->chat_template_kwargs);
    for (int i = 0; i < r->n_images; i++)
        pd_free(r->images[i]);
    pd_free(r->images);
    for (int i = 0; i < r->n_stop; i++)
        pd_free(r->stop[i]);
    pd_free(r->bootstrap_host);
    memset(r, 0, sizeof(*r));
}

/* r empty, with the defaults of kind's fields; e cleared. */
static void request_begin(enum pd_api_kind kind, struct pd_api_request *r, struct pd_api_error *e) {
    memset(r, 0, sizeof(*r));
    memset(e, 0, sizeof(*e));
    r->kind = kind;
    pd_sampling_params_default(&r->sampling);
    if (kind == PD_API_COMPLETIONS)
        r->sampling.max_new_tokens = 16; /* OpenAI's and SGLang's default for completions */
    r->skip_special_tokens = true;
    r->add_generation_prompt = true;
    r->logprob_start_len = -1;
    r->bootstrap_port = PD_API_DEFAULT_BOOTSTRAP_PORT;
}

/* body as one JSON value with nothing but white space after it, or NULL (*end: where cJSON
 * stopped, for the error). */
static cJSON *parse_whole(const char *body, size_t len, const char **end) {
    *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, end, false);
    if (root && skip_ws(*end, body + len) != body + len) {
        cJSON_Delete(root);
        root = NULL; /* trailing bytes after the value */
    }
    return root;
}

/* The request in root (body's tree, valid UTF-8; freed here). */
static int parse_root(enum pd_api_kind kind, const char *body, size_t len, cJSON *root,
                      const struct pd_api_config *cfg, struct pd_api_request *r,
                      struct pd_api_error *e) {
    int rc;
    if (!cJSON_IsObject(root)) {
        rc = bad(e, NULL, "the request body must be a JSON object, got %s", pd_json_kind(root));
        goto fail;
    }
    if (kind == PD_API_GENERATE) {
        rc = parse_generate_prompt(root, r, e);
        if (!rc)
            rc = pd__api_parse_image_data(root, cfg, r, e);
    } else if (kind == PD_API_COMPLETIONS) {
        rc = parse_completion_prompt(root, r, e);
    } else {
        rc = parse_messages(root, cfg, r, e);
    }
    if (rc || (rc = kind == PD_API_GENERATE ? parse_generate(root, body, len, r, e)
                                            : parse_openai(root, body, len, r, e)))
        goto fail;
    if (kind != PD_API_GENERATE && (rc = check_model(root, cfg, r, e)))
        goto fail;
    if ((rc = parse_bootstrap(root, body, len, cfg, r, e)))
        goto fail;
    if (pd_sampling_params_check(&r->sampling) != PD_OK) {
        rc = bad(e, NULL, "%s", pd_error_msg());
        goto fail;
    }
    cJSON_Delete(root);
    return PD_OK;
fail:
    cJSON_Delete(root);
    pd_api_request_free(r);
    r->kind = kind;
    return rc;
}

int pd_api_parse(enum pd_api_kind kind, const char *body, size_t len,
                 const struct pd_api_config *cfg, struct pd_api_request *r,
                 struct pd_api_error *e) {
    request_begin(kind, r, e);
    size_t bad_at;
    if (!pd_api_utf8_valid(body, len, &bad_at))
        return bad(e, NULL, "the request body is not valid UTF-8 (byte %zu)", bad_at);
    const char *end;
    cJSON *root = parse_whole(body, len, &end);
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return bad(e, NULL, "the request body is not valid JSON (near byte %zu)", at);
    }
    return parse_root(kind, body, len, root, cfg, r, e);
}

int pd_api_parse_tree(enum pd_api_kind kind, const char *body, size_t len, cJSON *root,
                      const struct pd_api_config *cfg, struct pd_api_request *r,
                      struct pd_api_error *e) {
    request_begin(kind, r, e);
    return parse_root(kind, body, len, root, cfg, r, e);
}

/* ---------------------------------------------------------------- stop strings */

int pd_api_find_stop(const struct pd_api_request *r, const char *text, size_t len, size_t before,
                     size_t *at) {
    for (int i = 0; i < r->n_stop; i++) {
        size_t l = r->stop_len[i];
        size_t from = before > l ? before - l : 0; /* a match may straddle the old end */
        if (l == 0 || len < from + l)
            continue;
        const char *m = memmem(text + from, len - from, r->stop[i], l);
        if (m) {
            *at = (size_t)(m - text);
            return i;
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- fan-out */

void pd_api_split_free(struct pd_api_split *s) {
    if (!s)
        return;
    for (int k = 0; s->bodies && k < s->count; k++)
        pd_free(s->bodies[k]);
    pd_free(s->bodies);
    pd_free(s->rid);
    cJSON_Delete(s->root);
    memset(s, 0, sizeof(*s));
}

/* The raw text of each item of the JSON list at raw (raw_len bytes, validated): up to cap. */
static int raw_items(const char *raw, size_t raw_len, const char **items, size_t *lens, int cap) {
    const char *p = raw, *end = raw + raw_len;
    int n = 0;
    if (p >= end || *p != '[')
        return -1;
    for (p = skip_ws(p + 1, end); p < end && *p != ']';) {
        const char *q = skip_value(p, end);
        if (n == cap)
            return -1;
        items[n] = p;
        lens[n++] = (size_t)(q - p);
        p = skip_ws(q, end);
        if (p < end && *p == ',')
            p = skip_ws(p + 1, end);
    }
    return n;
}

/* Replaces obj[key] with a copy of item (NULL: removes it). */
static int put_item(cJSON *obj, const char *key, const cJSON *item) {
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    if (!item)
        return PD_OK;
    cJSON *c = cJSON_Duplicate(item, true);
    if (!c || !cJSON_AddItemToObject(obj, key, c)) {
        cJSON_Delete(c);
        return PD_ENOMEM;
    }
    return PD_OK;
}

/* The prompt list of a batch body (NULL: one prompt) and the key it lives under. */
static const cJSON *batch_list(enum pd_api_kind kind, const cJSON *root, const char **key) {
    if (kind == PD_API_GENERATE) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
        if (cJSON_IsArray(text)) {
            *key = "text";
            return text;
        }
        if (cJSON_IsArray(ids) &&
            (cJSON_GetArraySize(ids) == 0 || cJSON_IsArray(cJSON_GetArrayItem(ids, 0)))) {
            *key = "input_ids";
            return ids;
        }
    } else if (kind == PD_API_COMPLETIONS) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        const cJSON *first = cJSON_GetArrayItem(p, 0);
        if (cJSON_IsArray(p) && (!first || cJSON_IsString(first) || cJSON_IsArray(first))) {
            *key = "prompt";
            return p;
        }
    }
    return NULL;
}

/* n of an object (absent or null: 1); 400 outside [1, max_n], naming the flag that sets it. */
static int samples_of(const cJSON *obj, const char *param, int max_n, int *n,
                      struct pd_api_error *e) {
    *n = 1;
    int rc = get_int(obj, "n", param, -INFINITY, INFINITY, n, NULL, e);
    if (rc == PD_OK && (*n < 1 || *n > max_n))
        rc = bad(e, param, "'%s' is %d: must be in [1, %d] (at most --max-n samples per prompt)",
                 param, *n, max_n);
    return rc;
}

/* Per-prompt generate fields SGLang accepts as lists (one entry per prompt). */
static const char *const per_prompt_keys[] = {"sampling_params", "return_logprob",
                                              "logprob_start_len", "top_logprobs_num"};

/* Sub-request k's rid: the client's list entry, or "<rid>_<j>" derived from a shared one. */
static int sub_rid(const cJSON *rid, int k, int n, int count, int n_prompts, char *buf, size_t cap,
                   struct pd_api_error *e) {
    buf[0] = '\0';
    if (!rid || cJSON_IsNull(rid))
        return PD_OK;
    if (cJSON_IsString(rid)) {
        snprintf(buf, cap, "%s_%d", rid->valuestring, k);
        return PD_OK;
    }
    int len = cJSON_IsArray(rid) ? cJSON_GetArraySize(rid) : -1;
    const cJSON *it = NULL;
    if (len == count)
        it = cJSON_GetArrayItem(rid, k);
    else if (len == n_prompts)
        it = cJSON_GetArrayItem(rid, k / n);
    if (!cJSON_IsString(it))
        return bad(e, "rid",
                   "'rid' must be a string or a list of %d strings (one per sub-request) or "
                   "of %d (one per prompt)",
                   count, n_prompts);
    if (len == count)
        snprintf(buf, cap, "%s", it->valuestring);
    else
        snprintf(buf, cap, "%s_%d", it->valuestring, k % n);
    return PD_OK;
}

/* bootstrap_host / bootstrap_port: a list with one entry per sub-request, or one for all. */
static int sub_bootstrap(cJSON *sub, const cJSON *root, const char *key, int k, int count,
                         struct pd_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsArray(v))
        return PD_OK;
    if (cJSON_GetArraySize(v) != count)
        return bad(e, key, "'%s' must be a list of %d entries (one per sub-request), got %d", key,
                   count, cJSON_GetArraySize(v));
    return put_item(sub, key, cJSON_GetArrayItem(v, k)) ? oom(e) : PD_OK;
}

int pd_api_split(enum pd_api_kind kind, const char *body, size_t len,
                 const struct pd_api_config *cfg, struct pd_api_split *out,
                 struct pd_api_error *e) {
    memset(out, 0, sizeof(*out));
    memset(e, 0, sizeof(*e));
    out->count = out->n = out->n_prompts = 1;
    const char **rooms = NULL;
    size_t *room_lens = NULL;
    cJSON *sub = NULL;
    if (!pd_api_utf8_valid(body, len, NULL))
        return PD_OK; /* pd_api_parse says what is wrong */
    const char *end;
    cJSON *root = parse_whole(body, len, &end);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return PD_OK;
    }
    int rc = PD_OK;
    const char *list_key = NULL;
    const cJSON *list = batch_list(kind, root, &list_key);
    int n_prompts = list ? cJSON_GetArraySize(list) : 1;
    if (n_prompts == 0) {
        rc = bad(e, list_key, "'%s' must not be empty", list_key);
        goto done;
    }
    int n = 1;
    int max_n = cfg && cfg->max_n > 0 ? cfg->max_n : PD_API_MAX_N;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "sampling_params");
    if (kind != PD_API_GENERATE) {
        rc = samples_of(root, "n", max_n, &n, e);
    } else if (cJSON_IsObject(sp)) {
        rc = samples_of(sp, "sampling_params.n", max_n, &n, e);
    } else if (cJSON_IsArray(sp)) { /* one per prompt: n must agree */
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, sp) {
            int ni = 1;
            if (cJSON_IsObject(it) && (rc = samples_of(it, "sampling_params.n", max_n, &ni, e)))
                break;
            if (i++ == 0)
                n = ni;
            else if (ni != n) {
                rc = bad(e, "sampling_params",
                         "every 'sampling_params' entry must have the same "
                         "'n'");
                break;
            }
        }
    }
    if (rc)
        goto done;
    long long count = (long long)n_prompts * n;
    if (count > PD_API_MAX_FANOUT) {
        rc = bad(e, n > 1 ? "n" : list_key,
                 "the request fans out into %lld sub-requests (%d prompts x n = %d): at most %d",
                 count, n_prompts, n, PD_API_MAX_FANOUT);
        goto done;
    }
    out->n = n;
    out->n_prompts = n_prompts;
    out->batch = list != NULL;
    out->count = (int)count;
    if (count == 1 && !list) { /* one request: pd_api_parse_tree takes the tree */
        out->root = root;
        root = NULL;
        goto done;
    }
    if (list && kind == PD_API_GENERATE)
        for (size_t i = 0; i < PD_ARRAY_LEN(per_prompt_keys); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, per_prompt_keys[i]);
            if (cJSON_IsArray(v) && cJSON_GetArraySize(v) != n_prompts) {
                rc = bad(e, per_prompt_keys[i], "'%s' must have one entry per prompt (%d), got %d",
                         per_prompt_keys[i], n_prompts, cJSON_GetArraySize(v));
                goto done;
            }
        }
    /* bootstrap_room: raw list items, so 64-bit rooms stay exact */
    const cJSON *room = cJSON_GetObjectItemCaseSensitive(root, "bootstrap_room");
    const char *room_raw = NULL;
    size_t room_raw_len = 0;
    if (cJSON_IsArray(room)) {
        rooms = pd_calloc((size_t)count, sizeof(*rooms));
        room_lens = pd_calloc((size_t)count, sizeof(*room_lens));
        if (!rooms || !room_lens) {
            rc = oom(e);
            goto done;
        }
        if (!raw_member(body, len, "bootstrap_room", &room_raw, &room_raw_len) ||
            cJSON_GetArraySize(room) != count ||
            raw_items(room_raw, room_raw_len, rooms, room_lens, (int)count) != count) {
            rc = bad(e, "bootstrap_room",
                     "'bootstrap_room' must be a list of %lld rooms (one per sub-request: %d "
                     "prompts x n = %d), got %d",
                     count, n_prompts, n, cJSON_GetArraySize(room));
            goto done;
        }
    } else if (cfg && cfg->disaggregated && room && !cJSON_IsNull(room)) {
        rc = bad(e, "bootstrap_room",
                 "the request fans out into %lld sub-requests (%d prompts x n = %d): "
                 "'bootstrap_room' must be a list of %lld rooms",
                 count, n_prompts, n, count);
        goto done;
    }
    if (!(out->bodies = pd_calloc((size_t)count, sizeof(char *)))) {
        rc = oom(e);
        goto done;
    }
    size_t total = 0; /* n copies of a long prompt: bounded, not n x the body limit */
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(root, "rid");
    if (cJSON_IsString(rid) && !(out->rid = pd_strdup(rid->valuestring))) {
        rc = oom(e);
        goto done;
    }
    for (int k = 0; k < count; k++) {
        int i = k / n;
        char rbuf[256];
        if (!(sub = cJSON_Duplicate(root, true))) {
            rc = oom(e);
            goto done;
        }
        if (list && put_item(sub, list_key, cJSON_GetArrayItem(list, i))) {
            rc = oom(e);
            goto done;
        }
        if (list && kind == PD_API_GENERATE)
            for (size_t f = 0; f < PD_ARRAY_LEN(per_prompt_keys); f++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, per_prompt_keys[f]);
                if (cJSON_IsArray(v) &&
                    put_item(sub, per_prompt_keys[f], cJSON_GetArrayItem(v, i))) {
                    rc = oom(e);
                    goto done;
                }
            }
        if (kind == PD_API_GENERATE) {
            cJSON *ssp = cJSON_GetObjectItemCaseSensitive(sub, "sampling_params");
            if (cJSON_IsObject(ssp))
                cJSON_DeleteItemFromObjectCaseSensitive(ssp, "n");
        } else {
            cJSON_DeleteItemFromObjectCaseSensitive(sub, "n");
        }
        if ((rc = sub_rid(rid, k, n, (int)count, n_prompts, rbuf, sizeof(rbuf), e)))
            goto done;
        if (rbuf[0]) {
            cJSON_DeleteItemFromObjectCaseSensitive(sub, "rid");
            if (!cJSON_AddStringToObject(sub, "rid", rbuf)) {
                rc = oom(e);
                goto done;
            }
        }
        if ((rc = sub_bootstrap(sub, root, "bootstrap_host", k, (int)count, e)) ||
            (rc = sub_bootstrap(sub, root, "bootstrap_port", k, (int)count, e)))
            goto done;
        if (rooms) {
            char num[40];
            if (room_lens[k] >= sizeof(num)) {
                rc = bad(e, "bootstrap_room", "'bootstrap_room'[%d] must be an integer", k);
                goto done;
            }
            memcpy(num, rooms[k], room_lens[k]);
            num[room_lens[k]] = '\0';
            cJSON_DeleteItemFromObjectCaseSensitive(sub, "bootstrap_room");
            if (!cJSON_AddRawToObject(sub, "bootstrap_room", num)) {
                rc = oom(e);
                goto done;
            }
        }
        if (!(out->bodies[k] = cJSON_PrintUnformatted(sub))) {
            rc = oom(e);
            goto done;
        }
        total += strlen(out->bodies[k]);
        if (total > PD_API_MAX_FANOUT_BYTES) {
            rc = bad(e, n > 1 ? "n" : list_key,
                     "the request fans out into %lld sub-requests whose bodies exceed %u MiB "
                     "together: send fewer samples or shorter prompts",
                     count, PD_API_MAX_FANOUT_BYTES >> 20);
            goto done;
        }
        cJSON_Delete(sub);
        sub = NULL;
    }
done:
    cJSON_Delete(sub);
    cJSON_Delete(root);
    pd_free(rooms);
    pd_free(room_lens);
    if (rc)
        pd_api_split_free(out);
    return rc;
}

int pd_api_merge(enum pd_api_kind kind, int n, char *const *bodies, int count, char **out) {
    *out = NULL;
    if (kind == PD_API_GENERATE) { /* a list of the bodies as they are */
        size_t total = 3;
        for (int k = 0; k < count; k++)
            total += strlen(bodies[k]) + 1;
        char *s = pd_malloc(total), *o = s;
        if (!s)
            return pd_errorf(PD_ENOMEM, "out of memory rendering a batch answer");
        *o++ = '[';
        for (int k = 0; k < count; k++) {
            size_t l = strlen(bodies[k]);
            if (k)
                *o++ = ',';
            memcpy(o, bodies[k], l);
            o += l;
        }
        *o++ = ']';
        *o = '\0';
        *out = s;
        return PD_OK;
    }
    cJSON *root = NULL, *sub = NULL;
    double prompt = 0, completion = 0, cached = 0;
    int rc = PD_OK;
    for (int k = 0; k < count; k++) {
        sub = cJSON_Parse(bodies[k]);
        cJSON *choices = cJSON_GetObjectItemCaseSensitive(sub, "choices");
        cJSON *usage = cJSON_GetObjectItemCaseSensitive(sub, "usage");
        cJSON *c = cJSON_DetachItemFromArray(choices, 0);
        if (!c) {
            rc = pd_errorf(PD_EINVAL, "sub-request %d's answer has no choice", k);
            goto fail;
        }
        cJSON *idx = cJSON_GetObjectItemCaseSensitive(c, "index");
        if (idx)
            cJSON_SetNumberValue(idx, k);
        else
            cJSON_AddNumberToObject(c, "index", k);
        if (k % n == 0) {
            prompt +=
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens"));
            cached += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details"), "cached_tokens"));
        }
        completion +=
            cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens"));
        if (!root) {
            root = sub;
            sub = NULL;
        }
        if (!cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(root, "choices"), c)) {
            cJSON_Delete(c);
            rc = pd_errorf(PD_ENOMEM, "out of memory rendering a batch answer");
            goto fail;
        }
        cJSON_Delete(sub);
        sub = NULL;
    }
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    if (usage) {
        cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens"), prompt);
        cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens"),
                             completion);
        cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(usage, "total_tokens"),
                             prompt + completion);
        cJSON_SetNumberValue(
            cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details"), "cached_tokens"),
            cached);
    }
    return pd_api_json_print(root, out);
fail:
    cJSON_Delete(sub);
    cJSON_Delete(root);
    return rc;
}

/* ---------------------------------------------------------------- after tokenizing */

int pd_api_render_chat_prompt(const struct pd_api_request *r, const struct pd_chat_template *t,
                              const char *bos_token, const char *eos_token, char **out,
                              size_t *out_len, struct pd_api_error *e) {
    PD_ASSERT(r->kind == PD_API_CHAT && r->messages);
    struct pd_chat_args args = {
        .messages = r->messages,
        .add_generation_prompt = r->add_generation_prompt,
        .bos_token = bos_token,
        .eos_token = eos_token,
        .extra = r->chat_template_kwargs,
    };
    int rc = pd_chat_template_render(t, &args, out, out_len);
    if (rc == PD_ENOMEM)
        return oom(e);
    if (rc)
        return bad(e, "messages", "the chat template refused the messages: %s", pd_error_msg());
    return PD_OK;
}

bool pd_api_wants_input_logprobs(const struct pd_api_request *r, int n_prompt_tokens) {
    return r->return_logprob && r->logprob_start_len >= 0 && r->logprob_start_len < n_prompt_tokens;
}

int pd_api_check_length(struct pd_api_request *r, int n_prompt_tokens, int context_length,
                        struct pd_api_error *e) {
    const char *param = r->kind == PD_API_CHAT          ? "messages"
                        : r->kind == PD_API_COMPLETIONS ? "prompt"
                        : r->input_ids                  ? "input_ids"
                                                        : "text";
    if (n_prompt_tokens <= 0)
        return bad(e, param, "the prompt is empty");
    if (context_length <= 0)
        return PD_OK;
    if (n_prompt_tokens >= context_length)
        return pd_api_error_set(e, 400, "invalid_request_error", param, "context_length_exceeded",
                                "The input (%d tokens) is longer than the model's context length "
                                "(%d tokens, --context-length).",
                                n_prompt_tokens, context_length);
    if (!r->max_tokens_given && r->kind == PD_API_CHAT) {
        r->sampling.max_new_tokens = context_length - n_prompt_tokens;
        return PD_OK;
    }
    long long total = (long long)n_prompt_tokens + r->sampling.max_new_tokens;
    if (total > context_length) {
        const char *mp =
            r->kind == PD_API_GENERATE ? "sampling_params.max_new_tokens" : "max_tokens";
        return pd_api_error_set(e, 400, "invalid_request_error", mp, "context_length_exceeded",
                                "Requested token count exceeds the model's maximum context length "
                                "of %d tokens (--context-length). You requested a total of %lld "
                                "tokens: %d tokens from the input and %d tokens for the "
                                "completion. Please reduce the input or the completion to fit "
                                "within the limit.",
                                context_length, total, n_prompt_tokens, r->sampling.max_new_tokens);
    }
    return PD_OK;
}

int pd_api_check_token_ids(const struct pd_api_request *r, int32_t vocab, struct pd_api_error *e) {
    const char *param = r->kind == PD_API_GENERATE ? "input_ids" : "prompt";
    for (int i = 0; i < r->n_input_ids; i++)
        if (r->input_ids[i] < 0 || r->input_ids[i] >= vocab)
            return bad(e, param, "'%s'[%d] = %d is not a token id (vocabulary size %d)", param, i,
                       r->input_ids[i], vocab);
    for (int i = 0; i < r->sampling.n_stop_token_ids; i++)
        if (r->sampling.stop_token_ids[i] >= vocab)
            return bad(e, "stop_token_ids", "stop token id %d is outside the vocabulary (size %d)",
                       r->sampling.stop_token_ids[i], vocab);
    for (int i = 0; i < r->sampling.n_logit_bias; i++)
        if (r->sampling.logit_bias_ids[i] >= vocab)
            return bad(e, "logit_bias",
                       "logit_bias token id %d is outside the vocabulary (size %d)",
                       r->sampling.logit_bias_ids[i], vocab);
    return PD_OK;
}
