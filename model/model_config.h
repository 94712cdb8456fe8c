/*
 * model_config.h — a model's shape and settings, read from a stock Hugging Face directory:
 * config.json (Llama incl. rope_scaling type llama3, Mistral, Qwen2 with qkv bias, Qwen3 with
 * q/k norm and explicit head_dim) and generation_config.json (eos ids, sampling defaults).
 *
 * Parsing validates: a missing required key, a value of the wrong type or outside its sane range,
 * or an unknown architecture is an error whose message names the key (or lists the supported
 * architectures). Nothing here touches weights; pd_model_tensor_specs says which tensors a
 * config implies, for the checkpoint validator and for pdserve-mkmodel alike.
 */
#ifndef PD_MODEL_CONFIG_H
#define PD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"

enum pd_arch {
    PD_ARCH_LLAMA = 0,   /* LlamaForCausalLM, model_type "llama" */
    PD_ARCH_MISTRAL = 1, /* MistralForCausalLM, "mistral" */
    PD_ARCH_QWEN2 = 2,   /* Qwen2ForCausalLM, "qwen2": q/k/v projections carry a bias */
    PD_ARCH_QWEN3 = 3,   /* Qwen3ForCausalLM, "qwen3": RMSNorm on q and k per head */
};
#define PD_ARCH_COUNT 4

/* "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM" */
extern const char pd_arch_supported_list[];
const char *pd_arch_hf_name(enum pd_arch a);    /* "LlamaForCausalLM" */
const char *pd_arch_model_type(enum pd_arch a); /* "llama" */

enum pd_rope_type {
    PD_ROPE_DEFAULT = 0,
    PD_ROPE_LLAMA3 = 1, /* Llama-3.1 frequency-dependent scaling */
};

struct pd_rope_scaling {
    enum pd_rope_type type;
    double factor;                        /* llama3: 8.0 for Llama-3.1 */
    double low_freq_factor;               /* llama3: 1.0 */
    double high_freq_factor;              /* llama3: 4.0 */
    int original_max_position_embeddings; /* llama3: 8192 */
};

#define PD_MAX_EOS_IDS 8

/* A vision-language checkpoint around the language model (model/vision/ holds its encoder). */
enum pd_vl_family {
    PD_VL_NONE = 0,
    PD_VL_QWEN2 = 1,   /* Qwen2VLForConditionalGeneration, "qwen2_vl" */
    PD_VL_QWEN2_5 = 2, /* Qwen2_5_VLForConditionalGeneration, "qwen2_5_vl" */
};

struct pd_model_config {
    enum pd_arch arch;
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* absent: transformers' default (llama: num_attention_heads,
                                mistral 8, qwen2/qwen3 32); null: num_attention_heads */
    int head_dim; /* explicit in config, else hidden_size / num_attention_heads (qwen3: 128) */
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta; /* default 10000 */
    struct pd_rope_scaling rope_scaling;
    /* Vision-language models (qwen2_vl, qwen2_5_vl): the language model is Qwen2's with M-RoPE —
     * head_dim / 2 rotary frequencies in three sections (mrope_section, e.g. 16, 24, 24) turned
     * by a token's temporal, height and width positions; text tokens have all three equal, so
     * a text-only prompt runs as plain RoPE. Keys under "text_config" (transformers 5) or at the
     * top level (Hub checkpoints). */
    enum pd_vl_family vl;
    int mrope_section[3]; /* all 0 without M-RoPE */
    int image_token_id;   /* the image's placeholder, repeated once per embedding; -1 none */
    int vision_start_token_id, vision_end_token_id; /* around each image's placeholders */
    bool tie_word_embeddings;
    bool attention_bias;   /* bias on q/k/v projections (always for qwen2); for llama and
                              qwen3 also on o_proj, as transformers builds them */
    bool qk_norm;          /* per-head RMSNorm on q and k (qwen3) */
    int sliding_window;    /* keys a query sees (itself included); 0 = none (mistral, qwen with
                              use_sliding_window) */
    int max_window_layers; /* the window applies to layers >= this (qwen; mistral: 0 = all) */
    enum pd_dtype torch_dtype;
    int bos_token_id; /* -1 when absent */
    int pad_token_id; /* -1 when absent */
    /* eos ids: union of config.json's and generation_config.json's eos_token_id (int or list) */
    int eos_token_ids[PD_MAX_EOS_IDS];
    int n_eos_token_ids;
    /* generation_config.json sampling defaults; < 0 when absent */
    double gen_temperature;
    double gen_top_p;
    int gen_top_k;
    double gen_repetition_penalty;
};

/* Parses config.json text (len bytes, not necessarily NUL-terminated) into *out. */
int pd_model_config_parse(const char *json, size_t len, struct pd_model_config *out);
/* Merges generation_config.json text into *cfg (eos ids, sampling defaults). */
int pd_generation_config_parse(const char *json, size_t len, struct pd_model_config *cfg);
/* Reads dir/config.json (required) and dir/generation_config.json (optional). */
int pd_model_config_load(const char *dir, struct pd_model_config *out);

/* config.json / generation_config.json text for cfg, as transformers writes them; caller frees
 * with pd_free. The text parses back to an identical config. */
char *pd_model_config_to_json(const struct pd_model_config *cfg);
char *pd_generation_config_to_json(const struct pd_model_config *cfg);

/* One tensor a config implies, in the order Hugging Face checkpoints list them. */
struct pd_tensor_spec {
    char name[96];    /* "model.layers.3.self_attn.q_proj.weight" */
    int ndim;         /* 1 or 2 (a vision encoder's patch embedding: 5) */
    int64_t shape[5]; /* row-major, as safetensors: [out_features][in_features] */
};

/* Fills *out (allocated with pd_malloc, caller frees) with every tensor cfg requires:
 * embed_tokens, per layer norms/projections (+ q/k/v biases, + q_norm/k_norm), final norm, and
 * lm_head unless embeddings are tied. */
int pd_model_tensor_specs(const struct pd_model_config *cfg, struct pd_tensor_spec **out,
                          size_t *n_out);

#endif
