/*
 * config.json / generation_config.json: the published configs of one model per family parse to
 * their real numbers, absent keys take transformers' defaults, generation eos ids merge, the
 * JSON we write parses back to the same struct, the tensor list has the count and shapes the
 * family implies, and every malformed input is refused with a message naming the key.
 */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "model/model_config.h"

#include <sys/stat.h>
#include <unistd.h>

/* meta-llama/Llama-3.1-8B-Instruct */
static const char LLAMA31_8B[] = "{\n"
                                 "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                 "  \"attention_bias\": false,\n"
                                 "  \"attention_dropout\": 0.0,\n"
                                 "  \"bos_token_id\": 128000,\n"
                                 "  \"eos_token_id\": [128001, 128008, 128009],\n"
                                 "  \"hidden_act\": \"silu\",\n"
                                 "  \"hidden_size\": 4096,\n"
                                 "  \"initializer_range\": 0.02,\n"
                                 "  \"intermediate_size\": 14336,\n"
                                 "  \"max_position_embeddings\": 131072,\n"
                                 "  \"mlp_bias\": false,\n"
                                 "  \"model_type\": \"llama\",\n"
                                 "  \"num_attention_heads\": 32,\n"
                                 "  \"num_hidden_layers\": 32,\n"
                                 "  \"num_key_value_heads\": 8,\n"
                                 "  \"pretraining_tp\": 1,\n"
                                 "  \"rms_norm_eps\": 1e-05,\n"
                                 "  \"rope_scaling\": {\n"
                                 "    \"factor\": 8.0,\n"
                                 "    \"low_freq_factor\": 1.0,\n"
                                 "    \"high_freq_factor\": 4.0,\n"
                                 "    \"original_max_position_embeddings\": 8192,\n"
                                 "    \"rope_type\": \"llama3\"\n"
                                 "  },\n"
                                 "  \"rope_theta\": 500000.0,\n"
                                 "  \"tie_word_embeddings\": false,\n"
                                 "  \"torch_dtype\": \"bfloat16\",\n"
                                 "  \"transformers_version\": \"4.42.3\",\n"
                                 "  \"use_cache\": true,\n"
                                 "  \"vocab_size\": 128256\n"
                                 "}\n";

static const char LLAMA31_8B_GEN[] = "{\n"
                                     "  \"bos_token_id\": 128000,\n"
                                     "  \"do_sample\": true,\n"
                                     "  \"eos_token_id\": [128001, 128008, 128009],\n"
                                     "  \"temperature\": 0.6,\n"
                                     "  \"top_p\": 0.9,\n"
                                     "  \"transformers_version\": \"4.42.3\"\n"
                                     "}\n";

/* mistralai/Mistral-7B-v0.1 */
static const char MISTRAL_7B_V01[] = "{\n"
                                     "  \"architectures\": [\"MistralForCausalLM\"],\n"
                                     "  \"bos_token_id\": 1,\n"
                                     "  \"eos_token_id\": 2,\n"
                                     "  \"hidden_act\": \"silu\",\n"
                                     "  \"hidden_size\": 4096,\n"
                                     "  \"initializer_range\": 0.02,\n"
                                     "  \"intermediate_size\": 14336,\n"
                                     "  \"max_position_embeddings\": 32768,\n"
                                     "  \"model_type\": \"mistral\",\n"
                                     "  \"num_attention_heads\": 32,\n"
                                     "  \"num_hidden_layers\": 32,\n"
                                     "  \"num_key_value_heads\": 8,\n"
                                     "  \"rms_norm_eps\": 1e-05,\n"
                                     "  \"rope_theta\": 10000.0,\n"
                                     "  \"sliding_window\": 4096,\n"
                                     "  \"tie_word_embeddings\": false,\n"
                                     "  \"torch_dtype\": \"bfloat16\",\n"
                                     "  \"transformers_version\": \"4.34.0.dev0\",\n"
                                     "  \"use_cache\": true,\n"
                                     "  \"vocab_size\": 32000\n"
                                     "}\n";

/* mistralai/Mistral-7B-v0.3 */
static const char MISTRAL_7B_V03[] = "{\n"
                                     "  \"architectures\": [\"MistralForCausalLM\"],\n"
                                     "  \"attention_dropout\": 0.0,\n"
                                     "  \"bos_token_id\": 1,\n"
                                     "  \"eos_token_id\": 2,\n"
                                     "  \"hidden_act\": \"silu\",\n"
                                     "  \"hidden_size\": 4096,\n"
                                     "  \"initializer_range\": 0.02,\n"
                                     "  \"intermediate_size\": 14336,\n"
                                     "  \"max_position_embeddings\": 32768,\n"
                                     "  \"model_type\": \"mistral\",\n"
                                     "  \"num_attention_heads\": 32,\n"
                                     "  \"num_hidden_layers\": 32,\n"
                                     "  \"num_key_value_heads\": 8,\n"
                                     "  \"rms_norm_eps\": 1e-05,\n"
                                     "  \"rope_theta\": 1000000.0,\n"
                                     "  \"sliding_window\": null,\n"
                                     "  \"tie_word_embeddings\": false,\n"
                                     "  \"torch_dtype\": \"bfloat16\",\n"
                                     "  \"transformers_version\": \"4.42.0.dev0\",\n"
                                     "  \"use_cache\": true,\n"
                                     "  \"vocab_size\": 32768\n"
                                     "}\n";

/* Qwen/Qwen2.5-0.5B-Instruct */
static const char QWEN25_05B[] = "{\n"
                                 "  \"architectures\": [\"Qwen2ForCausalLM\"],\n"
                                 "  \"attention_dropout\": 0.0,\n"
                                 "  \"bos_token_id\": 151643,\n"
                                 "  \"eos_token_id\": 151645,\n"
                                 "  \"hidden_act\": \"silu\",\n"
                                 "  \"hidden_size\": 896,\n"
                                 "  \"initializer_range\": 0.02,\n"
                                 "  \"intermediate_size\": 4864,\n"
                                 "  \"max_position_embeddings\": 32768,\n"
                                 "  \"max_window_layers\": 21,\n"
                                 "  \"model_type\": \"qwen2\",\n"
                                 "  \"num_attention_heads\": 14,\n"
                                 "  \"num_hidden_layers\": 24,\n"
                                 "  \"num_key_value_heads\": 2,\n"
                                 "  \"rms_norm_eps\": 1e-06,\n"
                                 "  \"rope_theta\": 1000000.0,\n"
                                 "  \"sliding_window\": 32768,\n"
                                 "  \"tie_word_embeddings\": true,\n"
                                 "  \"torch_dtype\": \"bfloat16\",\n"
                                 "  \"transformers_version\": \"4.43.1\",\n"
                                 "  \"use_cache\": true,\n"
                                 "  \"use_sliding_window\": false,\n"
                                 "  \"vocab_size\": 151936\n"
                                 "}\n";

static const char QWEN25_05B_GEN[] = "{\n"
                                     "  \"bos_token_id\": 151643,\n"
                                     "  \"pad_token_id\": 151643,\n"
                                     "  \"do_sample\": true,\n"
                                     "  \"eos_token_id\": [151645, 151643],\n"
                                     "  \"repetition_penalty\": 1.1,\n"
                                     "  \"temperature\": 0.7,\n"
                                     "  \"top_p\": 0.8,\n"
                                     "  \"top_k\": 20,\n"
                                     "  \"transformers_version\": \"4.37.0\"\n"
                                     "}\n";

/* Qwen/Qwen3-0.6B: head_dim 128 although hidden_size / heads is 64 */
static const char QWEN3_06B[] = "{\n"
                                "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
                                "  \"attention_bias\": false,\n"
                                "  \"attention_dropout\": 0.0,\n"
                                "  \"bos_token_id\": 151643,\n"
                                "  \"eos_token_id\": 151645,\n"
                                "  \"head_dim\": 128,\n"
                                "  \"hidden_act\": \"silu\",\n"
                                "  \"hidden_size\": 1024,\n"
                                "  \"initializer_range\": 0.02,\n"
                                "  \"intermediate_size\": 3072,\n"
                                "  \"max_position_embeddings\": 40960,\n"
                                "  \"max_window_layers\": 28,\n"
                                "  \"model_type\": \"qwen3\",\n"
                                "  \"num_attention_heads\": 16,\n"
                                "  \"num_hidden_layers\": 28,\n"
                                "  \"num_key_value_heads\": 8,\n"
                                "  \"rms_norm_eps\": 1e-06,\n"
                                "  \"rope_scaling\": null,\n"
                                "  \"rope_theta\": 1000000,\n"
                                "  \"sliding_window\": null,\n"
                                "  \"tie_word_embeddings\": true,\n"
                                "  \"torch_dtype\": \"bfloat16\",\n"
                                "  \"transformers_version\": \"4.51.0\",\n"
                                "  \"use_cache\": true,\n"
                                "  \"use_sliding_window\": false,\n"
                                "  \"vocab_size\": 151936\n"
                                "}\n";

static const char QWEN3_06B_GEN[] = "{\n"
                                    "  \"bos_token_id\": 151643,\n"
                                    "  \"do_sample\": true,\n"
                                    "  \"eos_token_id\": [151645, 151643],\n"
                                    "  \"pad_token_id\": 151643,\n"
                                    "  \"temperature\": 0.6,\n"
                                    "  \"top_k\": 20,\n"
                                    "  \"top_p\": 0.95,\n"
                                    "  \"transformers_version\": \"4.51.0\"\n"
                                    "}\n";

static int parse(const char *json, struct pd_model_config *c) {
    return pd_model_config_parse(json, strlen(json), c);
}

static int parse_gen(const char *json, struct pd_model_config *c) {
    return pd_generation_config_parse(json, strlen(json), c);
}

static int same_config(const struct pd_model_config *a, const struct pd_model_config *b) {
    int same =
        a->arch == b->arch && a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
        a->intermediate_size == b->intermediate_size &&
        a->num_hidden_layers == b->num_hidden_layers &&
        a->num_attention_heads == b->num_attention_heads &&
        a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
        a->max_position_embeddings == b->max_position_embeddings &&
        a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
        a->rope_scaling.type == b->rope_scaling.type &&
        a->rope_scaling.factor == b->rope_scaling.factor &&
        a->rope_scaling.low_freq_factor == b->rope_scaling.low_freq_factor &&
        a->rope_scaling.high_freq_factor == b->rope_scaling.high_freq_factor &&
        a->rope_scaling.original_max_position_embeddings ==
            b->rope_scaling.original_max_position_embeddings &&
        a->tie_word_embeddings == b->tie_word_embeddings &&
        a->attention_bias == b->attention_bias && a->qk_norm == b->qk_norm &&
        a->sliding_window == b->sliding_window && a->max_window_layers == b->max_window_layers &&
        a->torch_dtype == b->torch_dtype && a->bos_token_id == b->bos_token_id &&
        a->pad_token_id == b->pad_token_id && a->n_eos_token_ids == b->n_eos_token_ids &&
        a->gen_temperature == b->gen_temperature && a->gen_top_p == b->gen_top_p &&
        a->gen_top_k == b->gen_top_k && a->gen_repetition_penalty == b->gen_repetition_penalty &&
        a->vl == b->vl && a->image_token_id == b->image_token_id &&
        a->vision_start_token_id == b->vision_start_token_id &&
        a->vision_end_token_id == b->vision_end_token_id;
    for (int i = 0; same && i < 3; i++)
        same = a->mrope_section[i] == b->mrope_section[i];
    for (int i = 0; same && i < a->n_eos_token_ids; i++)
        same = a->eos_token_ids[i] == b->eos_token_ids[i];
    return same;
}

/* A fresh directory under the test tmpdir. */
static void make_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/model_config_%ld_%s", pd_test_tmpdir(), (long)getpid(), name);
    mkdir(buf, 0755);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void remove_file(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    unlink(path);
}

/* Expected tensor count: embed + norm + lm_head (untied) + per layer 9 (q,k,v,o, 3 mlp, 2 norms)
 * + q/k/v biases + o bias (llama/qwen3 with attention_bias) + q/k norms (qwen3). */
static size_t expected_specs(const struct pd_model_config *c) {
    size_t per = 9;
    if (c->arch == PD_ARCH_QWEN2 || c->attention_bias)
        per += 3;
    if (c->attention_bias && c->arch != PD_ARCH_QWEN2)
        per += 1;
    if (c->arch == PD_ARCH_QWEN3)
        per += 2;
    return 2 + (size_t)c->num_hidden_layers * per + (c->tie_word_embeddings ? 0 : 1);
}

static const struct pd_tensor_spec *spec_find(const struct pd_tensor_spec *s, size_t n,
                                              const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0)
            return &s[i];
    return NULL;
}

#define CHECK_SPEC(specs, n, nm, nd, d0, d1)                                                       \
    do {                                                                                           \
        const struct pd_tensor_spec *sp_ = spec_find(specs, n, nm);                                \
        CHECK(sp_ != NULL);                                                                        \
        if (sp_) {                                                                                 \
            CHECK_INT(sp_->ndim, nd);                                                              \
            CHECK_INT(sp_->shape[0], d0);                                                          \
            if (nd == 2)                                                                           \
                CHECK_INT(sp_->shape[1], d1);                                                      \
        }                                                                                          \
    } while (0)

/* to_json → parse (→ generation to_json → parse) gives the same struct back. */
static void check_round_trip(const struct pd_model_config *c) {
    struct pd_model_config back;
    char *json = pd_model_config_to_json(c);
    char *gen = pd_generation_config_to_json(c);
    CHECK(json != NULL && gen != NULL);
    if (json && gen) {
        CHECK_OK(parse(json, &back));
        CHECK_OK(parse_gen(gen, &back));
        CHECK(same_config(c, &back));
        if (!same_config(c, &back))
            fprintf(stderr, "round trip differs:\n%s\n%s\n", json, gen);
    }
    pd_free(json);
    pd_free(gen);
}

static void test_llama31_8b(void) {
    struct pd_model_config c;
    struct pd_tensor_spec *s = NULL;
    size_t n = 0;
    CHECK_OK(parse(LLAMA31_8B, &c));
    CHECK_INT(c.arch, PD_ARCH_LLAMA);
    CHECK_INT(c.vocab_size, 128256);
    CHECK_INT(c.hidden_size, 4096);
    CHECK_INT(c.intermediate_size, 14336);
    CHECK_INT(c.num_hidden_layers, 32);
    CHECK_INT(c.num_attention_heads, 32);
    CHECK_INT(c.num_key_value_heads, 8);
    CHECK_INT(c.head_dim, 128);
    CHECK_INT(c.max_position_embeddings, 131072);
    CHECK_DBL(c.rms_norm_eps, 1e-5, 0);
    CHECK_DBL(c.rope_theta, 500000.0, 0);
    CHECK_INT(c.rope_scaling.type, PD_ROPE_LLAMA3);
    CHECK_DBL(c.rope_scaling.factor, 8.0, 0);
    CHECK_DBL(c.rope_scaling.low_freq_factor, 1.0, 0);
    CHECK_DBL(c.rope_scaling.high_freq_factor, 4.0, 0);
    CHECK_INT(c.rope_scaling.original_max_position_embeddings, 8192);
    CHECK(!c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);
    CHECK_INT(c.sliding_window, 0);
    CHECK_INT(c.torch_dtype, PD_DTYPE_BF16);
    CHECK_INT(c.bos_token_id, 128000);
    CHECK_INT(c.pad_token_id, -1);
    CHECK_INT(c.n_eos_token_ids, 3);
    CHECK_INT(c.eos_token_ids[0], 128001);
    CHECK_INT(c.eos_token_ids[2], 128009);
    CHECK(c.gen_temperature < 0 && c.gen_top_p < 0 && c.gen_top_k < 0 &&
          c.gen_repetition_penalty < 0);

    CHECK_OK(parse_gen(LLAMA31_8B_GEN, &c));
    CHECK_INT(c.n_eos_token_ids, 3); /* same ids: no duplicates */
    CHECK_DBL(c.gen_temperature, 0.6, 0);
    CHECK_DBL(c.gen_top_p, 0.9, 0);
    CHECK(c.gen_top_k < 0);

    CHECK_OK(pd_model_tensor_specs(&c, &s, &n));
    CHECK_INT(n, expected_specs(&c));
    CHECK_INT(n, 291);
    if (s && n == 291) {
        CHECK_STR(s[0].name, "model.embed_tokens.weight");
        CHECK_STR(s[1].name, "model.layers.0.self_attn.q_proj.weight");
        CHECK_STR(s[9].name, "model.layers.0.post_attention_layernorm.weight");
        CHECK_STR(s[289].name, "model.norm.weight");
        CHECK_STR(s[290].name, "lm_head.weight");
    }
    CHECK_SPEC(s, n, "model.embed_tokens.weight", 2, 128256, 4096);
    CHECK_SPEC(s, n, "model.layers.31.self_attn.q_proj.weight", 2, 4096, 4096);
    CHECK_SPEC(s, n, "model.layers.31.self_attn.k_proj.weight", 2, 1024, 4096);
    CHECK_SPEC(s, n, "model.layers.31.self_attn.v_proj.weight", 2, 1024, 4096);
    CHECK_SPEC(s, n, "model.layers.31.self_attn.o_proj.weight", 2, 4096, 4096);
    CHECK_SPEC(s, n, "model.layers.7.mlp.gate_proj.weight", 2, 14336, 4096);
    CHECK_SPEC(s, n, "model.layers.7.mlp.up_proj.weight", 2, 14336, 4096);
    CHECK_SPEC(s, n, "model.layers.7.mlp.down_proj.weight", 2, 4096, 14336);
    CHECK_SPEC(s, n, "model.layers.0.input_layernorm.weight", 1, 4096, 0);
    CHECK_SPEC(s, n, "lm_head.weight", 2, 128256, 4096);
    CHECK(spec_find(s, n, "model.layers.0.self_attn.q_proj.bias") == NULL);
    pd_free(s);
    check_round_trip(&c);
}

static void test_mistral_7b(void) {
    struct pd_model_config c;
    struct pd_tensor_spec *s = NULL;
    size_t n = 0;
    CHECK_OK(parse(MISTRAL_7B_V01, &c));
    CHECK_INT(c.arch, PD_ARCH_MISTRAL);
    CHECK_INT(c.vocab_size, 32000);
    CHECK_INT(c.num_key_value_heads, 8);
    CHECK_INT(c.head_dim, 128);
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.max_position_embeddings, 32768);
    CHECK_DBL(c.rope_theta, 10000.0, 0);
    CHECK_INT(c.rope_scaling.type, PD_ROPE_DEFAULT);
    CHECK_INT(c.bos_token_id, 1);
    CHECK_INT(c.n_eos_token_ids, 1);
    CHECK_INT(c.eos_token_ids[0], 2);
    CHECK(!c.attention_bias && !c.tie_word_embeddings);
    CHECK_OK(pd_model_tensor_specs(&c, &s, &n));
    CHECK_INT(n, 2 + 32 * 9 + 1);
    CHECK_SPEC(s, n, "model.layers.0.self_attn.k_proj.weight", 2, 1024, 4096);
    pd_free(s);
    check_round_trip(&c);

    CHECK_OK(parse(MISTRAL_7B_V03, &c));
    CHECK_INT(c.vocab_size, 32768);
    CHECK_INT(c.sliding_window, 0); /* null: no window */
    CHECK_DBL(c.rope_theta, 1000000.0, 0);
    check_round_trip(&c);
}

static void test_qwen25_05b(void) {
    struct pd_model_config c;
    struct pd_tensor_spec *s = NULL;
    size_t n = 0;
    CHECK_OK(parse(QWEN25_05B, &c));
    CHECK_INT(c.arch, PD_ARCH_QWEN2);
    CHECK_INT(c.vocab_size, 151936);
    CHECK_INT(c.hidden_size, 896);
    CHECK_INT(c.intermediate_size, 4864);
    CHECK_INT(c.num_hidden_layers, 24);
    CHECK_INT(c.num_attention_heads, 14);
    CHECK_INT(c.num_key_value_heads, 2);
    CHECK_INT(c.head_dim, 64);
    CHECK_DBL(c.rms_norm_eps, 1e-6, 0);
    CHECK_DBL(c.rope_theta, 1e6, 0);
    CHECK(c.tie_word_embeddings);
    CHECK(c.attention_bias); /* qwen2 always has q/k/v bias */
    CHECK(!c.qk_norm);
    CHECK_INT(c.sliding_window, 0); /* use_sliding_window false */
    CHECK_INT(c.n_eos_token_ids, 1);
    CHECK_INT(c.pad_token_id, -1);

    CHECK_OK(parse_gen(QWEN25_05B_GEN, &c));
    CHECK_INT(c.n_eos_token_ids, 2); /* 151645 from config.json, 151643 added */
    CHECK_INT(c.eos_token_ids[0], 151645);
    CHECK_INT(c.eos_token_ids[1], 151643);
    CHECK_INT(c.pad_token_id, 151643); /* filled from generation_config.json */
    CHECK_DBL(c.gen_temperature, 0.7, 0);
    CHECK_DBL(c.gen_top_p, 0.8, 0);
    CHECK_INT(c.gen_top_k, 20);
    CHECK_DBL(c.gen_repetition_penalty, 1.1, 0);

    CHECK_OK(pd_model_tensor_specs(&c, &s, &n));
    CHECK_INT(n, expected_specs(&c));
    CHECK_INT(n, 2 + 24 * 12);
    CHECK(spec_find(s, n, "lm_head.weight") == NULL); /* tied */
    CHECK_SPEC(s, n, "model.layers.0.self_attn.q_proj.weight", 2, 896, 896);
    CHECK_SPEC(s, n, "model.layers.0.self_attn.q_proj.bias", 1, 896, 0);
    CHECK_SPEC(s, n, "model.layers.0.self_attn.k_proj.bias", 1, 128, 0);
    CHECK_SPEC(s, n, "model.layers.23.self_attn.v_proj.bias", 1, 128, 0);
    CHECK(spec_find(s, n, "model.layers.0.self_attn.o_proj.bias") == NULL);
    if (s && n > 2) {
        CHECK_STR(s[1].name, "model.layers.0.self_attn.q_proj.weight");
        CHECK_STR(s[2].name, "model.layers.0.self_attn.q_proj.bias");
    }
    pd_free(s);
    check_round_trip(&c);
}

static void test_qwen3_06b(void) {
    struct pd_model_config c;
    struct pd_tensor_spec *s = NULL;
    size_t n = 0;
    CHECK_OK(parse(QWEN3_06B, &c));
    CHECK_INT(c.arch, PD_ARCH_QWEN3);
    CHECK_INT(c.hidden_size, 1024);
    CHECK_INT(c.num_attention_heads, 16);
    CHECK_INT(c.num_key_value_heads, 8);
    CHECK_INT(c.head_dim, 128); /* explicit, not 1024 / 16 */
    CHECK_INT(c.max_position_embeddings, 40960);
    CHECK(c.qk_norm && !c.attention_bias && c.tie_word_embeddings);
    CHECK_INT(c.rope_scaling.type, PD_ROPE_DEFAULT);
    CHECK_DBL(c.rope_theta, 1e6, 0);
    CHECK_OK(parse_gen(QWEN3_06B_GEN, &c));
    CHECK_INT(c.n_eos_token_ids, 2);
    CHECK_DBL(c.gen_top_p, 0.95, 0);

    CHECK_OK(pd_model_tensor_specs(&c, &s, &n));
    CHECK_INT(n, expected_specs(&c));
    CHECK_INT(n, 2 + 28 * 11);
    CHECK_SPEC(s, n, "model.layers.0.self_attn.q_proj.weight", 2, 2048, 1024);
    CHECK_SPEC(s, n, "model.layers.0.self_attn.k_proj.weight", 2, 1024, 1024);
    CHECK_SPEC(s, n, "model.layers.0.self_attn.o_proj.weight", 2, 1024, 2048);
    CHECK_SPEC(s, n, "model.layers.27.self_attn.q_norm.weight", 1, 128, 0);
    CHECK_SPEC(s, n, "model.layers.27.self_attn.k_norm.weight", 1, 128, 0);
    if (s && n > 6)
        CHECK_STR(s[5].name, "model.layers.0.self_attn.q_norm.weight");
    pd_free(s);
    check_round_trip(&c);

    /* Qwen3 with attention_bias: q, k, v and o all carry a bias, as in transformers */
    static const char biased[] =
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
        "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"head_dim\":16,\"rms_norm_eps\":1e-6,\"attention_bias\":true}";
    CHECK_OK(parse(biased, &c));
    CHECK(c.attention_bias);
    CHECK_OK(pd_model_tensor_specs(&c, &s, &n));
    CHECK_INT(n, 2 + 2 * 15 + 1);
    CHECK_SPEC(s, n, "model.layers.1.self_attn.o_proj.bias", 1, 32, 0);
    CHECK_SPEC(s, n, "model.layers.1.self_attn.k_proj.bias", 1, 32, 0);
    pd_free(s);
    check_round_trip(&c);
}

/* Keys left out take transformers' defaults for each family. */
static void test_defaults(void) {
    struct pd_model_config c;
#define MINIMAL(arch)                                                                              \
    "{\"architectures\":[\"" arch "\"],\"vocab_size\":100,\"hidden_size\":256,"                    \
    "\"intermediate_size\":512,\"num_hidden_layers\":2,\"num_attention_heads\":32,"                \
    "\"rms_norm_eps\":1e-5"
    CHECK_OK(parse(MINIMAL("LlamaForCausalLM") "}", &c));
    CHECK_INT(c.num_key_value_heads, 32);
    CHECK_INT(c.head_dim, 8);
    CHECK_INT(c.max_position_embeddings, 2048);
    CHECK_DBL(c.rope_theta, 10000.0, 0);
    CHECK_INT(c.torch_dtype, PD_DTYPE_F32);
    CHECK_INT(c.bos_token_id, 1);
    CHECK_INT(c.n_eos_token_ids, 1);
    CHECK_INT(c.eos_token_ids[0], 2);
    CHECK(!c.tie_word_embeddings && !c.attention_bias);
    check_round_trip(&c);

    CHECK_OK(parse(MINIMAL("MistralForCausalLM") "}", &c));
    CHECK_INT(c.num_key_value_heads, 8); /* MistralConfig's default, not the head count */
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.max_position_embeddings, 131072);
    check_round_trip(&c);
    CHECK_OK(parse(MINIMAL("MistralForCausalLM") ",\"num_key_value_heads\":null}", &c));
    CHECK_INT(c.num_key_value_heads, 32); /* explicit null: as many as attention heads */

    CHECK_OK(parse(MINIMAL("Qwen2ForCausalLM") "}", &c));
    CHECK_INT(c.num_key_value_heads, 32);
    CHECK_INT(c.bos_token_id, -1);
    CHECK_INT(c.n_eos_token_ids, 0);
    CHECK_INT(c.max_position_embeddings, 32768);
    CHECK_INT(c.sliding_window, 0);
    check_round_trip(&c);
    CHECK_OK(parse(MINIMAL("Qwen2ForCausalLM") ",\"use_sliding_window\":true}", &c));
    CHECK_INT(c.sliding_window, 4096);
    check_round_trip(&c);
    CHECK_OK(parse(MINIMAL("Qwen2ForCausalLM") ",\"use_sliding_window\":true,"
                                               "\"sliding_window\":1024}",
                   &c));
    CHECK_INT(c.sliding_window, 1024);
    CHECK_INT(c.max_window_layers, 28); /* Qwen2Config's default: layers >= 28 slide */
    check_round_trip(&c);
    CHECK_OK(parse(MINIMAL("Qwen2ForCausalLM") ",\"use_sliding_window\":true,"
                                               "\"max_window_layers\":3}",
                   &c));
    CHECK_INT(c.max_window_layers, 3);
    check_round_trip(&c);
    CHECK_ERR(parse(MINIMAL("Qwen2ForCausalLM") ",\"use_sliding_window\":true,"
                                                "\"max_window_layers\":-1}",
                    &c),
              PD_ERANGE, "max_window_layers");
    CHECK_OK(parse(MINIMAL("MistralForCausalLM") ",\"sliding_window\":64}", &c));
    CHECK_INT(c.max_window_layers, 0); /* Mistral: every layer */

    CHECK_OK(parse(MINIMAL("Qwen3ForCausalLM") "}", &c));
    CHECK_INT(c.head_dim, 128); /* Qwen3Config's default */

    /* transformers 5.x files: rope_parameters and dtype */
    CHECK_OK(parse(MINIMAL("LlamaForCausalLM") ",\"dtype\":\"float16\",\"rope_parameters\":{"
                                               "\"rope_type\":\"llama3\",\"rope_theta\":500000.0,"
                                               "\"factor\":32.0,\"low_freq_factor\":1.0,"
                                               "\"high_freq_factor\":4.0}}",
                   &c));
    CHECK_INT(c.torch_dtype, PD_DTYPE_F16);
    CHECK_DBL(c.rope_theta, 500000.0, 0);
    CHECK_INT(c.rope_scaling.type, PD_ROPE_LLAMA3);
    CHECK_DBL(c.rope_scaling.factor, 32.0, 0);
    CHECK_INT(c.rope_scaling.original_max_position_embeddings, 2048); /* max_position default */
    check_round_trip(&c);
    /* older spelling "type" */
    CHECK_OK(parse(MINIMAL("LlamaForCausalLM") ",\"rope_scaling\":{\"type\":\"llama3\","
                                               "\"factor\":8,\"low_freq_factor\":1,"
                                               "\"high_freq_factor\":4,"
                                               "\"original_max_position_embeddings\":8192}}",
                   &c));
    CHECK_INT(c.rope_scaling.type, PD_ROPE_LLAMA3);
#undef MINIMAL
}

static void test_errors(void) {
    struct pd_model_config c;
    memset(&c, 0x5a, sizeof(c));
#define BASE                                                                                       \
    "\"vocab_size\":100,\"intermediate_size\":512,\"num_hidden_layers\":2,"                        \
    "\"num_attention_heads\":8,\"rms_norm_eps\":1e-5"
#define LLAMA "\"architectures\":[\"LlamaForCausalLM\"],"
    CHECK_ERR(parse("{" LLAMA BASE "}", &c), PD_EINVAL,
              "config.json: missing required key 'hidden_size'");
    CHECK_ERR(parse("{\"vocab_size\":1}", &c), PD_EINVAL, "missing required key 'architectures'");
    CHECK_ERR(parse("{" LLAMA "\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":8,\"intermediate_size\":9}",
                    &c),
              PD_EINVAL, "missing required key 'rms_norm_eps'");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":\"64\"}", &c), PD_EINVAL,
              "key 'hidden_size' must be an integer, got a string");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64.5}", &c), PD_EINVAL,
              "key 'hidden_size' must be an integer");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":0}", &c), PD_ERANGE, "'hidden_size' is 0");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":-64}", &c), PD_ERANGE, "'hidden_size'");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":100}", &c), PD_EINVAL,
              "hidden_size (100) must be a multiple of num_attention_heads (8)");
    /* found by tests/fuzz/fuzz_model_config: a derived head_dim escaped the bound a given one
     * has, so the config printed back (pd_model_config_to_json) did not parse */
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":640000}", &c), PD_ERANGE,
              "hidden_size / num_attention_heads (640000 / 8) is a head_dim of 80000");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"num_key_value_heads\":3}", &c), PD_EINVAL,
              "must be a multiple of num_key_value_heads (3)");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"tie_word_embeddings\":1}", &c), PD_EINVAL,
              "'tie_word_embeddings' must be a boolean");
    CHECK_ERR(parse("{" LLAMA "\"vocab_size\":100,\"intermediate_size\":512,\"hidden_size\":64,"
                    "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"rms_norm_eps\":0}",
                    &c),
              PD_ERANGE, "key 'rms_norm_eps' is 0");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"eos_token_id\":\"</s>\"}", &c), PD_EINVAL,
              "'eos_token_id' must be an integer or a list of integers");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", &c),
              PD_ERANGE, "eos_token_id");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"torch_dtype\":\"float64\"}", &c),
              PD_EUNSUPPORTED, "torch_dtype 'float64'");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"hidden_act\":\"gelu\"}", &c),
              PD_EUNSUPPORTED, "hidden_act 'gelu'");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"rope_scaling\":{\"rope_type\":\"yarn\","
                    "\"factor\":4}}",
                    &c),
              PD_EUNSUPPORTED, "type 'yarn' is not supported");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"rope_scaling\":{\"rope_type\":"
                    "\"llama3\",\"factor\":8}}",
                    &c),
              PD_EINVAL, "missing required key 'low_freq_factor'");
    CHECK_ERR(parse("{" LLAMA BASE ",\"hidden_size\":64,\"model_type\":\"qwen2\"}", &c),
              PD_EMISMATCH, "model_type is 'qwen2'");
    CHECK_ERR(parse("{\"architectures\":[\"GPT2LMHeadModel\"]," BASE ",\"hidden_size\":64}", &c),
              PD_EUNSUPPORTED, "architecture 'GPT2LMHeadModel' is not supported");
    CHECK_ERR(parse("{\"architectures\":[\"GPT2LMHeadModel\"]," BASE ",\"hidden_size\":64}", &c),
              PD_EUNSUPPORTED, pd_arch_supported_list);
    CHECK_ERR(parse("{\"architectures\":[]," BASE ",\"hidden_size\":64}", &c), PD_EINVAL,
              "'architectures' must be a non-empty list");
    CHECK_ERR(parse("{\"architectures\": \"LlamaForCausalLM\"", &c), PD_EFORMAT,
              "config.json: not valid JSON");
    CHECK_ERR(parse("[1, 2]", &c), PD_EFORMAT, "config.json: top level must be a JSON object");
    CHECK_ERR(pd_model_config_parse("", 0, &c), PD_EFORMAT, "config.json");
    /* text need not be NUL-terminated: only len bytes are read */
    CHECK_ERR(pd_model_config_parse("{}xxxx", 2, &c), PD_EINVAL, "architectures");
    CHECK_INT(c.vocab_size, 0x5a5a5a5a); /* untouched by failures */

    CHECK_OK(parse(QWEN3_06B, &c));
    CHECK_ERR(parse_gen("{\"temperature\": \"hot\"}", &c), PD_EINVAL,
              "generation_config.json: key 'temperature' must be a number");
    CHECK_ERR(parse_gen("{\"top_p\": 1.5}", &c), PD_ERANGE, "top_p");
    CHECK_ERR(parse_gen("{\"eos_token_id\": [1, \"x\"]}", &c), PD_EINVAL, "eos_token_id");
    CHECK_ERR(parse_gen("nope", &c), PD_EFORMAT, "generation_config.json");
    CHECK_INT(c.n_eos_token_ids, 1); /* untouched by failures */
#undef BASE
#undef LLAMA
}

static void test_load_dir(void) {
    char dir[400], msg_want[512];
    struct pd_model_config c;
    make_dir(dir, sizeof(dir), "load");
    remove_file(dir, "config.json");
    remove_file(dir, "generation_config.json");
    snprintf(msg_want, sizeof(msg_want), "%s/config.json", dir);
    CHECK_ERR(pd_model_config_load(dir, &c), PD_ENOENT, msg_want);

    write_text(dir, "config.json", QWEN25_05B);
    CHECK_OK(pd_model_config_load(dir, &c)); /* generation_config.json is optional */
    CHECK_INT(c.n_eos_token_ids, 1);
    CHECK(c.gen_temperature < 0);
    write_text(dir, "generation_config.json", QWEN25_05B_GEN);
    CHECK_OK(pd_model_config_load(dir, &c));
    CHECK_INT(c.n_eos_token_ids, 2);
    CHECK_INT(c.gen_top_k, 20);

    write_text(dir, "generation_config.json", "{\"top_k\": \"many\"}");
    snprintf(msg_want, sizeof(msg_want), "%s/generation_config.json: key 'top_k'", dir);
    CHECK_ERR(pd_model_config_load(dir, &c), PD_EINVAL, msg_want);
    remove_file(dir, "generation_config.json");

    write_text(dir, "config.json", "{\"architectures\":[\"LlamaForCausalLM\"]}");
    snprintf(msg_want, sizeof(msg_want), "%s/config.json: missing required key 'vocab_size'", dir);
    CHECK_ERR(pd_model_config_load(dir, &c), PD_EINVAL, msg_want);

    /* what we write loads back */
    CHECK_OK(parse(LLAMA31_8B, &c));
    CHECK_OK(parse_gen(LLAMA31_8B_GEN, &c));
    char *json = pd_model_config_to_json(&c), *gen = pd_generation_config_to_json(&c);
    struct pd_model_config back;
    if (json && gen) {
        write_text(dir, "config.json", json);
        write_text(dir, "generation_config.json", gen);
        CHECK_OK(pd_model_config_load(dir, &back));
        CHECK(same_config(&c, &back));
    }
    pd_free(json);
    pd_free(gen);
    remove_file(dir, "config.json");
    remove_file(dir, "generation_config.json");
    rmdir(dir);
}

/* Every allocation failing in turn: a clean error each time, never a leak or a crash. */
static void test_alloc_failures(void) {
    char dir[400];
    struct pd_model_config c;
    make_dir(dir, sizeof(dir), "oom");
    write_text(dir, "config.json", QWEN3_06B);
    write_text(dir, "generation_config.json", QWEN3_06B_GEN);
    int ok = 0;
    for (long i = 0; i < 200 && !ok; i++) {
        pd_alloc_fail_after(i);
        int rc = pd_model_config_load(dir, &c);
        struct pd_tensor_spec *s = NULL;
        size_t n;
        char *json = rc == PD_OK ? pd_model_config_to_json(&c) : NULL;
        int rc2 = rc == PD_OK ? pd_model_tensor_specs(&c, &s, &n) : rc;
        pd_alloc_fail_after(-1);
        ok = rc == PD_OK && json && rc2 == PD_OK;
        if (!ok)
            CHECK(rc == PD_ENOMEM || rc2 == PD_ENOMEM || (rc == PD_OK && !json));
        pd_free(json);
        pd_free(s);
    }
    CHECK(ok);
    remove_file(dir, "config.json");
    remove_file(dir, "generation_config.json");
    rmdir(dir);
}

static void test_arch_names(void) {
    CHECK_STR(pd_arch_hf_name(PD_ARCH_QWEN3), "Qwen3ForCausalLM");
    CHECK_STR(pd_arch_model_type(PD_ARCH_MISTRAL), "mistral");
    CHECK_STR(pd_arch_supported_list,
              "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
              "Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration");
}

/* Qwen2-VL-7B-Instruct's config.json (the Hub's layout: language keys at the top level). */
static const char QWEN2_VL_HUB[] =
    "{\"architectures\": [\"Qwen2VLForConditionalGeneration\"], \"attention_dropout\": 0.0,"
    "\"bos_token_id\": 151643, \"eos_token_id\": 151645, \"vision_start_token_id\": 151652,"
    "\"vision_end_token_id\": 151653, \"vision_token_id\": 151654, \"image_token_id\": 151655,"
    "\"video_token_id\": 151656, \"hidden_act\": \"silu\", \"hidden_size\": 3584,"
    "\"initializer_range\": 0.02, \"intermediate_size\": 18944, \"max_position_embeddings\": "
    "32768, \"max_window_layers\": 28, \"model_type\": \"qwen2_vl\", \"num_attention_heads\": 28,"
    "\"num_hidden_layers\": 28, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06,"
    "\"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": false,"
    "\"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"use_sliding_window\": false,"
    "\"vision_config\": {\"depth\": 32, \"embed_dim\": 1280, \"mlp_ratio\": 4, \"num_heads\": 16,"
    "\"in_chans\": 3, \"hidden_size\": 3584, \"patch_size\": 14, \"spatial_merge_size\": 2,"
    "\"spatial_patch_size\": 14, \"temporal_patch_size\": 2}, \"rope_scaling\": {\"type\": "
    "\"mrope\", \"mrope_section\": [16, 24, 24]}, \"vocab_size\": 152064}";

/* The same model as transformers 5 writes it: language keys under text_config, rope under
 * rope_parameters (with rope_type "default" beside the M-RoPE type). */
static const char QWEN2_VL_V5[] =
    "{\"architectures\": [\"Qwen2VLForConditionalGeneration\"], \"dtype\": \"bfloat16\","
    "\"image_token_id\": 151655, \"model_type\": \"qwen2_vl\", \"text_config\": {"
    "\"bos_token_id\": 151643, \"eos_token_id\": 151645, \"hidden_act\": \"silu\","
    "\"hidden_size\": 3584, \"intermediate_size\": 18944, \"max_position_embeddings\": 32768,"
    "\"max_window_layers\": 28, \"model_type\": \"qwen2_vl_text\", \"num_attention_heads\": 28,"
    "\"num_hidden_layers\": 28, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06,"
    "\"rope_parameters\": {\"mrope_section\": [16, 24, 24], \"rope_theta\": 1000000.0,"
    "\"rope_type\": \"default\", \"type\": \"mrope\"}, \"sliding_window\": 32768,"
    "\"use_sliding_window\": false, \"vocab_size\": 152064}, \"tie_word_embeddings\": false,"
    "\"vision_end_token_id\": 151653, \"vision_start_token_id\": 151652, \"vision_config\": "
    "{\"depth\": 32}}";

/* Qwen2-VL and Qwen2.5-VL: a Qwen2 language model with M-RoPE, read alike from both layouts;
 * the sections must split head_dim / 2; a text-only architecture keeps no M-RoPE. */
static void test_qwen2_vl(void) {
    struct pd_model_config hub, v5, c;
    CHECK_OK(parse(QWEN2_VL_HUB, &hub));
    CHECK_INT(hub.arch, PD_ARCH_QWEN2);
    CHECK_INT(hub.vl, PD_VL_QWEN2);
    CHECK_INT(hub.hidden_size, 3584);
    CHECK_INT(hub.head_dim, 128);
    CHECK_INT(hub.mrope_section[0] * 10000 + hub.mrope_section[1] * 100 + hub.mrope_section[2],
              162424);
    CHECK_INT(hub.image_token_id, 151655);
    CHECK_INT(hub.vision_start_token_id, 151652);
    CHECK_INT(hub.vision_end_token_id, 151653);
    CHECK(hub.attention_bias);
    CHECK_DBL(hub.rope_theta, 1e6, 0);
    CHECK_INT(hub.torch_dtype, PD_DTYPE_BF16);
    CHECK_OK(parse(QWEN2_VL_V5, &v5));
    CHECK(same_config(&hub, &v5));
    check_round_trip(&hub);

    CHECK_OK(parse(QWEN25_05B, &c));
    CHECK_INT(c.vl, PD_VL_NONE);
    CHECK(c.mrope_section[0] + c.mrope_section[1] + c.mrope_section[2] == 0);
    CHECK_INT(c.image_token_id, -1);

    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", QWEN2_VL_HUB);
    char *sec = strstr(buf, "[16, 24, 24]");
    CHECK(sec != NULL);
    if (sec) {
        memcpy(sec, "[16, 24, 16]", 12);
        CHECK_ERR(parse(buf, &c), PD_EINVAL, "mrope_section 16 + 24 + 16 must be head_dim / 2");
        /* sections whose sum overflows an int are refused like any other wrong sum */
        char big[4200];
        snprintf(big, sizeof(big), "%.*s[2147483647, 2147483647, 2]%s", (int)(sec - buf), buf,
                 sec + 12);
        CHECK_ERR(parse(big, &c), PD_EINVAL, "mrope_section 2147483647 + 2147483647 + 2 must be");
    }
    snprintf(buf, sizeof(buf), "%s", QWEN2_VL_HUB);
    char *mt = strstr(buf, "\"qwen2_vl\"");
    CHECK(mt != NULL);
    if (mt) {
        memcpy(mt, "\"qwen2_xx\"", 10);
        CHECK_ERR(parse(buf, &c), PD_EMISMATCH, "(model_type 'qwen2_vl') but model_type is");
    }
    CHECK_ERR(parse("{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],"
                    "\"text_config\": 3}",
                    &c),
              PD_EINVAL, "key 'text_config' must be an object");
    /* a text_config inside text_config (found by fuzz_model_config: merging it over the top
     * level freed the object being merged) is skipped, whatever it holds */
    const char *tc = strstr(QWEN2_VL_V5, "\"text_config\": {");
    CHECK(tc != NULL);
    if (tc) {
        size_t at = (size_t)(tc - QWEN2_VL_V5) + strlen("\"text_config\": {");
        for (int k = 0; k < 2; k++) {
            const char *inner = k == 0 ? "\"text_config\": {\"hidden_size\": 1}, "
                                       : "\"text_config\": 7, \"text_config\": [], ";
            snprintf(buf, sizeof(buf), "%.*s%s%s", (int)at, QWEN2_VL_V5, inner, QWEN2_VL_V5 + at);
            CHECK_OK(parse(buf, &c));
            CHECK(same_config(&v5, &c));
        }
    }
}

PD_TEST_MAIN(PD_TEST(test_llama31_8b), PD_TEST(test_mistral_7b), PD_TEST(test_qwen25_05b),
             PD_TEST(test_qwen3_06b), PD_TEST(test_defaults), PD_TEST(test_errors),
             PD_TEST(test_load_dir), PD_TEST(test_alloc_failures), PD_TEST(test_arch_names),
             PD_TEST(test_qwen2_vl))
