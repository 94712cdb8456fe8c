/*
 * safetensors: the same tensors written as one file and as shards load to identical bytes and
 * pass validation against the config that implies them; the files have the Hugging Face layout
 * (8-byte length, space-padded header, format metadata, index with total_size and weight_map);
 * and each damaged or inconsistent input — truncated file, header length past EOF, header not
 * JSON, bad offsets, unknown dtype, missing or misplaced tensors, a missing shard — is refused
 * with a message naming the file and tensor, without a crash or a leak.
 */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "model/model_config.h"
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* A tiny Llama: V=64, H=32, I=48, 2 layers, 4 heads of 8, 2 kv heads. */
static const char TINY_LLAMA[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":64,"
    "\"hidden_size\":32,\"intermediate_size\":48,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-5,"
    "\"torch_dtype\":\"bfloat16\"}";

static void make_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/safetensors_%ld_%s", pd_test_tmpdir(), (long)getpid(), name);
    mkdir(buf, 0755);
}

/* Removes every file in dir, then dir. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

static void join(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* Tensors for a config: deterministic contents, matrices BF16, norms F32, biases F16. */
struct model_tensors {
    struct pd_tensor_spec *specs;
    struct pd_tensor_write *w;
    void **data;
    size_t n;
};

static void model_tensors_make(const struct pd_model_config *cfg, struct model_tensors *m) {
    memset(m, 0, sizeof(*m));
    CHECK_OK(pd_model_tensor_specs(cfg, &m->specs, &m->n));
    m->w = pd_calloc(m->n, sizeof(*m->w));
    m->data = pd_calloc(m->n, sizeof(*m->data));
    for (size_t i = 0; i < m->n; i++) {
        struct pd_tensor_write *w = &m->w[i];
        const struct pd_tensor_spec *s = &m->specs[i];
        w->name = s->name;
        w->ndim = s->ndim;
        w->shape[0] = s->shape[0];
        w->shape[1] = s->shape[1];
        w->dtype = s->ndim == 2               ? PD_DTYPE_BF16
                   : strstr(s->name, ".bias") ? PD_DTYPE_F16
                                              : PD_DTYPE_F32;
        size_t count = (size_t)s->shape[0] * (s->ndim == 2 ? (size_t)s->shape[1] : 1);
        float *f = pd_malloc(count * sizeof(float));
        for (size_t j = 0; j < count; j++)
            f[j] = (float)((i * 131 + j * 7) % 97) / 97.0f - 0.5f;
        m->data[i] = pd_malloc(count * pd_dtype_size(w->dtype));
        pd_dtype_from_f32(w->dtype, f, m->data[i], count);
        pd_free(f);
        w->data = m->data[i];
    }
}

static void model_tensors_free(struct model_tensors *m) {
    for (size_t i = 0; i < m->n; i++)
        pd_free(m->data[i]);
    pd_free(m->data);
    pd_free(m->w);
    pd_free(m->specs);
}

static size_t tensor_nbytes(const struct pd_tensor_write *w) {
    size_t b = pd_dtype_size(w->dtype);
    for (int d = 0; d < w->ndim; d++)
        b *= (size_t)w->shape[d];
    return b;
}

/* The checkpoint holds exactly m's tensors with m's bytes. */
static void check_same_tensors(const struct pd_checkpoint *ck, const struct model_tensors *m) {
    CHECK_INT(pd_checkpoint_count(ck), m->n);
    for (size_t i = 0; i < m->n; i++) {
        const struct pd_tensor_view *v = pd_checkpoint_find(ck, m->w[i].name);
        CHECK(v != NULL);
        if (!v)
            continue;
        CHECK_STR(v->name, m->w[i].name);
        CHECK_INT(v->dtype, m->w[i].dtype);
        CHECK_INT(v->ndim, m->w[i].ndim);
        CHECK_INT(v->shape[0], m->w[i].shape[0]);
        CHECK_INT(v->nbytes, tensor_nbytes(&m->w[i]));
        CHECK(memcmp(v->data, m->w[i].data, v->nbytes) == 0);
        CHECK((uintptr_t)v->data % pd_dtype_size(v->dtype) == 0); /* usable as an array */
    }
    for (size_t i = 1; i < pd_checkpoint_count(ck); i++) /* name order */
        CHECK(strcmp(pd_checkpoint_at(ck, i - 1)->name, pd_checkpoint_at(ck, i)->name) < 0);
    CHECK(pd_checkpoint_at(ck, pd_checkpoint_count(ck)) == NULL);
    CHECK(pd_checkpoint_find(ck, "no.such.tensor") == NULL);
}

static void test_sharded_equals_single(void) {
    char one[400], many[400], path[600];
    struct pd_model_config cfg;
    struct model_tensors m;
    struct pd_checkpoint *a = NULL, *b = NULL;
    CHECK_OK(pd_model_config_parse(TINY_LLAMA, strlen(TINY_LLAMA), &cfg));
    model_tensors_make(&cfg, &m);
    make_dir(one, sizeof(one), "single");
    make_dir(many, sizeof(many), "sharded");

    CHECK_OK(pd_checkpoint_write(one, m.w, m.n, 0));
    CHECK_OK(pd_checkpoint_write(many, m.w, m.n, 8192)); /* ~36 KB of tensors: several shards */
    join(path, sizeof(path), one, "model.safetensors.index.json");
    CHECK(!pd_file_exists(path));
    join(path, sizeof(path), many, "model.safetensors");
    CHECK(!pd_file_exists(path));
    join(path, sizeof(path), many, "model-00005-of-00005.safetensors");
    CHECK(pd_file_exists(path));

    CHECK_OK(pd_checkpoint_open(one, &a));
    CHECK_OK(pd_checkpoint_open(many, &b));
    if (a && b) {
        check_same_tensors(a, &m);
        check_same_tensors(b, &m);
        int shards_seen = 0;
        for (size_t i = 0; i < pd_checkpoint_count(b); i++)
            if (pd_checkpoint_at(b, i)->shard > shards_seen)
                shards_seen = pd_checkpoint_at(b, i)->shard;
        CHECK_INT(shards_seen, 4);
        CHECK_OK(pd_checkpoint_validate(a, &cfg));
        CHECK_OK(pd_checkpoint_validate(b, &cfg));
    }
    pd_checkpoint_free(a);
    pd_checkpoint_free(b);

    /* rewriting a directory the other way leaves no stale file that would win */
    CHECK_OK(pd_checkpoint_write(many, m.w, m.n, 0));
    join(path, sizeof(path), many, "model.safetensors.index.json");
    CHECK(!pd_file_exists(path));
    CHECK_OK(pd_checkpoint_open(many, &b));
    if (b)
        check_same_tensors(b, &m);
    pd_checkpoint_free(b);

    model_tensors_free(&m);
    remove_dir(one);
    remove_dir(many);
}

/* Byte layout of one file and of the index, as the Hugging Face libraries write them. */
static void test_file_layout(void) {
    char dir[400], path[600];
    make_dir(dir, sizeof(dir), "layout");
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0x4040};
    struct pd_tensor_write t[2] = {
        {.name = "w\"q", .dtype = PD_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .dtype = PD_DTYPE_BF16, .ndim = 1, .shape = {3}, .data = b},
    };
    join(path, sizeof(path), dir, "x.safetensors");
    CHECK_OK(pd_safetensors_write(path, t, 2));
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(pd_file_read_all(path, &text, &len));
    if (text && len >= 8) {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = hlen << 8 | (uint8_t)text[i];
        CHECK_INT(hlen % 8, 0);
        CHECK_INT(len, 8 + hlen + 24 + 6);
        CHECK(text[8] == '{');
        CHECK(text[8 + hlen - 1] == '}' || text[8 + hlen - 1] == ' ');
        char *hdr = pd_strndup(text + 8, (size_t)hlen);
        CHECK(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\"}") != NULL);
        CHECK(strstr(hdr, "\"w\\\"q\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                          "\"data_offsets\":[0,24]}") != NULL);
        CHECK(strstr(hdr, "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[24,30]}") !=
              NULL);
        CHECK(memcmp(text + 8 + hlen, a, 24) == 0);
        pd_free(hdr);
    }
    pd_free(text);

    struct pd_checkpoint *ck = NULL;
    CHECK_OK(pd_checkpoint_open_file(path, &ck));
    if (ck) {
        const struct pd_tensor_view *v = pd_checkpoint_find(ck, "w\"q");
        CHECK(v && v->ndim == 2 && v->shape[1] == 3 && ((const float *)v->data)[5] == 6.0f);
        CHECK(((uintptr_t)v->data) % 8 == 0); /* header padding keeps data 8-byte aligned */
    }
    pd_checkpoint_free(ck);

    /* F32 data goes first whatever the order given, so it stays 4-byte aligned */
    struct pd_tensor_write rev[2] = {t[1], t[0]};
    CHECK_OK(pd_safetensors_write(path, rev, 2));
    text = NULL;
    CHECK_OK(pd_file_read_all(path, &text, &len));
    if (text && len > 8) {
        char *b_at = strstr(text + 8, "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],"
                                      "\"data_offsets\":[24,30]}");
        char *w_at = strstr(text + 8, "\"data_offsets\":[0,24]");
        CHECK(b_at && w_at && b_at < w_at); /* header keeps the given order */
    }
    pd_free(text);

    /* huggingface_hub's shard plan: a tensor over the limit gets its own shard, first */
    static uint8_t zeros[100];
    struct pd_tensor_write s[4] = {
        {.name = "t0", .dtype = PD_DTYPE_F16, .ndim = 1, .shape = {5}, .data = zeros},
        {.name = "t1", .dtype = PD_DTYPE_F16, .ndim = 1, .shape = {50}, .data = zeros},
        {.name = "t2", .dtype = PD_DTYPE_F16, .ndim = 1, .shape = {5}, .data = zeros},
        {.name = "t3", .dtype = PD_DTYPE_F16, .ndim = 1, .shape = {5}, .data = zeros},
    };
    CHECK_OK(pd_checkpoint_write(dir, s, 4, 25));
    join(path, sizeof(path), dir, "model.safetensors.index.json");
    text = NULL;
    CHECK_OK(pd_file_read_all(path, &text, &len));
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root != NULL);
    if (root) {
        cJSON *meta = cJSON_GetObjectItem(root, "metadata");
        cJSON *wm = cJSON_GetObjectItem(root, "weight_map");
        CHECK_DBL(cJSON_GetNumberValue(cJSON_GetObjectItem(meta, "total_size")), 130, 0);
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(wm, "t1")),
                  "model-00001-of-00003.safetensors");
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(wm, "t0")),
                  "model-00002-of-00003.safetensors");
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(wm, "t2")),
                  "model-00002-of-00003.safetensors");
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(wm, "t3")),
                  "model-00003-of-00003.safetensors");
        CHECK(strstr(text, "{\n  \"metadata\": {\n    \"total_size\": 130\n  },\n"
                           "  \"weight_map\": {\n    \"t0\": ") == text);
        cJSON_Delete(root);
    }
    pd_free(text);
    CHECK_OK(pd_checkpoint_open(dir, &ck));
    if (ck) {
        CHECK_INT(pd_checkpoint_count(ck), 4);
        CHECK_INT(pd_checkpoint_find(ck, "t1")->shard, 0);
        CHECK_INT(pd_checkpoint_find(ck, "t3")->shard, 2);
    }
    pd_checkpoint_free(ck);

    /* bad writes are refused before a file appears */
    struct pd_tensor_write dup[2] = {s[0], s[0]};
    join(path, sizeof(path), dir, "bad.safetensors");
    CHECK_ERR(pd_safetensors_write(path, dup, 2), PD_EINVAL, "tensor 't0' given twice");
    struct pd_tensor_write neg = s[0];
    neg.shape[0] = -1;
    CHECK_ERR(pd_safetensors_write(path, &neg, 1), PD_EINVAL, "negative dimension");
    CHECK(!pd_file_exists(path));
    CHECK_ERR(pd_safetensors_write("/nonexistent-dir/x.safetensors", s, 1), PD_ENOENT,
              "cannot create /nonexistent-dir/x.safetensors");
    remove_dir(dir);
}

/* A safetensors file with the given header text (hlen = its length unless forced) and data. */
static void write_raw(const char *path, const char *header, uint64_t forced_hlen, size_t data_len) {
    size_t hl = strlen(header);
    uint64_t hlen = forced_hlen ? forced_hlen : hl;
    size_t total = 8 + hl + data_len;
    uint8_t *buf = pd_calloc(1, total);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    CHECK_OK(pd_file_write_all(path, buf, total));
    pd_free(buf);
}

static int open_raw(const char *path, const char *header, uint64_t forced_hlen, size_t data_len) {
    struct pd_checkpoint *ck = NULL;
    write_raw(path, header, forced_hlen, data_len);
    int rc = pd_checkpoint_open_file(path, &ck);
    CHECK((rc == PD_OK) == (ck != NULL));
    pd_checkpoint_free(ck);
    return rc;
}

static void test_bad_files(void) {
    char dir[400], p[600];
    make_dir(dir, sizeof(dir), "bad");
    join(p, sizeof(p), dir, "m.safetensors");

    CHECK_OK(pd_file_write_all(p, "\x10\0\0", 3));
    CHECK_ERR(pd_checkpoint_open_file(p, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "too short for a safetensors header");
    CHECK_ERR(pd_checkpoint_open_file(p, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "m.safetensors");
    CHECK_ERR(open_raw(p, "{}", 1000, 0), PD_EFORMAT,
              "header length 1000 runs past the end of the file (10 bytes");
    CHECK_ERR(open_raw(p, "{}", 0xffffffffffffffffull, 0), PD_EFORMAT, "runs past the end");
    CHECK_ERR(open_raw(p, "{\"a\": {\"dtype\": \"F3", 0, 0), PD_EFORMAT,
              "header is not valid JSON");
    CHECK_ERR(open_raw(p, "[1, 2, 3]", 0, 0), PD_EFORMAT, "header is not a JSON object");
    CHECK_OK(open_raw(p, "{}", 0, 0)); /* empty but well-formed */
    CHECK_OK(open_raw(p, "{\"__metadata__\":{\"format\":\"pt\"}}", 0, 0));

    /* a valid file cut short in its data area */
    CHECK_ERR(
        open_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 12),
        PD_EFORMAT, "tensor 'x': data_offsets [0, 16] run past the data area (12 bytes");
    CHECK_ERR(
        open_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 0, 16),
        PD_EFORMAT, "tensor 'x': data_offsets [8, 0] begin after end");
    CHECK_ERR(
        open_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 0, 16),
        PD_EFORMAT, "tensor 'x': 16 bytes of data, but shape and dtype F32 need 12");
    CHECK_ERR(
        open_raw(p, "{\"x\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 0, 16),
        PD_EUNSUPPORTED, "tensor 'x' has dtype 'I64', which is not supported");
    CHECK_ERR(
        open_raw(p, "{\"y\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 0, 16),
        PD_EUNSUPPORTED, "tensor 'y' has dtype 'F8_E4M3'");
    CHECK_ERR(open_raw(p,
                       "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                       0, 16),
              PD_EUNSUPPORTED, "tensor 'x' has 6 dimensions");
    CHECK_ERR(
        open_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 16),
        PD_EFORMAT, "shape[0] is not a non-negative integer");
    CHECK_ERR(open_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 16), PD_EFORMAT,
              "tensor 'x' needs an object");
    CHECK_ERR(open_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 0, 16),
              PD_EFORMAT, "data_offsets must be two non-negative integers");
    CHECK_ERR(open_raw(p,
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                       0, 16),
              PD_EFORMAT, "tensors 'a' and 'b' overlap");
    CHECK_ERR(open_raw(p,
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                       0, 16),
              PD_EFORMAT, "tensor 'a' appears twice");
    CHECK_OK(open_raw(p,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[8,8]},"
                      "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[8,16]}}",
                      0, 16));

    join(p, sizeof(p), dir, "missing.safetensors");
    CHECK_ERR(pd_checkpoint_open_file(p, &(struct pd_checkpoint *){0}), PD_ENOENT,
              "missing.safetensors");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_ENOENT,
              "neither model.safetensors nor model.safetensors.index.json");
    remove_dir(dir);
}

static void test_validate(void) {
    char dir[400];
    struct pd_model_config cfg;
    struct model_tensors m;
    struct pd_checkpoint *ck = NULL;
    CHECK_OK(pd_model_config_parse(TINY_LLAMA, strlen(TINY_LLAMA), &cfg));
    model_tensors_make(&cfg, &m);
    make_dir(dir, sizeof(dir), "validate");

    /* lm_head left out */
    PD_ASSERT(strcmp(m.w[m.n - 1].name, "lm_head.weight") == 0);
    CHECK_OK(pd_checkpoint_write(dir, m.w, m.n - 1, 0));
    CHECK_OK(pd_checkpoint_open(dir, &ck));
    if (ck)
        CHECK_ERR(pd_checkpoint_validate(ck, &cfg), PD_ENOENT,
                  "tensor 'lm_head.weight' missing from checkpoint");
    pd_checkpoint_free(ck);
    ck = NULL;

    /* ... which is right once the embeddings are tied; extra tensors are ignored */
    struct pd_model_config tied = cfg;
    tied.tie_word_embeddings = true;
    CHECK_OK(pd_checkpoint_open(dir, &ck));
    if (ck)
        CHECK_OK(pd_checkpoint_validate(ck, &tied));
    pd_checkpoint_free(ck);
    ck = NULL;

    /* up_proj of layer 1 with half its rows */
    size_t up = 0;
    while (up < m.n && strcmp(m.w[up].name, "model.layers.1.mlp.up_proj.weight") != 0)
        up++;
    PD_ASSERT(up < m.n);
    m.w[up].shape[0] = 24;
    CHECK_OK(pd_checkpoint_write(dir, m.w, m.n, 4096));
    CHECK_OK(pd_checkpoint_open(dir, &ck));
    if (ck)
        CHECK_ERR(pd_checkpoint_validate(ck, &cfg), PD_EMISMATCH,
                  "tensor 'model.layers.1.mlp.up_proj.weight' has shape [24, 32], config implies "
                  "[48, 32]");
    pd_checkpoint_free(ck);
    ck = NULL;
    m.w[up].shape[0] = 48;

    /* a config that wants biases the checkpoint lacks */
    struct pd_model_config biased = cfg;
    biased.attention_bias = true;
    CHECK_OK(pd_checkpoint_write(dir, m.w, m.n, 0));
    CHECK_OK(pd_checkpoint_open(dir, &ck));
    if (ck)
        CHECK_ERR(pd_checkpoint_validate(ck, &biased), PD_ENOENT,
                  "tensor 'model.layers.0.self_attn.q_proj.bias' missing");
    pd_checkpoint_free(ck);

    model_tensors_free(&m);
    remove_dir(dir);
}

static void write_index(const char *dir, const char *text) {
    char p[600];
    join(p, sizeof(p), dir, "model.safetensors.index.json");
    CHECK_OK(pd_file_write_all(p, text, strlen(text)));
}

static void test_bad_shards(void) {
    char dir[400], p[600];
    struct pd_checkpoint *ck = NULL;
    static const float data[4] = {1, 2, 3, 4};
    struct pd_tensor_write a = {
        .name = "a", .dtype = PD_DTYPE_F32, .ndim = 1, .shape = {4}, .data = data};
    struct pd_tensor_write b = a, c = a;
    b.name = "b";
    c.name = "c";
    make_dir(dir, sizeof(dir), "shards");
    join(p, sizeof(p), dir, "s1.safetensors");
    CHECK_OK(pd_safetensors_write(p, (struct pd_tensor_write[]){a, b}, 2));
    join(p, sizeof(p), dir, "s2.safetensors");
    CHECK_OK(pd_safetensors_write(p, &c, 1));

    write_index(dir, "{\"metadata\":{},\"weight_map\":{\"a\":\"s1.safetensors\","
                     "\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}");
    CHECK_OK(pd_checkpoint_open(dir, &ck));
    if (ck) {
        CHECK_INT(pd_checkpoint_count(ck), 3);
        CHECK_INT(pd_checkpoint_find(ck, "c")->shard, 1);
        CHECK(((const float *)pd_checkpoint_find(ck, "c")->data)[3] == 4.0f);
    }
    pd_checkpoint_free(ck);

    write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                     "\"c\":\"s3.safetensors\"}}");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_ENOENT,
              "shard 's3.safetensors': cannot open");
    write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                     "\"c\":\"s2.safetensors\",\"d\":\"s2.safetensors\"}}");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_ENOENT,
              "tensor 'd' is mapped to s2.safetensors, which does not contain it");
    write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\","
                     "\"c\":\"s2.safetensors\"}}");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "tensor 'b' is mapped to s2.safetensors but found in s1.safetensors");
    write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "s1.safetensors holds tensor 'b', which weight_map does not list");
    write_index(dir, "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "weight_map entry 'a' must name a file");
    write_index(dir, "{\"weight_map\":[]}");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "missing 'weight_map' object");
    write_index(dir, "weight_map");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "model.safetensors.index.json: not a JSON object");

    /* the same name in two shards */
    join(p, sizeof(p), dir, "s2.safetensors");
    CHECK_OK(pd_safetensors_write(p, (struct pd_tensor_write[]){b, c}, 2));
    write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                     "\"c\":\"s2.safetensors\"}}");
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "tensor 'b' appears in both");

    /* a damaged shard is reported with the index and the shard named */
    CHECK_OK(pd_file_write_all(p, "\x01\x02", 2));
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_EFORMAT,
              "shard 's2.safetensors'");
    remove_dir(dir);

    /* a shard of a written checkpoint deleted */
    struct pd_tensor_write three[3] = {a, b, c};
    make_dir(dir, sizeof(dir), "shards2");
    CHECK_OK(pd_checkpoint_write(dir, three, 3, 16));
    join(p, sizeof(p), dir, "model-00002-of-00003.safetensors");
    unlink(p);
    CHECK_ERR(pd_checkpoint_open(dir, &(struct pd_checkpoint *){0}), PD_ENOENT,
              "model-00002-of-00003.safetensors: No such file");
    remove_dir(dir);
}

/* Every allocation failing in turn while writing and opening a sharded checkpoint. */
static void test_alloc_failures(void) {
    char dir[400];
    struct pd_model_config cfg;
    struct model_tensors m;
    CHECK_OK(pd_model_config_parse(TINY_LLAMA, strlen(TINY_LLAMA), &cfg));
    model_tensors_make(&cfg, &m);
    make_dir(dir, sizeof(dir), "oom");
    int wrote = 0, opened = 0;
    for (long i = 0; i < 400 && !wrote; i++) {
        pd_alloc_fail_after(i);
        int rc = pd_checkpoint_write(dir, m.w, m.n, 8192);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        wrote = rc == PD_OK;
    }
    for (long i = 0; i < 400 && !opened; i++) {
        struct pd_checkpoint *ck = NULL;
        pd_alloc_fail_after(i);
        int rc = pd_checkpoint_open(dir, &ck);
        int vrc = rc == PD_OK ? pd_checkpoint_validate(ck, &cfg) : rc;
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        CHECK(vrc == PD_OK || vrc == PD_ENOMEM);
        opened = rc == PD_OK && vrc == PD_OK;
        pd_checkpoint_free(ck);
    }
    CHECK(wrote && opened);
    model_tensors_free(&m);
    remove_dir(dir);
}

PD_TEST_MAIN(PD_TEST(test_sharded_equals_single), PD_TEST(test_file_layout),
             PD_TEST(test_bad_files), PD_TEST(test_validate), PD_TEST(test_bad_shards),
             PD_TEST(test_alloc_failures))
