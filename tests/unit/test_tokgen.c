/* BPE trainer invariants and the tokenizer files tokgen makes for each family. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "tools/mkmodel/bpe_train.h"
#include "tools/mkmodel/tokgen.h"

#include <cjson/cJSON.h>
#include <time.h>

static const enum pd_tokgen_flavor flavors[] = {
    PD_TOKGEN_LLAMA3, PD_TOKGEN_LLAMA2, PD_TOKGEN_MISTRAL, PD_TOKGEN_QWEN2, PD_TOKGEN_QWEN3};

/* Every merge joins two older tokens into the next new one, spelled as their concatenation. */
static void check_vocab(const struct pd_bpe_vocab *v) {
    CHECK_INT(v->n_tokens, v->n_base + v->n_merges);
    int bad = 0;
    for (int i = 0; i < v->n_merges; i++) {
        int l = v->merges[i][0], r = v->merges[i][1], id = v->n_base + i;
        if (l < 0 || r < 0 || l >= id || r >= id) {
            bad++;
            continue;
        }
        size_t ll = strlen(v->tokens[l]);
        if (strncmp(v->tokens[id], v->tokens[l], ll) != 0 ||
            strcmp(v->tokens[id] + ll, v->tokens[r]) != 0)
            bad++;
    }
    CHECK_INT(bad, 0);
    int dups = 0;
    for (int i = 0; i < v->n_tokens; i++)
        for (int j = i + 1; j < v->n_tokens; j++)
            dups += strcmp(v->tokens[i], v->tokens[j]) == 0;
    CHECK_INT(dups, 0);
}

static void test_bytelevel_alphabet(void) {
    CHECK_INT(pd_bpe_byte_to_codepoint(' '), 0x120);  /* "Ġ" */
    CHECK_INT(pd_bpe_byte_to_codepoint('\n'), 0x10A); /* "Ċ" */
    CHECK_INT(pd_bpe_byte_to_codepoint('A'), 'A');
    CHECK_INT(pd_bpe_byte_to_codepoint(0xAD), 0x143);
    CHECK_INT(pd_bpe_byte_to_codepoint(0xFF), 0xFF);

    struct pd_bpe_train_opts o = {.style = PD_BPE_BYTE_LEVEL,
                                  .corpus = pd_tokgen_corpus,
                                  .corpus_len = pd_tokgen_corpus_len,
                                  .max_tokens = 600,
                                  .max_digits = 3};
    struct pd_bpe_vocab v;
    CHECK_OK(pd_bpe_train(&o, &v));
    CHECK_INT(v.n_tokens, 600);
    CHECK_INT(v.n_base, 256);
    CHECK_STR(v.tokens[0], "!");          /* GPT-2 order: printable bytes first */
    CHECK_STR(v.tokens[188], "\xC4\x80"); /* byte 0 -> U+0100 */
    check_vocab(&v);
    /* the most frequent pair of an English corpus is a space before a letter or "he" */
    CHECK(strcmp(v.tokens[256], "\xC4\xA0"
                                "t") == 0 ||
          strcmp(v.tokens[256], "he") == 0 ||
          strcmp(v.tokens[256], "\xC4\xA0"
                                "a") == 0);
    pd_bpe_vocab_free(&v);
}

static void test_sentencepiece_alphabet(void) {
    static const char *const prefix[] = {"<unk>", "<s>", "</s>"};
    struct pd_bpe_train_opts o = {.style = PD_BPE_SENTENCEPIECE,
                                  .corpus = pd_tokgen_corpus,
                                  .corpus_len = pd_tokgen_corpus_len,
                                  .max_tokens = 1000,
                                  .prefix_tokens = prefix,
                                  .n_prefix = 3};
    struct pd_bpe_vocab v;
    CHECK_OK(pd_bpe_train(&o, &v));
    CHECK_INT(v.n_tokens, 1000);
    CHECK_STR(v.tokens[1], "<s>");
    CHECK_STR(v.tokens[3], "<0x00>");
    CHECK_STR(v.tokens[3 + 0x0A], "<0x0A>");
    CHECK_STR(v.tokens[258], "<0xFF>");
    CHECK_STR(v.tokens[259], "\xE2\x96\x81"); /* "▁" is the most frequent character */
    check_vocab(&v);
    int digit_merges = 0, inner_space = 0;
    for (int i = v.n_base; i < v.n_tokens; i++) {
        const char *s = v.tokens[i];
        digit_merges += strpbrk(s, "0123456789") != NULL;
        /* "▁" may lead a token or fill it ("▁▁▁"), never follow a letter */
        const char *sp = strstr(s, "\xE2\x96\x81");
        while (sp && sp != s && strncmp(sp - 3, "\xE2\x96\x81", 3) == 0)
            sp = strstr(sp + 3, "\xE2\x96\x81");
        inner_space += sp && sp != s;
    }
    CHECK_INT(digit_merges, 0);
    CHECK_INT(inner_space, 0);
    pd_bpe_vocab_free(&v);
}

static void test_train_limits(void) {
    struct pd_bpe_train_opts o = {
        .style = PD_BPE_BYTE_LEVEL, .corpus = "aaaa bbbb", .corpus_len = 9, .max_tokens = 255};
    struct pd_bpe_vocab v;
    CHECK_ERR(pd_bpe_train(&o, &v), PD_ERANGE, "at least 256");
    /* a tiny corpus runs out of pairs long before a big cap */
    o.max_tokens = 100000;
    CHECK_OK(pd_bpe_train(&o, &v));
    CHECK(v.n_merges > 0 && v.n_merges < 10);
    check_vocab(&v);
    pd_bpe_vocab_free(&v);
    /* nothing to merge at all */
    o.corpus = "";
    o.corpus_len = 0;
    CHECK_OK(pd_bpe_train(&o, &v));
    CHECK_INT(v.n_merges, 0);
    pd_bpe_vocab_free(&v);

    CHECK_INT(pd_tokgen_min_tokens(PD_TOKGEN_LLAMA3), 256 + 5);
    CHECK_INT(pd_tokgen_min_tokens(PD_TOKGEN_QWEN2), 256 + 3);
    CHECK_INT(pd_tokgen_min_tokens(PD_TOKGEN_LLAMA2), 3 + 256);
    struct pd_tokgen t;
    CHECK_ERR(pd_tokgen_build(PD_TOKGEN_LLAMA3, 260, &t), PD_ERANGE, "llama3");
    CHECK_OK(pd_tokgen_build(PD_TOKGEN_LLAMA3, 261, &t));
    CHECK_INT(t.n_tokens, 261);
    CHECK_INT(t.bpe.n_merges, 0);
    pd_tokgen_free(&t);
}

static void test_deterministic_and_fast(void) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    struct pd_tokgen t1, t2;
    CHECK_OK(pd_tokgen_build(PD_TOKGEN_QWEN2, 5000, &t1));
    clock_gettime(CLOCK_MONOTONIC, &b);
    double secs = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    fprintf(stderr, "qwen2 tokenizer: %d tokens, %d merges in %.3f s\n", t1.n_tokens,
            t1.bpe.n_merges, secs);
    CHECK(t1.bpe.n_merges > 1000); /* the corpus supports a few thousand merges */
    CHECK_OK(pd_tokgen_build(PD_TOKGEN_QWEN2, 5000, &t2));
    char *j1 = pd_tokgen_tokenizer_json(&t1), *j2 = pd_tokgen_tokenizer_json(&t2);
    CHECK(j1 && j2 && strcmp(j1, j2) == 0);
    pd_free(j1);
    pd_free(j2);
    pd_tokgen_free(&t1);
    pd_tokgen_free(&t2);
}

static int json_int(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valueint : -999;
}

/* The files parse as JSON; vocab, merges, added tokens and ids agree with each other. */
static void test_files_per_family(void) {
    for (size_t f = 0; f < PD_ARRAY_LEN(flavors); f++) {
        struct pd_tokgen t;
        CHECK_OK(pd_tokgen_build(flavors[f], 1024, &t));
        CHECK(t.n_tokens <= 1024 && t.n_tokens > 900);
        char *tj = pd_tokgen_tokenizer_json(&t);
        char *cj = pd_tokgen_tokenizer_config_json(&t, 4096);
        CHECK(tj && cj);
        cJSON *tok = cJSON_Parse(tj), *cfg = cJSON_Parse(cj);
        CHECK(tok && cfg);
        if (tok && cfg) {
            const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
            const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
            const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
            const cJSON *added = cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");
            CHECK_INT(cJSON_GetArraySize(vocab), t.bpe.n_tokens);
            CHECK_INT(cJSON_GetArraySize(merges), t.bpe.n_merges);
            CHECK_INT(cJSON_GetArraySize(vocab), t.bpe.n_base + t.bpe.n_merges);
            /* ids are 0..n-1 in order */
            int i = 0, bad = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, vocab) bad += !cJSON_IsNumber(e) || e->valueint != i++;
            CHECK_INT(bad, 0);
            int n_added = cJSON_GetArraySize(added);
            CHECK_INT(n_added, t.n_added ? t.n_added : 3);
            const cJSON *last = cJSON_GetArrayItem(added, n_added - 1);
            CHECK_INT(json_int(last, "id"), t.n_added ? t.n_tokens - 1 : 2);
            const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
            CHECK(cJSON_IsString(eos));
            const cJSON *dec = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
            char key[16];
            snprintf(key, sizeof(key), "%d", t.eos_id);
            const cJSON *eos_entry = cJSON_GetObjectItemCaseSensitive(dec, key);
            CHECK(eos_entry && cJSON_IsString(eos) &&
                  strcmp(cJSON_GetObjectItemCaseSensitive(eos_entry, "content")->valuestring,
                         eos->valuestring) == 0);
            CHECK_INT(json_int(cfg, "model_max_length"), 4096);
            CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template")));
        }
        cJSON_Delete(tok);
        cJSON_Delete(cfg);
        pd_free(tj);
        pd_free(cj);
        pd_tokgen_free(&t);
    }
}

static void test_alloc_failures(void) {
    /* every allocation of a build may fail; each failure is an error, never a crash or leak */
    int failures = 0;
    for (long n = 0; n < 4000; n += 37) {
        struct pd_tokgen t;
        pd_alloc_fail_after(n);
        int rc = pd_tokgen_build(PD_TOKGEN_LLAMA2, 400, &t);
        char *j = rc == PD_OK ? pd_tokgen_tokenizer_json(&t) : NULL;
        pd_alloc_fail_after(-1);
        failures += rc != PD_OK || j == NULL;
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        pd_free(j);
        pd_tokgen_free(&t);
    }
    CHECK(failures > 0);
}

PD_TEST_MAIN(PD_TEST(test_bytelevel_alphabet), PD_TEST(test_sentencepiece_alphabet),
             PD_TEST(test_train_limits), PD_TEST(test_deterministic_and_fast),
             PD_TEST(test_files_per_family), PD_TEST(test_alloc_failures))
