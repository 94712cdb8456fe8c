/*
 * route_text.c — a request's routing text (see route_text.h), built from the client's body as
 * cJSON parsed it. Fields of the wrong type are skipped, not refused: validation is the workers'
 * job, and the routing text only steers where a request goes.
 */
#include "router/route_text.h"
#include "router/body.h"

#include "common/base/alloc.h"
#include "common/base/json_keys.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct tbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void put(struct tbuf *b, const char *s, size_t n) {
    if (b->oom || pd_array_grow((void **)&b->p, &b->cap, b->n + n + 1, 1)) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* One piece of text: separated from what came before by a space (sglang-router's join(" ")). */
static void piece(struct tbuf *b, bool *first, const char *s) {
    if (!*first)
        put(b, " ", 1);
    *first = false;
    put(b, s, strlen(s));
}

/* A string, a list of strings, ids, a list of id lists — any nesting of them. */
static void texts(struct tbuf *b, bool *first, const cJSON *v) {
    if (cJSON_IsString(v)) {
        piece(b, first, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        char num[32];
        double d = v->valuedouble;
        if (!signbit(d) && d < 1e15 && d == (double)(uint64_t)d)
            pd_json_u64((uint64_t)d, num); /* a token id: as "%.0f" prints it, faster */
        else
            snprintf(num, sizeof(num), "%.0f", d);
        piece(b, first, num);
    } else if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) texts(b, first, e);
    }
}

static void chat(struct tbuf *b, const cJSON *messages) {
    bool first = true;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(c)) {
            piece(b, &first, c->valuestring);
        } else if (cJSON_IsArray(c)) {
            /* the text parts of one message joined by spaces, then that as one piece */
            struct tbuf parts = {0};
            bool part_first = true;
            put(&parts, "", 0);
            const cJSON *part;
            cJSON_ArrayForEach(part, c) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (cJSON_IsString(text) &&
                    (!cJSON_IsString(type) || strcmp(type->valuestring, "text") == 0))
                    piece(&parts, &part_first, text->valuestring);
            }
            if (parts.oom)
                b->oom = true;
            else
                piece(b, &first, parts.p);
            pd_free(parts.p);
        }
    }
}

int pd_router_route_text(int route, const cJSON *root, char **out, size_t *out_len) {
    struct tbuf b = {0};
    put(&b, "", 0);
    if (cJSON_IsObject(root)) {
        bool first = true;
        switch (route) {
        case PD_ROUTER_ROUTE_GENERATE: {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
            if (text && !cJSON_IsNull(text))
                texts(&b, &first, text);
            else
                texts(&b, &first, cJSON_GetObjectItemCaseSensitive(root, "input_ids"));
            break;
        }
        case PD_ROUTER_ROUTE_COMPLETIONS:
            texts(&b, &first, cJSON_GetObjectItemCaseSensitive(root, "prompt"));
            break;
        case PD_ROUTER_ROUTE_CHAT:
            chat(&b, cJSON_GetObjectItemCaseSensitive(root, "messages"));
            break;
        default: break;
        }
    }
    if (b.oom) {
        pd_free(b.p);
        *out = NULL;
        *out_len = 0;
        return pd_errorf(PD_ENOMEM, "routing text of a request");
    }
    *out = b.p;
    *out_len = b.n;
    return PD_OK;
}
