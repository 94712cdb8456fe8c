/*
 * dataset.c — the prompts pdserve-bench sends, made as sglang.bench_serving makes them so that
 * the same flags give the same load shape:
 *   random    input lengths uniform in [max(int(len*ratio), 1), len], output lengths in
 *             [int(len*ratio), len] (at least 1); prompts are random token ids of the model's
 *             vocabulary, special tokens left out (an EOS in a prompt would be noise), sent as
 *             ids where the API takes ids (exact lengths) or decoded to text for chat;
 *   sharegpt  a ShareGPT JSON file: first turn the prompt, second turn's token count the output
 *             length; shuffled; too short (< 2 tokens) or too long (> context) pairs skipped;
 *   sharegpt-synthetic  no file: the random dataset's prompts with ShareGPT's long-tailed
 *             lengths (log-normal), for soaks and loads that want that shape without the file.
 *             ShareGPT's lengths span two orders of magnitude around a few hundred tokens
 *             (vLLM's paper reports means of 161 prompt and 338 output tokens); sigma 1 gives
 *             that spread (a 16:1 ratio between the 5th and 95th percentiles), the means are
 *             the flags', so the shape scales to a small test model.
 * A malformed file is an error naming the file and where it is wrong (line for JSON syntax, the
 * JSON path for structure); entries with fewer than two turns are skipped as bench_serving does.
 */
#include "bench/serving/serving.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/rng.h"
#include "common/base/status.h"
#include "model/tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

struct rng {
    uint64_t s[4];
};

static void rng_seed(struct rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = pd_splitmix64(&x);
}

/* Uniform integer in [lo, hi]. */
static int rng_int(struct rng *r, int lo, int hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int)(pd_xoshiro256ss(r->s) % span);
}

void pd_bench_dataset_free(struct pd_bench_dataset *d) {
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++) {
        pd_free(d->p[i].text);
        pd_free(d->p[i].ids);
    }
    pd_free(d->p);
    d->p = NULL;
    d->n = 0;
}

/* Uniform in [0, 1). */
static double rng_unit(struct rng *r) {
    return (double)(pd_xoshiro256ss(r->s) >> 11) * 0x1.0p-53;
}

/* A standard normal draw (Box-Muller). */
static double rng_normal(struct rng *r) {
    double u = 1.0 - rng_unit(r), v = rng_unit(r); /* u in (0, 1] */
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* A log-normal length of the given mean: mean * exp(sigma Z - sigma^2 / 2), in [2, max_x mean]. */
static int lognormal_len(struct rng *r, int mean) {
    double sigma = PD_BENCH_SHAREGPT_SIGMA;
    double v = (double)mean * exp(sigma * rng_normal(r) - sigma * sigma / 2);
    double hi = (double)mean * PD_BENCH_SHAREGPT_MAX_X;
    v = v > hi ? hi : v;
    int len = (int)lround(v);
    return len < 2 ? 2 : len;
}

/* The random prompt of every p->prompt_len in out (lengths already set): ids from the
 * non-special vocabulary, decoded to text when as_text. */
static int fill_random_prompts(const char *what, bool as_text, struct rng *r,
                               const struct pd_tokenizer *tok, struct pd_bench_dataset *out) {
    int32_t vocab = pd_tokenizer_vocab_size(tok);
    int32_t *pool = pd_calloc((size_t)vocab, sizeof(int32_t));
    if (!pool)
        return pd_errorf(PD_ENOMEM, "%s dataset: vocabulary of %d ids", what, vocab);
    int32_t n_pool = 0;
    for (int32_t id = 0; id < vocab; id++)
        if (!pd_tokenizer_is_special(tok, id) && pd_tokenizer_id_to_token(tok, id))
            pool[n_pool++] = id;
    if (n_pool == 0) {
        pd_free(pool);
        return pd_errorf(PD_EINVAL, "%s dataset: the tokenizer has no non-special tokens", what);
    }
    int rc = PD_OK;
    for (size_t i = 0; i < out->n && !rc; i++) {
        struct pd_bench_prompt *p = &out->p[i];
        p->ids = pd_malloc((size_t)p->prompt_len * sizeof(int32_t));
        if (!p->ids) {
            rc = pd_errorf(PD_ENOMEM, "%s dataset: prompt of %d tokens", what, p->prompt_len);
            break;
        }
        for (int j = 0; j < p->prompt_len; j++)
            p->ids[j] = pool[rng_int(r, 0, n_pool - 1)];
        if (as_text) {
            size_t len;
            rc = pd_tokenizer_decode(tok, p->ids, (size_t)p->prompt_len, false, &p->text, &len);
            pd_free(p->ids);
            p->ids = NULL;
            if (rc)
                pd_error_wrap(rc, "%s dataset: decoding prompt %zu", what, i);
        }
    }
    pd_free(pool);
    return rc;
}

/* n zeroed prompts in out; PD_ENOMEM naming the dataset when that fails. */
static int alloc_prompts(const char *what, size_t n, struct pd_bench_dataset *out) {
    out->p = pd_calloc(n ? n : 1, sizeof(*out->p));
    out->n = out->p ? n : 0;
    return out->p ? PD_OK : pd_errorf(PD_ENOMEM, "%s dataset: %zu prompts", what, n);
}

int pd_bench_dataset_sharegpt_synthetic(const struct pd_bench_random_spec *spec, size_t n,
                                        uint64_t seed, int context_len,
                                        const struct pd_tokenizer *tok,
                                        struct pd_bench_dataset *out) {
    if (spec->input_len < 2 || spec->output_len < 2)
        return pd_errorf(PD_EINVAL,
                         "sharegpt-synthetic dataset: the mean input and output lengths "
                         "(--random-input-len, --random-output-len) must be >= 2 (got %d and %d)",
                         spec->input_len, spec->output_len);
    if (context_len > 0 && context_len < 4)
        return pd_errorf(PD_EINVAL,
                         "sharegpt-synthetic dataset: a context of %d tokens is too "
                         "short",
                         context_len);
    struct rng r;
    rng_seed(&r, seed);
    if (alloc_prompts("sharegpt-synthetic", n, out))
        return PD_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        struct pd_bench_prompt *p = &out->p[i];
        p->prompt_len = lognormal_len(&r, spec->input_len);
        p->output_len = lognormal_len(&r, spec->output_len);
        if (context_len > 0 && p->prompt_len + p->output_len > context_len) {
            if (p->prompt_len > context_len - 2)
                p->prompt_len = context_len - 2;
            p->output_len = context_len - p->prompt_len;
        }
    }
    int rc = fill_random_prompts("sharegpt-synthetic", spec->as_text, &r, tok, out);
    if (rc)
        pd_bench_dataset_free(out);
    return rc;
}

int pd_bench_dataset_random(const struct pd_bench_random_spec *spec, size_t n, uint64_t seed,
                            const struct pd_tokenizer *tok, struct pd_bench_dataset *out) {
    if (spec->input_len < 1 || spec->output_len < 1)
        return pd_errorf(PD_EINVAL,
                         "random dataset: input and output lengths must be >= 1 "
                         "(got %d and %d)",
                         spec->input_len, spec->output_len);
    if (!(spec->range_ratio >= 0 && spec->range_ratio <= 1))
        return pd_errorf(PD_EINVAL, "random dataset: --random-range-ratio must be in [0, 1]");
    struct rng r;
    rng_seed(&r, seed);
    if (alloc_prompts("random", n, out))
        return PD_ENOMEM;
    int in_lo = (int)(spec->input_len * spec->range_ratio);
    in_lo = in_lo < 1 ? 1 : in_lo;
    int out_lo = (int)(spec->output_len * spec->range_ratio);
    out_lo = out_lo < 1 ? 1 : out_lo;
    for (size_t i = 0; i < n; i++) {
        out->p[i].prompt_len = rng_int(&r, in_lo, spec->input_len);
        out->p[i].output_len = rng_int(&r, out_lo, spec->output_len);
    }
    int rc = fill_random_prompts("random", spec->as_text, &r, tok, out);
    if (rc)
        pd_bench_dataset_free(out);
    return rc;
}

/* Line and column of byte offset off in text (1-based), for a JSON syntax error. */
static void line_col(const char *text, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && text[i]; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int count_tokens(const struct pd_tokenizer *tok, const char *s, const char *path, size_t idx,
                        int *out) {
    struct pd_token_ids ids = {0};
    int rc = pd_tokenizer_encode(tok, s, strlen(s), PD_TOK_ADD_SPECIAL, &ids);
    *out = (int)ids.n;
    pd_token_ids_free(&ids);
    if (rc)
        return pd_error_wrap(rc, "%s: [%zu]: tokenizing", path, idx);
    return PD_OK;
}

/* The "value" string of conversations[turn] of entry idx, or an error naming the JSON path. */
static int turn_value(const cJSON *conv, int turn, const char *path, size_t idx, const char *key,
                      const char **out) {
    const cJSON *t = cJSON_GetArrayItem(conv, turn);
    if (!cJSON_IsObject(t))
        return pd_errorf(PD_EFORMAT, "%s: [%zu].%s[%d]: expected an object with \"value\"", path,
                         idx, key, turn);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, "value");
    if (!cJSON_IsString(v))
        return pd_errorf(PD_EFORMAT, "%s: [%zu].%s[%d].value: expected a string", path, idx, key,
                         turn);
    *out = v->valuestring;
    return PD_OK;
}

int pd_bench_dataset_sharegpt(const char *path, size_t n, uint64_t seed, int fixed_output_len,
                              int context_len, const struct pd_tokenizer *tok,
                              struct pd_bench_dataset *out) {
    char *text = NULL;
    size_t len = 0;
    int rc = pd_file_read_all(path, &text, &len);
    if (rc)
        return pd_error_wrap(rc, "ShareGPT dataset");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        int line, col;
        size_t off = end ? (size_t)(end - text) : 0;
        if (!end && cJSON_GetErrorPtr())
            off = (size_t)(cJSON_GetErrorPtr() - text);
        line_col(text, off, &line, &col);
        pd_free(text);
        return pd_errorf(PD_EFORMAT, "%s: not valid JSON (syntax error at line %d, column %d)",
                         path, line, col);
    }
    size_t *order = NULL;
    size_t n_entries = 0;
    if (!cJSON_IsArray(root)) {
        rc = pd_errorf(PD_EFORMAT, "%s: expected a JSON list of conversations at the top level",
                       path);
        goto done;
    }
    /* Structure check of every entry first: a malformed file fails whatever the shuffle picks. */
    size_t total = (size_t)cJSON_GetArraySize(root);
    order = pd_calloc(total ? total : 1, sizeof(size_t));
    if (!order) {
        rc = pd_errorf(PD_ENOMEM, "%s: %zu entries", path, total);
        goto done;
    }
    size_t idx = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!cJSON_IsObject(e)) {
            rc = pd_errorf(PD_EFORMAT, "%s: [%zu]: expected an object with \"conversations\"", path,
                           idx);
            goto done;
        }
        const char *key = "conversations";
        const cJSON *conv = cJSON_GetObjectItemCaseSensitive(e, key);
        if (!conv) {
            key = "conversation";
            conv = cJSON_GetObjectItemCaseSensitive(e, key);
        }
        if (!cJSON_IsArray(conv)) {
            rc = pd_errorf(PD_EFORMAT, "%s: [%zu].conversations: expected a list of turns", path,
                           idx);
            goto done;
        }
        if (cJSON_GetArraySize(conv) >= 2) {
            const char *a = NULL, *b = NULL;
            if ((rc = turn_value(conv, 0, path, idx, key, &a)) ||
                (rc = turn_value(conv, 1, path, idx, key, &b)))
                goto done;
            order[n_entries++] = idx;
        }
        idx++;
    }
    if (n_entries == 0) {
        rc = pd_errorf(PD_EFORMAT, "%s: no conversation with at least two turns", path);
        goto done;
    }
    struct rng r;
    rng_seed(&r, seed);
    for (size_t i = n_entries - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = (size_t)rng_int(&r, 0, (int)i);
        size_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    out->p = pd_calloc(n ? n : 1, sizeof(*out->p));
    out->n = 0;
    if (!out->p) {
        rc = pd_errorf(PD_ENOMEM, "%s: %zu prompts", path, n);
        goto done;
    }
    for (size_t k = 0; k < n_entries && out->n < n; k++) {
        const cJSON *entry = cJSON_GetArrayItem(root, (int)order[k]);
        const char *key = cJSON_GetObjectItemCaseSensitive(entry, "conversations") ? "conversations"
                                                                                   : "conversation";
        const cJSON *conv = cJSON_GetObjectItemCaseSensitive(entry, key);
        const char *prompt = "", *answer = "";
        if ((rc = turn_value(conv, 0, path, order[k], key, &prompt)) ||
            (rc = turn_value(conv, 1, path, order[k], key, &answer)))
            goto done; /* checked above; kept for the compiler and for safety */
        int plen, olen = fixed_output_len;
        if ((rc = count_tokens(tok, prompt, path, order[k], &plen)))
            goto done;
        if (fixed_output_len <= 0 && (rc = count_tokens(tok, answer, path, order[k], &olen)))
            goto done;
        if (plen < 2 || olen < 2)
            continue; /* too short */
        if (context_len > 0 && plen + olen > context_len)
            continue; /* too long */
        struct pd_bench_prompt *p = &out->p[out->n];
        p->text = pd_strdup(prompt);
        if (!p->text) {
            rc = pd_errorf(PD_ENOMEM, "%s: prompt text", path);
            goto done;
        }
        p->prompt_len = plen;
        p->output_len = olen;
        out->n++;
    }
    if (out->n == 0)
        rc = pd_errorf(PD_EINVAL,
                       "%s: every conversation was skipped (prompt or answer under 2 tokens, or "
                       "longer than the context of %d tokens)",
                       path, context_len);
done:
    if (rc)
        pd_bench_dataset_free(out);
    pd_free(order);
    cJSON_Delete(root);
    pd_free(text);
    return rc;
}
