/*
 * test_sample_device.c — choosing tokens "on the device" as a decode step does, on the cpu
 * backend: pd_backend_sample with penalty slots (pd_backend_penalty_reserve / _set) and top-n
 * logprobs gives bit for bit what the host sampler gives (pd_sampler_next, pd_sampler_score),
 * step after step while the slots count the chosen tokens. The sweep: vocabularies of odd sizes
 * (1 up to Qwen's 151936), penalties on and off (repetition over prompt + output, frequency and
 * presence, positive and negative), top-n 0/1/5/20, greedy and sampled rows mixed in one call,
 * rows full of exact ties, prompts with ids outside the vocabulary, a slot set again from the
 * request's tokens mid-way. Then bad rows and slots are refused naming the problem.
 */
#include "pd_test.h"

#include "model/backend.h"
#include "model/sampling.h"

#include <math.h>

static uint64_t lcg = 99;
static uint32_t rnd(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(lcg >> 33);
}
static float frnd(void) { /* [-1, 1) */
    return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f;
}

/* One request's parameters per row of a call: greedy and sampled, with and without each
 * penalty and top-n. */
struct cfg {
    float t;
    int k;
    float p, mp, rep, freq, pres;
    int nlp;
};
static const struct cfg cfgs[] = {
    {0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},    /* greedy, plain */
    {0.0f, 0, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, 5},    /* greedy, repetition */
    {0.8f, 0, 1.0f, 0.0f, 1.0f, 0.5f, 0.3f, 1},    /* sampled, frequency + presence */
    {1.0f, 40, 0.9f, 0.0f, 1.2f, 0.4f, -0.5f, 20}, /* all three */
    {0.7f, 0, 0.95f, 0.05f, 0.8f, -0.3f, 0.2f, 0}, /* repetition < 1 */
    {1.3f, 5, 1.0f, 0.1f, 1.0f, 0.0f, 1.0f, 5},    /* presence alone */
    {0.0f, 1, 1.0f, 0.0f, 1.0f, 1.5f, 0.0f, 20},   /* top_k 1: greedy, frequency */
    {0.5f, 0, 0.5f, 0.0f, 2.0f, 2.0f, 2.0f, 1},    /* strong */
    {1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 20},   /* sampled, top-n only */
    {0.0f, 0, 1.0f, 0.0f, 1.0f, -2.0f, -2.0f, 0},  /* greedy, negative: repeats favoured */
};
enum { R = sizeof(cfgs) / sizeof(cfgs[0]), NSLOTS = 16, MAX_PROMPT = 40, STEPS = 10 };

static int slot_of(int r) {
    return (r * 7 + 3) % NSLOTS; /* not the row's index: the slot indexing is exercised */
}

static bool penalized(const struct cfg *c) {
    return c->rep != 1 || c->freq != 0 || c->pres != 0;
}

static bool same_float(float a, float b) {
    return memcmp(&a, &b, sizeof(float)) == 0;
}

struct req {
    struct pd_sampler ref, dev; /* host reference; the device path's twin */
    int32_t toks[MAX_PROMPT + STEPS + 4];
    int n_prompt, n_out;
    struct pd_sample top;
};

static int pen_changed, drawn, tops_seen;

/* Logits of row r at a step: a base per row (so the top tokens recur and the penalties bite)
 * plus noise; every third row coarse, full of exact ties. */
static void fill(float *l, int V, int r, int step, const float *base) {
    for (int t = 0; t < V; t++) {
        float v = base[t] + 0.3f * frnd();
        l[t] = r % 3 == 0 ? floorf(v * 4.0f) * 0.25f : v;
    }
    (void)step;
}

static void sweep_vocab(int V, int steps) {
    struct pd_backend_opts o = {.kind = PD_BACKEND_CPU, .threads = 1};
    struct pd_backend *be = NULL;
    CHECK_OK(pd_backend_new(&o, &be));
    CHECK_OK(pd_backend_penalty_reserve(be, NSLOTS, V, MAX_PROMPT + STEPS + 4));
    float *x = NULL, *base = NULL, *buf = NULL;
    CHECK_OK(pd_backend_alloc(be, sizeof(float) * (size_t)V * R, (void **)&x));
    base = calloc((size_t)V * R, sizeof(float));
    buf = calloc((size_t)V, sizeof(float));
    struct pd_sampling_scratch sc;
    CHECK_OK(pd_sampling_scratch_init(&sc, V));
    static struct req rq[R];
    struct pd_sample_row rows[R];
    for (int r = 0; r < R; r++) {
        for (int t = 0; t < V; t++)
            base[(size_t)r * V + t] = 3.0f * frnd() * fabsf(frnd());
        const struct cfg *c = &cfgs[r];
        struct pd_sampling_params sp;
        pd_sampling_params_default(&sp);
        sp.temperature = c->t;
        sp.top_k = c->k;
        sp.top_p = c->p;
        sp.min_p = c->mp;
        sp.repetition_penalty = c->rep;
        sp.frequency_penalty = c->freq;
        sp.presence_penalty = c->pres;
        sp.n_logprobs = c->nlp;
        sp.max_new_tokens = 1 << 20;
        sp.has_seed = true;
        sp.seed = (uint64_t)V * 131 + (uint64_t)r;
        struct req *q = &rq[r];
        q->n_prompt = 1 + (int)(rnd() % (MAX_PROMPT - 1));
        for (int i = 0; i < q->n_prompt; i++) /* the most likely tokens, and strays */
            q->toks[i] = i % 9 == 8 ? (i % 2 ? -1 : V + 3) : (int32_t)(rnd() % (uint32_t)V);
        CHECK_OK(pd_sampler_init(&q->ref, &sp, V, q->toks, q->n_prompt, NULL, 0));
        CHECK_OK(pd_sampler_init(&q->dev, &sp, V, q->toks, q->n_prompt, NULL, 0));
        /* two outputs the prefill chose, accepted before the slot is set from them */
        q->n_out = 0;
        for (int i = 0; i < 2; i++) {
            int32_t tok = (int32_t)(rnd() % (uint32_t)V);
            enum pd_finish f;
            pd_sampler_accept(&q->ref, tok, &f);
            pd_sampler_accept(&q->dev, tok, &f);
            q->toks[q->n_prompt + q->n_out++] = tok;
        }
        CHECK(pd_sampler_has_penalties(&q->dev) == penalized(c));
        if (penalized(c))
            CHECK_OK(pd_backend_penalty_set(be, slot_of(r), q->toks, q->n_prompt,
                                            q->toks + q->n_prompt, q->n_out));
    }
    for (int step = 0; step < steps; step++) {
        if (step == steps / 2) /* a slot given back and taken again: set from the tokens */
            for (int r = 0; r < R; r++)
                if (penalized(&cfgs[r]))
                    CHECK_OK(pd_backend_penalty_set(be, slot_of(r), rq[r].toks, rq[r].n_prompt,
                                                    rq[r].toks + rq[r].n_prompt, rq[r].n_out));
        for (int r = 0; r < R; r++) {
            fill(x + (size_t)r * V, V, r, step, base + (size_t)r * V);
            struct req *q = &rq[r];
            pd_sampler_row(&q->dev, &rows[r]);
            rows[r].slot = slot_of(r);
            rows[r].top = &q->top;
            rows[r].u = pd_sampler_next_u(&q->dev);
            CHECK(rows[r].penalized == penalized(&cfgs[r]));
            CHECK_INT(rows[r].n_logprobs, cfgs[r].nlp);
        }
        int32_t ids[R];
        float lps[R];
        memset(ids, 0xff, sizeof(ids));
        CHECK_OK(pd_backend_sample(be, x, R, V, rows, ids, lps));
        for (int r = 0; r < R; r++) {
            struct req *q = &rq[r];
            const float *l = x + (size_t)r * V;
            struct pd_sample want, score;
            memcpy(buf, l, sizeof(float) * (size_t)V);
            pd_sampler_next(&q->ref, &sc, buf, &want);
            CHECK_INT(ids[r], want.token);
            CHECK(same_float(lps[r], want.logprob));
            int n = cfgs[r].nlp < V ? cfgs[r].nlp : V;
            CHECK_INT(want.n_top, n);
            if (n) {
                CHECK_INT(q->top.n_top, n);
                for (int i = 0; i < n && i < q->top.n_top; i++) {
                    CHECK_INT(q->top.top_ids[i], want.top_ids[i]);
                    CHECK(same_float(q->top.top_logprobs[i], want.top_logprobs[i]));
                }
                tops_seen++;
            }
            /* the prompt-logprob scorer reports the same for the chosen token */
            pd_sampler_score(&q->ref, &sc, l, ids[r], &score);
            CHECK(same_float(score.logprob, lps[r]));
            /* would the same u have chosen otherwise without the penalties? */
            if (penalized(&cfgs[r])) {
                memcpy(buf, l, sizeof(float) * (size_t)V);
                pen_changed += pd_sampling_choose(&rows[r], &sc, buf, V) != ids[r];
            }
            drawn += !pd_sampling_row_greedy(&rows[r]);
            enum pd_finish f;
            pd_sampler_record(&q->dev, ids[r], &f);
            q->toks[q->n_prompt + q->n_out++] = ids[r];
        }
    }
    for (int r = 0; r < R; r++) {
        pd_sampler_free(&rq[r].ref);
        pd_sampler_free(&rq[r].dev);
    }
    pd_sampling_scratch_free(&sc);
    free(base);
    free(buf);
    pd_backend_release(be, x);
    pd_backend_free(be);
}

static void test_matches_host_sampler(void) {
    static const int vocabs[] = {1, 2, 7, 97, 1000, 1001, 4099, 32003};
    for (size_t i = 0; i < sizeof(vocabs) / sizeof(vocabs[0]); i++)
        sweep_vocab(vocabs[i], STEPS);
    sweep_vocab(151936, 3);
    printf("  penalties changed %d choices; %d sampled rows; %d top-n rows\n", pen_changed, drawn,
           tops_seen);
    CHECK(pen_changed > 20); /* the penalties are not a no-op in the sweep */
    CHECK(drawn > 100);
    CHECK(tops_seen > 100);
}

/* Bad rows and slots: refused with the cause named, nothing run. */
static void test_refusals(void) {
    enum { V = 50 };
    struct pd_backend_opts o = {.kind = PD_BACKEND_CPU, .threads = 1};
    struct pd_backend *be = NULL;
    CHECK_OK(pd_backend_new(&o, &be));
    static float x[2][V];
    struct pd_sample top;
    struct pd_sample_row rows[2] = {
        {.temperature = 0, .top_p = 1, .penalized = true, .slot = 0, .repetition_penalty = 1.2f},
        {.temperature = 1, .top_p = 1, .u = 0.5}};
    int32_t ids[2];
    float lps[2];
    int32_t prompt[3] = {1, 2, 3};
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, rows, ids, lps), PD_EINVAL,
              "pd_backend_penalty_reserve");
    CHECK_ERR(pd_backend_penalty_set(be, 0, prompt, 3, NULL, 0), PD_ERANGE, "slot 0");
    CHECK_ERR(pd_backend_penalty_reserve(be, 0, V, 8), PD_EINVAL, "0 slots");
    CHECK_OK(pd_backend_penalty_reserve(be, 4, V, 8));
    CHECK_ERR(pd_backend_penalty_reserve(be, 4, V, 8), PD_EINVAL, "already");
    CHECK_OK(pd_backend_penalty_set(be, 0, prompt, 3, prompt, 3));
    CHECK_ERR(pd_backend_penalty_set(be, 4, prompt, 3, NULL, 0), PD_ERANGE, "slot 4");
    CHECK_ERR(pd_backend_penalty_set(be, -1, prompt, 3, NULL, 0), PD_ERANGE, "slot -1");
    CHECK_ERR(pd_backend_penalty_set(be, 1, prompt, 3, prompt, 6), PD_ERANGE, "at most 8");
    CHECK_OK(pd_backend_sample(be, &x[0][0], 2, V, rows, ids, lps));
    rows[1] = rows[0]; /* two rows, one slot: their counts would race on a device */
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 2, V, rows, ids, lps), PD_EINVAL,
              "penalty slot 0 is another row's");
    rows[1].slot = 1;
    CHECK_OK(pd_backend_sample(be, &x[0][0], 2, V, rows, ids, lps));
    rows[1].slot = 4;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 2, V, rows, ids, lps), PD_ERANGE, "slot 4");
    rows[1].slot = 1;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V - 1, rows, ids, lps), PD_EINVAL,
              "the slots hold 50");
    rows[0].repetition_penalty = 0;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, rows, ids, lps), PD_EINVAL,
              "repetition_penalty");
    rows[0].repetition_penalty = 1.2f;
    rows[0].frequency_penalty = 2.5f;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, rows, ids, lps), PD_EINVAL,
              "frequency_penalty");
    rows[0].frequency_penalty = 0;
    rows[0].n_logprobs = 3;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, rows, ids, lps), PD_EINVAL, "nowhere to put");
    rows[0].top = &top;
    rows[0].n_logprobs = 21;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, rows, ids, lps), PD_EINVAL, "21");
    rows[0].n_logprobs = 20;
    CHECK_OK(pd_backend_sample(be, &x[0][0], 1, V, rows, ids, lps));
    CHECK_INT(top.n_top, 20);
    pd_backend_free(be);
}

/* The slot's state is what the host sampler counts: a token the prompt has is penalized by the
 * repetition penalty once, an output token by frequency × count + presence, ids outside the
 * vocabulary ignored; and sampling counts the chosen token. Checked on logits that make the
 * effect visible: all equal, so the choice is the lowest id not penalized. */
static void test_slot_state(void) {
    enum { V = 8 };
    struct pd_backend_opts o = {.kind = PD_BACKEND_CPU, .threads = 1};
    struct pd_backend *be = NULL;
    CHECK_OK(pd_backend_new(&o, &be));
    CHECK_OK(pd_backend_penalty_reserve(be, 2, V, 16));
    float x[V];
    for (int t = 0; t < V; t++)
        x[t] = 1.0f;
    int32_t prompt[4] = {0, -5, 2, 99}, out[3] = {1, 1, 3};
    CHECK_OK(pd_backend_penalty_set(be, 1, prompt, 4, out, 3));
    struct pd_sample_row row = {
        .temperature = 0, .top_p = 1, .penalized = true, .slot = 1, .repetition_penalty = 2.0f};
    int32_t id;
    float lp;
    /* 0 and 2 (prompt), 1 and 3 (output) are halved: 4 is the first unpenalized */
    CHECK_OK(pd_backend_sample(be, x, 1, V, &row, &id, &lp));
    CHECK_INT(id, 4);
    /* 4 is now counted: 5 next */
    CHECK_OK(pd_backend_sample(be, x, 1, V, &row, &id, &lp));
    CHECK_INT(id, 5);
    /* set again: the counts of those draws are gone, 4 is first again */
    CHECK_OK(pd_backend_penalty_set(be, 1, prompt, 4, out, 3));
    CHECK_OK(pd_backend_sample(be, x, 1, V, &row, &id, &lp));
    CHECK_INT(id, 4);
    /* frequency: 1 (twice) and 3 (once) get 1 - 0.25 × count; with logits 1 + 0.1 × id the
     * order of the penalized ones is 3 (1.3 - 0.25 = 1.05) before 1 (1.1 - 0.5 = 0.6) */
    for (int t = 0; t < V; t++)
        x[t] = t == 1 || t == 3 ? 1.0f + 0.1f * (float)t : 0.0f;
    CHECK_OK(pd_backend_penalty_set(be, 0, NULL, 0, out, 3));
    row = (struct pd_sample_row){.temperature = 0,
                                 .top_p = 1,
                                 .penalized = true,
                                 .slot = 0,
                                 .repetition_penalty = 1,
                                 .frequency_penalty = 0.25f};
    CHECK_OK(pd_backend_sample(be, x, 1, V, &row, &id, &lp));
    CHECK_INT(id, 3);
    /* 3 was just counted (twice now); presence 0.5 on top: 3 → 1.3 - 0.5 - 0.5 = 0.3,
     * 1 → 1.1 - 0.5 - 0.5 = 0.1, the rest 0 */
    row.presence_penalty = 0.5f;
    CHECK_OK(pd_backend_sample(be, x, 1, V, &row, &id, &lp));
    CHECK_INT(id, 3);
    /* presence 1: 3 → -0.2, 1 → -0.4: now 0 (the lowest id of the unpenalized zeros) */
    row.presence_penalty = 1.0f;
    CHECK_OK(pd_backend_sample(be, x, 1, V, &row, &id, &lp));
    CHECK_INT(id, 0);
    pd_backend_free(be);
}

PD_TEST_MAIN(PD_TEST(test_matches_host_sampler), PD_TEST(test_refusals), PD_TEST(test_slot_state))
