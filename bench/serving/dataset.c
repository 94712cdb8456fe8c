/*
 * dataset.c — the prompts pdserve-bench sends, made as sglang.bench_serving makes them so that
 * the same flags give the same load shape:
 *   random    input lengths uniform in [max(int(len*ratio), 1), len], output lengths in
 *             [int(len*ratio), len] (at least 1); prompts are random token ids of the model's
 *             vocabulary, special tokens left out (an EOS in a prompt would be noise), sent as
 *             ids where the API takes ids (exact lengths) or decoded to text for chat;
 *   sharegpt  a ShareGPT JSON file: first turn the prompt, second turn's token count the output
 *             length; shuffled; too short (< 2 tokens) or too long (> context) pairs skipped;
 *   random with --random-mix  prompt lengths from length classes (a class drawn with its
 *             share, then a length uniform in its range), so one load mixes short and long
 *             prompts; each prompt keeps its class for the per-class report;
 *   multiturn conversations x turns of random text (decoded token ids), in turn-major order;
 *             only each turn's new text is made here: what a turn sends depends on the answers
 *             before it, so load.c builds it when the turn leaves;
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
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
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
/* The ids random prompts are drawn from: the vocabulary's non-special ones. *pool: caller frees. */
static int random_pool(const char *what, const struct pd_tokenizer *tok, int32_t **pool,
                       int32_t *n_pool) {
    int32_t vocab = pd_tokenizer_vocab_size(tok);
    *pool = pd_calloc((size_t)vocab, sizeof(int32_t));
    if (!*pool)
        return pd_errorf(PD_ENOMEM, "%s dataset: vocabulary of %d ids", what, vocab);
    *n_pool = 0;
    for (int32_t id = 0; id < vocab; id++)
        if (!pd_tokenizer_is_special(tok, id) && pd_tokenizer_id_to_token(tok, id))
            (*pool)[(*n_pool)++] = id;
    if (*n_pool == 0) {
        pd_free(*pool);
        *pool = NULL;
        return pd_errorf(PD_EINVAL, "%s dataset: the tokenizer has no non-special tokens", what);
    }
    return PD_OK;
}

static int fill_random_prompts(const char *what, bool as_text, struct rng *r,
                               const struct pd_tokenizer *tok, struct pd_bench_dataset *out) {
    int32_t *pool, n_pool;
    int rc = random_pool(what, tok, &pool, &n_pool);
    if (rc)
        return rc;
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

/* n zeroed prompts in out, of no length class; PD_ENOMEM naming the dataset when that fails. */
static int alloc_prompts(const char *what, size_t n, struct pd_bench_dataset *out) {
    out->p = pd_calloc(n ? n : 1, sizeof(*out->p));
    out->n = out->p ? n : 0;
    for (size_t i = 0; i < out->n; i++)
        out->p[i].length_class = -1;
    return out->p ? PD_OK : pd_errorf(PD_ENOMEM, "%s dataset: %zu prompts", what, n);
}

/* A positive whole number at *p (advanced past it), at most 1e7. */
static bool parse_len(const char **p, int *out) {
    char *end;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (end == *p || errno || v < 1 || v > 10000000 || !isdigit((unsigned char)**p))
        return false;
    *out = (int)v;
    *p = end;
    return true;
}

int pd_bench_length_mix_parse(const char *s, struct pd_bench_length_mix *out) {
    memset(out, 0, sizeof(*out));
    const char *p = s;
    double sum = 0;
    for (;;) {
        if (out->n == PD_BENCH_MAX_CLASSES)
            return pd_errorf(PD_EINVAL, "--random-mix '%s': at most %d length classes", s,
                             PD_BENCH_MAX_CLASSES);
        struct pd_bench_length_class *c = &out->cls[out->n];
        const char *item = p;
        char *end;
        errno = 0;
        c->share = strtod(p, &end);
        bool ok = end != p && !errno && *end == ':' && c->share > 0 && c->share <= 1;
        p = end + (ok ? 1 : 0);
        ok = ok && parse_len(&p, &c->min_len) && *p == '-';
        p += ok ? 1 : 0;
        ok = ok && parse_len(&p, &c->max_len) && (*p == ',' || *p == '\0');
        if (!ok) {
            const char *comma = strchr(item, ',');
            int len = comma ? (int)(comma - item) : (int)strlen(item);
            return pd_errorf(PD_EINVAL,
                             "--random-mix '%s': item '%.*s' is not SHARE:MIN-MAX (a share in "
                             "(0, 1], lengths in tokens >= 1, e.g. 0.7:32-128)",
                             s, len, item);
        }
        if (c->min_len > c->max_len)
            return pd_errorf(PD_EINVAL, "--random-mix '%s': class %d has MIN %d > MAX %d", s,
                             out->n + 1, c->min_len, c->max_len);
        sum += c->share;
        out->n++;
        if (*p == '\0')
            break;
        p++;
    }
    if (fabs(sum - 1) > 1e-6)
        return pd_errorf(PD_EINVAL, "--random-mix '%s': the shares sum to %.9g, not 1", s, sum);
    return PD_OK;
}

/* The class of a draw u in [0, 1): the first whose cumulative share exceeds u (the last one
 * takes what rounding leaves). */
static int pick_class(const struct pd_bench_length_mix *mix, double u) {
    double acc = 0;
    for (int k = 0; k < mix->n - 1; k++) {
        acc += mix->cls[k].share;
        if (u < acc)
            return k;
    }
    return mix->n - 1;
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
    const struct pd_bench_length_mix *mix = spec->mix && spec->mix->n > 0 ? spec->mix : NULL;
    for (size_t i = 0; i < n; i++) {
        struct pd_bench_prompt *p = &out->p[i];
        if (mix) {
            p->length_class = pick_class(mix, rng_unit(&r));
            const struct pd_bench_length_class *c = &mix->cls[p->length_class];
            p->prompt_len = rng_int(&r, c->min_len, c->max_len);
        } else {
            p->prompt_len = rng_int(&r, in_lo, spec->input_len);
        }
        p->output_len = rng_int(&r, out_lo, spec->output_len);
    }
    int rc = fill_random_prompts("random", spec->as_text, &r, tok, out);
    if (rc)
        pd_bench_dataset_free(out);
    return rc;
}

/* The tokens of text[0..len) as the server would count them (no special token added). */
static int count_text(const struct pd_tokenizer *tok, const char *text, size_t len, int *count) {
    struct pd_token_ids ids = {0};
    int rc = pd_tokenizer_encode(tok, text, len, 0, &ids);
    *count = (int)ids.n;
    pd_token_ids_free(&ids);
    return rc;
}

/* The longest prefix of text (whole UTF-8 characters, found by bisection) that encodes to at
 * most target tokens; *len: its count. */
static int cut_text(const struct pd_tokenizer *tok, char *text, int target, int *len) {
    size_t hi = strlen(text), lo = 0; /* the prefix of lo bytes fits, that of hi may not */
    int rc = count_text(tok, text, hi, len);
    if (rc || *len <= target)
        return rc;
    int lo_count = 0;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        while (mid < hi && ((unsigned char)text[mid] & 0xC0) == 0x80)
            mid++; /* not inside a character */
        if (mid == hi)
            break;
        int c;
        if ((rc = count_text(tok, text, mid, &c)))
            return rc;
        if (c <= target)
            lo = mid, lo_count = c;
        else
            hi = mid;
    }
    text[lo] = '\0';
    *len = lo_count;
    return PD_OK;
}

/* Random text of target tokens as the tokenizer reads it back, in *text (replaced; it ends at
 * its first NUL). Random ids decoded to text do not encode to as many tokens (a byte token alone
 * decodes to U+FFFD, which encodes to several; neighbours merge), so more decoded ids are
 * appended while it encodes to fewer (a few rounds), then it is cut where it would encode to
 * more. *len: the final count,
 * target unless the tokenizer will not land on it exactly. */
static int fit_random_text(const struct pd_tokenizer *tok, const int32_t *pool, int32_t n_pool,
                           struct rng *r, int target, char **text, int *len) {
    size_t bytes = strlen(*text);
    int rc = count_text(tok, *text, bytes, len);
    int32_t *more = NULL;
    for (int round = 0; round < 16 && !rc && *len < target; round++) {
        int k = target - *len;
        int32_t *grown = pd_realloc(more, (size_t)k * sizeof(int32_t));
        if (!grown) {
            rc = pd_errorf(PD_ENOMEM, "%d token ids", k);
            break;
        }
        more = grown;
        for (int j = 0; j < k; j++)
            more[j] = pool[rng_int(r, 0, n_pool - 1)];
        char *piece;
        size_t piece_len;
        if ((rc = pd_tokenizer_decode(tok, more, (size_t)k, false, &piece, &piece_len)))
            break;
        size_t kept = 0; /* a byte token can decode to NUL, which would end the text */
        for (size_t j = 0; j < piece_len; j++)
            if (piece[j])
                piece[kept++] = piece[j];
        piece[kept] = '\0';
        piece_len = kept;
        char *joined = pd_realloc(*text, bytes + piece_len + 1);
        if (!joined) {
            pd_free(piece);
            rc = pd_errorf(PD_ENOMEM, "a text of %zu bytes", bytes + piece_len);
            break;
        }
        memcpy(joined + bytes, piece, piece_len + 1);
        pd_free(piece);
        *text = joined;
        bytes += piece_len;
        rc = count_text(tok, *text, bytes, len);
    }
    pd_free(more);
    if (!rc)
        rc = cut_text(tok, *text, target, len);
    return rc;
}

int pd_bench_dataset_multiturn(const struct pd_bench_random_spec *spec, int conversations,
                               int turns, uint64_t seed, const struct pd_tokenizer *tok,
                               struct pd_bench_dataset *out) {
    if (conversations < 1 || turns < 1 || turns > PD_BENCH_MAX_TURNS)
        return pd_errorf(PD_EINVAL,
                         "multiturn dataset: %d conversations of %d turns (want >= 1 "
                         "conversation, 1..%d turns)",
                         conversations, turns, PD_BENCH_MAX_TURNS);
    struct pd_bench_random_spec one = *spec;
    one.as_text = true; /* a turn's text is appended to the conversation's text */
    one.mix = NULL;
    size_t n = (size_t)conversations * (size_t)turns;
    int rc = pd_bench_dataset_random(&one, n, seed, tok, out);
    if (rc)
        return pd_error_wrap(rc, "multiturn dataset");
    int32_t *pool = NULL, n_pool = 0;
    struct rng r;
    rng_seed(&r, seed ^ 0x7e47u); /* the top-ups' own stream: the texts start as random's */
    rc = random_pool("multiturn", tok, &pool, &n_pool);
    for (size_t i = 0; i < n && !rc; i++) {
        struct pd_bench_prompt *p = &out->p[i];
        p->conversation = (int)(i % (size_t)conversations);
        p->turn = (int)(i / (size_t)conversations) + 1;
        rc = fit_random_text(tok, pool, n_pool, &r, p->prompt_len, &p->text, &p->prompt_len);
        if (rc)
            pd_error_wrap(rc, "multiturn dataset: turn %d of conversation %d", p->turn,
                          p->conversation);
    }
    pd_free(pool);
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
        p->length_class = -1;
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
