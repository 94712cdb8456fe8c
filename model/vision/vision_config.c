/*
 * vision_config.c — config.json's vision_config for Qwen2-VL and Qwen2.5-VL, with transformers'
 * defaults for absent keys (Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig) and the Hub's older
 * spelling in_chans. Everything the encoder divides by or indexes with is checked here, so the
 * encoder can trust the config: widths that split into heads of a multiple of 4 (the 2-D rotary
 * gives a quarter of a head to each axis and each half), Qwen2.5-VL windows of at least one merge
 * window, full-attention block indexes inside the depth.
 */
#include "model/vision/vision_encoder.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/json_keys.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#define MAX_WIDTH (1 << 16)
#define MAX_DEPTH 1024

static int get_int(const char *src, const cJSON *vc, const char *key, int64_t lo, int64_t hi,
                   int *v) {
    int64_t x = *v;
    char name[64];
    snprintf(name, sizeof(name), "vision_config.%s", key);
    const cJSON *e = pd_json_key(vc, key);
    if (!e)
        return PD_OK;
    int rc = pd_json_as_int(src, name, e, lo, hi, &x);
    if (rc == PD_OK)
        *v = (int)x;
    return rc;
}

static int parse_act(const char *src, const cJSON *vc, struct pd_vision_config *c) {
    const char *act = c->family == PD_VISION_QWEN2_VL ? "quick_gelu" : "silu";
    int rc = pd_json_string(src, vc, "hidden_act", &act);
    if (rc != PD_OK)
        return rc;
    if (c->family == PD_VISION_QWEN2_5_VL) {
        if (strcmp(act, "silu") != 0)
            return pd_errorf(PD_EUNSUPPORTED,
                             "%s: vision_config.hidden_act '%s': the Qwen2.5-VL vision MLP runs "
                             "'silu' only",
                             src, act);
        return PD_OK;
    }
    if (strcmp(act, "quick_gelu") == 0)
        c->act = PD_ACT_QUICK_GELU;
    else if (strcmp(act, "gelu") == 0)
        c->act = PD_ACT_GELU;
    else
        return pd_errorf(PD_EUNSUPPORTED,
                         "%s: vision_config.hidden_act '%s' (supported: quick_gelu, gelu)", src,
                         act);
    return PD_OK;
}

static int parse_fullatt(const char *src, const cJSON *vc, struct pd_vision_config *c) {
    const cJSON *v = pd_json_key(vc, "fullatt_block_indexes");
    if (!v) {
        static const int dflt[] = {7, 15, 23, 31}; /* Qwen2_5_VLVisionConfig's */
        c->n_fullatt = 0;
        for (int i = 0; i < 4; i++)
            if (dflt[i] < c->depth)
                c->fullatt_block_indexes[c->n_fullatt++] = dflt[i];
        return PD_OK;
    }
    if (!cJSON_IsArray(v))
        return pd_errorf(PD_EINVAL,
                         "%s: vision_config.fullatt_block_indexes must be a list, not %s", src,
                         pd_json_kind(v));
    int n = cJSON_GetArraySize(v);
    if (n > PD_VISION_MAX_FULLATT)
        return pd_errorf(PD_ERANGE,
                         "%s: vision_config.fullatt_block_indexes has %d entries (at most %d)", src,
                         n, PD_VISION_MAX_FULLATT);
    c->n_fullatt = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        int64_t x;
        int rc = pd_json_as_int(src, "vision_config.fullatt_block_indexes", e, 0, c->depth - 1, &x);
        if (rc != PD_OK)
            return rc;
        c->fullatt_block_indexes[c->n_fullatt++] = (int)x;
    }
    return PD_OK;
}

static int parse_vision(const char *src, const cJSON *root, struct pd_vision_config *c) {
    const char *mt = NULL;
    int rc = pd_json_string(src, root, "model_type", &mt);
    if (rc != PD_OK)
        return rc;
    if (!mt)
        return pd_json_missing(src, "model_type");
    if (strcmp(mt, "qwen2_vl") == 0)
        c->family = PD_VISION_QWEN2_VL;
    else if (strcmp(mt, "qwen2_5_vl") == 0)
        c->family = PD_VISION_QWEN2_5_VL;
    else
        return pd_errorf(PD_EUNSUPPORTED,
                         "%s: model_type '%s' has no vision encoder (supported: qwen2_vl, "
                         "qwen2_5_vl)",
                         src, mt);
    const cJSON *vc = pd_json_key(root, "vision_config");
    if (!vc)
        return pd_json_missing(src, "vision_config");
    if (!cJSON_IsObject(vc))
        return pd_errorf(PD_EINVAL, "%s: vision_config must be an object, not %s", src,
                         pd_json_kind(vc));
    bool v2 = c->family == PD_VISION_QWEN2_VL;
    /* transformers' defaults */
    c->depth = 32;
    c->embed_dim = v2 ? 1280 : 3584;
    c->num_heads = 16;
    c->out_dim = 3584;
    c->in_channels = 3;
    c->patch_size = 14;
    c->temporal_patch_size = 2;
    c->spatial_merge_size = 2;
    c->window_size = 112;
    c->rope_theta = 10000;
    c->act = PD_ACT_QUICK_GELU;
    int mlp_dim = 3420;
    double mlp_ratio = 4;
    if ((rc = get_int(src, vc, "depth", 1, MAX_DEPTH, &c->depth)) ||
        (rc = get_int(src, vc, "num_heads", 1, 1024, &c->num_heads)) ||
        (rc = get_int(src, vc, "in_chans", 1, 64, &c->in_channels)) ||
        (rc = get_int(src, vc, "in_channels", 1, 64, &c->in_channels)) ||
        (rc = get_int(src, vc, "patch_size", 1, 1024, &c->patch_size)) ||
        (rc = get_int(src, vc, "temporal_patch_size", 1, 64, &c->temporal_patch_size)) ||
        (rc = get_int(src, vc, "spatial_merge_size", 1, 64, &c->spatial_merge_size)))
        return rc;
    if (v2) {
        if ((rc = get_int(src, vc, "embed_dim", 1, MAX_WIDTH, &c->embed_dim)) ||
            (rc = get_int(src, vc, "hidden_size", 1, MAX_WIDTH, &c->out_dim)) ||
            (rc = pd_json_number(src, vc, "mlp_ratio", &mlp_ratio)))
            return rc;
        double m = (double)c->embed_dim * mlp_ratio; /* int(embed_dim * mlp_ratio) */
        if (!(m >= 1 && m <= MAX_WIDTH))
            return pd_errorf(PD_ERANGE, "%s: vision_config.mlp_ratio %g gives an MLP of %g", src,
                             mlp_ratio, m);
        c->mlp_dim = (int)m;
    } else {
        if ((rc = get_int(src, vc, "hidden_size", 1, MAX_WIDTH, &c->embed_dim)) ||
            (rc = get_int(src, vc, "out_hidden_size", 1, MAX_WIDTH, &c->out_dim)) ||
            (rc = get_int(src, vc, "intermediate_size", 1, MAX_WIDTH, &mlp_dim)) ||
            (rc = get_int(src, vc, "window_size", 1, 1 << 20, &c->window_size)) ||
            (rc = parse_fullatt(src, vc, c)))
            return rc;
        c->mlp_dim = mlp_dim;
        if (c->window_size / c->spatial_merge_size / c->patch_size < 1)
            return pd_errorf(PD_EINVAL,
                             "%s: vision_config.window_size %d is smaller than one merge window "
                             "(%d x %d pixels)",
                             src, c->window_size, c->spatial_merge_size * c->patch_size,
                             c->spatial_merge_size * c->patch_size);
    }
    if ((rc = parse_act(src, vc, c)) != PD_OK)
        return rc;
    const cJSON *rp = pd_json_key(vc, "rope_parameters");
    if (rp && (rc = pd_json_number(src, rp, "rope_theta", &c->rope_theta)))
        return rc;
    if (!(c->rope_theta > 0))
        return pd_errorf(PD_ERANGE, "%s: vision_config.rope_parameters.rope_theta %g", src,
                         c->rope_theta);
    if (c->embed_dim % c->num_heads || (c->embed_dim / c->num_heads) % 4)
        return pd_errorf(PD_EINVAL,
                         "%s: vision_config: a width of %d in %d heads must give heads of a "
                         "multiple of 4 values (the 2-D rotary's quarters)",
                         src, c->embed_dim, c->num_heads);
    return PD_OK;
}

int pd_vision_config_parse(const char *json, size_t len, const char *src,
                           struct pd_vision_config *out) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return pd_errorf(PD_EFORMAT, "%s is not valid JSON", src);
    struct pd_vision_config c = {0};
    int rc = cJSON_IsObject(root) ? parse_vision(src, root, &c)
                                  : pd_errorf(PD_EFORMAT, "%s is not a JSON object", src);
    cJSON_Delete(root);
    if (rc == PD_OK)
        *out = c;
    return rc;
}

int pd_vision_config_load(const char *dir, struct pd_vision_config *out) {
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/config.json", dir) >= (int)sizeof(path))
        return pd_errorf(PD_EINVAL, "model path too long");
    char *text;
    size_t len;
    int rc = pd_file_read_all(path, &text, &len);
    if (rc != PD_OK)
        return rc;
    rc = pd_vision_config_parse(text, len, path, out);
    pd_free(text);
    return rc;
}

struct cJSON *pd_vision_config_json(const struct pd_vision_config *c) {
    bool v2 = c->family == PD_VISION_QWEN2_VL;
    if (v2 && c->mlp_dim % c->embed_dim) {
        pd_errorf(PD_EINVAL, "vision_config: an MLP of %d is no mlp_ratio of a width of %d",
                  c->mlp_dim, c->embed_dim);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    const char *act = !v2 ? "silu" : c->act == PD_ACT_GELU ? "gelu" : "quick_gelu";
    cJSON *rope = cJSON_CreateObject();
    bool ok = o && rope && cJSON_AddItemToObject(o, "rope_parameters", rope);
    if (!ok)
        cJSON_Delete(rope);
    ok = ok && cJSON_AddNumberToObject(rope, "rope_theta", c->rope_theta) &&
         cJSON_AddStringToObject(rope, "rope_type", "axial") &&
         cJSON_AddStringToObject(o, "model_type", v2 ? "qwen2_vl" : "qwen2_5_vl") &&
         cJSON_AddNumberToObject(o, "depth", c->depth) &&
         cJSON_AddStringToObject(o, "hidden_act", act) &&
         cJSON_AddNumberToObject(o, "num_heads", c->num_heads) &&
         cJSON_AddNumberToObject(o, "in_channels", c->in_channels) &&
         cJSON_AddNumberToObject(o, "patch_size", c->patch_size) &&
         cJSON_AddNumberToObject(o, "spatial_merge_size", c->spatial_merge_size) &&
         cJSON_AddNumberToObject(o, "temporal_patch_size", c->temporal_patch_size);
    if (ok && v2)
        ok = cJSON_AddNumberToObject(o, "embed_dim", c->embed_dim) &&
             cJSON_AddNumberToObject(o, "hidden_size", c->out_dim) &&
             cJSON_AddNumberToObject(o, "mlp_ratio", c->mlp_dim / c->embed_dim);
    else if (ok)
        ok = cJSON_AddNumberToObject(o, "hidden_size", c->embed_dim) &&
             cJSON_AddNumberToObject(o, "out_hidden_size", c->out_dim) &&
             cJSON_AddNumberToObject(o, "intermediate_size", c->mlp_dim) &&
             cJSON_AddNumberToObject(o, "window_size", c->window_size) &&
             cJSON_AddNumberToObject(o, "tokens_per_second", 2) &&
             cJSON_AddItemToObject(o, "fullatt_block_indexes",
                                   cJSON_CreateIntArray(c->fullatt_block_indexes, c->n_fullatt));
    if (!ok) {
        cJSON_Delete(o);
        pd_errorf(PD_ENOMEM, "writing vision_config");
        return NULL;
    }
    return o;
}

static void spec(struct pd_tensor_spec *s, size_t *n, const char *name, int ndim, int64_t d0,
                 int64_t d1) {
    struct pd_tensor_spec *t = &s[(*n)++];
    snprintf(t->name, sizeof(t->name), "visual.%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

int pd_vision_tensor_specs(const struct pd_vision_config *c, struct pd_tensor_spec **out,
                           size_t *n_out) {
    bool v2 = c->family == PD_VISION_QWEN2_VL;
    int64_t E = c->embed_dim, M = c->mlp_dim, H = E * c->spatial_merge_size * c->spatial_merge_size;
    size_t cap = 8 + (size_t)c->depth * 16, n = 0;
    struct pd_tensor_spec *s = pd_calloc(cap, sizeof(*s));
    if (!s)
        return pd_error_wrap(PD_ENOMEM, "listing the vision encoder's tensors");
    char nm[96];
    spec(s, &n, "patch_embed.proj.weight", 5, E, c->in_channels);
    s[0].shape[2] = c->temporal_patch_size;
    s[0].shape[3] = s[0].shape[4] = c->patch_size;
    for (int l = 0; l < c->depth; l++) {
#define B(suffix, nd, d0, d1)                                                                      \
    snprintf(nm, sizeof(nm), "blocks.%d.%s", l, suffix);                                           \
    spec(s, &n, nm, nd, d0, d1)
        B("norm1.weight", 1, E, 0);
        if (v2) {
            B("norm1.bias", 1, E, 0);
        }
        B("norm2.weight", 1, E, 0);
        if (v2) {
            B("norm2.bias", 1, E, 0);
        }
        B("attn.qkv.weight", 2, 3 * E, E);
        B("attn.qkv.bias", 1, 3 * E, 0);
        B("attn.proj.weight", 2, E, E);
        B("attn.proj.bias", 1, E, 0);
        if (v2) {
            B("mlp.fc1.weight", 2, M, E);
            B("mlp.fc1.bias", 1, M, 0);
            B("mlp.fc2.weight", 2, E, M);
            B("mlp.fc2.bias", 1, E, 0);
        } else {
            B("mlp.gate_proj.weight", 2, M, E);
            B("mlp.gate_proj.bias", 1, M, 0);
            B("mlp.up_proj.weight", 2, M, E);
            B("mlp.up_proj.bias", 1, M, 0);
            B("mlp.down_proj.weight", 2, E, M);
            B("mlp.down_proj.bias", 1, E, 0);
        }
#undef B
    }
    spec(s, &n, "merger.ln_q.weight", 1, E, 0);
    if (v2)
        spec(s, &n, "merger.ln_q.bias", 1, E, 0);
    spec(s, &n, "merger.mlp.0.weight", 2, H, H);
    spec(s, &n, "merger.mlp.0.bias", 1, H, 0);
    spec(s, &n, "merger.mlp.2.weight", 2, c->out_dim, H);
    spec(s, &n, "merger.mlp.2.bias", 1, c->out_dim, 0);
    PD_ASSERT(n <= cap);
    *out = s;
    *n_out = n;
    return PD_OK;
}
