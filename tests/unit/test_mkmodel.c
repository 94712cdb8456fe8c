/* pdserve-mkmodel's writer: every family's output loads back through the model loader; sharded
 * and unsharded writes hold the same tensors; files depend on the seed and nothing else; the
 * published shapes have their published parameter counts; bad options are refused by name. */
#include "pd_test.h"
#include "model/vision/image_processor.h"
#include "model/vision/vision_encoder.h"

#include "common/base/alloc.h"
#include "model/dtype.h"
#include "common/base/file.h"
#include "common/base/log.h"
#include "tools/mkmodel/mkmodel.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/safetensors_index.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir_for(const char *name) {
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof(buf[0]), "%s/mkmodel/%s", pd_test_tmpdir(), name);
    return b;
}

static struct pd_mkmodel_opts tiny(enum pd_mkmodel_family f) {
    struct pd_mkmodel_opts o;
    pd_mkmodel_opts_defaults(&o);
    o.family = (int)f;
    o.seed = 7;
    return o;
}

static bool same_file(const char *a_dir, const char *b_dir, const char *name) {
    char pa[600], pb[600];
    snprintf(pa, sizeof(pa), "%s/%s", a_dir, name);
    snprintf(pb, sizeof(pb), "%s/%s", b_dir, name);
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    bool same = pd_file_read_all(pa, &a, &la) == PD_OK && pd_file_read_all(pb, &b, &lb) == PD_OK &&
                la == lb && memcmp(a, b, la) == 0;
    pd_free(a);
    pd_free(b);
    return same;
}

/* Every tensor of a is in b with the same dtype, shape and bytes, and the counts agree. */
static bool same_tensors(const struct pd_checkpoint *a, const struct pd_checkpoint *b) {
    if (pd_checkpoint_count(a) != pd_checkpoint_count(b))
        return false;
    for (size_t i = 0; i < pd_checkpoint_count(a); i++) {
        const struct pd_tensor_view *x = pd_checkpoint_at(a, i);
        const struct pd_tensor_view *y = pd_checkpoint_find(b, x->name);
        if (!y || x->dtype != y->dtype || x->ndim != y->ndim || x->nbytes != y->nbytes ||
            memcmp(x->shape, y->shape, sizeof(x->shape)) != 0 ||
            memcmp(x->data, y->data, x->nbytes) != 0)
            return false;
    }
    return true;
}

/* tokenizer.json parses; its vocabulary is base + merges, its ids fit config's vocab_size, and
 * config's bos/eos ids name the family's special tokens. */
static void check_tokenizer(const char *dir, const struct pd_model_config *cfg) {
    char path[600], *text = NULL;
    size_t len;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    CHECK_OK(pd_file_read_all(path, &text, &len));
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root != NULL);
    if (root) {
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
        const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
        const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
        const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
        int n_vocab = cJSON_GetArraySize(vocab), n_merges = cJSON_GetArraySize(merges);
        bool sp = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
        /* the alphabet: 256 bytes (byte-level) or <unk> <s> </s> + 256 <0xNN> + characters */
        if (sp)
            CHECK(n_vocab - n_merges > 259);
        else
            CHECK_INT(n_vocab - n_merges, 256);
        CHECK(n_merges > 100);
        int max_id = n_vocab - 1, bos_ok = cfg->bos_token_id < 0, eos_ok = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, added) {
            int id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
            const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
            max_id = id > max_id ? id : max_id;
            if (id == cfg->bos_token_id)
                bos_ok = strcmp(content, "<s>") == 0 || strcmp(content, "<|begin_of_text|>") == 0 ||
                         strcmp(content, "<|endoftext|>") == 0;
            if (cfg->n_eos_token_ids > 0 && id == cfg->eos_token_ids[0])
                eos_ok = strcmp(content, "</s>") == 0 || strcmp(content, "<|eot_id|>") == 0 ||
                         strcmp(content, "<|im_end|>") == 0;
        }
        CHECK(max_id < cfg->vocab_size);
        CHECK(bos_ok);
        CHECK(eos_ok);
    }
    cJSON_Delete(root);
    pd_free(text);
}

/* A vision-language model's encoder: its config, its processor's, and the encoder built on a
 * cpu backend from the checkpoint (which checks every visual.* tensor's shape); adds its tensor
 * count to *n. */
static void check_vision(const char *dir, const struct pd_checkpoint *ck,
                         const struct pd_model_config *lm, size_t *n) {
    struct pd_vision_config vc;
    struct pd_image_processor_config pc;
    char path[600];
    snprintf(path, sizeof(path), "%s/preprocessor_config.json", dir);
    CHECK_OK(pd_vision_config_load(dir, &vc));
    CHECK_OK(pd_image_processor_config_load(path, &pc));
    CHECK_INT(vc.out_dim, lm->hidden_size);
    CHECK(lm->image_token_id >= 0 && lm->image_token_id < lm->vocab_size);
    struct pd_tensor_spec *vs = NULL;
    size_t nv = 0;
    CHECK_OK(pd_vision_tensor_specs(&vc, &vs, &nv));
    pd_free(vs);
    *n += nv;
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    struct pd_vision_encoder *enc = NULL;
    struct pd_vision_encoder_opts eo = {.max_patches = 64};
    CHECK_OK(pd_backend_new(&bo, &be));
    if (be)
        CHECK_OK(pd_vision_encoder_new(be, &vc, ck, &eo, &enc));
    pd_vision_encoder_free(enc);
    pd_backend_free(be);
}

static void test_every_family_loads(void) {
    for (int f = 0; pd_mkmodel_family_names[f]; f++) {
        struct pd_mkmodel_opts o = tiny((enum pd_mkmodel_family)f);
        struct pd_model_config want, got, got_sh;
        CHECK_OK(pd_mkmodel_config(&o, &want));
        char name[64];
        snprintf(name, sizeof(name), "%s", pd_mkmodel_family_names[f]);
        const char *one = dir_for(name);
        snprintf(name, sizeof(name), "%s-sharded", pd_mkmodel_family_names[f]);
        const char *sh = dir_for(name);

        o.max_shard_bytes = 0;
        CHECK_OK(pd_mkmodel_write(&o, one));
        o.max_shard_bytes = 64 << 10;
        CHECK_OK(pd_mkmodel_write(&o, sh));

        CHECK_OK(pd_model_config_load(one, &got));
        CHECK_OK(pd_model_config_load(sh, &got_sh));
        CHECK_INT(got.arch, want.arch);
        CHECK_INT(got.vocab_size, want.vocab_size);
        CHECK_INT(got.hidden_size, 64);
        CHECK_INT(got.num_hidden_layers, 2);
        CHECK_INT(got.head_dim, want.head_dim);
        CHECK_INT(got.num_key_value_heads, want.num_key_value_heads);
        CHECK_INT(got.tie_word_embeddings, want.tie_word_embeddings);
        bool vl = f == PD_MKMODEL_QWEN2_VL || f == PD_MKMODEL_QWEN2_5_VL;
        CHECK_INT(got.attention_bias, f == PD_MKMODEL_QWEN2 || vl);
        CHECK_INT(got.vl,
                  vl ? (f == PD_MKMODEL_QWEN2_VL ? PD_VL_QWEN2 : PD_VL_QWEN2_5) : PD_VL_NONE);
        CHECK_INT(got.qk_norm, f == PD_MKMODEL_QWEN3);
        CHECK_INT(got.rope_scaling.type, f == PD_MKMODEL_LLAMA ? PD_ROPE_LLAMA3 : PD_ROPE_DEFAULT);
        CHECK_DBL(got.rms_norm_eps, want.rms_norm_eps, 1e-12);
        CHECK_INT(got.torch_dtype, PD_DTYPE_BF16);
        CHECK(got.n_eos_token_ids >= 1);
        CHECK_INT(got_sh.eos_token_ids[0], got.eos_token_ids[0]);
        check_tokenizer(one, &got);

        struct pd_checkpoint *a = NULL, *b = NULL;
        CHECK_OK(pd_checkpoint_open(one, &a));
        CHECK_OK(pd_checkpoint_open(sh, &b));
        if (a && b) {
            CHECK_OK(pd_checkpoint_validate(a, &got));
            CHECK_OK(pd_checkpoint_validate(b, &got_sh));
            struct pd_tensor_spec *specs;
            size_t n;
            CHECK_OK(pd_model_tensor_specs(&got, &specs, &n));
            pd_free(specs);
            if (vl) /* the vision encoder's tensors too, and it builds from them */
                check_vision(one, a, &got, &n);
            CHECK_INT(pd_checkpoint_count(a), n);
            CHECK(same_tensors(a, b));
            /* the sharded one really is sharded, across several files */
            int max_shard = 0;
            for (size_t i = 0; i < pd_checkpoint_count(b); i++)
                max_shard = pd_checkpoint_at(b, i)->shard > max_shard
                                ? pd_checkpoint_at(b, i)->shard
                                : max_shard;
            CHECK(max_shard >= 2);
        }
        pd_checkpoint_free(a);
        pd_checkpoint_free(b);
        char idx[600];
        snprintf(idx, sizeof(idx), "%s/%s", sh, PD_SAFETENSORS_INDEX_NAME);
        CHECK(pd_file_exists(idx));
        snprintf(idx, sizeof(idx), "%s/%s", one, PD_SAFETENSORS_INDEX_NAME);
        CHECK(!pd_file_exists(idx));
    }
}

static void test_deterministic_by_seed(void) {
    struct pd_mkmodel_opts o = tiny(PD_MKMODEL_QWEN3);
    const char *a = dir_for("seed-a"), *b = dir_for("seed-b"), *c = dir_for("seed-c");
    o.threads = 1;
    CHECK_OK(pd_mkmodel_write(&o, a));
    o.threads = 3; /* blocks land on other threads: bytes must not change */
    CHECK_OK(pd_mkmodel_write(&o, b));
    static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "model.safetensors"};
    for (size_t i = 0; i < PD_ARRAY_LEN(files); i++)
        CHECK(same_file(a, b, files[i]));

    o.seed = 8;
    CHECK_OK(pd_mkmodel_write(&o, c));
    CHECK(same_file(a, c, "tokenizer.json"));
    CHECK(!same_file(a, c, "model.safetensors"));
    struct pd_checkpoint *ca = NULL, *cc = NULL;
    CHECK_OK(pd_checkpoint_open(a, &ca));
    CHECK_OK(pd_checkpoint_open(c, &cc));
    if (ca && cc) {
        /* every tensor changes with the seed, not just some */
        int same = 0;
        for (size_t i = 0; i < pd_checkpoint_count(ca); i++) {
            const struct pd_tensor_view *x = pd_checkpoint_at(ca, i);
            const struct pd_tensor_view *y = pd_checkpoint_find(cc, x->name);
            same += y && memcmp(x->data, y->data, x->nbytes) == 0;
        }
        CHECK_INT(same, 0);
    }
    pd_checkpoint_free(ca);
    pd_checkpoint_free(cc);
}

/* Blocks of one tensor draw from different streams, and the values look like the documented
 * init: matrices N(0, 1/fan_in), norms around 1, biases small. */
static void test_weight_statistics(void) {
    struct pd_mkmodel_opts o = tiny(PD_MKMODEL_QWEN2);
    o.dtype = PD_DTYPE_F32;
    o.hidden_size = 256; /* embed is 1024 x 256: four PRNG blocks */
    const char *d = dir_for("stats");
    CHECK_OK(pd_mkmodel_write(&o, d));
    struct pd_checkpoint *ck = NULL;
    CHECK_OK(pd_checkpoint_open(d, &ck));
    if (!ck)
        return;
    const struct pd_tensor_view *emb = pd_checkpoint_find(ck, "model.embed_tokens.weight");
    const struct pd_tensor_view *up = pd_checkpoint_find(ck, "model.layers.1.mlp.down_proj.weight");
    const struct pd_tensor_view *nrm = pd_checkpoint_find(ck, "model.norm.weight");
    const struct pd_tensor_view *bias =
        pd_checkpoint_find(ck, "model.layers.0.self_attn.k_proj.bias");
    CHECK(emb && up && nrm && bias);
    if (emb && up && nrm && bias) {
        CHECK_INT(emb->dtype, PD_DTYPE_F32);
        const struct pd_tensor_view *v[] = {emb, up, nrm, bias};
        const double want_mean[] = {0, 0, 1, 0};
        const double want_std[] = {1 / 16.0, 1 / sqrt(128.0), 0.05, 0.1};
        for (int k = 0; k < 4; k++) {
            const float *x = v[k]->data;
            size_t n = v[k]->nbytes / 4;
            double s = 0, ss = 0;
            for (size_t i = 0; i < n; i++)
                s += x[i];
            double mean = s / (double)n;
            for (size_t i = 0; i < n; i++)
                ss += (x[i] - mean) * (x[i] - mean);
            double sd = sqrt(ss / (double)n);
            CHECK_DBL(mean, want_mean[k], 4 * want_std[k] / sqrt((double)n) + 1e-9);
            CHECK_DBL(sd / want_std[k], 1.0, 0.3); /* the bias has only 128 values */
        }
        /* two PRNG blocks of the embedding are not copies of each other */
        const float *x = emb->data;
        CHECK(memcmp(x, x + 65536, 1024 * sizeof(float)) != 0);
    }
    pd_checkpoint_free(ck);
}

/* The same seed in f32, f16 and bf16: the narrow files are the f32 values rounded. */
static void test_dtypes_round_the_same_values(void) {
    struct pd_mkmodel_opts o = tiny(PD_MKMODEL_LLAMA);
    const char *dirs[3] = {dir_for("dt-f32"), dir_for("dt-f16"), dir_for("dt-bf16")};
    const enum pd_dtype dts[3] = {PD_DTYPE_F32, PD_DTYPE_F16, PD_DTYPE_BF16};
    struct pd_checkpoint *ck[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        o.dtype = dts[i];
        CHECK_OK(pd_mkmodel_write(&o, dirs[i]));
        CHECK_OK(pd_checkpoint_open(dirs[i], &ck[i]));
    }
    if (ck[0] && ck[1] && ck[2]) {
        int bad = 0;
        for (size_t t = 0; t < pd_checkpoint_count(ck[0]); t++) {
            const struct pd_tensor_view *f = pd_checkpoint_at(ck[0], t);
            const struct pd_tensor_view *h = pd_checkpoint_find(ck[1], f->name);
            const struct pd_tensor_view *b = pd_checkpoint_find(ck[2], f->name);
            const float *fv = f->data;
            const uint16_t *hv = h->data, *bv = b->data;
            for (size_t i = 0; i < f->nbytes / 4; i++)
                bad += hv[i] != pd_f32_to_f16(fv[i]) || bv[i] != pd_f32_to_bf16(fv[i]);
        }
        CHECK_INT(bad, 0);
    }
    for (int i = 0; i < 3; i++)
        pd_checkpoint_free(ck[i]);
}

/* A sharded write into a directory holding a single file (and back) leaves one checkpoint. */
static void test_rewrite_replaces_old_checkpoint(void) {
    struct pd_mkmodel_opts o = tiny(PD_MKMODEL_MISTRAL);
    const char *d = dir_for("rewrite/nested/dir");
    char single[600], index[600];
    snprintf(single, sizeof(single), "%s/model.safetensors", d);
    snprintf(index, sizeof(index), "%s/%s", d, PD_SAFETENSORS_INDEX_NAME);
    o.max_shard_bytes = 0;
    CHECK_OK(pd_mkmodel_write(&o, d));
    o.max_shard_bytes = 100 << 10;
    CHECK_OK(pd_mkmodel_write(&o, d));
    CHECK(!pd_file_exists(single));
    CHECK(pd_file_exists(index));
    o.max_shard_bytes = 0;
    CHECK_OK(pd_mkmodel_write(&o, d));
    CHECK(pd_file_exists(single));
    CHECK(!pd_file_exists(index));
    int shards_left = 0;
    DIR *dp = opendir(d);
    CHECK(dp != NULL);
    for (struct dirent *e; dp && (e = readdir(dp)) != NULL;)
        shards_left += strncmp(e->d_name, "model-", 6) == 0;
    if (dp)
        closedir(dp);
    CHECK_INT(shards_left, 0);

    /* a file where the directory should be */
    char file[600];
    snprintf(file, sizeof(file), "%s/config.json", d);
    CHECK_ERR(pd_mkmodel_write(&o, file), PD_EINVAL, "not a directory");
}

static int64_t param_count(const struct pd_model_config *cfg) {
    struct pd_tensor_spec *s;
    size_t n;
    if (pd_model_tensor_specs(cfg, &s, &n) != PD_OK)
        return -1;
    int64_t p = 0;
    for (size_t i = 0; i < n; i++)
        p += s[i].shape[0] * (s[i].ndim == 2 ? s[i].shape[1] : 1); /* language models: 1-2 */
    pd_free(s);
    return p;
}

static int shape_index(const char *name) {
    for (int i = 0; pd_mkmodel_shape_names[i]; i++)
        if (strcmp(pd_mkmodel_shape_names[i], name) == 0)
            return i;
    return -1;
}

/* The published shapes reproduce the parameter counts their model cards give. */
static void test_published_shapes(void) {
    static const struct {
        const char *shape;
        int64_t params;
        enum pd_arch arch;
        int vocab;
    } want[] = {
        {"llama-3.1-8b", 8030261248, PD_ARCH_LLAMA, 128256},
        {"llama-3.2-1b", 1235814400, PD_ARCH_LLAMA, 128256},
        {"llama-2-7b", 6738415616, PD_ARCH_LLAMA, 32000},
        {"mistral-7b", 7248023552, PD_ARCH_MISTRAL, 32768},
        {"qwen2.5-0.5b", 494032768, PD_ARCH_QWEN2, 151936},
        {"qwen2.5-7b", 7615616512, PD_ARCH_QWEN2, 152064},
        {"qwen3-0.6b", 596049920, PD_ARCH_QWEN3, 151936},
        {"qwen3-8b", 8190735360, PD_ARCH_QWEN3, 151936},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(want); i++) {
        struct pd_mkmodel_opts o;
        pd_mkmodel_opts_defaults(&o);
        o.shape = shape_index(want[i].shape);
        CHECK(o.shape > 0);
        struct pd_model_config cfg;
        CHECK_OK(pd_mkmodel_config(&o, &cfg));
        CHECK_INT(cfg.arch, want[i].arch);
        CHECK_INT(cfg.vocab_size, want[i].vocab);
        if (param_count(&cfg) != want[i].params)
            fprintf(stderr, "%s: %lld parameters\n", want[i].shape, (long long)param_count(&cfg));
        CHECK_INT(param_count(&cfg), want[i].params);
    }
    struct pd_mkmodel_opts o;
    pd_mkmodel_opts_defaults(&o);
    o.shape = shape_index("llama-3.1-8b");
    struct pd_model_config c;
    CHECK_OK(pd_mkmodel_config(&o, &c));
    CHECK_INT(c.rope_scaling.type, PD_ROPE_LLAMA3);
    CHECK_DBL(c.rope_scaling.factor, 8.0, 0);
    CHECK_INT(c.rope_scaling.original_max_position_embeddings, 8192);
    CHECK_DBL(c.rope_theta, 500000.0, 0);
    CHECK_INT(c.max_position_embeddings, 131072);
    o.shape = shape_index("qwen3-0.6b");
    CHECK_OK(pd_mkmodel_config(&o, &c));
    CHECK_INT(c.head_dim, 128); /* != 1024 / 16 */
    CHECK(c.tie_word_embeddings);
    /* a same-architecture family is fine, another architecture contradicts the shape */
    o.shape = shape_index("llama-2-7b");
    o.family = PD_MKMODEL_LLAMA;
    CHECK_OK(pd_mkmodel_config(&o, &c));
    o.family = PD_MKMODEL_QWEN2;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_EINVAL, "contradicts");
}

static void test_overrides_and_bad_options(void) {
    struct pd_mkmodel_opts o = tiny(PD_MKMODEL_LLAMA);
    struct pd_model_config c;
    o.hidden_size = 128;
    o.num_attention_heads = 8;
    o.num_key_value_heads = 8;
    o.num_hidden_layers = 3;
    o.intermediate_size = 200;
    o.vocab_size = 700;
    o.tie_word_embeddings = 1;
    CHECK_OK(pd_mkmodel_config(&o, &c));
    CHECK_INT(c.head_dim, 16);
    CHECK_INT(c.num_hidden_layers, 3);
    CHECK_INT(c.intermediate_size, 200);
    CHECK_INT(c.vocab_size, 700);
    CHECK(c.tie_word_embeddings);
    const char *d = dir_for("overrides");
    CHECK_OK(pd_mkmodel_write(&o, d));
    struct pd_model_config got;
    CHECK_OK(pd_model_config_load(d, &got));
    CHECK_INT(got.vocab_size, 700);
    check_tokenizer(d, &got);

    o = tiny(PD_MKMODEL_LLAMA);
    o.num_key_value_heads = 3;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_EINVAL, "not a multiple of 3 kv heads");
    o = tiny(PD_MKMODEL_LLAMA);
    o.head_dim = 15;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_EINVAL, "odd");
    o = tiny(PD_MKMODEL_LLAMA);
    o.hidden_size = 66;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_EINVAL, "--head-dim");
    o = tiny(PD_MKMODEL_LLAMA);
    o.vocab_size = 260;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_ERANGE, "too small for the llama3 tokenizer");
    o.vocab_size = 261; /* bytes + 5 specials, not one merge: still a valid tokenizer */
    CHECK_OK(pd_mkmodel_config(&o, &c));
    o = tiny(PD_MKMODEL_LLAMA);
    o.num_hidden_layers = -2;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_ERANGE, "--layers");
    /* sliding windows: mistral and qwen only; written and read back */
    o = tiny(PD_MKMODEL_LLAMA);
    o.sliding_window = 8;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_EINVAL, "mistral, qwen2 or qwen3");
    o = tiny(PD_MKMODEL_MISTRAL);
    o.sliding_window = 8;
    o.max_window_layers = 1;
    CHECK_ERR(pd_mkmodel_config(&o, &c), PD_EINVAL, "qwen2 or qwen3");
    o = tiny(PD_MKMODEL_QWEN2);
    o.sliding_window = 8;
    o.max_window_layers = 1;
    d = dir_for("window");
    CHECK_OK(pd_mkmodel_write(&o, d));
    CHECK_OK(pd_model_config_load(d, &got));
    CHECK_INT(got.sliding_window, 8);
    CHECK_INT(got.max_window_layers, 1);

    uint64_t v;
    CHECK_OK(pd_mkmodel_size_parse("0", &v));
    CHECK_INT(v, 0);
    CHECK_OK(pd_mkmodel_size_parse("4096", &v));
    CHECK_INT(v, 4096);
    CHECK_OK(pd_mkmodel_size_parse("64K", &v));
    CHECK_INT(v, 65536);
    CHECK_OK(pd_mkmodel_size_parse("2m", &v));
    CHECK_INT(v, 2 << 20);
    CHECK_OK(pd_mkmodel_size_parse("5G", &v));
    CHECK_INT(v, 5ll << 30);
    CHECK_ERR(pd_mkmodel_size_parse("5GB", &v), PD_EINVAL, "'5GB' is not a size");
    CHECK_ERR(pd_mkmodel_size_parse("", &v), PD_EINVAL, "not a size");
    CHECK_ERR(pd_mkmodel_size_parse("-1", &v), PD_EINVAL, "not a size");
    CHECK_ERR(pd_mkmodel_size_parse("99999999999999999999", &v), PD_EINVAL, "not a size");
    CHECK_ERR(pd_mkmodel_size_parse("17179869184G", &v), PD_EINVAL, "not a size");
}

static void test_shard_plan(void) {
    /* huggingface_hub's rule: an oversize tensor gets its own shard at once, the open shard
     * closes when the next tensor would tip it over */
    const uint64_t sizes[] = {40, 50, 200, 30, 60, 20};
    int shard_of[6];
    CHECK_INT(pd_safetensors_shard_plan(sizes, 6, 100, shard_of), 4);
    const int want[] = {1, 1, 0, 2, 2, 3};
    for (int i = 0; i < 6; i++)
        CHECK_INT(shard_of[i], want[i]);
    CHECK_INT(pd_safetensors_shard_plan(sizes, 6, 0, shard_of), 1);
    CHECK_INT(pd_safetensors_shard_plan(sizes, 6, 1000, shard_of), 1);
    CHECK_INT(shard_of[5], 0);
    CHECK_INT(pd_safetensors_shard_plan(sizes, 0, 100, shard_of), 0);
    char name[64];
    pd_safetensors_shard_name(1, 3, name, sizeof(name));
    CHECK_STR(name, "model-00002-of-00003.safetensors");
    pd_safetensors_shard_name(0, 1, name, sizeof(name));
    CHECK_STR(name, "model.safetensors");
}

static void test_alloc_failures(void) {
    struct pd_mkmodel_opts o = tiny(PD_MKMODEL_QWEN2);
    o.max_shard_bytes = 64 << 10;
    o.threads = 2;
    const char *d = dir_for("alloc-fail");
    int failed = 0;
    for (long n = 0; n < 3000; n += 97) {
        pd_alloc_fail_after(n);
        int rc = pd_mkmodel_write(&o, d);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        failed += rc != PD_OK;
    }
    CHECK(failed > 0);
    CHECK_OK(pd_mkmodel_write(&o, d));
}

int main(int argc, char **argv) {
    (void)argc;
    pd_log_set_level(PD_LOG_WARNING);
    static const struct pd_test_case cases[] = {
        PD_TEST(test_every_family_loads),
        PD_TEST(test_deterministic_by_seed),
        PD_TEST(test_weight_statistics),
        PD_TEST(test_dtypes_round_the_same_values),
        PD_TEST(test_rewrite_replaces_old_checkpoint),
        PD_TEST(test_published_shapes),
        PD_TEST(test_overrides_and_bad_options),
        PD_TEST(test_shard_plan),
        PD_TEST(test_alloc_failures),
    };
    return pd_test_run(argv[0], cases, PD_ARRAY_LEN(cases));
}
