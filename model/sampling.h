/*
 * sampling.h — choosing the next token from a request's logits (DESIGN.md §4), with SGLang's
 * parameter meanings: penalties, then temperature, then top-k / top-p / min-p on the
 * probabilities, then a draw from the request's own random stream. temperature 0 is greedy.
 *
 * A pd_sampler is request-lifetime state: parameters, the random stream (seeded from the
 * request's seed, so the same seed and prompt give the same text whatever else is in the
 * batch), output-token counts for the penalties, and the stop conditions. A pd_sampling_scratch
 * is step-lifetime working memory one thread reuses for every request it samples; nothing is
 * allocated per token. Logprobs are those of the model's own distribution (log-softmax of the
 * raw logits, before penalties and temperature), as vLLM reports them by default.
 */
#ifndef PD_SAMPLING_H
#define PD_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#define PD_SAMPLING_MAX_LOGPROBS 20
#define PD_SAMPLING_MAX_STOP_IDS 16
#define PD_SAMPLING_MAX_LOGIT_BIAS 300 /* logit_bias entries one request may hold */

struct pd_sampling_params {
    float temperature;        /* 0 = greedy; default 1 */
    int top_k;                /* keep the k most likely; <= 0 (default) = all */
    float top_p;              /* keep the smallest set with mass >= top_p; default 1 = all */
    float min_p;              /* drop tokens below min_p * p(top token); default 0 */
    float repetition_penalty; /* over prompt and output tokens, as transformers; default 1 */
    float frequency_penalty;  /* minus count × this over output tokens, as OpenAI; default 0 */
    float presence_penalty;   /* minus this once per output token seen; default 0 */
    int max_new_tokens;       /* default 128 */
    bool has_seed;            /* without a seed the stream is seeded from the clock */
    uint64_t seed;
    bool ignore_eos; /* EOS does not finish the request */
    /* EOS and the stop token ids cannot be chosen before this many output tokens (SGLang's
     * min_new_tokens, vLLM's min_tokens: their logits are masked); default 0 */
    int min_new_tokens;
    int n_logprobs; /* top-n logprobs to report, 0..PD_SAMPLING_MAX_LOGPROBS */
    int32_t stop_token_ids[PD_SAMPLING_MAX_STOP_IDS]; /* finish on any of these */
    int n_stop_token_ids;
    /* OpenAI's logit_bias: logit_bias[i] (in [-100, 100]) added to token logit_bias_ids[i]'s
     * logit before the penalties, as vLLM does. The device samplers know nothing of it: a step
     * holding such a request samples on the host. */
    int n_logit_bias;
    int32_t logit_bias_ids[PD_SAMPLING_MAX_LOGIT_BIAS];
    float logit_bias[PD_SAMPLING_MAX_LOGIT_BIAS];
};

enum pd_finish {
    PD_FINISH_NONE = 0,   /* keep going */
    PD_FINISH_STOP = 1,   /* EOS or a stop token was produced */
    PD_FINISH_LENGTH = 2, /* max_new_tokens reached */
};

struct pd_sample {
    int32_t token;
    float logprob; /* of token under the model's distribution */
    int n_top;
    int32_t top_ids[PD_SAMPLING_MAX_LOGPROBS]; /* most likely first */
    float top_logprobs[PD_SAMPLING_MAX_LOGPROBS];
    enum pd_finish finish;
};

struct pd_sampler {
    struct pd_sampling_params p;
    int vocab;
    uint64_t rng[4];     /* xoshiro256** state */
    int32_t *out_counts; /* [vocab] output-token counts; NULL without penalties */
    uint8_t *in_prompt;  /* [vocab] 1 where the prompt has the token; NULL without rep. penalty */
    int32_t eos_ids[8];
    int n_eos;
    int n_generated;
};

/* Per-thread working memory for vocabularies up to vocab. */
struct pd_sampling_scratch {
    int vocab;
    int32_t *idx; /* [vocab] */
    float *prob;  /* [vocab] */
    float *raw;   /* [vocab] the logits before penalties */
};

void pd_sampling_params_default(struct pd_sampling_params *p);
/* PD_EINVAL naming the field when a value is out of its range (temperature < 0, top_p outside
 * (0, 1], min_p outside [0, 1], repetition_penalty <= 0, frequency/presence outside [-2, 2],
 * n_logprobs outside [0, 20], max_new_tokens < 0). */
int pd_sampling_params_check(const struct pd_sampling_params *p);

int pd_sampling_scratch_init(struct pd_sampling_scratch *s, int vocab);
void pd_sampling_scratch_free(struct pd_sampling_scratch *s);

/* One row's choice: what the device sampler (pd_backend_sample) and the host share, so both
 * pick the same token from the same logits and u. The choice itself (pd_sampling_choose) reads
 * the first five fields; the rest say what a backend does around it: the penalties from the
 * request's state in a penalty slot (pd_backend_penalty_set) before the choice, and the top-n
 * of the raw row after. Zeroed fields mean neither. */
struct pd_sample_row {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    double u;       /* the request's uniform [0, 1) draw for this token; unused when greedy */
    bool penalized; /* apply the three penalties with slot's counts (and record) */
    int32_t slot;   /* penalty slot of the request; read when penalized */
    float repetition_penalty; /* as pd_sampling_params; read when penalized */
    float frequency_penalty;
    float presence_penalty;
    int32_t n_logprobs;    /* top-n of the raw row to report, 0..PD_SAMPLING_MAX_LOGPROBS */
    struct pd_sample *top; /* host: n_top, top_ids, top_logprobs written when n_logprobs > 0 */
};

/* One logit after the penalties, given the token's output count and whether the prompt has it:
 * repetition (divide a positive logit, multiply a negative one, as transformers) over prompt
 * and output tokens, then frequency (× count) and presence (once) subtracted over output tokens
 * (OpenAI). The one arithmetic the host sampler and every backend apply, in this order and with
 * no fused multiply-add, so they agree bit for bit. */
static inline float pd_sampling_penalize(float l, int32_t count, bool in_prompt, float rep,
                                         float freq, float pres) {
    if (rep != 1 && (count || in_prompt))
        l = l > 0 ? l / rep : l * rep;
    if (count) {
        float sub = freq * (float)count;
        sub = sub + pres;
        l = l - sub;
    }
    return l;
}

/* The model's log-softmax normaliser of a raw row (log of the sum of exp, the max taken out,
 * summed in double) and its n most likely tokens (logit descending, lower id on ties) with
 * their logprobs, into ids / lps [n] (n <= vocab; 0: only the normaliser). What pd_sampler_next
 * and pd_sampler_score report, and what the backends' samplers reproduce. sc: idx is used. */
float pd_sampling_logprobs(struct pd_sampling_scratch *sc, const float *logits, int vocab, int n,
                           int32_t *ids, float *lps);

/* temperature < 1e-5 or top_k 1: the argmax (lowest id on ties), and no draw is taken. */
bool pd_sampling_row_greedy(const struct pd_sample_row *r);
/* Temperature, top-k, top-p, min-p and the draw with r->u over logits (host [vocab] f32,
 * modified in place); the token chosen. */
int32_t pd_sampling_choose(const struct pd_sample_row *r, struct pd_sampling_scratch *sc,
                           float *logits, int vocab);

/* Sets up a request's sampler; the prompt feeds the repetition penalty. eos ids (up to 8) finish
 * the request unless ignore_eos. */
int pd_sampler_init(struct pd_sampler *s, const struct pd_sampling_params *p, int vocab,
                    const int32_t *prompt, int n_prompt, const int32_t *eos_ids, int n_eos);
void pd_sampler_free(struct pd_sampler *s);

/* Picks the next token from logits (host [vocab] f32, modified in place), records it in the
 * penalties' counts, and says whether the request is finished. */
void pd_sampler_next(struct pd_sampler *s, struct pd_sampling_scratch *scratch, float *logits,
                     struct pd_sample *out);

/* The row of s's parameters: choice, penalties (penalized when s has any; slot left 0 for the
 * caller) and n_logprobs; u left 0, top NULL. */
void pd_sampler_row(const struct pd_sampler *s, struct pd_sample_row *r);
/* Takes the next value from s's random stream as pd_sampler_next would: 0 without a draw for
 * greedy parameters. For choosing elsewhere (the device): pd_sampler_next_u, choose, then
 * pd_sampler_record. */
double pd_sampler_next_u(struct pd_sampler *s);
/* Counts a token chosen elsewhere with a u from pd_sampler_next_u; *finish as in
 * pd_sampler_next. */
void pd_sampler_record(struct pd_sampler *s, int32_t token, enum pd_finish *finish);
/* True when repetition/frequency/presence penalties change s's logits. */
bool pd_sampler_has_penalties(const struct pd_sampler *s);
/* The next token must be chosen by pd_sampler_next (on the host): the request has a logit_bias,
 * or min_new_tokens still masks its stop tokens; the device samplers know neither. */
bool pd_sampler_host_only(const struct pd_sampler *s);

/* The model's logprob of a given token (a prompt token: input logprobs) under logits (one
 * row, untouched) and the row's top-n (p.n_logprobs), as pd_sampler_next reports them; draws
 * nothing. */
void pd_sampler_score(const struct pd_sampler *s, struct pd_sampling_scratch *sc,
                      const float *logits, int32_t token, struct pd_sample *out);

/* Records a token chosen elsewhere as if this sampler had drawn it — the first output token
 * that the prefill daemon sampled from the same parameters: penalties count it, the random
 * stream advances as a draw would, and *finish says whether it ends the request. So a decode
 * daemon continues exactly where a single process would. */
void pd_sampler_accept(struct pd_sampler *s, int32_t token, enum pd_finish *finish);

#endif
