/*
 * answers.c — what the router learns from a decode's answer (router_internal.h):
 *  - the prompt's token count the decode reports (prompt_tokens), which corrects the
 *    --local-prefill-max-tokens estimate (prompt_size.h), from the first event of a stream or
 *    the whole answer;
 *  - with --decode-policy cache_aware, the text the decode now holds in its own prefix cache:
 *    the request's routing text followed by the answer's text, recorded in the decode's tree
 *    (cache_tree.h). The decode keeps a finished request's prompt and output (decode-side prefix
 *    reuse, docs/routing.md), and a conversation's next turn repeats both; with the prompt's text
 *    alone in the tree, the answer's share of that turn counted as not held, and a follow-up
 *    whose new text was short took the PD path to move pages the decode already had. The
 *    answer's text is /generate's "text" (a stream's last event holds the whole text), or the
 *    one choice's text or message content of a non-streamed OpenAI answer; a chat's routing
 *    text joins messages with spaces (route_text.h), so a space goes between. OpenAI streams
 *    (deltas), batches and n > 1 teach nothing.
 */
#include "router/router_internal.h"

/* The first answer bytes of rq (a stream's first event, or the whole answer). */
void pd__router_answer_first(struct rreq *rq, const char *answer, size_t len) {
    long n;
    if (rq->psize_known && pd_router_answer_prompt_tokens(answer, len, &n))
        pd_router_token_rate_learn(&rq->rt->token_rate, &rq->psize, n);
    rq->psize_known = false;
}

/* Whether rq's answer text can go into its decode's tree: cache_aware decode policy, a routing
 * text, one prompt of one sample. */
static bool wants_answer(const struct rreq *rq) {
    return rq->rt->tree[1] && rq->rtext_len > 0 && rq->info.n == 1 && !rq->info.batch;
}

void pd__router_keep_last_event(struct rreq *rq, const char *buf, size_t len) {
    if (!wants_answer(rq) || rq->route != PD_ROUTER_ROUTE_GENERATE)
        return;
    /* buf holds whole events ("data: ...\n\n"): the last one that carries JSON */
    size_t end = len;
    while (end >= 2) {
        size_t start = end - 2;
        while (start >= 2 && !(buf[start - 1] == '\n' && buf[start - 2] == '\n'))
            start--;
        if (start < 2)
            start = 0;
        const char *ev = buf + start;
        size_t evlen = end - 2 - start;
        if (evlen > 5 && strncmp(ev, "data:", 5) == 0 && memchr(ev, '{', evlen)) {
            rq->last_ev.len = 0;
            if (pd__router_sb_put(&rq->last_ev, ev + 5, evlen - 5)) /* no memory: learn nothing */
                rq->last_ev.len = 0;
            return;
        }
        end = start;
    }
}

/* The answer's text (see the file comment), NULL when there is none. */
static const char *answer_text(int route, const cJSON *root) {
    const cJSON *t = NULL;
    if (route == PD_ROUTER_ROUTE_GENERATE) {
        t = cJSON_GetObjectItemCaseSensitive(root, "text");
    } else {
        const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
        const cJSON *c = cJSON_GetArraySize(choices) == 1 ? cJSON_GetArrayItem(choices, 0) : NULL;
        if (route == PD_ROUTER_ROUTE_COMPLETIONS)
            t = cJSON_GetObjectItemCaseSensitive(c, "text");
        else
            t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "message"),
                                                 "content");
    }
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

void pd__router_answer_last(struct rreq *rq, const char *answer, size_t len) {
    struct worker *dw = rq->dw;
    if (!wants_answer(rq) || !dw || dw->tenant < 0 || !answer || !len)
        return;
    cJSON *root = cJSON_ParseWithLength(answer, len);
    const char *text = cJSON_IsObject(root) ? answer_text(rq->route, root) : NULL;
    size_t tlen = text ? strlen(text) : 0;
    if (tlen) {
        bool chat = rq->route == PD_ROUTER_ROUTE_CHAT;
        size_t n = rq->rtext_len + chat + tlen;
        char *s = pd_malloc(n);
        if (s) {
            memcpy(s, rq->rtext, rq->rtext_len);
            if (chat)
                s[rq->rtext_len] = ' ';
            memcpy(s + rq->rtext_len + chat, text, tlen);
        }
        if (!s || pd_cache_tree_insert(rq->rt->tree[1], dw->tenant, s, n))
            pd_warn("cache_aware: the answer of %s not recorded: out of memory", rq->info.rids[0]);
        pd_free(s);
    }
    cJSON_Delete(root);
}
