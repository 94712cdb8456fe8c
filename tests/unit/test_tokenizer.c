/* Tokenizer: ids and text identical to Hugging Face `tokenizers` on the committed fixtures
 * (tests/fixtures/make_tokenizer_fixtures.py), streaming == one-shot decode, clear errors. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <utf8proc.h>

static const char *const fixture_names[] = {"qwen2", "llama3", "gpt2", "llama2", "mistral"};

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return p;
}

/* Splits a JSONL file into parsed lines. */
static cJSON **read_jsonl(const char *path, size_t *n) {
    char *text = slurp(path, NULL);
    *n = 0;
    if (!text)
        return NULL;
    size_t cap = 0;
    cJSON **v = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 256;
            v = realloc(v, cap * sizeof(*v));
        }
        v[(*n)++] = cJSON_Parse(line);
    }
    free(text);
    return v;
}

static void free_jsonl(cJSON **v, size_t n) {
    for (size_t i = 0; i < n; i++)
        cJSON_Delete(v[i]);
    free(v);
}

static bool ids_equal(const struct pd_token_ids *got, const cJSON *want) {
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != got->n)
        return false;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, want) {
        if (it->valueint != got->ids[i++])
            return false;
    }
    return true;
}

static void print_ids(const char *label, const struct pd_token_ids *v, const cJSON *want) {
    fprintf(stderr, "  %s got:", label);
    for (size_t i = 0; i < v->n; i++)
        fprintf(stderr, " %d", v->ids[i]);
    char *w = cJSON_PrintUnformatted(want);
    fprintf(stderr, "\n  %s want: %s\n", label, w);
    free(w);
}

/* Streams ids one at a time and checks the pieces add up to the one-shot decode. */
static bool stream_matches(const struct pd_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                           const char *oneshot, size_t oneshot_len) {
    struct pd_detok *d;
    if (pd_detok_new(t, skip, &d) != PD_OK)
        return false;
    size_t cap = oneshot_len + 64, len = 0;
    char *acc = malloc(cap);
    bool ok = true;
    const char *piece;
    size_t pl;
    for (size_t i = 0; i <= n && ok; i++) {
        int rc = i < n ? pd_detok_step(d, ids[i], &piece, &pl) : pd_detok_flush(d, &piece, &pl);
        if (rc != PD_OK || len + pl >= cap) {
            ok = false;
            break;
        }
        memcpy(acc + len, piece, pl);
        len += pl;
    }
    ok = ok && len == oneshot_len && memcmp(acc, oneshot, len) == 0;
    free(acc);
    pd_detok_free(d);
    return ok;
}

static int mismatch_budget = 12;

static void check_encode(const struct pd_tokenizer *t, const char *name, const char *line,
                         size_t line_no, unsigned flags, const cJSON *want, const char *label,
                         int *matched) {
    struct pd_token_ids v = {0};
    int rc = pd_tokenizer_encode(t, line, strlen(line), flags, &v);
    pd_test_checks++;
    if (rc == PD_OK && ids_equal(&v, want)) {
        (*matched)++;
    } else {
        pd_test_failures++;
        if (mismatch_budget-- > 0) {
            cJSON *js = cJSON_CreateString(line);
            char *q = cJSON_PrintUnformatted(js);
            cJSON_Delete(js);
            fprintf(stderr, "%s: %s mismatch on line %zu %s (rc %d %s)\n", name, label, line_no, q,
                    rc, rc ? pd_error_msg() : "");
            print_ids(label, &v, want);
            free(q);
        }
    }
    pd_token_ids_free(&v);
}

static void check_decode(const struct pd_tokenizer *t, const char *name, const int32_t *ids,
                         size_t n, bool skip, const char *want, int *matched) {
    char *text = NULL;
    size_t len = 0;
    int rc = pd_tokenizer_decode(t, ids, n, skip, &text, &len);
    pd_test_checks++;
    if (rc == PD_OK && strcmp(text, want) == 0 && stream_matches(t, ids, n, skip, text, len)) {
        (*matched)++;
    } else {
        pd_test_failures++;
        if (mismatch_budget-- > 0) {
            fprintf(stderr, "%s: decode(skip=%d) mismatch: got \"%s\" want \"%s\"; ids:", name,
                    skip, text ? text : "(null)", want);
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
    }
    pd_free(text);
}

static void load_fixture(const char *name, struct pd_tokenizer **t) {
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/tokenizers/%s", PD_FIXTURES_DIR, name);
    CHECK_OK(pd_tokenizer_new(dir, t));
}

static void test_fixture_corpus(void) {
    size_t n_lines, n_gold;
    cJSON **lines = read_jsonl(PD_FIXTURES_DIR "/tokenizer_corpus.jsonl", &n_lines);
    CHECK(n_lines >= 2000);
    for (size_t f = 0; f < PD_ARRAY_LEN(fixture_names); f++) {
        const char *name = fixture_names[f];
        struct pd_tokenizer *t = NULL;
        load_fixture(name, &t);
        if (!t)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/tokenizers/%s/encode.jsonl", PD_FIXTURES_DIR, name);
        cJSON **gold = read_jsonl(path, &n_gold);
        CHECK_INT(n_gold, n_lines);
        int enc_ok = 0, enc_total = 0, dec_ok = 0, dec_total = 0;
        for (size_t i = 0; i < n_lines && i < n_gold; i++) {
            const char *line = lines[i]->valuestring;
            const cJSON *g = gold[i];
            const cJSON *a = cJSON_GetObjectItem(g, "a"), *n = cJSON_GetObjectItem(g, "n");
            const cJSON *r = cJSON_GetObjectItem(g, "r");
            cJSON *n_arr = NULL;
            if (!n) {
                n = a;
            } else if (cJSON_IsNumber(n)) { /* 1: "a" without its BOS */
                n_arr = cJSON_CreateArray();
                const cJSON *it;
                bool first = true;
                cJSON_ArrayForEach(it, a) {
                    if (!first)
                        cJSON_AddItemToArray(n_arr, cJSON_CreateNumber(it->valueint));
                    first = false;
                }
                n = n_arr;
            }
            if (!r)
                r = n;
            check_encode(t, name, line, i, PD_TOK_DEFAULT, a, "add_special", &enc_ok);
            check_encode(t, name, line, i, PD_TOK_PARSE_SPECIAL, n, "no_add_special", &enc_ok);
            check_encode(t, name, line, i, 0, r, "no_special", &enc_ok);
            enc_total += 3;

            int32_t ids[4096];
            size_t nid = 0;
            const cJSON *it;
            cJSON_ArrayForEach(it, n) {
                if (nid < PD_ARRAY_LEN(ids))
                    ids[nid++] = it->valueint;
            }
            const cJSON *d = cJSON_GetObjectItem(g, "d"), *s = cJSON_GetObjectItem(g, "s");
            const char *dw = d ? d->valuestring : line;
            check_decode(t, name, ids, nid, false, dw, &dec_ok);
            check_decode(t, name, ids, nid, true, s ? s->valuestring : dw, &dec_ok);
            dec_total += 2;
            cJSON_Delete(n_arr);
        }
        fprintf(stderr, "%s: %zu lines, encode %d/%d identical to HF, decode %d/%d\n", name,
                n_lines, enc_ok, enc_total, dec_ok, dec_total);
        free_jsonl(gold, n_gold);
        pd_tokenizer_free(t);
    }
    free_jsonl(lines, n_lines);
}

/* One tokenizer shared by several threads (its word cache is shared): every thread still gets
 * HF's ids for every corpus line. */
struct encode_job {
    const struct pd_tokenizer *t;
    cJSON **lines, **gold;
    size_t n;
    int wrong;
};

static void *encode_all(void *arg) {
    struct encode_job *j = arg;
    for (size_t i = 0; i < j->n; i++) {
        struct pd_token_ids v = {0};
        const char *line = j->lines[i]->valuestring;
        if (pd_tokenizer_encode(j->t, line, strlen(line), PD_TOK_DEFAULT, &v) != PD_OK ||
            !ids_equal(&v, cJSON_GetObjectItem(j->gold[i], "a")))
            j->wrong++;
        pd_token_ids_free(&v);
    }
    return NULL;
}

static void test_concurrent_encode(void) {
    size_t n_lines, n_gold;
    cJSON **lines = read_jsonl(PD_FIXTURES_DIR "/tokenizer_corpus.jsonl", &n_lines);
    cJSON **gold = read_jsonl(PD_FIXTURES_DIR "/tokenizers/qwen2/encode.jsonl", &n_gold);
    struct pd_tokenizer *t = NULL;
    load_fixture("qwen2", &t);
    CHECK_INT(n_gold, n_lines);
    if (t && n_gold == n_lines) {
        struct encode_job jobs[4];
        pthread_t th[4];
        int started = 0;
        for (; started < 4; started++) {
            jobs[started] = (struct encode_job){t, lines, gold, n_lines, 0};
            if (pthread_create(&th[started], NULL, encode_all, &jobs[started]) != 0)
                break;
        }
        CHECK_INT(started, 4);
        for (int k = 0; k < started; k++) {
            pthread_join(th[k], NULL);
            CHECK_INT(jobs[k].wrong, 0);
        }
    }
    pd_tokenizer_free(t);
    free_jsonl(gold, n_gold);
    free_jsonl(lines, n_lines);
}

static void test_fixture_decode_random(void) {
    for (size_t f = 0; f < PD_ARRAY_LEN(fixture_names); f++) {
        const char *name = fixture_names[f];
        struct pd_tokenizer *t = NULL;
        load_fixture(name, &t);
        if (!t)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/tokenizers/%s/decode_random.jsonl", PD_FIXTURES_DIR, name);
        size_t n;
        cJSON **gold = read_jsonl(path, &n);
        CHECK(n >= 100);
        int ok = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t ids[64];
            size_t nid = 0;
            const cJSON *it;
            cJSON_ArrayForEach(it, cJSON_GetObjectItem(gold[i], "ids")) {
                if (nid < PD_ARRAY_LEN(ids))
                    ids[nid++] = it->valueint;
            }
            check_decode(t, name, ids, nid, false, cJSON_GetObjectItem(gold[i], "d")->valuestring,
                         &ok);
            check_decode(t, name, ids, nid, true, cJSON_GetObjectItem(gold[i], "s")->valuestring,
                         &ok);
        }
        fprintf(stderr, "%s: random id sequences: decode %d/%zu identical to HF\n", name, ok,
                2 * n);
        free_jsonl(gold, n);
        pd_tokenizer_free(t);
    }
}

/* The streaming property on many random sequences, beyond the HF goldens. */
static void test_stream_property(void) {
    uint64_t seed = 12345;
    for (size_t f = 0; f < PD_ARRAY_LEN(fixture_names); f++) {
        struct pd_tokenizer *t = NULL;
        load_fixture(fixture_names[f], &t);
        if (!t)
            continue;
        int32_t vs = pd_tokenizer_vocab_size(t);
        for (int round = 0; round < 400; round++) {
            int32_t ids[48];
            size_t n = (size_t)(round % 48);
            for (size_t i = 0; i < n; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t r = (uint32_t)(seed >> 33);
                /* half the time stay among byte tokens so UTF-8 gets cut mid-character */
                ids[i] = (int32_t)(r % (uint32_t)(round & 1 ? vs : (vs < 300 ? vs : 300)));
            }
            for (int skip = 0; skip < 2; skip++) {
                char *text = NULL;
                size_t len = 0;
                CHECK_OK(pd_tokenizer_decode(t, ids, n, skip, &text, &len));
                CHECK(text && stream_matches(t, ids, n, skip, text, len));
                pd_free(text);
            }
        }
        pd_tokenizer_free(t);
    }
}

static void test_invalid_utf8(void) {
    struct pd_tokenizer *t = NULL;
    load_fixture("qwen2", &t);
    if (!t)
        return;
    struct pd_token_ids v = {0};
    CHECK_ERR(pd_tokenizer_encode(t, "ok \xC3\x28 no", 8, PD_TOK_DEFAULT, &v), PD_EINVAL,
              "not valid UTF-8 (byte 0xC3 at offset 3)");
    CHECK_INT(v.n, 0);
    CHECK_ERR(pd_tokenizer_encode(t, "\xED\xA0\x80", 3, PD_TOK_DEFAULT, &v), PD_EINVAL,
              "offset 0"); /* a UTF-16 surrogate */
    CHECK_ERR(pd_tokenizer_encode(t, "cut \xE4\xBD", 6, PD_TOK_DEFAULT, &v), PD_EINVAL, "offset 4");
    /* NUL bytes are text like any other */
    CHECK_OK(pd_tokenizer_encode(t, "a\0b", 3, PD_TOK_DEFAULT, &v));
    CHECK(v.n >= 1);
    pd_token_ids_free(&v);
    pd_tokenizer_free(t);
}

static void test_accessors(void) {
    struct pd_tokenizer *t = NULL;
    load_fixture("llama3", &t);
    if (!t)
        return;
    CHECK_STR(pd_tokenizer_bos_token(t), "<|begin_of_text|>");
    CHECK_INT(pd_tokenizer_bos_id(t), pd_tokenizer_token_id(t, "<|begin_of_text|>"));
    CHECK_INT(pd_tokenizer_eos_id(t), pd_tokenizer_token_id(t, "<|eot_id|>"));
    CHECK(pd_tokenizer_is_special(t, pd_tokenizer_eos_id(t)));
    CHECK(!pd_tokenizer_is_special(t, 5));
    CHECK_STR(pd_tokenizer_id_to_token(t, pd_tokenizer_eos_id(t)), "<|eot_id|>");
    CHECK(pd_tokenizer_id_to_token(t, -1) == NULL);
    CHECK(pd_tokenizer_id_to_token(t, pd_tokenizer_vocab_size(t)) == NULL);
    CHECK(pd_tokenizer_chat_template(t) != NULL);
    pd_tokenizer_free(t);
    load_fixture("mistral", &t); /* chat_template.jinja beside the config */
    if (!t)
        return;
    CHECK(strstr(pd_tokenizer_chat_template(t), "namespace(") != NULL);
    pd_tokenizer_free(t);
}

/* A minimal byte-level tokenizer.json; %s slots: model, extra top-level fields. */
static const char tiny_fmt[] =
    "{%s \"added_tokens\": [{\"id\": 5, \"content\": \"<x>\", \"special\": true}],"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
    " \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": %s}";
static const char tiny_model[] =
    "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120\": 3,"
    " \"\\u0120a\": 4}, \"merges\": [\"a b\", [\"\\u0120\", \"a\"]]}";

static int load_tiny(const char *extra, const char *model, struct pd_tokenizer **t) {
    char buf[2048];
    snprintf(buf, sizeof(buf), tiny_fmt, extra, model);
    return pd_tokenizer_new_from_json(buf, strlen(buf), NULL, "tiny.json", t);
}

static void test_malformed(void) {
    struct pd_tokenizer *t = NULL;
    CHECK_OK(load_tiny("", tiny_model, &t));
    if (t) {
        struct pd_token_ids v = {0};
        CHECK_OK(pd_tokenizer_encode(t, "ab a<x>", 7, PD_TOK_DEFAULT, &v));
        CHECK_INT(v.n, 3);
        if (v.n == 3) {
            CHECK_INT(v.ids[0], 2);
            CHECK_INT(v.ids[1], 4);
            CHECK_INT(v.ids[2], 5);
        }
        pd_token_ids_free(&v);
        pd_tokenizer_free(t);
    }
    const char *js = "{\"model\": ";
    CHECK_ERR(pd_tokenizer_new_from_json(js, strlen(js), NULL, "x.json", &t), PD_EFORMAT,
              "x.json: not valid JSON");
    js = "{\"added_tokens\": []}";
    CHECK_ERR(pd_tokenizer_new_from_json(js, strlen(js), NULL, "x.json", &t), PD_EFORMAT,
              "x.json: model: missing");
    CHECK(t == NULL);
    CHECK_ERR(load_tiny("", "{\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}", &t),
              PD_EUNSUPPORTED, "model.type: 'Unigram' models are not supported");
    CHECK_ERR(load_tiny("", "{\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}", &t),
              PD_EUNSUPPORTED, "'WordPiece'");
    CHECK_ERR(load_tiny("", "{\"vocab\": {\"a\": 0}}", &t), PD_EUNSUPPORTED, "'WordPiece'");
    CHECK_ERR(
        load_tiny("", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}", &t),
        PD_EFORMAT, "model.merges[0]: token 'c' is not in model.vocab");
    CHECK_ERR(load_tiny("",
                        "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": "
                        "[\"a b\"]}",
                        &t),
              PD_EFORMAT, "model.merges[0]: merged token 'ab' is not in model.vocab");
    CHECK_ERR(
        load_tiny("", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}", &t),
        PD_EFORMAT, "model.merges[0]: a merge string must be two tokens");
    CHECK_ERR(load_tiny("", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[1, 2]]}", &t),
              PD_EFORMAT, "model.merges[0]");
    CHECK_ERR(load_tiny("", "{\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}", &t),
              PD_EFORMAT, "model.vocab[\"a\"]: id must be");
    CHECK_ERR(load_tiny("\"normalizer\": {\"type\": \"BertNormalizer\"},", tiny_model, &t),
              PD_EUNSUPPORTED, "normalizer: normalizer 'BertNormalizer' is not supported");
    CHECK_ERR(load_tiny("\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": "
                        "\"NFC\"}, {\"type\": \"Precompiled\"}]},",
                        tiny_model, &t),
              PD_EUNSUPPORTED, "normalizer.normalizers[1]: normalizer 'Precompiled'");
    CHECK_ERR(load_tiny("\"post_processor\": {\"type\": \"RobertaProcessing\"},", tiny_model, &t),
              PD_EUNSUPPORTED, "'RobertaProcessing'");
    CHECK_ERR(load_tiny("\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                        "[{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
                        " \"special_tokens\": {}},",
                        tiny_model, &t),
              PD_EFORMAT, "post_processor.single[0]: special token '<s>' is not in");
    CHECK_ERR(load_tiny("\"decoder\": {\"type\": \"WordPiece\"},", tiny_model, &t), PD_EUNSUPPORTED,
              "decoder 'WordPiece'");
    const char bad_re[] = "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
                          "\"(a\"}, \"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\","
                          " \"vocab\": {}, \"merges\": []}}";
    CHECK_ERR(pd_tokenizer_new_from_json(bad_re, strlen(bad_re), NULL, "r.json", &t), PD_EFORMAT,
              "r.json: pre_tokenizer.pattern: regex /(a/ does not compile");
    CHECK_ERR(pd_tokenizer_new("/nonexistent/model", &t), PD_ENOENT,
              "/nonexistent/model/tokenizer.json");
}

/* SentencePiece-style models cut their text before "▁" only when the merges allow it: a merge
 * across the cut must keep the whole-text BPE result, and so must a merge inside a "▁" run. */
static void test_marker_split(void) {
    static const char fmt[] =
        "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"},"
        " \"content\": \"\u2581\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"\u2581\": 0,"
        " \"a\": 1, \"b\": 2, \"a\u2581\": 3, \"\u2581b\": 4, \"\u2581\u2581\": 5}, \"merges\": "
        "[%s]}}";
    struct {
        const char *merges;
        int32_t want[3];
        size_t n;
    } cases[] = {
        /* "a▁" crosses the cut before "▁b" and has the lower rank: "a▁" "b", never "a" "▁b" */
        {"\"a \u2581\", \"\u2581 b\"", {3, 2}, 2},
        /* no merge crosses a cut; "▁▁" (rank 0) joins inside the run, before "▁b" */
        {"\"\u2581 \u2581\", \"\u2581 b\"", {1, 5, 2}, 3},
    };
    const char *text[] = {"a b", "a  b"};
    for (size_t i = 0; i < PD_ARRAY_LEN(cases); i++) {
        char js[1024];
        snprintf(js, sizeof(js), fmt, cases[i].merges);
        struct pd_tokenizer *t = NULL;
        CHECK_OK(pd_tokenizer_new_from_json(js, strlen(js), NULL, "spm.json", &t));
        if (!t)
            continue;
        struct pd_token_ids v = {0};
        for (int rep = 0; rep < 2; rep++) { /* the second time from the word cache */
            v.n = 0;
            CHECK_OK(pd_tokenizer_encode(t, text[i], strlen(text[i]), 0, &v));
            CHECK_INT(v.n, cases[i].n);
            for (size_t k = 0; k < v.n && k < cases[i].n; k++)
                CHECK_INT(v.ids[k], cases[i].want[k]);
        }
        pd_token_ids_free(&v);
        pd_tokenizer_free(t);
    }
}

/* Normalizers hand utf8proc only the pieces that are not inert; the result must equal
 * normalizing the whole text, for every form, on random strings of characters that compose,
 * decompose, reorder or do nothing. */
static void test_normalize_pieces(void) {
    static const uint32_t alphabet[] = {
        'a',    'e',    ' ',    0x00E9, 0x0301, 0x0327,  0x0323, 0x0344, 0x212B,
        0xFB01, 0x00BD, 0x1100, 0x1161, 0x11A8, 0xAC00,  0xAC01, 0x4E2D, 0xF900,
        0x0627, 0x064E, 0x0651, 0xFE0F, 0x200D, 0x1F600, 0x0BC6, 0x0BBE, 0x0B47,
        0x0B3E, 0x0B56, 0x1025, 0x102E, 0x0F73, 0x0958,  0x2126, 0x1E9B,
    };
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    static const int options[] = {
        UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    uint32_t rng = 12345;
    for (size_t f = 0; f < PD_ARRAY_LEN(forms); f++) {
        char extra[96];
        snprintf(extra, sizeof(extra), "\"normalizer\": {\"type\": \"%s\"},", forms[f]);
        struct pd_tokenizer *t = NULL;
        CHECK_OK(load_tiny(extra, tiny_model, &t));
        if (!t)
            continue;
        int bad = 0;
        for (int it = 0; it < 5000; it++) {
            char s[64];
            size_t n = 0;
            int len = 1 + it % 12;
            for (int k = 0; k < len; k++) {
                rng = rng * 1103515245u + 12345u;
                n += pd__utf8_encode(alphabet[(rng >> 16) % PD_ARRAY_LEN(alphabet)], s + n);
            }
            utf8proc_uint8_t *want = NULL;
            utf8proc_ssize_t wn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n,
                                               &want, (utf8proc_option_t)options[f]);
            struct pd__buf got = {0};
            CHECK_OK(pd__normalize(t, s, n, &got));
            if (wn < 0 || (size_t)wn != got.n || memcmp(want, got.p, got.n) != 0)
                bad++;
            free(want); /* utf8proc's allocation */
            pd__buf_free(&got);
        }
        if (bad)
            fprintf(stderr, "%s: %d of 5000 strings differ from utf8proc on the whole\n", forms[f],
                    bad);
        CHECK_INT(bad, 0);
        pd_tokenizer_free(t);
    }
}

/* Every allocation failure during load, encode and decode is reported, never crashes or leaks
 * (ASan checks the leaks). */
static void test_alloc_failures(void) {
    bool loaded = false;
    for (long k = 0; k < 400 && !loaded; k++) {
        struct pd_tokenizer *t = NULL;
        pd_alloc_fail_after(k);
        int rc = load_tiny("\"normalizer\": {\"type\": \"NFC\"},", tiny_model, &t);
        pd_alloc_fail_after(-1);
        if (rc == PD_OK) {
            loaded = true;
            for (long j = 0; j < 100; j++) {
                struct pd_token_ids v = {0};
                char *s = NULL;
                pd_alloc_fail_after(j);
                int e = pd_tokenizer_encode(t, "ab ab a<x>b", 11, PD_TOK_DEFAULT, &v);
                int d = e == PD_OK ? pd_tokenizer_decode(t, v.ids, v.n, false, &s, NULL) : e;
                pd_alloc_fail_after(-1);
                CHECK(e == PD_OK || e == PD_ENOMEM);
                CHECK(d == PD_OK || d == PD_ENOMEM);
                if (d == PD_OK)
                    CHECK_STR(s, "ab ab a<x>b");
                pd_free(s);
                pd_token_ids_free(&v);
                if (d == PD_OK)
                    break;
            }
            pd_tokenizer_free(t);
        } else {
            CHECK_INT(rc, PD_ENOMEM);
            CHECK(strstr(pd_error_msg(), "tiny.json") != NULL);
        }
    }
    CHECK(loaded);
}

PD_TEST_MAIN(PD_TEST(test_fixture_corpus), PD_TEST(test_concurrent_encode),
             PD_TEST(test_fixture_decode_random), PD_TEST(test_stream_property),
             PD_TEST(test_invalid_utf8), PD_TEST(test_accessors), PD_TEST(test_malformed),
             PD_TEST(test_marker_split), PD_TEST(test_normalize_pieces),
             PD_TEST(test_alloc_failures))
