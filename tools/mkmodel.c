/*
 * pdserve-mkmodel — writes a random-weight model in Hugging Face format (config.json,
 * generation_config.json, safetensors, tokenizer.json, tokenizer_config.json) so that pdserve
 * runs and is tested without downloads. Only flags live here; the writer is
 * tools/mkmodel/mkmodel.c. Exit status: 0 done (or --help), 2 bad flags, 1 the write failed.
 */
#include "model/dtype.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "tools/mkmodel/mkmodel.h"
#include "common/base/status.h"

#include <stdio.h>
#include <string.h>

/* index 0 is "auto"; the rest follow enum pd_mkmodel_family */
static const char *const family_choices[] = {"auto",  "llama",    "llama2",     "mistral", "qwen2",
                                             "qwen3", "qwen2_vl", "qwen2_5_vl", NULL};
static const char *const dtype_choices[] = {"bf16", "f16", "f32", NULL};
static const enum pd_dtype dtype_values[] = {PD_DTYPE_BF16, PD_DTYPE_F16, PD_DTYPE_F32};

static const char summary[] =
    "Writes a complete Hugging Face model directory with random weights and a real BPE tokenizer\n"
    "trained on a built-in corpus: config.json, generation_config.json, model.safetensors (or\n"
    "model-0000i-of-0000N.safetensors + model.safetensors.index.json), tokenizer.json,\n"
    "tokenizer_config.json. Same flags and seed give byte-identical files.\n"
    "Families: llama (Llama-3 style: byte-level tokenizer, llama3 rope scaling), llama2\n"
    "(sentencepiece-style tokenizer with byte fallback), mistral, qwen2 (q/k/v bias), qwen3\n"
    "(q/k norm), qwen2_vl and qwen2_5_vl (a Qwen2 language model with M-RoPE, a small vision\n"
    "encoder, preprocessor_config.json and Qwen2-VL's vision tokens and chat template; tiny\n"
    "only). --shape tiny is a few hundred KB for tests; the other shapes are the published\n"
    "configs (GBs: shards are generated one at a time, so memory stays about one shard).\n"
    "Size overrides default to 0, meaning the shape's value.\n"
    "example: pdserve-mkmodel --family qwen3 --out models/tiny-qwen3 --shard-size 64K";

int main(int argc, char **argv) {
    struct pd_mkmodel_opts o;
    pd_mkmodel_opts_defaults(&o);
    const char *out = NULL, *shard_size = "5G";
    int family = 0, dtype = 0, log_level = PD_LOG_INFO;
    int64_t seed = 0;
    bool tie = false;

    pd_log_set_name("mkmodel");
    struct pd_flagset fs;
    pd_flagset_init(&fs, "pdserve-mkmodel", summary);
    pd_flag_string(&fs, "--out", &out, "DIR",
                   "model directory to write (created; old checkpoint files in it are replaced)")
        ->required = true;
    pd_flag_choice(&fs, "--family", &family, family_choices,
                   "model family; auto = the shape's (llama for tiny)");
    pd_flag_choice(&fs, "--shape", &o.shape, pd_mkmodel_shape_names,
                   "tiny test model or a published model's exact config");
    pd_flag_int(&fs, "--vocab-size", &o.vocab_size, "N", 0, 1 << 24,
                "override vocab_size (the tokenizer uses at most this many ids)");
    pd_flag_int(&fs, "--hidden-size", &o.hidden_size, "N", 0, 1 << 16, "override hidden_size");
    pd_flag_int(&fs, "--intermediate-size", &o.intermediate_size, "N", 0, 1 << 18,
                "override intermediate_size (MLP width)");
    pd_flag_int(&fs, "--layers", &o.num_hidden_layers, "N", 0, 1024, "override num_hidden_layers");
    pd_flag_int(&fs, "--heads", &o.num_attention_heads, "N", 0, 1024,
                "override num_attention_heads");
    pd_flag_int(&fs, "--kv-heads", &o.num_key_value_heads, "N", 0, 1024,
                "override num_key_value_heads (must divide --heads)");
    pd_flag_int(&fs, "--head-dim", &o.head_dim, "N", 0, 1024,
                "override head_dim (default hidden/heads when those change; qwen3 keeps its own)");
    struct pd_flag *tie_flag = pd_flag_bool(
        &fs, "--tie-word-embeddings", &tie,
        "share embed_tokens with lm_head (--tie-word-embeddings=false unties; default: shape's)");
    pd_flag_choice(&fs, "--dtype", &dtype, dtype_choices, "weight dtype (config torch_dtype)");
    pd_flag_int(&fs, "--sliding-window", &o.sliding_window, "N", 0, 1 << 30,
                "attention window in tokens (mistral, qwen2, qwen3; 0 = none)");
    pd_flag_int(&fs, "--max-window-layers", &o.max_window_layers, "N", 0, 1024,
                "qwen2/qwen3: the window applies to layers >= N (default 0: every layer)");
    pd_flag_int64(&fs, "--seed", &seed, "N", 0, 9007199254740991.0,
                  "weight seed: same seed and flags, same bytes");
    pd_flag_string(&fs, "--shard-size", &shard_size, "BYTES",
                   "largest safetensors shard, K/M/G = 1024^1/2/3; 0 = one file");
    pd_flag_int(&fs, "--threads", &o.threads, "N", 0, 256,
                "weight generation threads; 0 = one per CPU (at most 16)");
    pd_flag_log_level(&fs, &log_level);

    if (pd_flags_parse(&fs, argc, argv) != PD_OK) {
        fprintf(stderr, "pdserve-mkmodel: %s\n", pd_error_msg());
        return 2;
    }
    if (fs.help) {
        pd_flags_usage(&fs, stdout);
        return 0;
    }
    pd_log_set_level((enum pd_log_level)log_level);
    o.family = family - 1;
    o.dtype = dtype_values[dtype];
    o.seed = (uint64_t)seed;
    if (tie_flag->seen)
        o.tie_word_embeddings = tie;
    if (pd_mkmodel_size_parse(shard_size, &o.max_shard_bytes) != PD_OK) {
        fprintf(stderr, "pdserve-mkmodel: --shard-size: %s\n", pd_error_msg());
        return 2;
    }
    struct pd_model_config cfg;
    if (pd_mkmodel_config(&o, &cfg) != PD_OK) {
        fprintf(stderr, "pdserve-mkmodel: %s\n", pd_error_msg());
        return 2;
    }
    if (pd_mkmodel_write(&o, out) != PD_OK) {
        pd_error("mkmodel: %s", pd_error_msg());
        return 1;
    }
    return 0;
}
