/*
 * model_config.c — config.json / generation_config.json parsing, writing, and the tensor list a
 * config implies.
 *
 * Defaults for absent keys are those of transformers' LlamaConfig, MistralConfig, Qwen2Config
 * and Qwen3Config (read from transformers 5.x; 4.x agrees), because a checkpoint means what
 * transformers makes of it: e.g. an absent num_key_value_heads is 8 for Mistral and 32 for
 * Qwen2/3 (only an explicit null means "as many as attention heads"), Qwen3's absent head_dim is
 * 128. rope parameters are read from "rope_scaling" (transformers 4.x files) or
 * "rope_parameters" (5.x files), rope_theta from either place.
 *
 * Anything we cannot run faithfully (another hidden_act, mlp_bias, a rope type other than
 * default/llama3) is refused with PD_EUNSUPPORTED instead of producing wrong tokens later.
 * Parsing fills a local struct and copies it out only on success.
 */
#include "model/model_config.h"
#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/json_keys.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char pd_arch_supported_list[] =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
    "Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration";

/* The vision-language checkpoints: a Qwen2 language model under another name (vl_info[vl]). */
static const struct {
    const char *hf_name, *model_type;
} vl_info[] = {
    [PD_VL_QWEN2] = {"Qwen2VLForConditionalGeneration", "qwen2_vl"},
    [PD_VL_QWEN2_5] = {"Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl"},
};

static const struct arch_info {
    const char *hf_name;
    const char *model_type;
    int kv_heads_absent; /* num_key_value_heads when the key is absent; 0 = num_attention_heads */
    int head_dim_absent; /* head_dim when absent; 0 = hidden_size / num_attention_heads */
    int max_pos_absent;  /* max_position_embeddings default */
    int bos_absent;      /* -1 = None */
    int eos_absent;      /* -1 = None */
} arch_info[PD_ARCH_COUNT] = {
    [PD_ARCH_LLAMA] = {"LlamaForCausalLM", "llama", 0, 0, 2048, 1, 2},
    [PD_ARCH_MISTRAL] = {"MistralForCausalLM", "mistral", 8, 0, 4096 * 32, 1, 2},
    [PD_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2", 32, 0, 32768, -1, -1},
    [PD_ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3", 32, 128, 32768, -1, -1},
};

/* Sliding window transformers assumes when the key is absent (Mistral; Qwen with it enabled). */
#define PD_DEFAULT_SLIDING_WINDOW 4096
/* Upper bound for any width or count: far above every real model, low enough that products of
 * two of them never overflow int64 and one of them never overflows int. */
#define PD_MAX_DIM (1 << 24)

const char *pd_arch_hf_name(enum pd_arch a) {
    return (unsigned)a < PD_ARCH_COUNT ? arch_info[a].hf_name : "?";
}

const char *pd_arch_model_type(enum pd_arch a) {
    return (unsigned)a < PD_ARCH_COUNT ? arch_info[a].model_type : "?";
}

/* ---- typed access to JSON keys (common/base/json_keys.h), with this file's defaults and
 * required keys; every error names the source file and the key ---- */

static int as_int(const char *src, const char *key, const cJSON *v, int *out) {
    int64_t x;
    int rc = pd_json_as_int(src, key, v, INT_MIN, INT_MAX, &x);
    if (rc == PD_OK)
        *out = (int)x;
    return rc;
}

/* required: absent (or null) is an error; else *out = def when absent or null. */
static int get_int(const char *src, const cJSON *obj, const char *key, bool required, int def,
                   int *out) {
    const cJSON *v = pd_json_key(obj, key);
    if (!v)
        return required ? pd_json_missing(src, key) : (*out = def, PD_OK);
    return as_int(src, key, v, out);
}

static int get_double(const char *src, const cJSON *obj, const char *key, bool required, double def,
                      double *out) {
    if (!pd_json_key(obj, key))
        return required ? pd_json_missing(src, key) : (*out = def, PD_OK);
    return pd_json_number(src, obj, key, out);
}

static int get_bool(const char *src, const cJSON *obj, const char *key, bool def, bool *out) {
    *out = def;
    return pd_json_bool(src, obj, key, out);
}

/* *out = NULL when absent or null. */
static int get_string(const char *src, const cJSON *obj, const char *key, const char **out) {
    *out = NULL;
    return pd_json_string(src, obj, key, out);
}

static int check_range(const char *src, const char *key, long long v, long long lo, long long hi) {
    if (v < lo || v > hi)
        return pd_errorf(PD_ERANGE, "%s: key '%s' is %lld, must be in [%lld, %lld]", src, key, v,
                         lo, hi);
    return PD_OK;
}

static int add_eos(const char *src, struct pd_model_config *c, int id) {
    if (id < 0)
        return pd_errorf(PD_ERANGE, "%s: eos_token_id %d is negative", src, id);
    for (int i = 0; i < c->n_eos_token_ids; i++)
        if (c->eos_token_ids[i] == id)
            return PD_OK;
    if (c->n_eos_token_ids >= PD_MAX_EOS_IDS)
        return pd_errorf(PD_ERANGE, "%s: more than %d distinct eos_token_id values", src,
                         PD_MAX_EOS_IDS);
    c->eos_token_ids[c->n_eos_token_ids++] = id;
    return PD_OK;
}

/* eos_token_id: an int, a list of ints, or null. */
static int parse_eos(const char *src, const cJSON *root, struct pd_model_config *c) {
    const cJSON *v = pd_json_key(root, "eos_token_id");
    int rc, id;
    if (!v)
        return PD_OK;
    if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsNumber(e))
                return pd_errorf(PD_EINVAL,
                                 "%s: key 'eos_token_id' must be an integer or a list of "
                                 "integers, found %s in the list",
                                 src, pd_json_kind(e));
            if ((rc = as_int(src, "eos_token_id", e, &id)) != PD_OK ||
                (rc = add_eos(src, c, id)) != PD_OK)
                return rc;
        }
        return PD_OK;
    }
    if (!cJSON_IsNumber(v))
        return pd_errorf(PD_EINVAL,
                         "%s: key 'eos_token_id' must be an integer or a list of integers, got %s",
                         src, pd_json_kind(v));
    if ((rc = as_int(src, "eos_token_id", v, &id)) != PD_OK)
        return rc;
    return add_eos(src, c, id);
}

/* A token id: int >= 0; null or -1 mean none (-1); absent means def. */
static int get_token_id(const char *src, const cJSON *root, const char *key, int def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    int rc;
    if (v && cJSON_IsNull(v)) {
        *out = -1;
        return PD_OK;
    }
    if ((rc = get_int(src, root, key, false, def, out)) != PD_OK)
        return rc;
    if (*out < -1) /* -1 is how some older configs say "none" */
        return pd_errorf(PD_ERANGE, "%s: key '%s' is %d, must be >= 0 (or -1/null for none)", src,
                         key, *out);
    return PD_OK;
}

static cJSON *parse_root(const char *src, const char *json, size_t len, int *rc) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t off = end && end >= json ? (size_t)(end - json) : 0;
        *rc = pd_errorf(PD_EFORMAT, "%s: not valid JSON (parse error near byte %zu)", src, off);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        *rc = pd_errorf(PD_EFORMAT, "%s: top level must be a JSON object, got %s", src,
                        pd_json_kind(root));
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static int parse_arch(const char *src, const cJSON *root, enum pd_arch *arch,
                      enum pd_vl_family *vl) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const char *model_type;
    int rc;
    if (!list)
        return pd_json_missing(src, "architectures");
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < 1 ||
        !cJSON_IsString(cJSON_GetArrayItem(list, 0)))
        return pd_errorf(PD_EINVAL,
                         "%s: key 'architectures' must be a non-empty list of strings, e.g. "
                         "[\"LlamaForCausalLM\"]",
                         src);
    const char *name = cJSON_GetArrayItem(list, 0)->valuestring, *want_type = NULL;
    int found = -1;
    *vl = PD_VL_NONE;
    for (int a = 0; a < PD_ARCH_COUNT; a++)
        if (strcmp(name, arch_info[a].hf_name) == 0)
            found = a, want_type = arch_info[a].model_type;
    for (int v = PD_VL_QWEN2; v <= PD_VL_QWEN2_5; v++)
        if (strcmp(name, vl_info[v].hf_name) == 0) {
            found = PD_ARCH_QWEN2;
            *vl = (enum pd_vl_family)v;
            want_type = vl_info[v].model_type;
        }
    if (found < 0)
        return pd_errorf(PD_EUNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)",
                         src, name, pd_arch_supported_list);
    if ((rc = get_string(src, root, "model_type", &model_type)) != PD_OK)
        return rc;
    if (model_type && strcmp(model_type, want_type) != 0)
        return pd_errorf(PD_EMISMATCH,
                         "%s: architectures[0] is '%s' (model_type '%s') but model_type is '%s'",
                         src, name, want_type, model_type);
    *arch = (enum pd_arch)found;
    return PD_OK;
}

/* M-RoPE's mrope_section from the rope object rs (transformers' default 16, 24, 24 when absent),
 * which must split the head's head_dim / 2 frequencies; any other scaling is refused. */
static int parse_mrope(const char *src, const char *key, const cJSON *rs,
                       struct pd_model_config *c) {
    static const int dflt[3] = {16, 24, 24};
    const cJSON *sec = rs ? pd_json_key(rs, "mrope_section") : NULL;
    const char *type = NULL;
    int rc;
    int64_t sum = 0; /* of three ints: no overflow */
    if (rs && (rc = get_string(src, rs, "rope_type", &type)) != PD_OK)
        return rc;
    if (type && strcmp(type, "default") != 0 && strcmp(type, "mrope") != 0)
        return pd_errorf(PD_EUNSUPPORTED,
                         "%s: %s.rope_type '%s' with M-RoPE is not supported (supported: default)",
                         src, key, type);
    if (sec && (!cJSON_IsArray(sec) || cJSON_GetArraySize(sec) != 3))
        return pd_errorf(PD_EINVAL, "%s: %s.mrope_section must be a list of 3 integers, got %s",
                         src, key, pd_json_kind(sec));
    for (int i = 0; i < 3; i++) {
        c->mrope_section[i] = dflt[i];
        if (sec && (rc = as_int(src, "mrope_section", cJSON_GetArrayItem(sec, i),
                                &c->mrope_section[i])) != PD_OK)
            return rc;
        if (c->mrope_section[i] < 0)
            return pd_errorf(PD_ERANGE, "%s: %s.mrope_section[%d] is %d", src, key, i,
                             c->mrope_section[i]);
        sum += c->mrope_section[i];
    }
    if (sum * 2 != c->head_dim)
        return pd_errorf(PD_EINVAL, "%s: %s.mrope_section %d + %d + %d must be head_dim / 2 = %d",
                         src, key, c->mrope_section[0], c->mrope_section[1], c->mrope_section[2],
                         c->head_dim / 2);
    if (!(c->rope_theta > 0))
        return pd_errorf(PD_ERANGE, "%s: key 'rope_theta' is %g, must be > 0", src, c->rope_theta);
    return PD_OK;
}

/* rope_theta and rope scaling, from "rope_scaling" (4.x) or "rope_parameters" (5.x). */
static int parse_rope(const char *src, const cJSON *root, struct pd_model_config *c) {
    const cJSON *rs = pd_json_key(root, "rope_scaling");
    const char *key = "rope_scaling";
    const char *type = NULL;
    int rc;
    if (!rs) {
        rs = pd_json_key(root, "rope_parameters");
        key = "rope_parameters";
    }
    if ((rc = get_double(src, root, "rope_theta", false, 10000.0, &c->rope_theta)) != PD_OK)
        return rc;
    memset(&c->rope_scaling, 0, sizeof(c->rope_scaling));
    c->rope_scaling.type = PD_ROPE_DEFAULT;
    if (!rs && c->vl != PD_VL_NONE)
        return parse_mrope(src, key, NULL, c);
    if (!rs)
        goto check_theta;
    if (!cJSON_IsObject(rs))
        return pd_errorf(PD_EINVAL, "%s: key '%s' must be an object or null, got %s", src, key,
                         pd_json_kind(rs));
    if ((rc = get_double(src, rs, "rope_theta", false, c->rope_theta, &c->rope_theta)) != PD_OK)
        return rc;
    if (c->vl != PD_VL_NONE) /* M-RoPE: its sections, the rest as the default rope */
        return parse_mrope(src, key, rs, c);
    if ((rc = get_string(src, rs, "rope_type", &type)) != PD_OK)
        return rc;
    if (!type && (rc = get_string(src, rs, "type", &type)) != PD_OK)
        return rc;
    if (!type || strcmp(type, "default") == 0)
        goto check_theta;
    if (strcmp(type, "llama3") != 0)
        return pd_errorf(PD_EUNSUPPORTED,
                         "%s: %s type '%s' is not supported (supported: default, llama3)", src, key,
                         type);
    struct pd_rope_scaling *r = &c->rope_scaling;
    char sub[160]; /* messages about inner keys read "config.json: rope_scaling: ..." */
    snprintf(sub, sizeof(sub), "%s: %s", src, key);
    r->type = PD_ROPE_LLAMA3;
    if ((rc = get_double(sub, rs, "factor", true, 0, &r->factor)) != PD_OK ||
        (rc = get_double(sub, rs, "low_freq_factor", true, 0, &r->low_freq_factor)) != PD_OK ||
        (rc = get_double(sub, rs, "high_freq_factor", true, 0, &r->high_freq_factor)) != PD_OK ||
        (rc = get_int(sub, rs, "original_max_position_embeddings", false,
                      c->max_position_embeddings, &r->original_max_position_embeddings)) != PD_OK)
        return rc;
    if (!(r->factor >= 1.0))
        return pd_errorf(PD_ERANGE, "%s: %s.factor is %g, must be >= 1", src, key, r->factor);
    if (!(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor))
        return pd_errorf(PD_ERANGE,
                         "%s: %s needs 0 < low_freq_factor < high_freq_factor, got %g and %g", src,
                         key, r->low_freq_factor, r->high_freq_factor);
    if ((rc = check_range(src, "original_max_position_embeddings",
                          r->original_max_position_embeddings, 1, INT_MAX)) != PD_OK)
        return rc;
check_theta:
    if (!(c->rope_theta > 0))
        return pd_errorf(PD_ERANGE, "%s: key 'rope_theta' is %g, must be > 0", src, c->rope_theta);
    return PD_OK;
}

/* transformers 5 writes a vision-language model's language keys under "text_config": they are
 * copied over the top level (model_type and architectures stay the checkpoint's), so the rest of
 * the parser reads one object for both layouts. A "text_config" inside it means nothing and is
 * skipped: copied over the top level it would replace, and free, the object being read. */
static int merge_text_config(const char *src, cJSON *root) {
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!tc || cJSON_IsNull(tc))
        return PD_OK;
    if (!cJSON_IsObject(tc))
        return pd_errorf(PD_EINVAL, "%s: key 'text_config' must be an object, got %s", src,
                         pd_json_kind(tc));
    const cJSON *e;
    cJSON_ArrayForEach(e, tc) {
        if (strcmp(e->string, "model_type") == 0 || strcmp(e->string, "architectures") == 0 ||
            strcmp(e->string, "text_config") == 0)
            continue;
        cJSON *copy = cJSON_Duplicate(e, 1);
        if (!copy)
            return PD_ENOMEM;
        if (cJSON_GetObjectItemCaseSensitive(root, e->string))
            cJSON_ReplaceItemInObjectCaseSensitive(root, e->string, copy);
        else
            cJSON_AddItemToObject(root, e->string, copy);
    }
    return PD_OK;
}

static int parse_config(const char *src, const char *json, size_t len,
                        struct pd_model_config *out) {
    struct pd_model_config c;
    const struct arch_info *ai;
    const char *s;
    bool b;
    int rc;
    cJSON *root = parse_root(src, json, len, &rc);
    if (!root)
        return rc;
    memset(&c, 0, sizeof(c));
    if ((rc = parse_arch(src, root, &c.arch, &c.vl)) != PD_OK)
        goto out;
    ai = &arch_info[c.arch];
    c.image_token_id = c.vision_start_token_id = c.vision_end_token_id = -1;
    if (c.vl != PD_VL_NONE) {
        if ((rc = get_token_id(src, root, "image_token_id", 151655, &c.image_token_id)) ||
            (rc = get_token_id(src, root, "vision_start_token_id", 151652,
                               &c.vision_start_token_id)) ||
            (rc = get_token_id(src, root, "vision_end_token_id", 151653, &c.vision_end_token_id)) ||
            (rc = merge_text_config(src, root)) != PD_OK)
            goto out;
    }

    /* required, in the order a reader of config.json would look for them */
    static const struct {
        const char *key;
        size_t off;
        int hi;
    } req[] = {
        {"vocab_size", offsetof(struct pd_model_config, vocab_size), PD_MAX_DIM},
        {"hidden_size", offsetof(struct pd_model_config, hidden_size), PD_MAX_DIM},
        {"intermediate_size", offsetof(struct pd_model_config, intermediate_size), PD_MAX_DIM},
        {"num_hidden_layers", offsetof(struct pd_model_config, num_hidden_layers), 65536},
        {"num_attention_heads", offsetof(struct pd_model_config, num_attention_heads), 65536},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(req); i++) {
        int *field = (int *)((char *)&c + req[i].off);
        if ((rc = get_int(src, root, req[i].key, true, 0, field)) != PD_OK ||
            (rc = check_range(src, req[i].key, *field, 1, req[i].hi)) != PD_OK)
            goto out;
    }
    if ((rc = get_double(src, root, "rms_norm_eps", true, 0, &c.rms_norm_eps)) != PD_OK)
        goto out;
    if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1)) {
        rc = pd_errorf(PD_ERANGE, "%s: key 'rms_norm_eps' is %g, must be in (0, 1)", src,
                       c.rms_norm_eps);
        goto out;
    }

    /* optional, transformers' defaults */
    int kv_def = ai->kv_heads_absent;
    if (cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads") || kv_def == 0)
        kv_def = c.num_attention_heads; /* explicit null means "as many as attention heads" */
    if ((rc = get_int(src, root, "num_key_value_heads", false, kv_def, &c.num_key_value_heads)) !=
            PD_OK ||
        (rc = check_range(src, "num_key_value_heads", c.num_key_value_heads, 1, 65536)) != PD_OK)
        goto out;
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
        rc = pd_errorf(PD_EINVAL,
                       "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads "
                       "(%d)",
                       src, c.num_attention_heads, c.num_key_value_heads);
        goto out;
    }
    if (pd_json_key(root, "head_dim") || ai->head_dim_absent) {
        if ((rc = get_int(src, root, "head_dim", false, ai->head_dim_absent, &c.head_dim)) !=
                PD_OK ||
            (rc = check_range(src, "head_dim", c.head_dim, 1, 65536)) != PD_OK)
            goto out;
    } else {
        if (c.hidden_size % c.num_attention_heads != 0) {
            rc = pd_errorf(PD_EINVAL,
                           "%s: hidden_size (%d) must be a multiple of num_attention_heads (%d) "
                           "when head_dim is not given",
                           src, c.hidden_size, c.num_attention_heads);
            goto out;
        }
        c.head_dim = c.hidden_size / c.num_attention_heads;
        /* the bound a given head_dim has: else a config we accept would print (to_json) a
         * head_dim our own parser refuses */
        if (c.head_dim > 65536) {
            rc = pd_errorf(PD_ERANGE,
                           "%s: hidden_size / num_attention_heads (%d / %d) is a head_dim of %d, "
                           "must be in [1, 65536]",
                           src, c.hidden_size, c.num_attention_heads, c.head_dim);
            goto out;
        }
    }
    if ((long long)c.num_attention_heads * c.head_dim > PD_MAX_DIM) {
        rc = pd_errorf(PD_ERANGE, "%s: num_attention_heads x head_dim (%d x %d) is too large", src,
                       c.num_attention_heads, c.head_dim);
        goto out;
    }
    if ((rc = get_int(src, root, "max_position_embeddings", false, ai->max_pos_absent,
                      &c.max_position_embeddings)) != PD_OK ||
        (rc = check_range(src, "max_position_embeddings", c.max_position_embeddings, 1, INT_MAX)) !=
            PD_OK)
        goto out;
    if ((rc = parse_rope(src, root, &c)) != PD_OK)
        goto out;
    if ((rc = get_bool(src, root, "tie_word_embeddings", false, &c.tie_word_embeddings)) != PD_OK)
        goto out;

    switch (c.arch) {
    case PD_ARCH_LLAMA:
    case PD_ARCH_QWEN3: rc = get_bool(src, root, "attention_bias", false, &c.attention_bias); break;
    case PD_ARCH_QWEN2: c.attention_bias = true; break;
    case PD_ARCH_MISTRAL: c.attention_bias = false; break;
    }
    if (rc != PD_OK)
        goto out;
    c.qk_norm = c.arch == PD_ARCH_QWEN3;
    if ((rc = get_bool(src, root, "mlp_bias", false, &b)) != PD_OK)
        goto out;
    if (b) {
        rc = pd_errorf(PD_EUNSUPPORTED, "%s: mlp_bias true is not supported", src);
        goto out;
    }
    if ((rc = get_string(src, root, "hidden_act", &s)) != PD_OK)
        goto out;
    if (s && strcmp(s, "silu") != 0) {
        rc = pd_errorf(PD_EUNSUPPORTED, "%s: hidden_act '%s' is not supported (supported: silu)",
                       src, s);
        goto out;
    }

    /* sliding window: Mistral's applies when set (null = none); Qwen's only with
     * use_sliding_window true. Llama has none and ignores the key, as transformers does. */
    c.sliding_window = 0;
    c.max_window_layers = 0;
    if (c.arch == PD_ARCH_MISTRAL || c.arch == PD_ARCH_QWEN2 || c.arch == PD_ARCH_QWEN3) {
        bool use = true;
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
        if (c.arch != PD_ARCH_MISTRAL &&
            (rc = get_bool(src, root, "use_sliding_window", false, &use)) != PD_OK)
            goto out;
        if (use && !(sw && cJSON_IsNull(sw))) {
            if ((rc = get_int(src, root, "sliding_window", false, PD_DEFAULT_SLIDING_WINDOW,
                              &c.sliding_window)) != PD_OK ||
                (rc = check_range(src, "sliding_window", c.sliding_window, 1, INT_MAX)) != PD_OK)
                goto out;
            /* transformers' Qwen2/Qwen3: layer i slides when i >= max_window_layers (default
             * 28, so a small model with the key absent slides nowhere) */
            if (c.arch != PD_ARCH_MISTRAL &&
                ((rc = get_int(src, root, "max_window_layers", false, 28, &c.max_window_layers)) !=
                     PD_OK ||
                 (rc = check_range(src, "max_window_layers", c.max_window_layers, 0, INT_MAX)) !=
                     PD_OK))
                goto out;
        }
    }

    /* torch_dtype (4.x) or dtype (5.x); absent means float32, as transformers assumes */
    c.torch_dtype = PD_DTYPE_F32;
    if ((rc = get_string(src, root, "torch_dtype", &s)) != PD_OK)
        goto out;
    if (!s && (rc = get_string(src, root, "dtype", &s)) != PD_OK)
        goto out;
    if (s && (rc = pd_dtype_parse_torch(s, &c.torch_dtype)) != PD_OK) {
        rc = pd_error_wrap(rc, "%s", src);
        goto out;
    }

    if ((rc = get_token_id(src, root, "bos_token_id", ai->bos_absent, &c.bos_token_id)) != PD_OK ||
        (rc = get_token_id(src, root, "pad_token_id", -1, &c.pad_token_id)) != PD_OK)
        goto out;
    if (!cJSON_GetObjectItemCaseSensitive(root, "eos_token_id") && ai->eos_absent >= 0)
        rc = add_eos(src, &c, ai->eos_absent);
    else
        rc = parse_eos(src, root, &c);
    if (rc != PD_OK)
        goto out;

    c.gen_temperature = -1;
    c.gen_top_p = -1;
    c.gen_top_k = -1;
    c.gen_repetition_penalty = -1;
    *out = c;
    rc = PD_OK;
out:
    cJSON_Delete(root);
    return rc;
}

int pd_model_config_parse(const char *json, size_t len, struct pd_model_config *out) {
    return parse_config("config.json", json, len, out);
}

static int parse_generation(const char *src, const char *json, size_t len,
                            struct pd_model_config *cfg) {
    struct pd_model_config c = *cfg;
    int rc;
    cJSON *root = parse_root(src, json, len, &rc);
    if (!root)
        return rc;
    if ((rc = parse_eos(src, root, &c)) != PD_OK)
        goto out;
    /* config.json's ids win; generation_config.json fills what it left open */
    if (c.bos_token_id < 0 &&
        (rc = get_token_id(src, root, "bos_token_id", -1, &c.bos_token_id)) != PD_OK)
        goto out;
    if (c.pad_token_id < 0 &&
        (rc = get_token_id(src, root, "pad_token_id", -1, &c.pad_token_id)) != PD_OK)
        goto out;
    if ((rc = get_double(src, root, "temperature", false, c.gen_temperature, &c.gen_temperature)) !=
            PD_OK ||
        (rc = get_double(src, root, "top_p", false, c.gen_top_p, &c.gen_top_p)) != PD_OK ||
        (rc = get_int(src, root, "top_k", false, c.gen_top_k, &c.gen_top_k)) != PD_OK ||
        (rc = get_double(src, root, "repetition_penalty", false, c.gen_repetition_penalty,
                         &c.gen_repetition_penalty)) != PD_OK)
        goto out;
    if (pd_json_key(root, "temperature") && c.gen_temperature < 0) {
        rc = pd_errorf(PD_ERANGE, "%s: key 'temperature' is %g, must be >= 0", src,
                       c.gen_temperature);
        goto out;
    }
    if (pd_json_key(root, "top_p") && !(c.gen_top_p >= 0 && c.gen_top_p <= 1)) {
        rc = pd_errorf(PD_ERANGE, "%s: key 'top_p' is %g, must be in [0, 1]", src, c.gen_top_p);
        goto out;
    }
    if (pd_json_key(root, "top_k") && c.gen_top_k < 0) {
        rc = pd_errorf(PD_ERANGE, "%s: key 'top_k' is %d, must be >= 0", src, c.gen_top_k);
        goto out;
    }
    if (pd_json_key(root, "repetition_penalty") && !(c.gen_repetition_penalty > 0)) {
        rc = pd_errorf(PD_ERANGE, "%s: key 'repetition_penalty' is %g, must be > 0", src,
                       c.gen_repetition_penalty);
        goto out;
    }
    *cfg = c;
out:
    cJSON_Delete(root);
    return rc;
}

int pd_generation_config_parse(const char *json, size_t len, struct pd_model_config *cfg) {
    return parse_generation("generation_config.json", json, len, cfg);
}

int pd_model_config_load(const char *dir, struct pd_model_config *out) {
    struct pd_model_config c;
    char *path = NULL, *text = NULL;
    size_t plen = strlen(dir) + sizeof("/generation_config.json"), len;
    int rc;
    if (!(path = pd_malloc(plen)))
        return pd_error_wrap(PD_ENOMEM, "loading the config of %s", dir);
    snprintf(path, plen, "%s/config.json", dir);
    if ((rc = pd_file_read_all(path, &text, &len)) != PD_OK)
        goto out;
    if ((rc = parse_config(path, text, len, &c)) != PD_OK)
        goto out;
    pd_free(text);
    text = NULL;
    snprintf(path, plen, "%s/generation_config.json", dir);
    rc = pd_file_read_all(path, &text, &len);
    if (rc == PD_ENOENT) {
        rc = PD_OK; /* optional: many repos have none */
    } else if (rc == PD_OK) {
        rc = parse_generation(path, text, len, &c);
    }
    if (rc == PD_OK)
        *out = c;
out:
    pd_free(text);
    pd_free(path);
    return rc;
}

/* ---- writing ---- */

/* cJSON allocates with malloc; hand the caller pd_malloc'ed text so pd_free is right. */
static char *finish_json(cJSON *root, const char *what) {
    char *text = NULL, *copy = NULL;
    if (root)
        text = cJSON_Print(root);
    if (text)
        copy = pd_strdup(text);
    if (!copy)
        pd_errorf(PD_ENOMEM, "out of memory writing %s", what);
    cJSON_free(text);
    cJSON_Delete(root);
    return copy;
}

static cJSON *id_or_null(int id) {
    return id >= 0 ? cJSON_CreateNumber(id) : cJSON_CreateNull();
}

static cJSON *eos_json(const struct pd_model_config *cfg) {
    if (cfg->n_eos_token_ids == 0)
        return cJSON_CreateNull();
    if (cfg->n_eos_token_ids == 1)
        return cJSON_CreateNumber(cfg->eos_token_ids[0]);
    return cJSON_CreateIntArray(cfg->eos_token_ids, cfg->n_eos_token_ids);
}

/* Keys in sorted order, as transformers writes them (json.dumps(sort_keys=True)). cJSON
 * allocation failures are caught at the end: adding NULL to an object is a no-op that leaves
 * the key out, and the final check sees the missing key count. */
char *pd_model_config_to_json(const struct pd_model_config *cfg) {
    if ((unsigned)cfg->arch >= PD_ARCH_COUNT) {
        pd_errorf(PD_EINVAL, "writing config.json: unknown architecture %d", (int)cfg->arch);
        return NULL;
    }
    const struct arch_info *ai = &arch_info[cfg->arch];
    bool qwen = cfg->arch == PD_ARCH_QWEN2 || cfg->arch == PD_ARCH_QWEN3;
    int expect = 0;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return finish_json(NULL, "config.json");
#define ADD(key, item) (expect++, cJSON_AddItemToObject(o, key, item))
    bool vl = cfg->vl == PD_VL_QWEN2 || cfg->vl == PD_VL_QWEN2_5;
    const char *arch_name = vl ? vl_info[cfg->vl].hf_name : ai->hf_name;
    ADD("architectures", cJSON_CreateStringArray(&arch_name, 1));
    if (cfg->arch == PD_ARCH_LLAMA || cfg->arch == PD_ARCH_QWEN3)
        ADD("attention_bias", cJSON_CreateBool(cfg->attention_bias));
    ADD("bos_token_id", id_or_null(cfg->bos_token_id));
    ADD("eos_token_id", eos_json(cfg));
    ADD("head_dim", cJSON_CreateNumber(cfg->head_dim));
    ADD("hidden_act", cJSON_CreateString("silu"));
    ADD("hidden_size", cJSON_CreateNumber(cfg->hidden_size));
    ADD("intermediate_size", cJSON_CreateNumber(cfg->intermediate_size));
    ADD("max_position_embeddings", cJSON_CreateNumber(cfg->max_position_embeddings));
    if (qwen && cfg->sliding_window > 0)
        ADD("max_window_layers", cJSON_CreateNumber(cfg->max_window_layers));
    ADD("model_type", cJSON_CreateString(vl ? vl_info[cfg->vl].model_type : ai->model_type));
    if (vl) { /* the Hub's layout: the language keys at the top level */
        ADD("image_token_id", cJSON_CreateNumber(cfg->image_token_id));
        ADD("vision_start_token_id", cJSON_CreateNumber(cfg->vision_start_token_id));
        ADD("vision_end_token_id", cJSON_CreateNumber(cfg->vision_end_token_id));
    }
    ADD("num_attention_heads", cJSON_CreateNumber(cfg->num_attention_heads));
    ADD("num_hidden_layers", cJSON_CreateNumber(cfg->num_hidden_layers));
    ADD("num_key_value_heads", cJSON_CreateNumber(cfg->num_key_value_heads));
    ADD("pad_token_id", id_or_null(cfg->pad_token_id));
    ADD("rms_norm_eps", cJSON_CreateNumber(cfg->rms_norm_eps));
    if (cfg->rope_scaling.type == PD_ROPE_LLAMA3) {
        const struct pd_rope_scaling *r = &cfg->rope_scaling;
        cJSON *rs = cJSON_CreateObject();
        if (rs) {
            int n = 0;
            n += cJSON_AddNumberToObject(rs, "factor", r->factor) != NULL;
            n += cJSON_AddNumberToObject(rs, "high_freq_factor", r->high_freq_factor) != NULL;
            n += cJSON_AddNumberToObject(rs, "low_freq_factor", r->low_freq_factor) != NULL;
            n += cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                         r->original_max_position_embeddings) != NULL;
            n += cJSON_AddStringToObject(rs, "rope_type", "llama3") != NULL;
            if (n != 5) {
                cJSON_Delete(rs);
                rs = NULL;
            }
        }
        ADD("rope_scaling", rs);
    } else if (vl) {
        cJSON *rs = cJSON_CreateObject();
        if (rs && (!cJSON_AddStringToObject(rs, "type", "mrope") ||
                   !cJSON_AddItemToObject(rs, "mrope_section",
                                          cJSON_CreateIntArray(cfg->mrope_section, 3)))) {
            cJSON_Delete(rs);
            rs = NULL;
        }
        ADD("rope_scaling", rs);
    } else {
        ADD("rope_scaling", cJSON_CreateNull());
    }
    ADD("rope_theta", cJSON_CreateNumber(cfg->rope_theta));
    if (cfg->arch != PD_ARCH_LLAMA)
        ADD("sliding_window",
            cfg->sliding_window > 0 ? cJSON_CreateNumber(cfg->sliding_window) : cJSON_CreateNull());
    ADD("tie_word_embeddings", cJSON_CreateBool(cfg->tie_word_embeddings));
    ADD("torch_dtype", cJSON_CreateString(pd_dtype_torch_name(cfg->torch_dtype)));
    if (qwen)
        ADD("use_sliding_window", cJSON_CreateBool(cfg->sliding_window > 0));
    ADD("vocab_size", cJSON_CreateNumber(cfg->vocab_size));
#undef ADD
    if (cJSON_GetArraySize(o) != expect) {
        cJSON_Delete(o);
        o = NULL;
    }
    return finish_json(o, "config.json");
}

char *pd_generation_config_to_json(const struct pd_model_config *cfg) {
    int expect = 0;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return finish_json(NULL, "generation_config.json");
    bool sampling = cfg->gen_temperature >= 0 || cfg->gen_top_p >= 0 || cfg->gen_top_k >= 0;
#define ADD(key, item) (expect++, cJSON_AddItemToObject(o, key, item))
    if (cfg->bos_token_id >= 0)
        ADD("bos_token_id", cJSON_CreateNumber(cfg->bos_token_id));
    /* GenerationConfig warns about sampling knobs set while do_sample is false */
    if (sampling)
        ADD("do_sample", cJSON_CreateTrue());
    if (cfg->n_eos_token_ids > 0)
        ADD("eos_token_id", eos_json(cfg));
    if (cfg->pad_token_id >= 0)
        ADD("pad_token_id", cJSON_CreateNumber(cfg->pad_token_id));
    if (cfg->gen_repetition_penalty >= 0)
        ADD("repetition_penalty", cJSON_CreateNumber(cfg->gen_repetition_penalty));
    if (cfg->gen_temperature >= 0)
        ADD("temperature", cJSON_CreateNumber(cfg->gen_temperature));
    if (cfg->gen_top_k >= 0)
        ADD("top_k", cJSON_CreateNumber(cfg->gen_top_k));
    if (cfg->gen_top_p >= 0)
        ADD("top_p", cJSON_CreateNumber(cfg->gen_top_p));
#undef ADD
    if (cJSON_GetArraySize(o) != expect) {
        cJSON_Delete(o);
        o = NULL;
    }
    return finish_json(o, "generation_config.json");
}

/* ---- the tensors a config implies ---- */

/* layer < 0: a top-level tensor named leaf; else model.layers.<layer>.<leaf>. */
static void spec_set(struct pd_tensor_spec *s, int ndim, int64_t d0, int64_t d1, int layer,
                     const char *leaf) {
    if (layer < 0)
        snprintf(s->name, sizeof(s->name), "%s", leaf);
    else
        snprintf(s->name, sizeof(s->name), "model.layers.%d.%s", layer, leaf);
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = ndim == 2 ? d1 : 0;
}

/* Module registration order of transformers' *ForCausalLM, which is the state_dict order that
 * save_pretrained shards by: embed_tokens; per layer self_attn (q, k, v, o, then Qwen3's
 * q_norm, k_norm), mlp (gate, up, down), input_layernorm, post_attention_layernorm; norm;
 * lm_head. Llama and Qwen3 put a bias on o_proj too when attention_bias is set; Qwen2 only on
 * q/k/v. */
int pd_model_tensor_specs(const struct pd_model_config *cfg, struct pd_tensor_spec **out,
                          size_t *n_out) {
    if ((unsigned)cfg->arch >= PD_ARCH_COUNT || cfg->num_hidden_layers < 0 ||
        cfg->num_hidden_layers > 65536)
        return pd_errorf(PD_EINVAL, "tensor list: config is not valid (arch %d, %d layers)",
                         (int)cfg->arch, cfg->num_hidden_layers);
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t hd = cfg->head_dim, q = (int64_t)cfg->num_attention_heads * hd;
    const int64_t kv = (int64_t)cfg->num_key_value_heads * hd;
    const bool qkv_bias = cfg->attention_bias || cfg->arch == PD_ARCH_QWEN2;
    const bool o_bias = cfg->attention_bias && cfg->arch != PD_ARCH_QWEN2;
    const size_t per_layer = 9 + (qkv_bias ? 3 : 0) + (o_bias ? 1 : 0) + (cfg->qk_norm ? 2 : 0);
    const size_t n = 2 + (size_t)cfg->num_hidden_layers * per_layer + !cfg->tie_word_embeddings;
    struct pd_tensor_spec *s = pd_calloc(n, sizeof(*s));
    if (!s)
        return pd_error_wrap(PD_ENOMEM, "tensor list of %zu tensors", n);
    size_t k = 0;
    spec_set(&s[k++], 2, V, H, -1, "model.embed_tokens.weight");
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        spec_set(&s[k++], 2, q, H, l, "self_attn.q_proj.weight");
        if (qkv_bias)
            spec_set(&s[k++], 1, q, 0, l, "self_attn.q_proj.bias");
        spec_set(&s[k++], 2, kv, H, l, "self_attn.k_proj.weight");
        if (qkv_bias)
            spec_set(&s[k++], 1, kv, 0, l, "self_attn.k_proj.bias");
        spec_set(&s[k++], 2, kv, H, l, "self_attn.v_proj.weight");
        if (qkv_bias)
            spec_set(&s[k++], 1, kv, 0, l, "self_attn.v_proj.bias");
        spec_set(&s[k++], 2, H, q, l, "self_attn.o_proj.weight");
        if (o_bias)
            spec_set(&s[k++], 1, H, 0, l, "self_attn.o_proj.bias");
        if (cfg->qk_norm) {
            spec_set(&s[k++], 1, hd, 0, l, "self_attn.q_norm.weight");
            spec_set(&s[k++], 1, hd, 0, l, "self_attn.k_norm.weight");
        }
        spec_set(&s[k++], 2, I, H, l, "mlp.gate_proj.weight");
        spec_set(&s[k++], 2, I, H, l, "mlp.up_proj.weight");
        spec_set(&s[k++], 2, H, I, l, "mlp.down_proj.weight");
        spec_set(&s[k++], 1, H, 0, l, "input_layernorm.weight");
        spec_set(&s[k++], 1, H, 0, l, "post_attention_layernorm.weight");
    }
    spec_set(&s[k++], 1, H, 0, -1, "model.norm.weight");
    if (!cfg->tie_word_embeddings)
        spec_set(&s[k++], 2, V, H, -1, "lm_head.weight");
    PD_ASSERT(k == n);
    *out = s;
    *n_out = n;
    return PD_OK;
}
