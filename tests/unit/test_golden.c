/*
 * test_golden.c — the runtime against Hugging Face transformers (issue 10 "Done when"): for
 * every model of tests/fixtures/runtime/golden.txt (written by make_runtime_fixtures.py), the
 * model is regenerated with pdserve-mkmodel's writer from the same options (deterministic by
 * seed), loaded from disk like a real checkpoint, and
 *   - the last-position logits of the fixed prompt must match transformers' within 1e-4
 *     (f32 weights) or 2e-2 (bf16), as max |ours - theirs| / max |theirs|;
 *   - 32 greedy tokens (extend, then decode steps) must be identical.
 * The prompt runs once whole and once in chunks of 16 (page-aligned chunked prefill).
 */
#include "pd_compare.h"
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "tools/mkmodel/mkmodel.h"
#include "model/model.h"

#include <math.h>

#ifndef PD_FIXTURES_DIR
#error "PD_FIXTURES_DIR must point at tests/fixtures"
#endif

#define MAXP 64
#define GREEDY 32

struct golden {
    char name[64];
    struct pd_mkmodel_opts mk;
    int vocab;
    int32_t prompt[MAXP];
    int n_prompt;
    int32_t greedy[GREEDY];
};

static int parse_flags(char *flags, struct pd_mkmodel_opts *o) {
    pd_mkmodel_opts_defaults(o);
    o->family = -1;
    o->threads = 1;
    for (char *w = strtok(flags, " \n"); w; w = strtok(NULL, " \n")) {
        char *v = strtok(NULL, " \n");
        if (strcmp(w, "--tie-word-embeddings") == 0) {
            o->tie_word_embeddings = 1;
            if (v) { /* not a value: the next flag */
                w = v;
                v = strtok(NULL, " \n");
            } else {
                break;
            }
        }
        if (!v)
            return -1;
        if (strcmp(w, "--family") == 0) {
            for (int i = 0; pd_mkmodel_family_names[i]; i++)
                if (strcmp(v, pd_mkmodel_family_names[i]) == 0)
                    o->family = i;
        } else if (strcmp(w, "--dtype") == 0) {
            o->dtype = strcmp(v, "f32") == 0 ? PD_DTYPE_F32 : PD_DTYPE_BF16;
        } else if (strcmp(w, "--seed") == 0) {
            o->seed = strtoull(v, NULL, 10);
        } else if (strcmp(w, "--heads") == 0) {
            o->num_attention_heads = atoi(v);
        } else if (strcmp(w, "--kv-heads") == 0) {
            o->num_key_value_heads = atoi(v);
        } else if (strcmp(w, "--sliding-window") == 0) {
            o->sliding_window = atoi(v);
        } else if (strcmp(w, "--max-window-layers") == 0) {
            o->max_window_layers = atoi(v);
        } else {
            return -1;
        }
    }
    return o->family >= 0 ? 0 : -1;
}

static int read_golden(struct golden *g, int max) {
    FILE *f = fopen(PD_FIXTURES_DIR "/runtime/golden.txt", "r");
    if (!f)
        return -1;
    char line[4096];
    int n = -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model ", 6) == 0) {
            if (++n >= max)
                break;
            char *p = line + 6, *sp = strchr(p, ' ');
            *sp = '\0';
            snprintf(g[n].name, sizeof(g[n].name), "%s", p);
            p = sp + 1;
            g[n].vocab = atoi(strstr(p, "vocab=") + 6);
            p = strstr(p, "--");
            if (!p || parse_flags(p, &g[n].mk) != 0)
                n = max; /* malformed: fail below */
        } else if (n >= 0 && n < max && strncmp(line, "prompt ", 7) == 0) {
            char *p = line + 7, *e;
            for (g[n].n_prompt = 0; g[n].n_prompt < MAXP; g[n].n_prompt++, p = e) {
                long v = strtol(p, &e, 10);
                if (e == p)
                    break;
                g[n].prompt[g[n].n_prompt] = (int32_t)v;
            }
        } else if (n >= 0 && n < max && strncmp(line, "greedy ", 7) == 0) {
            char *p = line + 7;
            for (int i = 0; i < GREEDY; i++)
                g[n].greedy[i] = (int32_t)strtol(p, &p, 10);
        }
    }
    fclose(f);
    return n + 1;
}

static int read_logits(const char *name, float *out, int vocab) {
    char path[512];
    snprintf(path, sizeof(path), PD_FIXTURES_DIR "/runtime/%s.f32", name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t got = fread(out, sizeof(float), (size_t)vocab, f);
    fclose(f);
    return got == (size_t)vocab ? 0 : -1; /* little-endian host assumed (x86-64, aarch64) */
}

static void check_model(const struct golden *g, const char *scratch) {
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/golden-%s", scratch, g->name);
    CHECK_OK(pd_mkmodel_write(&g->mk, dir));
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 2};
    CHECK_OK(pd_backend_new(&bo, &be));
    struct pd_model *m = NULL;
    struct pd_model_opts mo = {
        .max_tokens = 64, .max_reqs = 1, .page_size = 16, .context_length = 128};
    CHECK_OK(pd_model_load(be, dir, &mo, &m));
    if (!m) {
        pd_backend_free(be);
        return;
    }
    int vocab = pd_model_config_of(m)->vocab_size;
    CHECK_INT(vocab, g->vocab);
    struct pd_kv_pool kv;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, PD_DTYPE_F32);
    ko.n_pages = 8;
    CHECK_OK(pd_kv_pool_init(&kv, be, &ko));
    int32_t pages[8] = {5, 2, 7, 0, 1, 3, 4, 6};
    float *ref = pd_malloc(sizeof(float) * (size_t)vocab);
    float *lg = pd_malloc(sizeof(float) * (size_t)vocab);
    CHECK(read_logits(g->name, ref, vocab) == 0);
    double tol = g->mk.dtype == PD_DTYPE_F32 ? 1e-4 : 2e-2;
    for (int chunk = g->n_prompt; chunk >= 16; chunk = chunk == 16 ? 0 : 16) {
        for (int done = 0; done < g->n_prompt; done += chunk) {
            int n = g->n_prompt - done < chunk ? g->n_prompt - done : chunk;
            struct pd_model_seq s = {.tokens = g->prompt + done,
                                     .n_new = n,
                                     .n_cached = done,
                                     .pages = pages,
                                     .n_pages = 8};
            CHECK_OK(pd_model_extend(m, &kv, &s, 1, false, lg));
        }
        double d = 0, mx = 0;
        for (int i = 0; i < vocab; i++) {
            d = pd_err_max(d, fabs((double)lg[i] - ref[i]));
            mx = fmax(mx, fabs((double)ref[i]));
        }
        CHECK(d / mx <= tol);
        fprintf(stderr, "  %s (chunk %d): logits rel err %.2e (tolerance %.0e)\n", g->name, chunk,
                d / mx, tol);
    }
    int32_t got[GREEDY];
    for (int i = 0; i < GREEDY; i++) {
        int32_t t = 0;
        for (int v = 1; v < vocab; v++)
            if (lg[v] > lg[t])
                t = v;
        got[i] = t;
        struct pd_model_seq s = {.tokens = &got[i],
                                 .n_new = 1,
                                 .n_cached = g->n_prompt + i,
                                 .pages = pages,
                                 .n_pages = 8};
        CHECK_OK(pd_model_decode(m, &kv, &s, 1, lg));
    }
    int same = memcmp(got, g->greedy, sizeof(got)) == 0;
    CHECK(same);
    if (!same) {
        fprintf(stderr, "  %s greedy differs:", g->name);
        for (int i = 0; i < GREEDY; i++)
            fprintf(stderr, " %d/%d", got[i], g->greedy[i]);
        fprintf(stderr, "\n");
    }
    pd_free(ref);
    pd_free(lg);
    pd_kv_pool_free(&kv);
    pd_model_free(m);
    pd_backend_free(be);
}

static void test_against_transformers(void) {
    static struct golden g[16];
    pd_log_set_level(PD_LOG_WARNING);
    int n = read_golden(g, 16);
    CHECK(n >= 8 && n <= 16);
    /* this process's own directory: CTest runs this binary once per instruction set at once,
     * and a model rewritten under another one's mmap killed it with SIGBUS */
    char scratch[400];
    CHECK_OK(pd_test_scratch_dir(scratch, sizeof(scratch), "golden"));
    for (int i = 0; i < n && i < 16; i++)
        check_model(&g[i], scratch);
    pd_test_scratch_remove(scratch);
}

PD_TEST_MAIN(PD_TEST(test_against_transformers))
