/*
 * body.c — the bootstrap-field rewrite of generation bodies (see body.h). cJSON parses the body
 * only to inspect it (batch shape, n, stream, rid); the output is the client's text with the
 * router's fields spliced in after '{', except when the client sent bootstrap fields of its own.
 * Rooms are printed as integers from uint64_t, never through a double (2^63 > 2^53).
 */
#include "router/body.h"
#include "router/config.h"

#include "common/base/alloc.h"
#include "common/api.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* A growable string. */
struct sbuf {
    char *p;
    size_t len, cap;
    int err;
};

static void sb_put(struct sbuf *b, const char *s, size_t n) {
    if (b->err)
        return;
    if (pd_array_grow((void **)&b->p, &b->cap, b->len + n + 1, 1) != PD_OK) {
        b->err = PD_ENOMEM;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

/* s as a JSON string literal. */
static void sb_json_str(struct sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            sb_put(b, esc, 2);
        } else if (*c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", *c);
            sb_str(b, esc);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

void pd_router_body_info_free(struct pd_router_body_info *info) {
    if (!info)
        return;
    if (info->rids)
        for (int i = 0; i < info->n; i++)
            pd_free(info->rids[i]);
    pd_free(info->rids);
    pd_free(info->rooms);
    memset(info, 0, sizeof(*info));
}

/* Batch size of the body: 0 when it holds one prompt, -1 for an empty prompt list. */
static int batch_size(int route, const cJSON *root) {
    const cJSON *list = NULL;
    if (route == PD_ROUTER_ROUTE_GENERATE) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
        if (cJSON_IsArray(text))
            list = text;
        else if (cJSON_IsArray(ids) &&
                 (cJSON_GetArraySize(ids) == 0 || cJSON_IsArray(cJSON_GetArrayItem(ids, 0))))
            list = ids; /* [[ids], ...]; [] is an empty list either way */
    } else if (route == PD_ROUTER_ROUTE_COMPLETIONS) {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        const cJSON *first = cJSON_GetArrayItem(prompt, 0);
        if (cJSON_IsArray(prompt) && (!first || cJSON_IsString(first) || cJSON_IsArray(first)))
            list = prompt; /* [int...] is one tokenized prompt */
    }
    if (!list)
        return 0;
    int n = cJSON_GetArraySize(list);
    return n > 0 ? n : -1;
}

/* n (parallel samples per prompt): generate's sampling_params.n (an object, or a list with one
 * per prompt whose first entry speaks for all: the daemons check they agree), OpenAI's n. */
static int samples_n(int route, const cJSON *root, int max_n, int *n) {
    const cJSON *item = NULL;
    *n = 1;
    if (route == PD_ROUTER_ROUTE_GENERATE) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "sampling_params");
        if (cJSON_IsArray(sp))
            sp = cJSON_GetArrayItem(sp, 0);
        item = cJSON_GetObjectItemCaseSensitive(sp, "n");
    } else {
        item = cJSON_GetObjectItemCaseSensitive(root, "n");
    }
    if (!item || cJSON_IsNull(item))
        return PD_OK;
    double v = cJSON_GetNumberValue(item);
    /* range first: (int) of a double outside int (1e400 parses as inf) is undefined */
    if (!cJSON_IsNumber(item) || !(v >= 1 && v <= max_n) || v != (double)(int)v)
        return pd_errorf(PD_EINVAL,
                         "'n' must be an integer in [1, %d] (at most --max-n samples per prompt)",
                         max_n);
    *n = (int)v;
    return PD_OK;
}

static const char *const owned_keys[] = {"bootstrap_host", "bootstrap_port", "bootstrap_room"};

/* The client's rid(s) into info->rids, or rooms as strings when there is none. */
static int collect_rids(const cJSON *root, struct pd_router_body_info *info) {
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(root, "rid");
    info->rids = pd_calloc((size_t)info->n, sizeof(char *));
    if (!info->rids)
        return pd_errorf(PD_ENOMEM, "rids");
    if (!rid || cJSON_IsNull(rid)) {
        info->rid_added = true;
        for (int i = 0; i < info->n; i++) {
            char s[24];
            snprintf(s, sizeof(s), "%" PRIu64, info->rooms[i]);
            if (!(info->rids[i] = pd_strdup(s)))
                return pd_errorf(PD_ENOMEM, "rids");
        }
        return PD_OK;
    }
    if (!info->batch) {
        if (!cJSON_IsString(rid))
            return pd_errorf(PD_EINVAL, "'rid' must be a string");
        return (info->rids[0] = pd_strdup(rid->valuestring)) ? PD_OK : pd_errorf(PD_ENOMEM, "rids");
    }
    /* the sub-requests' rids as the daemons name them (common/api.h pd_api_split): a list entry
     * each, "<rid>_<k>" from one string, "<rid[prompt]>_<sample>" from one per prompt */
    int n = info->samples > 0 ? info->samples : 1, prompts = info->n / n;
    int len = cJSON_IsArray(rid) ? cJSON_GetArraySize(rid) : -1;
    if (!cJSON_IsString(rid) && len != info->n && len != prompts)
        return pd_errorf(PD_EINVAL,
                         "'rid' must be a string or a list of %d strings (one per "
                         "sub-request) or of %d (one per prompt)",
                         info->n, prompts);
    for (int k = 0; k < info->n; k++) {
        const cJSON *r = cJSON_IsString(rid) ? rid
                         : len == info->n    ? cJSON_GetArrayItem(rid, k)
                                             : cJSON_GetArrayItem(rid, k / n);
        if (!cJSON_IsString(r))
            return pd_errorf(PD_EINVAL, "'rid' must hold strings");
        char s[300];
        if (len == info->n)
            snprintf(s, sizeof(s), "%s", r->valuestring);
        else
            snprintf(s, sizeof(s), "%s_%d", r->valuestring, cJSON_IsString(rid) ? k : k % n);
        if (!(info->rids[k] = pd_strdup(s)))
            return pd_errorf(PD_ENOMEM, "rids");
    }
    return PD_OK;
}

/* "rid":... with the router's rids */
static void put_rids(struct sbuf *b, const struct pd_router_body_info *info, const char *open,
                     const char *close) {
    sb_str(b, "\"rid\":");
    sb_str(b, open);
    for (int i = 0; i < info->n; i++) {
        if (i)
            sb_str(b, ",");
        sb_json_str(b, info->rids[i]);
    }
    sb_str(b, close);
}

/* The spliced fields, without braces: "bootstrap_host":...,"rid":... (host NULL: the rid only,
 * and nothing when the client gave its own). */
static void put_fields(struct sbuf *b, const struct pd_router_body_info *info, const char *host,
                       int port) {
    char num[24];
    const char *open = info->batch ? "[" : "", *close = info->batch ? "]" : "";
    if (!host) {
        if (info->rid_added)
            put_rids(b, info, open, close);
        return;
    }
    sb_str(b, "\"bootstrap_host\":");
    sb_str(b, open);
    for (int i = 0; i < info->n; i++) {
        if (i)
            sb_str(b, ",");
        sb_json_str(b, host);
    }
    sb_str(b, close);
    sb_str(b, ",\"bootstrap_port\":");
    sb_str(b, open);
    for (int i = 0; i < info->n; i++) {
        if (i)
            sb_str(b, ",");
        if (port == PD_ROUTER_BOOTSTRAP_PORT_NULL)
            sb_str(b, "null");
        else {
            snprintf(num, sizeof(num), "%d", port);
            sb_str(b, num);
        }
    }
    sb_str(b, close);
    sb_str(b, ",\"bootstrap_room\":");
    sb_str(b, open);
    for (int i = 0; i < info->n; i++) {
        if (i)
            sb_str(b, ",");
        snprintf(num, sizeof(num), "%" PRIu64, info->rooms[i]);
        sb_str(b, num);
    }
    sb_str(b, close);
    if (info->rid_added) {
        sb_str(b, ",");
        put_rids(b, info, open, close);
    }
}

/* Prompt logprobs asked for; a logprob_start_len list (batch) counts when any entry is >= 0. */
static bool wants_input_logprobs(int route, const cJSON *root) {
    if (route == PD_ROUTER_ROUTE_COMPLETIONS) {
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
        return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "echo")) && cJSON_IsNumber(lp);
    }
    if (route != PD_ROUTER_ROUTE_GENERATE)
        return false;
    const cJSON *rl = cJSON_GetObjectItemCaseSensitive(root, "return_logprob");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "logprob_start_len");
    bool any_rl = cJSON_IsTrue(rl), any_st = cJSON_IsNumber(st) && st->valuedouble >= 0;
    const cJSON *it;
    if (cJSON_IsArray(rl))
        cJSON_ArrayForEach(it, rl) any_rl = any_rl || cJSON_IsTrue(it);
    if (cJSON_IsArray(st))
        cJSON_ArrayForEach(it, st) any_st = any_st || (cJSON_IsNumber(it) && it->valuedouble >= 0);
    return any_rl && any_st;
}

int pd_router_body_rewrite(int route, int max_n, const char *body, size_t len,
                           const char *bootstrap_host, int bootstrap_port,
                           struct pd_router_rng *rng, char **out, size_t *out_len,
                           struct pd_router_body_info *info) {
    cJSON *root = cJSON_ParseWithLength(body, len);
    int rc = pd_router_body_rewrite_parsed(route, max_n, body, len, root, bootstrap_host,
                                           bootstrap_port, rng, out, out_len, info);
    cJSON_Delete(root);
    return rc;
}

int pd_router_body_rewrite_parsed(int route, int max_n, const char *body, size_t len, cJSON *root,
                                  const char *bootstrap_host, int bootstrap_port,
                                  struct pd_router_rng *rng, char **out, size_t *out_len,
                                  struct pd_router_body_info *info) {
    int rc;
    char *printed = NULL;
    struct sbuf b = {0};
    memset(info, 0, sizeof(*info));
    *out = NULL;
    *out_len = 0;
    if (!root)
        return pd_errorf(PD_EINVAL, "request body is not valid JSON");
    if (!cJSON_IsObject(root)) {
        rc = pd_errorf(PD_EINVAL, "request body must be a JSON object");
        goto fail;
    }
    int n_samples;
    if ((rc = samples_n(route, root, max_n > 0 ? max_n : PD_API_MAX_N, &n_samples)))
        goto fail;
    int bs = batch_size(route, root);
    if (bs < 0) {
        rc = pd_errorf(PD_EINVAL, "the prompt list is empty");
        goto fail;
    }
    long long count = (long long)(bs > 0 ? bs : 1) * n_samples;
    if (count > PD_API_MAX_FANOUT) {
        rc = pd_errorf(PD_EINVAL,
                       "the request fans out into %lld sub-requests (prompts x n): at "
                       "most %d",
                       count, PD_API_MAX_FANOUT);
        goto fail;
    }
    /* one room (and rid) per sub-request the daemons fan the body out into, prompt-major */
    info->batch = bs > 0 || n_samples > 1;
    info->n = (int)count;
    info->samples = n_samples;
    info->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "stream"));
    info->input_logprobs = wants_input_logprobs(route, root);
    info->rooms = pd_calloc((size_t)info->n, sizeof(uint64_t));
    if (!info->rooms) {
        rc = pd_errorf(PD_ENOMEM, "rooms");
        goto fail;
    }
    for (int i = 0; i < info->n; i++)
        info->rooms[i] = pd_router_rng_room(rng);
    if ((rc = collect_rids(root, info)))
        goto fail;

    /* the text to splice into: the client's, or a re-print without its bootstrap fields */
    const char *src = body;
    size_t src_len = len;
    bool owned_present = false;
    for (size_t k = 0; k < PD_ARRAY_LEN(owned_keys); k++)
        owned_present |= cJSON_GetObjectItemCaseSensitive(root, owned_keys[k]) != NULL;
    if (owned_present) {
        for (size_t k = 0; k < PD_ARRAY_LEN(owned_keys); k++)
            cJSON_DeleteItemFromObjectCaseSensitive(root, owned_keys[k]);
        if (!(printed = cJSON_PrintUnformatted(root))) {
            rc = pd_errorf(PD_ENOMEM, "re-printing the request body");
            goto fail;
        }
        src = printed;
        src_len = strlen(printed);
    }
    size_t brace = 0;
    while (brace < src_len && src[brace] != '{')
        brace++;
    PD_ASSERT(brace < src_len); /* cJSON said it is an object */
    sb_put(&b, "{", 1);
    size_t before = b.len;
    put_fields(&b, info, bootstrap_host, bootstrap_port);
    if (root->child && b.len > before)
        sb_put(&b, ",", 1);
    sb_put(&b, src + brace + 1, src_len - brace - 1);
    if (b.err) {
        rc = pd_errorf(PD_ENOMEM, "rewriting the request body");
        goto fail;
    }
    cJSON_free(printed);
    *out = b.p;
    *out_len = b.len;
    return PD_OK;

fail:
    pd_free(b.p);
    cJSON_free(printed);
    pd_router_body_info_free(info);
    return rc;
}

/* A prompt given as text (its bytes) or as token ids (counted); false for anything else. */
static bool add_prompt(const cJSON *p, struct pd_router_prompt_size *sz) {
    if (cJSON_IsString(p)) {
        sz->text_bytes += strlen(p->valuestring);
        return true;
    }
    if (!cJSON_IsArray(p))
        return false;
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsNumber(it))
            return false; /* a batch of prompts */
        sz->id_tokens++;
    }
    return true;
}

int pd_router_body_prompt_size(int route, const cJSON *root, struct pd_router_prompt_size *out) {
    struct pd_router_prompt_size sz = {0};
    bool ok = false;
    int samples;
    if (!cJSON_IsObject(root) || batch_size(route, root) != 0 ||
        samples_n(route, root, PD_API_MAX_FANOUT, &samples) != PD_OK || samples != 1)
        goto out;
    /* a prompt with images has no size known here (and the decode has no vision encoder to
     * prefill it alone): PD_EINVAL, so it takes the prefill */
    const cJSON *img = cJSON_GetObjectItemCaseSensitive(root, "image_data");
    if (route == PD_ROUTER_ROUTE_GENERATE && img && !cJSON_IsNull(img))
        goto out;
    if (route == PD_ROUTER_ROUTE_GENERATE) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
        ok = add_prompt(ids ? ids : cJSON_GetObjectItemCaseSensitive(root, "text"), &sz);
    } else if (route == PD_ROUTER_ROUTE_COMPLETIONS) {
        ok = add_prompt(cJSON_GetObjectItemCaseSensitive(root, "prompt"), &sz);
    } else if (route == PD_ROUTER_ROUTE_CHAT) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages"), *m;
        if (!cJSON_IsArray(msgs))
            goto out;
        ok = true;
        cJSON_ArrayForEach(m, msgs) {
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *part;
            sz.id_tokens += PD_ROUTER_CHAT_MESSAGE_TOKENS; /* the template's role markers */
            if (cJSON_IsString(c))
                sz.text_bytes += strlen(c->valuestring);
            else if (cJSON_IsArray(c))
                cJSON_ArrayForEach(part, c) {
                    const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
                    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                    if (cJSON_IsString(type) && strcmp(type->valuestring, "text") != 0)
                        ok = false; /* an image (or another part) */
                    if (cJSON_IsString(t))
                        sz.text_bytes += strlen(t->valuestring);
                }
        }
    }
out:
    if (!ok)
        return PD_EINVAL;
    *out = sz;
    return PD_OK;
}

char *pd_router_abort_body(const char *rid) {
    struct sbuf b = {0};
    sb_str(&b, "{\"rid\":");
    sb_json_str(&b, rid);
    sb_str(&b, "}");
    if (b.err) {
        pd_free(b.p);
        return NULL;
    }
    return b.p;
}
