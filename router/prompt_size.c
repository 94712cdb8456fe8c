/*
 * prompt_size.c — the prompt size estimate of --local-prefill-max-tokens (see prompt_size.h).
 */
#include "router/prompt_size.h"

#include <math.h>
#include <string.h>

double pd_router_token_rate_get(const struct pd_router_token_rate *r) {
    if (r->tokens <= 0)
        return PD_ROUTER_BYTES_PER_TOKEN_DEFAULT;
    double rate = r->bytes / r->tokens;
    if (rate < PD_ROUTER_BYTES_PER_TOKEN_MIN)
        return PD_ROUTER_BYTES_PER_TOKEN_MIN;
    return rate > PD_ROUTER_BYTES_PER_TOKEN_MAX ? PD_ROUTER_BYTES_PER_TOKEN_MAX : rate;
}

long pd_router_prompt_tokens(const struct pd_router_prompt_size *sz,
                             const struct pd_router_token_rate *r) {
    return sz->id_tokens + (long)ceil((double)sz->text_bytes / pd_router_token_rate_get(r));
}

bool pd_router_answer_prompt_tokens(const char *answer, size_t len, long *out) {
    static const char key[] = "\"prompt_tokens\"";
    const size_t klen = sizeof(key) - 1;
    /* inside a JSON string a quote is escaped, so the key's bytes are only ever a key */
    const char *p = answer, *end = answer + len;
    const char *k = len >= klen ? memmem(p, len, key, klen) : NULL;
    if (!k)
        return false;
    p = k + klen;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    if (p == end || *p++ != ':')
        return false;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    long n = 0;
    const char *digits = p;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (n > (1L << 40)) /* far beyond any context: not a count */
            return false;
        n = n * 10 + (*p - '0');
    }
    if (p == digits || (p < end && (*p == '.' || *p == 'e' || *p == 'E')))
        return false; /* no digits, or not an integer */
    *out = n;
    return true;
}

bool pd_router_token_rate_learn(struct pd_router_token_rate *r,
                                const struct pd_router_prompt_size *sz, long prompt_tokens) {
    long text_tokens = prompt_tokens - sz->id_tokens;
    if (sz->text_bytes == 0 || text_tokens <= 0)
        return false;
    r->bytes = r->bytes * PD_ROUTER_RATE_DECAY + (double)sz->text_bytes;
    r->tokens = r->tokens * PD_ROUTER_RATE_DECAY + (double)text_tokens;
    r->answers++;
    return true;
}
