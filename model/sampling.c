/*
 * sampling.c — penalties, temperature, top-k/top-p/min-p and the draw.
 *
 * Candidate selection never sorts the whole vocabulary: the top m logits are moved to the front
 * with a partial quickselect (O(vocab)), sorted, and m grows ×4 only while top-k or the top-p
 * mass needs more — usually a few dozen candidates out of 150k. Filters follow SGLang's
 * top_k_top_p_min_p_sampling_from_probs: a token is kept by top-p when the mass strictly before
 * it is <= top_p; min-p compares with the most likely token.
 */
#include "model/sampling.h"
#include "common/base/alloc.h"
#include "common/base/rng.h"
#include "common/base/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void pd_sampling_params_default(struct pd_sampling_params *p) {
    memset(p, 0, sizeof(*p));
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->max_new_tokens = 128;
}

int pd_sampling_params_check(const struct pd_sampling_params *p) {
    if (!(p->temperature >= 0))
        return pd_errorf(PD_EINVAL, "temperature %g: must be >= 0", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return pd_errorf(PD_EINVAL, "top_p %g: must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return pd_errorf(PD_EINVAL, "min_p %g: must be in [0, 1]", p->min_p);
    if (!(p->repetition_penalty > 0))
        return pd_errorf(PD_EINVAL, "repetition_penalty %g: must be > 0", p->repetition_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return pd_errorf(PD_EINVAL, "frequency_penalty %g: must be in [-2, 2]",
                         p->frequency_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return pd_errorf(PD_EINVAL, "presence_penalty %g: must be in [-2, 2]", p->presence_penalty);
    if (p->n_logprobs < 0 || p->n_logprobs > PD_SAMPLING_MAX_LOGPROBS)
        return pd_errorf(PD_EINVAL, "top_logprobs_num %d: must be in [0, %d]", p->n_logprobs,
                         PD_SAMPLING_MAX_LOGPROBS);
    if (p->max_new_tokens < 0)
        return pd_errorf(PD_EINVAL, "max_new_tokens %d: must be >= 0", p->max_new_tokens);
    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > PD_SAMPLING_MAX_STOP_IDS)
        return pd_errorf(PD_EINVAL, "%d stop token ids: at most %d", p->n_stop_token_ids,
                         PD_SAMPLING_MAX_STOP_IDS);
    if (p->min_new_tokens < 0)
        return pd_errorf(PD_EINVAL, "min_new_tokens %d: must be >= 0", p->min_new_tokens);
    if (p->n_logit_bias < 0 || p->n_logit_bias > PD_SAMPLING_MAX_LOGIT_BIAS)
        return pd_errorf(PD_EINVAL, "%d logit_bias entries: at most %d", p->n_logit_bias,
                         PD_SAMPLING_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0)
            return pd_errorf(PD_EINVAL, "logit_bias token id %d: must be >= 0",
                             p->logit_bias_ids[i]);
        if (!(p->logit_bias[i] >= -100 && p->logit_bias[i] <= 100))
            return pd_errorf(PD_EINVAL, "logit_bias %g for token %d: must be in [-100, 100]",
                             p->logit_bias[i], p->logit_bias_ids[i]);
    }
    return PD_OK;
}

int pd_sampling_scratch_init(struct pd_sampling_scratch *s, int vocab) {
    s->vocab = vocab;
    s->idx = pd_calloc((size_t)vocab, sizeof(int32_t));
    s->prob = pd_calloc((size_t)vocab, sizeof(float));
    s->raw = pd_calloc((size_t)vocab, sizeof(float));
    if (!s->idx || !s->prob || !s->raw) {
        pd_sampling_scratch_free(s);
        return pd_error_wrap(PD_ENOMEM, "sampling scratch for a vocabulary of %d", vocab);
    }
    return PD_OK;
}

void pd_sampling_scratch_free(struct pd_sampling_scratch *s) {
    pd_free(s->idx);
    pd_free(s->prob);
    pd_free(s->raw);
    s->idx = NULL;
    s->prob = s->raw = NULL;
}

/* ---- random stream: xoshiro256** seeded through splitmix64 (common/base/rng.h) ---- */

static double uniform01(uint64_t *s) { /* [0, 1) with 53 bits */
    return (double)(pd_xoshiro256ss(s) >> 11) * 0x1.0p-53;
}

int pd_sampler_init(struct pd_sampler *s, const struct pd_sampling_params *p, int vocab,
                    const int32_t *prompt, int n_prompt, const int32_t *eos_ids, int n_eos) {
    memset(s, 0, sizeof(*s));
    int rc = pd_sampling_params_check(p);
    if (rc)
        return rc;
    if (vocab < 1)
        return pd_errorf(PD_EINVAL, "vocabulary of %d", vocab);
    s->p = *p;
    s->vocab = vocab;
    uint64_t seed = p->has_seed ? p->seed : (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)s;
    for (int i = 0; i < 4; i++)
        s->rng[i] = pd_splitmix64(&seed);
    for (int i = 0; i < n_eos && s->n_eos < (int)PD_ARRAY_LEN(s->eos_ids); i++)
        s->eos_ids[s->n_eos++] = eos_ids[i];
    if (p->frequency_penalty != 0 || p->presence_penalty != 0 || p->repetition_penalty != 1) {
        if (!(s->out_counts = pd_calloc((size_t)vocab, sizeof(int32_t))))
            return PD_ENOMEM;
    }
    if (p->repetition_penalty != 1) {
        if (!(s->in_prompt = pd_calloc((size_t)vocab, 1))) {
            pd_sampler_free(s);
            return PD_ENOMEM;
        }
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] >= 0 && prompt[i] < vocab)
                s->in_prompt[prompt[i]] = 1;
    }
    return PD_OK;
}

void pd_sampler_free(struct pd_sampler *s) {
    pd_free(s->out_counts);
    pd_free(s->in_prompt);
    s->out_counts = NULL;
    s->in_prompt = NULL;
}

/* ---- selection ---- */

/* The sorting order: logit descending, ties by lower id. A strict total order, so the top m
 * are the same tokens however many candidates are taken (the device sampler relies on it). */
static inline bool ranks_before(int32_t a, float va, int32_t b, float vb) {
    return va > vb || (va == vb && a < b);
}

/* Moves the m first tokens in sorting order to idx[0..m-1] (unordered); idx holds n indices. */
static void select_top(int32_t *idx, int n, int m, const float *l) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t pid = idx[(lo + hi) / 2];
        float pv = l[pid];
        int i = lo, j = hi;
        while (i <= j) {
            while (ranks_before(idx[i], l[idx[i]], pid, pv))
                i++;
            while (ranks_before(pid, pv, idx[j], l[idx[j]]))
                j--;
            if (i <= j) {
                int32_t t = idx[i];
                idx[i++] = idx[j];
                idx[j--] = t;
            }
        }
        if (m - 1 <= j)
            hi = j;
        else if (m - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* qsort has no context argument; a thread samples one request at a time */
static _Thread_local const float *tl_sort_logits;

static int by_logit_desc(const void *a, const void *b) {
    float x = tl_sort_logits[*(const int32_t *)a], y = tl_sort_logits[*(const int32_t *)b];
    if (x != y)
        return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b; /* ties: lower id first, deterministic */
}

/* Sorted top m of the vocabulary into idx[0..m-1]. */
static void top_sorted(int32_t *idx, int n, int m, const float *l) {
    select_top(idx, n, m, l);
    tl_sort_logits = l;
    qsort(idx, (size_t)m, sizeof(int32_t), by_logit_desc);
}

static void apply_penalties(struct pd_sampler *s, float *l) {
    if (!s->out_counts)
        return;
    const struct pd_sampling_params *p = &s->p;
    for (int t = 0; t < s->vocab; t++)
        l[t] =
            pd_sampling_penalize(l[t], s->out_counts[t], s->in_prompt && s->in_prompt[t],
                                 p->repetition_penalty, p->frequency_penalty, p->presence_penalty);
}

float pd_sampling_logprobs(struct pd_sampling_scratch *sc, const float *l, int vocab, int n,
                           int32_t *ids, float *lps) {
    PD_ASSERT(n >= 0 && n <= vocab && sc->vocab >= vocab);
    float mx = -INFINITY;
    for (int t = 0; t < vocab; t++)
        mx = l[t] > mx ? l[t] : mx;
    double sum = 0;
    for (int t = 0; t < vocab; t++)
        sum += exp((double)(l[t] - mx));
    float lse = mx + (float)log(sum);
    if (n) {
        for (int t = 0; t < vocab; t++)
            sc->idx[t] = t;
        top_sorted(sc->idx, vocab, n, l);
        for (int i = 0; i < n; i++) {
            ids[i] = sc->idx[i];
            lps[i] = l[sc->idx[i]] - lse;
        }
    }
    return lse;
}

static void model_logprobs(const struct pd_sampler *s, struct pd_sampling_scratch *sc,
                           const float *l, struct pd_sample *out, float *lse_out) {
    out->n_top = s->p.n_logprobs < s->vocab ? s->p.n_logprobs : s->vocab;
    *lse_out = pd_sampling_logprobs(sc, l, s->vocab, out->n_top, out->top_ids, out->top_logprobs);
}

void pd_sampler_score(const struct pd_sampler *s, struct pd_sampling_scratch *sc,
                      const float *logits, int32_t token, struct pd_sample *out) {
    float lse;
    model_logprobs(s, sc, logits, out, &lse);
    out->token = token;
    out->logprob = logits[token] - lse;
    out->finish = PD_FINISH_NONE;
}

static int32_t argmax(const float *l, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

static int32_t draw(const struct pd_sample_row *p, struct pd_sampling_scratch *sc, float *l,
                    int V) {
    float inv_t = 1.0f / p->temperature;
    for (int t = 0; t < V; t++)
        l[t] *= inv_t;
    for (int t = 0; t < V; t++)
        sc->idx[t] = t;
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    float mx = l[argmax(l, V)];
    double z = 0;
    for (int t = 0; t < V; t++)
        z += exp((double)(l[t] - mx));
    /* grow the sorted candidate set until it covers top-k and the top-p mass */
    int m = k < 64 ? k : 64, keep = 0;
    for (;;) {
        top_sorted(sc->idx, V, m, l);
        double before = 0;
        keep = 0;
        for (int i = 0; i < m; i++) {
            if (i >= k || before > p->top_p * z)
                break;
            sc->prob[i] = (float)(exp((double)(l[sc->idx[i]] - mx)) / z);
            before += sc->prob[i] * z;
            keep = i + 1;
        }
        if (keep < m || m == k)
            break;
        m = m * 4 < k ? m * 4 : k;
    }
    /* min-p against the most likely token */
    double total = 0;
    int n = 0;
    for (int i = 0; i < keep; i++) {
        if (sc->prob[i] < p->min_p * sc->prob[0])
            break;
        total += sc->prob[i];
        n = i + 1;
    }
    double r = p->u * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += sc->prob[i];
        if (r < acc)
            return sc->idx[i];
    }
    return sc->idx[n - 1];
}

bool pd_sampling_row_greedy(const struct pd_sample_row *r) {
    return r->temperature < 1e-5f || r->top_k == 1;
}

int32_t pd_sampling_choose(const struct pd_sample_row *r, struct pd_sampling_scratch *sc,
                           float *logits, int vocab) {
    PD_ASSERT(sc->vocab >= vocab && vocab >= 1);
    return pd_sampling_row_greedy(r) ? argmax(logits, vocab) : draw(r, sc, logits, vocab);
}

void pd_sampler_row(const struct pd_sampler *s, struct pd_sample_row *r) {
    r->temperature = s->p.temperature;
    r->top_k = s->p.top_k;
    r->top_p = s->p.top_p;
    r->min_p = s->p.min_p;
    r->u = 0;
    r->penalized = pd_sampler_has_penalties(s);
    r->slot = 0;
    r->repetition_penalty = s->p.repetition_penalty;
    r->frequency_penalty = s->p.frequency_penalty;
    r->presence_penalty = s->p.presence_penalty;
    r->n_logprobs = s->p.n_logprobs;
    r->top = NULL;
}

double pd_sampler_next_u(struct pd_sampler *s) {
    struct pd_sample_row r;
    pd_sampler_row(s, &r);
    return pd_sampling_row_greedy(&r) ? 0 : uniform01(s->rng);
}

void pd_sampler_next(struct pd_sampler *s, struct pd_sampling_scratch *sc, float *logits,
                     struct pd_sample *out) {
    PD_ASSERT(sc->vocab >= s->vocab);
    memset(out, 0, sizeof(*out));
    /* logprobs come from the raw logits; penalties and temperature then work in place */
    memcpy(sc->raw, logits, sizeof(float) * (size_t)s->vocab);
    float lse;
    model_logprobs(s, sc, sc->raw, out, &lse);
    for (int i = 0; i < s->p.n_logit_bias; i++)
        if (s->p.logit_bias_ids[i] < s->vocab)
            logits[s->p.logit_bias_ids[i]] += s->p.logit_bias[i];
    if (s->n_generated < s->p.min_new_tokens) { /* too early to stop: mask what would stop it */
        for (int i = 0; i < s->n_eos && !s->p.ignore_eos; i++)
            if (s->eos_ids[i] >= 0 && s->eos_ids[i] < s->vocab)
                logits[s->eos_ids[i]] = -INFINITY;
        for (int i = 0; i < s->p.n_stop_token_ids; i++)
            if (s->p.stop_token_ids[i] >= 0 && s->p.stop_token_ids[i] < s->vocab)
                logits[s->p.stop_token_ids[i]] = -INFINITY;
    }
    apply_penalties(s, logits);
    struct pd_sample_row row;
    pd_sampler_row(s, &row);
    row.u = pd_sampler_next_u(s); /* the draw takes exactly one value from the stream */
    int32_t tok = pd_sampling_choose(&row, sc, logits, s->vocab);
    out->token = tok;
    out->logprob = sc->raw[tok] - lse;
    pd_sampler_record(s, tok, &out->finish);
}

void pd_sampler_record(struct pd_sampler *s, int32_t token, enum pd_finish *finish) {
    s->n_generated++;
    if (s->out_counts && token >= 0 && token < s->vocab)
        s->out_counts[token]++;
    *finish = PD_FINISH_NONE;
    for (int i = 0; i < s->p.n_stop_token_ids; i++)
        if (token == s->p.stop_token_ids[i])
            *finish = PD_FINISH_STOP;
    for (int i = 0; i < s->n_eos && !s->p.ignore_eos; i++)
        if (token == s->eos_ids[i])
            *finish = PD_FINISH_STOP;
    if (!*finish && s->n_generated >= s->p.max_new_tokens)
        *finish = PD_FINISH_LENGTH;
}

void pd_sampler_accept(struct pd_sampler *s, int32_t token, enum pd_finish *finish) {
    (void)pd_sampler_next_u(s); /* as the draw pd_sampler_next would have made */
    pd_sampler_record(s, token, finish);
}

bool pd_sampler_has_penalties(const struct pd_sampler *s) {
    return s->out_counts != NULL;
}

bool pd_sampler_host_only(const struct pd_sampler *s) {
    return s->p.n_logit_bias > 0 || s->n_generated < s->p.min_new_tokens;
}
