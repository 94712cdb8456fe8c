/*
 * lpmerge.c — the prefill's prompt logprobs into the decode's answer (lpmerge.h says where).
 */
#include "router/lpmerge.h"

#include "common/base/alloc.h"
#include "common/base/status.h"
#include "router/body.h"

#include <cjson/cJSON.h>
#include <string.h>

static int prepend(cJSON *dst, const cJSON *src, const char *key);

/* One event of a streamed prefill answer into the source: /generate keeps each index's last
 * meta_info (its chunks are cumulative), completions appends each choice's logprobs lists. */
static int absorb_event(int route, cJSON *src, cJSON *ev) {
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(ev, "index");
    if (route == PD_ROUTER_ROUTE_GENERATE) {
        int k = cJSON_IsNumber(idx) ? idx->valueint : 0;
        cJSON *mi = cJSON_DetachItemFromObjectCaseSensitive(ev, "meta_info");
        if (!mi || k < 0 || k >= 1 << 20) {
            cJSON_Delete(mi);
            return PD_OK;
        }
        /* the size once: cJSON_GetArraySize walks the list, so asking per slot was quadratic */
        for (int n = cJSON_GetArraySize(src); n <= k; n++) {
            cJSON *o = cJSON_CreateObject();
            if (!o || !cJSON_AddItemToArray(src, o)) {
                cJSON_Delete(o);
                cJSON_Delete(mi);
                return PD_ENOMEM;
            }
        }
        cJSON *slot = cJSON_GetArrayItem(src, k);
        cJSON_DeleteItemFromObjectCaseSensitive(slot, "meta_info");
        return cJSON_AddItemToObject(slot, "meta_info", mi) ? PD_OK : PD_ENOMEM;
    }
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(src, "choices");
    cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(ev, "choices")) {
        const cJSON *ci = cJSON_GetObjectItemCaseSensitive(c, "index");
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c, "logprobs");
        if (!cJSON_IsNumber(ci) || !cJSON_IsObject(lp))
            continue;
        cJSON *have = NULL, *it;
        cJSON_ArrayForEach(it, choices) {
            const cJSON *hi = cJSON_GetObjectItemCaseSensitive(it, "index");
            if (cJSON_IsNumber(hi) && hi->valueint == ci->valueint)
                have = it;
        }
        if (!have) {
            have = cJSON_CreateObject();
            if (!have || !cJSON_AddItemToArray(choices, have) ||
                !cJSON_AddNumberToObject(have, "index", ci->valueint) ||
                !cJSON_AddObjectToObject(have, "logprobs")) {
                if (have && !cJSON_GetArraySize(choices))
                    cJSON_Delete(have);
                return PD_ENOMEM;
            }
        }
        cJSON *hlp = cJSON_GetObjectItemCaseSensitive(have, "logprobs");
        /* appended: the earlier events' entries come first */
        static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs",
                                           "text_offset"};
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
            cJSON *tmp = cJSON_Duplicate(lp, true);
            if (!tmp)
                return PD_ENOMEM;
            int rc = prepend(tmp, hlp, keys[i]); /* tmp[key] = have's + this event's */
            cJSON *merged = rc ? NULL : cJSON_DetachItemFromObjectCaseSensitive(tmp, keys[i]);
            cJSON_Delete(tmp);
            if (rc)
                return rc;
            if (!merged)
                continue;
            cJSON_DeleteItemFromObjectCaseSensitive(hlp, keys[i]);
            if (!cJSON_AddItemToObject(hlp, keys[i], merged)) {
                cJSON_Delete(merged);
                return PD_ENOMEM;
            }
        }
    }
    return PD_OK;
}

/* A streamed prefill answer ("data: {...}" events) as the JSON source a whole answer gives. */
static int parse_events(int route, const char *p, size_t len, cJSON **out) {
    cJSON *src = route == PD_ROUTER_ROUTE_GENERATE ? cJSON_CreateArray() : cJSON_CreateObject();
    if (!src || (route != PD_ROUTER_ROUTE_GENERATE && !cJSON_AddArrayToObject(src, "choices"))) {
        cJSON_Delete(src);
        return PD_ENOMEM;
    }
    size_t i = 0;
    while (i < len) {
        size_t e = i;
        while (e < len && p[e] != '\n')
            e++;
        if (e - i > 5 && strncmp(p + i, "data:", 5) == 0) {
            cJSON *ev = cJSON_ParseWithLength(p + i + 5, e - i - 5);
            int rc = cJSON_IsObject(ev) ? absorb_event(route, src, ev) : PD_OK;
            cJSON_Delete(ev);
            if (rc) {
                cJSON_Delete(src);
                return rc;
            }
        }
        i = e + 1;
    }
    *out = src;
    return PD_OK;
}

int pd_router_lpmerge_init(struct pd_router_lpmerge *m, int route, const char *prefill,
                           size_t len) {
    memset(m, 0, sizeof(*m));
    m->route = route;
    size_t i = 0;
    while (i < len && (prefill[i] == ' ' || prefill[i] == '\n' || prefill[i] == '\r'))
        i++;
    if (len - i >= 5 && strncmp(prefill + i, "data:", 5) == 0)
        return parse_events(route, prefill + i, len - i, &m->source);
    m->source = cJSON_ParseWithLength(prefill, len);
    if (!m->source)
        return pd_errorf(PD_EINVAL, "the prefill's answer is not JSON");
    return PD_OK;
}

void pd_router_lpmerge_free(struct pd_router_lpmerge *m) {
    cJSON_Delete(m->source);
    pd_free(m->done);
    memset(m, 0, sizeof(*m));
}

/* dst[key] = src[key] followed by dst[key]'s items (when an array). Nothing when src has no
 * array under key. */
static int prepend(cJSON *dst, const cJSON *src, const char *key) {
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(src, key);
    if (!cJSON_IsArray(from))
        return PD_OK;
    cJSON *arr = cJSON_Duplicate(from, true);
    if (!arr)
        return PD_ENOMEM;
    cJSON *old = cJSON_GetObjectItemCaseSensitive(dst, key);
    if (cJSON_IsArray(old)) {
        cJSON *it;
        cJSON_ArrayForEach(it, old) {
            cJSON *d = cJSON_Duplicate(it, true);
            if (!d || !cJSON_AddItemToArray(arr, d)) {
                cJSON_Delete(d);
                cJSON_Delete(arr);
                return PD_ENOMEM;
            }
        }
    }
    if (old ? !cJSON_ReplaceItemInObjectCaseSensitive(dst, key, arr)
            : !cJSON_AddItemToObject(dst, key, arr)) {
        cJSON_Delete(arr);
        return PD_ENOMEM;
    }
    return PD_OK;
}

/* /generate: the prefill's meta_info for sub-request k (a list answers a batch / n > 1). */
static const cJSON *generate_source(const cJSON *src, int k) {
    const cJSON *obj = cJSON_IsArray(src) ? cJSON_GetArrayItem(src, k) : (k == 0 ? src : NULL);
    return cJSON_GetObjectItemCaseSensitive(obj, "meta_info");
}

static int merge_generate(const cJSON *src, cJSON *obj, int k) {
    const cJSON *smi = generate_source(src, k);
    cJSON *mi = cJSON_GetObjectItemCaseSensitive(obj, "meta_info");
    if (!cJSON_IsObject(smi) || !cJSON_IsObject(mi))
        return PD_OK;
    int rc = prepend(mi, smi, "input_token_logprobs");
    return rc ? rc : prepend(mi, smi, "input_top_logprobs");
}

/* /v1/completions: the prefill's choice of index k's logprobs object. */
static const cJSON *completion_source(const cJSON *src, int k) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(src, "choices")) {
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c, "index");
        if (cJSON_IsNumber(idx) && idx->valueint == k)
            return cJSON_GetObjectItemCaseSensitive(c, "logprobs");
    }
    return NULL;
}

static const char *const completion_keys[] = {"tokens", "token_logprobs", "top_logprobs",
                                              "text_offset"};

/* Every choice of obj (once per index when m->done tracks a stream). */
static int merge_completion(struct pd_router_lpmerge *m, cJSON *obj, bool once) {
    cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(obj, "choices")) {
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c, "index");
        int k = cJSON_IsNumber(idx) ? idx->valueint : 0;
        const cJSON *slp = completion_source(m->source, k);
        cJSON *lp = cJSON_GetObjectItemCaseSensitive(c, "logprobs");
        if (!cJSON_IsObject(slp) || !cJSON_IsObject(lp) || k < 0)
            continue;
        if (once) {
            if (k >= m->n_done) {
                size_t cap = (size_t)m->n_done;
                if (pd_array_grow((void **)&m->done, &cap, (size_t)k + 1, sizeof(bool)))
                    return PD_ENOMEM;
                memset(m->done + m->n_done, 0, (size_t)(k + 1 - m->n_done) * sizeof(bool));
                m->n_done = k + 1;
            }
            if (m->done[k])
                continue;
            m->done[k] = true;
        }
        for (size_t i = 0; i < sizeof(completion_keys) / sizeof(completion_keys[0]); i++) {
            int rc = prepend(lp, slp, completion_keys[i]);
            if (rc)
                return rc;
        }
    }
    return PD_OK;
}

static int merge(struct pd_router_lpmerge *m, const char *text, size_t len, bool stream, char **out,
                 size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root)
        return pd_errorf(PD_EINVAL, "the decode's answer is not JSON");
    int rc = PD_OK;
    if (m->route == PD_ROUTER_ROUTE_GENERATE) {
        if (cJSON_IsArray(root)) {
            int k = 0;
            cJSON *it;
            cJSON_ArrayForEach(it, root) {
                if ((rc = merge_generate(m->source, it, k++)))
                    break;
            }
        } else {
            const cJSON *idx = cJSON_GetObjectItemCaseSensitive(root, "index");
            rc = merge_generate(m->source, root, cJSON_IsNumber(idx) ? idx->valueint : 0);
        }
    } else if (m->route == PD_ROUTER_ROUTE_COMPLETIONS) {
        rc = merge_completion(m, root, stream);
    }
    char *s = rc ? NULL : cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (rc)
        return rc;
    if (!s)
        return PD_ENOMEM;
    *out_len = strlen(s);
    *out = pd_malloc(*out_len + 1);
    if (*out)
        memcpy(*out, s, *out_len + 1);
    cJSON_free(s);
    return *out ? PD_OK : PD_ENOMEM;
}

int pd_router_lpmerge_body(struct pd_router_lpmerge *m, const char *decode, size_t len, char **out,
                           size_t *out_len) {
    return merge(m, decode, len, false, out, out_len);
}

int pd_router_lpmerge_event(struct pd_router_lpmerge *m, const char *data, size_t len, char **out,
                            size_t *out_len) {
    size_t i = 0;
    while (i < len && (data[i] == ' ' || data[i] == '\t'))
        i++;
    if (i == len || data[i] != '{') { /* [DONE] */
        *out = pd_malloc(len + 1);
        if (!*out)
            return PD_ENOMEM;
        memcpy(*out, data, len);
        (*out)[len] = '\0';
        *out_len = len;
        return PD_OK;
    }
    return merge(m, data, len, true, out, out_len);
}
