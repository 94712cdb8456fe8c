/*
 * test_sampling.c — each sampling parameter changes what can be drawn the way SGLang's sampler
 * does: greedy, seeded reproducibility, the draw follows softmax(logits / T), top-k, top-p
 * (including a nucleus wider than the first candidate block), min-p, the three penalties,
 * logprobs, logit_bias, min_new_tokens, and the finish reasons (stop ids, EOS, ignore_eos,
 * length).
 */
#include "pd_test.h"

#include "model/sampling.h"

#include <math.h>

static struct pd_sampling_scratch sc;

static struct pd_sampling_params params(float t) {
    struct pd_sampling_params p;
    pd_sampling_params_default(&p);
    p.temperature = t;
    p.max_new_tokens = 1 << 20;
    p.has_seed = true;
    p.seed = 1234;
    return p;
}

static int32_t one(struct pd_sampler *s, const float *l, int n, struct pd_sample *out) {
    float buf[8];
    memcpy(buf, l, sizeof(float) * (size_t)n);
    pd_sampler_next(s, &sc, buf, out);
    return out->token;
}

/* Histogram of 20000 draws over a 4-token vocabulary. */
static void histogram(const struct pd_sampling_params *p, const float *l, double *freq) {
    struct pd_sampler s;
    struct pd_sample o;
    CHECK_OK(pd_sampler_init(&s, p, 4, NULL, 0, NULL, 0));
    for (int i = 0; i < 4; i++)
        freq[i] = 0;
    for (int i = 0; i < 20000; i++)
        freq[one(&s, l, 4, &o)] += 1.0 / 20000;
    pd_sampler_free(&s);
}

static void test_greedy_and_logprobs(void) {
    float l[4] = {0.5f, 2.0f, -1.0f, 1.0f};
    struct pd_sampling_params p = params(0);
    p.n_logprobs = 3;
    struct pd_sampler s;
    struct pd_sample o;
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0));
    CHECK_INT(one(&s, l, 4, &o), 1);
    double z = exp(0.5) + exp(2.0) + exp(-1.0) + exp(1.0);
    CHECK_DBL(o.logprob, 2.0 - log(z), 1e-5);
    CHECK_INT(o.n_top, 3);
    CHECK_INT(o.top_ids[0], 1);
    CHECK_INT(o.top_ids[1], 3);
    CHECK_INT(o.top_ids[2], 0);
    CHECK_DBL(o.top_logprobs[2], 0.5 - log(z), 1e-5);
    CHECK_INT(o.finish, PD_FINISH_NONE);
    pd_sampler_free(&s);
    p = params(1.0f);
    p.top_k = 1; /* top-k 1 is greedy too */
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0));
    for (int i = 0; i < 20; i++)
        CHECK_INT(one(&s, l, 4, &o), 1);
    pd_sampler_free(&s);
}

static void test_seed_and_distribution(void) {
    float l[4] = {1.0f, 0.0f, 2.0f, -0.5f};
    struct pd_sampling_params p = params(1.0f);
    struct pd_sampler a, b;
    struct pd_sample o;
    int32_t sa[64], sb[64];
    CHECK_OK(pd_sampler_init(&a, &p, 4, NULL, 0, NULL, 0));
    CHECK_OK(pd_sampler_init(&b, &p, 4, NULL, 0, NULL, 0));
    for (int i = 0; i < 64; i++) {
        sa[i] = one(&a, l, 4, &o);
        sb[i] = one(&b, l, 4, &o);
    }
    CHECK(memcmp(sa, sb, sizeof(sa)) == 0);
    pd_sampler_free(&b);
    p.seed = 99;
    CHECK_OK(pd_sampler_init(&b, &p, 4, NULL, 0, NULL, 0));
    int diff = 0;
    for (int i = 0; i < 64; i++)
        diff += one(&b, l, 4, &o) != sa[i];
    CHECK(diff > 0);
    pd_sampler_free(&a);
    pd_sampler_free(&b);

    double f[4], z = 0;
    for (int t = 1; t <= 2; t++) { /* T = 1 and T = 2 */
        p = params((float)t);
        histogram(&p, l, f);
        z = 0;
        for (int i = 0; i < 4; i++)
            z += exp(l[i] / t);
        for (int i = 0; i < 4; i++)
            CHECK_DBL(f[i], exp(l[i] / t) / z, 0.015);
    }
}

static void test_filters(void) {
    /* probabilities 0.6, 0.3, 0.1 (and an impossible 4th) */
    float l[4] = {logf(0.6f), logf(0.3f), logf(0.1f), -INFINITY};
    double f[4];
    struct pd_sampling_params p = params(1.0f);
    p.top_k = 2;
    histogram(&p, l, f);
    CHECK(f[2] == 0 && f[3] == 0);
    CHECK_DBL(f[0], 2.0 / 3, 0.015);
    p = params(1.0f);
    p.top_p = 0.5f; /* mass before token 1 is 0.6 > 0.5: only token 0 */
    histogram(&p, l, f);
    CHECK_DBL(f[0], 1.0, 1e-12);
    p.top_p = 0.7f; /* tokens 0 and 1 */
    histogram(&p, l, f);
    CHECK(f[2] == 0 && f[1] > 0.25);
    p = params(1.0f);
    p.min_p = 0.25f; /* threshold 0.15: drops token 2 */
    histogram(&p, l, f);
    CHECK(f[2] == 0 && f[1] > 0.25);
}

/* 3000 equally likely tokens and top_p 0.5: 1500 candidates, far past the first block of 64. */
static void test_wide_nucleus(void) {
    enum { V = 3000 };
    static float l[V], buf[V];
    for (int i = 0; i < V; i++)
        l[i] = 0;
    struct pd_sampling_params p = params(1.0f);
    p.top_p = 0.5f;
    struct pd_sampler s;
    struct pd_sample o;
    struct pd_sampling_scratch big;
    CHECK_OK(pd_sampling_scratch_init(&big, V));
    CHECK_OK(pd_sampler_init(&s, &p, V, NULL, 0, NULL, 0));
    int maxtok = 0, hit_high = 0;
    for (int i = 0; i < 600; i++) {
        memcpy(buf, l, sizeof(l));
        pd_sampler_next(&s, &big, buf, &o);
        maxtok = o.token > maxtok ? o.token : maxtok;
        hit_high += o.token >= 1000;
    }
    /* ties keep lower ids first: the nucleus is ids 0..1500 */
    CHECK(maxtok <= 1501);
    CHECK(hit_high > 100);
    pd_sampler_free(&s);
    pd_sampling_scratch_free(&big);
}

static void test_penalties(void) {
    float l[4] = {2.0f, 1.9f, -1.0f, 0.0f};
    struct pd_sample o;
    struct pd_sampler s;
    struct pd_sampling_params p = params(0);
    p.repetition_penalty = 2.0f; /* token 0 is in the prompt: 2.0 → 1.0 */
    int32_t prompt[2] = {0, 3};
    CHECK_OK(pd_sampler_init(&s, &p, 4, prompt, 2, NULL, 0));
    CHECK_INT(one(&s, l, 4, &o), 1);
    /* 1 is now an output token: 1.9 → 0.95 < 1.0 */
    CHECK_INT(one(&s, l, 4, &o), 0);
    pd_sampler_free(&s);

    p = params(0);
    p.frequency_penalty = 0.06f; /* each use of a token costs 0.06 */
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0));
    CHECK_INT(one(&s, l, 4, &o), 0); /* 2.0 */
    CHECK_INT(one(&s, l, 4, &o), 0); /* 1.94 > 1.9 */
    CHECK_INT(one(&s, l, 4, &o), 1); /* 1.88 < 1.9 */
    pd_sampler_free(&s);

    p = params(0);
    p.presence_penalty = 0.5f;
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0));
    CHECK_INT(one(&s, l, 4, &o), 0);
    CHECK_INT(one(&s, l, 4, &o), 1); /* 1.5 < 1.9 */
    CHECK_INT(one(&s, l, 4, &o), 0); /* 1.5 vs 1.4 */
    pd_sampler_free(&s);
}

static void test_finish(void) {
    float l[4] = {0, 5, 0, 0};
    struct pd_sample o;
    struct pd_sampler s;
    struct pd_sampling_params p = params(0);
    int32_t eos[1] = {1};
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, eos, 1));
    one(&s, l, 4, &o);
    CHECK_INT(o.finish, PD_FINISH_STOP);
    pd_sampler_free(&s);
    p.ignore_eos = true;
    p.max_new_tokens = 3;
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, eos, 1));
    one(&s, l, 4, &o);
    CHECK_INT(o.finish, PD_FINISH_NONE);
    one(&s, l, 4, &o);
    one(&s, l, 4, &o);
    CHECK_INT(o.finish, PD_FINISH_LENGTH);
    pd_sampler_free(&s);
    p = params(0);
    p.stop_token_ids[0] = 1;
    p.n_stop_token_ids = 1;
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0));
    one(&s, l, 4, &o);
    CHECK_INT(o.finish, PD_FINISH_STOP);
    pd_sampler_free(&s);

    p = params(-1);
    CHECK_ERR(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0), PD_EINVAL, "temperature");
    p = params(1);
    p.top_p = 0;
    CHECK_ERR(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0), PD_EINVAL, "top_p");
    p = params(1);
    p.n_logprobs = 21;
    CHECK_ERR(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0), PD_EINVAL, "logprobs");
}

/* logit_bias moves the choice (and what can be drawn) but not the reported logprobs, which
 * stay the model's own (as vLLM reports them); out-of-range entries are refused. */
static void test_logit_bias(void) {
    float l[4] = {0.5f, 2.0f, -1.0f, 1.0f};
    double z = exp(0.5) + exp(2.0) + exp(-1.0) + exp(1.0);
    struct pd_sampling_params p = params(0);
    p.n_logit_bias = 2;
    p.logit_bias_ids[0] = 2;
    p.logit_bias[0] = 5.0f; /* -1 + 5 = 4: now the greedy choice */
    p.logit_bias_ids[1] = 1;
    p.logit_bias[1] = -100.0f;
    struct pd_sampler s;
    struct pd_sample o;
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0));
    CHECK_INT(one(&s, l, 4, &o), 2);
    CHECK_DBL(o.logprob, -1.0 - log(z), 1e-5); /* the raw distribution's */
    pd_sampler_free(&s);
    /* -100 on the two most likely: a draw at T=1 never picks them */
    p = params(1.0f);
    p.n_logit_bias = 2;
    p.logit_bias_ids[0] = 1;
    p.logit_bias[0] = -100.0f;
    p.logit_bias_ids[1] = 3;
    p.logit_bias[1] = -100.0f;
    double freq[4];
    histogram(&p, l, freq);
    CHECK(freq[1] == 0 && freq[3] == 0 && freq[0] > 0.7 && freq[2] > 0.1);
    p.logit_bias[1] = 100.5f;
    CHECK_ERR(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0), PD_EINVAL, "[-100, 100]");
    p.logit_bias[1] = 1;
    p.logit_bias_ids[1] = -3;
    CHECK_ERR(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0), PD_EINVAL, "logit_bias token id");
    p.logit_bias_ids[1] = 3;
    p.n_logit_bias = PD_SAMPLING_MAX_LOGIT_BIAS + 1;
    CHECK_ERR(pd_sampler_init(&s, &p, 4, NULL, 0, NULL, 0), PD_EINVAL, "at most");
}

/* min_new_tokens: EOS and the stop ids cannot be chosen before that many tokens (the next most
 * likely is), then they stop the request as before; the host sampler is needed until then. */
static void test_min_new_tokens(void) {
    float l[4] = {0, 5, 1, 4}; /* 1 (EOS) most likely, then 3 (a stop id), then 2 */
    struct pd_sample o;
    struct pd_sampler s;
    struct pd_sampling_params p = params(0);
    p.min_new_tokens = 2;
    p.stop_token_ids[0] = 3;
    p.n_stop_token_ids = 1;
    int32_t eos[1] = {1};
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, eos, 1));
    CHECK(pd_sampler_host_only(&s));
    CHECK_INT(one(&s, l, 4, &o), 2);
    CHECK_INT(o.finish, PD_FINISH_NONE);
    CHECK_DBL(o.logprob, 1.0 - log(1 + exp(5.0) + exp(1.0) + exp(4.0)), 1e-5); /* raw */
    CHECK_INT(one(&s, l, 4, &o), 2);
    CHECK(!pd_sampler_host_only(&s));
    CHECK_INT(one(&s, l, 4, &o), 1);
    CHECK_INT(o.finish, PD_FINISH_STOP);
    pd_sampler_free(&s);
    /* ignore_eos: EOS is not masked (it stops nothing), the stop id still is */
    p.ignore_eos = true;
    CHECK_OK(pd_sampler_init(&s, &p, 4, NULL, 0, eos, 1));
    CHECK_INT(one(&s, l, 4, &o), 1);
    CHECK_INT(o.finish, PD_FINISH_NONE);
    pd_sampler_free(&s);
    p.min_new_tokens = -1;
    CHECK_ERR(pd_sampler_init(&s, &p, 4, NULL, 0, eos, 1), PD_EINVAL, "min_new_tokens");
}

static void setup(void) {
    CHECK_OK(pd_sampling_scratch_init(&sc, 8));
}
static void teardown(void) {
    pd_sampling_scratch_free(&sc);
}

PD_TEST_MAIN(PD_TEST(setup), PD_TEST(test_greedy_and_logprobs), PD_TEST(test_seed_and_distribution),
             PD_TEST(test_filters), PD_TEST(test_wide_nucleus), PD_TEST(test_penalties),
             PD_TEST(test_finish), PD_TEST(test_logit_bias), PD_TEST(test_min_new_tokens),
             PD_TEST(teardown))
