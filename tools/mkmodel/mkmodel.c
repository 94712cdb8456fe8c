/*
 * mkmodel.c — the random-weight model writer of mkmodel.h: shape table, config resolution,
 * weight generation and the order files are written in.
 *
 * Weights. Matrices are N(0, 1/fan_in) (std 1/sqrt(in_features)), not the flat 0.02 of
 * transformers' initializer_range: for the published shapes the two agree within a factor of
 * two (fan_in 896..18944), but in a tiny model (hidden 64) 0.02 gives attention scores ~0.01
 * apart — uniform attention, so a broken RoPE or KV cache would not change a single output —
 * and logits with spread 0.16 over 1024 tokens, where greedy picks hinge on near-ties. With
 * 1/sqrt(fan_in) every projection keeps activations at unit scale: attention scores and logits
 * have spread ~1, outputs depend on position and context, and top-1/top-2 logit gaps are wide
 * enough that CPU, GPU and transformers agree on greedy tokens. Norm weights are 1 + N(0, 0.05)
 * and biases N(0, 0.1), so a norm or bias that is skipped or misindexed changes the output.
 *
 * Each tensor is cut into blocks of PD_MK_BLOCK elements and each block draws from its own
 * xoshiro256** stream seeded by (seed, tensor name, block), Box-Muller for normals: the files do
 * not depend on thread count or shard layout, and blocks fill in parallel.
 */
#include "tools/mkmodel/mkmodel.h"
#include "model/vision/image_processor.h"
#include "model/vision/vision_encoder.h"
#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/log.h"
#include "common/base/rng.h"
#include "model/safetensors.h"
#include "model/safetensors_index.h"
#include "common/base/status.h"
#include "tools/mkmodel/tokgen.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PD_MK_BLOCK 65536 /* elements per PRNG stream; part of the file format: never change */
#define PD_MK_MAX_THREADS 16
#define PD_MK_TOKENIZER_CAP 4096 /* the corpus supports ~1.5-2k merges; HF vocabs are bigger */

const char *const pd_mkmodel_family_names[] = {"llama", "llama2",   "mistral",    "qwen2",
                                               "qwen3", "qwen2_vl", "qwen2_5_vl", NULL};

struct shape {
    const char *name;
    enum pd_mkmodel_family family;
    int vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
    double rope_theta, eps;
    bool tie;
    double llama3_factor; /* > 0: rope_scaling llama3 (low 1, high 4) with ... */
    int llama3_orig_max;  /* ... this original_max_position_embeddings */
};

/* The published configs (config.json of the instruct checkpoints). Mistral is v0.3: 32768
 * vocab, rope_theta 1e6 and no sliding window. */
static const struct shape shapes[] = {
    {"tiny", PD_MKMODEL_LLAMA, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0, 0}, /* see tiny_shapes */
    {"llama-3.1-8b", PD_MKMODEL_LLAMA, 128256, 4096, 14336, 32, 32, 8, 128, 131072, 500000.0, 1e-5,
     false, 8.0, 8192},
    {"llama-3.2-1b", PD_MKMODEL_LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 131072, 500000.0, 1e-5,
     true, 32.0, 8192},
    {"llama-2-7b", PD_MKMODEL_LLAMA2, 32000, 4096, 11008, 32, 32, 32, 128, 4096, 10000.0, 1e-5,
     false, 0, 0},
    {"mistral-7b", PD_MKMODEL_MISTRAL, 32768, 4096, 14336, 32, 32, 8, 128, 32768, 1000000.0, 1e-5,
     false, 0, 0},
    {"qwen2.5-0.5b", PD_MKMODEL_QWEN2, 151936, 896, 4864, 24, 14, 2, 64, 32768, 1000000.0, 1e-6,
     true, 0, 0},
    {"qwen2.5-7b", PD_MKMODEL_QWEN2, 152064, 3584, 18944, 28, 28, 4, 128, 32768, 1000000.0, 1e-6,
     false, 0, 0},
    {"qwen3-0.6b", PD_MKMODEL_QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1000000.0, 1e-6,
     true, 0, 0},
    {"qwen3-8b", PD_MKMODEL_QWEN3, 151936, 4096, 12288, 36, 32, 8, 128, 40960, 1000000.0, 1e-6,
     false, 0, 0},
};

/* same order as shapes[] */
const char *const pd_mkmodel_shape_names[] = {
    "tiny",         "llama-3.1-8b", "llama-3.2-1b", "llama-2-7b", "mistral-7b",
    "qwen2.5-0.5b", "qwen2.5-7b",   "qwen3-0.6b",   "qwen3-8b",   NULL,
};

/* Tiny models keep each family's distinguishing features: Llama-3's rope scaling, Llama-2's
 * full multi-head attention, Qwen's tied embeddings and eps, Qwen3's head_dim != hidden/heads. */
static const struct shape tiny_shapes[] = {
    [PD_MKMODEL_LLAMA] = {"tiny", PD_MKMODEL_LLAMA, 1024, 64, 128, 2, 4, 2, 16, 2048, 500000.0,
                          1e-5, false, 8.0, 256},
    [PD_MKMODEL_LLAMA2] = {"tiny", PD_MKMODEL_LLAMA2, 1024, 64, 128, 2, 4, 4, 16, 2048, 10000.0,
                           1e-5, false, 0, 0},
    [PD_MKMODEL_MISTRAL] = {"tiny", PD_MKMODEL_MISTRAL, 1024, 64, 128, 2, 4, 2, 16, 2048, 1000000.0,
                            1e-5, false, 0, 0},
    [PD_MKMODEL_QWEN2] = {"tiny", PD_MKMODEL_QWEN2, 1024, 64, 128, 2, 4, 2, 16, 2048, 1000000.0,
                          1e-6, true, 0, 0},
    [PD_MKMODEL_QWEN3] = {"tiny", PD_MKMODEL_QWEN3, 1024, 64, 128, 2, 4, 2, 32, 2048, 1000000.0,
                          1e-6, true, 0, 0},
    [PD_MKMODEL_QWEN2_VL] = {"tiny", PD_MKMODEL_QWEN2_VL, 1024, 64, 128, 2, 4, 2, 16, 2048,
                             1000000.0, 1e-6, false, 0, 0},
    [PD_MKMODEL_QWEN2_5_VL] = {"tiny", PD_MKMODEL_QWEN2_5_VL, 1024, 64, 128, 2, 4, 2, 16, 2048,
                               1000000.0, 1e-6, false, 0, 0},
};

static bool is_vl(enum pd_mkmodel_family f) {
    return f == PD_MKMODEL_QWEN2_VL || f == PD_MKMODEL_QWEN2_5_VL;
}

static bool is_qwen2_lm(enum pd_mkmodel_family f) {
    return f == PD_MKMODEL_QWEN2 || is_vl(f);
}

static const struct shape *shape_by_name(const char *name) {
    for (size_t i = 0; i < PD_ARRAY_LEN(shapes); i++)
        if (strcmp(shapes[i].name, name) == 0)
            return &shapes[i];
    return NULL;
}

static enum pd_arch family_arch(enum pd_mkmodel_family f) {
    switch (f) {
    case PD_MKMODEL_MISTRAL: return PD_ARCH_MISTRAL;
    case PD_MKMODEL_QWEN2:
    case PD_MKMODEL_QWEN2_VL:
    case PD_MKMODEL_QWEN2_5_VL: return PD_ARCH_QWEN2;
    case PD_MKMODEL_QWEN3: return PD_ARCH_QWEN3;
    default: return PD_ARCH_LLAMA;
    }
}

static enum pd_tokgen_flavor family_tokenizer(enum pd_mkmodel_family f) {
    switch (f) {
    case PD_MKMODEL_LLAMA2: return PD_TOKGEN_LLAMA2;
    case PD_MKMODEL_MISTRAL: return PD_TOKGEN_MISTRAL;
    case PD_MKMODEL_QWEN2: return PD_TOKGEN_QWEN2;
    case PD_MKMODEL_QWEN3: return PD_TOKGEN_QWEN3;
    case PD_MKMODEL_QWEN2_VL:
    case PD_MKMODEL_QWEN2_5_VL: return PD_TOKGEN_QWEN2_VL;
    default: return PD_TOKGEN_LLAMA3;
    }
}

void pd_mkmodel_opts_defaults(struct pd_mkmodel_opts *o) {
    memset(o, 0, sizeof(*o));
    o->family = -1;
    o->tie_word_embeddings = -1;
    o->dtype = PD_DTYPE_BF16;
    o->max_shard_bytes = 5ull << 30;
}

/* Resolves the shape a set of options means; *family_out gets the family. */
static int resolve_shape(const struct pd_mkmodel_opts *o, const struct shape **out,
                         enum pd_mkmodel_family *family_out) {
    const char *name = o->shape >= 0 && o->shape < (int)PD_ARRAY_LEN(shapes)
                           ? pd_mkmodel_shape_names[o->shape]
                           : NULL;
    const struct shape *s = name ? shape_by_name(name) : NULL;
    if (!s)
        return pd_errorf(PD_EINVAL, "unknown model shape index %d", o->shape);
    if (o->family < -1 || o->family >= (int)PD_ARRAY_LEN(tiny_shapes))
        return pd_errorf(PD_EINVAL, "unknown model family index %d", o->family);
    if (strcmp(s->name, "tiny") == 0) {
        *family_out = o->family < 0 ? PD_MKMODEL_LLAMA : (enum pd_mkmodel_family)o->family;
        *out = &tiny_shapes[*family_out];
        return PD_OK;
    }
    /* a published shape fixes its family; another family of the same architecture (llama for
     * llama-2-7b) is accepted and keeps the shape's tokenizer */
    if (o->family >= 0 && family_arch((enum pd_mkmodel_family)o->family) != family_arch(s->family))
        return pd_errorf(PD_EINVAL, "shape %s is a %s model; family %s contradicts it", s->name,
                         pd_mkmodel_family_names[s->family], pd_mkmodel_family_names[o->family]);
    *family_out = s->family;
    *out = s;
    return PD_OK;
}

static int check_dim(const char *what, int v, int max) {
    if (v < 1 || v > max)
        return pd_errorf(PD_ERANGE, "%s is %d, must be in [1, %d]", what, v, max);
    return PD_OK;
}

/* The most tokens the tokenizer may have: never above vocab_size, capped where the corpus
 * runs dry anyway; Qwen leaves the top ids unused, as Qwen pads its embedding past the
 * tokenizer (151936 rows, 151665 tokens). */
static int tokenizer_cap(enum pd_mkmodel_family f, int vocab) {
    int cap = vocab < PD_MK_TOKENIZER_CAP ? vocab : PD_MK_TOKENIZER_CAP;
    if ((is_qwen2_lm(f) || f == PD_MKMODEL_QWEN3) && vocab <= PD_MK_TOKENIZER_CAP &&
        vocab - vocab / 64 >= pd_tokgen_min_tokens(family_tokenizer(f)))
        cap = vocab - vocab / 64;
    return cap;
}

int pd_mkmodel_config(const struct pd_mkmodel_opts *o, struct pd_model_config *cfg) {
    const struct shape *s;
    enum pd_mkmodel_family fam;
    int rc = resolve_shape(o, &s, &fam);
    if (rc)
        return rc;
    struct pd_model_config c;
    memset(&c, 0, sizeof(c));
    c.arch = family_arch(fam);
    c.vocab_size = o->vocab_size ? o->vocab_size : s->vocab;
    c.hidden_size = o->hidden_size ? o->hidden_size : s->hidden;
    c.intermediate_size = o->intermediate_size ? o->intermediate_size : s->inter;
    c.num_hidden_layers = o->num_hidden_layers ? o->num_hidden_layers : s->layers;
    c.num_attention_heads = o->num_attention_heads ? o->num_attention_heads : s->heads;
    c.num_key_value_heads = o->num_key_value_heads ? o->num_key_value_heads : s->kv_heads;
    if ((rc = check_dim("--vocab-size", c.vocab_size, 1 << 24)) ||
        (rc = check_dim("--hidden-size", c.hidden_size, 1 << 16)) ||
        (rc = check_dim("--intermediate-size", c.intermediate_size, 1 << 18)) ||
        (rc = check_dim("--layers", c.num_hidden_layers, 1024)) ||
        (rc = check_dim("--heads", c.num_attention_heads, 1024)) ||
        (rc = check_dim("--kv-heads", c.num_key_value_heads, 1024)))
        return rc;
    if (o->head_dim) {
        c.head_dim = o->head_dim;
    } else if (fam != PD_MKMODEL_QWEN3 && (o->hidden_size || o->num_attention_heads)) {
        /* head_dim is hidden/heads in these families; Qwen3 states its own */
        if (c.hidden_size % c.num_attention_heads)
            return pd_errorf(PD_EINVAL,
                             "hidden size %d is not a multiple of %d heads; give --head-dim",
                             c.hidden_size, c.num_attention_heads);
        c.head_dim = c.hidden_size / c.num_attention_heads;
    } else {
        c.head_dim = s->head_dim;
    }
    if ((rc = check_dim("--head-dim", c.head_dim, 1024)))
        return rc;
    if (c.head_dim % 2)
        return pd_errorf(PD_EINVAL, "head dim %d is odd; rotary embeddings rotate pairs",
                         c.head_dim);
    if (c.num_attention_heads % c.num_key_value_heads)
        return pd_errorf(PD_EINVAL, "%d attention heads are not a multiple of %d kv heads",
                         c.num_attention_heads, c.num_key_value_heads);
    int min_vocab = pd_tokgen_min_tokens(family_tokenizer(fam));
    if (c.vocab_size < min_vocab)
        return pd_errorf(PD_ERANGE, "vocab size %d is too small for the %s tokenizer (needs %d)",
                         c.vocab_size, pd_tokgen_flavor_name(family_tokenizer(fam)), min_vocab);

    c.max_position_embeddings = s->max_pos;
    c.rms_norm_eps = s->eps;
    c.rope_theta = s->rope_theta;
    if (s->llama3_factor > 0) {
        c.rope_scaling.type = PD_ROPE_LLAMA3;
        c.rope_scaling.factor = s->llama3_factor;
        c.rope_scaling.low_freq_factor = 1.0;
        c.rope_scaling.high_freq_factor = 4.0;
        c.rope_scaling.original_max_position_embeddings = s->llama3_orig_max;
    }
    c.tie_word_embeddings = o->tie_word_embeddings < 0 ? s->tie : o->tie_word_embeddings != 0;
    c.attention_bias = is_qwen2_lm(fam);
    if (is_vl(fam)) { /* M-RoPE sections in Qwen's proportions (16, 24, 24 of 64) */
        int half = c.head_dim / 2;
        c.vl = fam == PD_MKMODEL_QWEN2_VL ? PD_VL_QWEN2 : PD_VL_QWEN2_5;
        c.mrope_section[0] = half / 4;
        c.mrope_section[1] = (half - half / 4) / 2;
        c.mrope_section[2] = half - c.mrope_section[0] - c.mrope_section[1];
        if (o->sliding_window)
            return pd_errorf(PD_EINVAL, "a sliding window is not offered with family %s",
                             pd_mkmodel_family_names[fam]);
    }
    c.image_token_id = c.vision_start_token_id = c.vision_end_token_id = -1;
    c.qk_norm = fam == PD_MKMODEL_QWEN3;
    if (o->sliding_window < 0 || o->max_window_layers < 0)
        return pd_errorf(PD_EINVAL, "sliding window %d / max window layers %d: must be >= 0",
                         o->sliding_window, o->max_window_layers);
    if (o->sliding_window > 0 && fam != PD_MKMODEL_MISTRAL && fam != PD_MKMODEL_QWEN2 &&
        fam != PD_MKMODEL_QWEN3)
        return pd_errorf(PD_EINVAL, "a sliding window needs family mistral, qwen2 or qwen3");
    if (o->max_window_layers > 0 && (o->sliding_window == 0 || fam == PD_MKMODEL_MISTRAL))
        return pd_errorf(PD_EINVAL, "max window layers needs a sliding window and family qwen2 "
                                    "or qwen3");
    c.sliding_window = o->sliding_window;
    c.max_window_layers = o->max_window_layers;
    c.torch_dtype = o->dtype;
    c.bos_token_id = -1;
    c.pad_token_id = -1;
    c.n_eos_token_ids = 0;
    /* generation_config.json sampling defaults as each family publishes them */
    c.gen_temperature = c.gen_top_p = c.gen_repetition_penalty = -1;
    c.gen_top_k = -1;
    switch (fam) {
    case PD_MKMODEL_LLAMA:
    case PD_MKMODEL_LLAMA2:
        c.gen_temperature = 0.6;
        c.gen_top_p = 0.9;
        break;
    case PD_MKMODEL_QWEN2:
    case PD_MKMODEL_QWEN2_VL:
    case PD_MKMODEL_QWEN2_5_VL:
        c.gen_temperature = 0.7;
        c.gen_top_p = 0.8;
        c.gen_top_k = 20;
        c.gen_repetition_penalty = 1.05;
        break;
    case PD_MKMODEL_QWEN3:
        c.gen_temperature = 0.6;
        c.gen_top_p = 0.95;
        c.gen_top_k = 20;
        break;
    case PD_MKMODEL_MISTRAL: break;
    }
    *cfg = c;
    return PD_OK;
}

int pd_mkmodel_size_parse(const char *s, uint64_t *out) {
    const char *p = s;
    uint64_t v = 0;
    if (*p < '0' || *p > '9')
        goto bad;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            goto bad;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    int shift = 0;
    switch (*p) {
    case 'k':
    case 'K':
        shift = 10;
        p++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        p++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        p++;
        break;
    default: break;
    }
    if (*p || (shift && v > (UINT64_MAX >> shift)))
        goto bad;
    *out = v << shift;
    return PD_OK;
bad:
    return pd_errorf(PD_EINVAL, "'%s' is not a size: want bytes, optionally with K, M or G", s);
}

/* ---- random numbers (common/base/rng.h) ---- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* ---- weight generation ---- */

struct tensor_job {
    const char *name;
    uint64_t n_elems;
    uint64_t first_block; /* shard-wide index of the tensor's first block */
    unsigned char *dst;   /* [n_elems] in the shard's dtype */
    uint64_t stream;      /* (seed, name) → base of the per-block PRNG seeds */
    float mean, std;
};

struct shard_job {
    struct tensor_job *t;
    size_t n;
    uint64_t n_blocks;
    enum pd_dtype dtype;
    atomic_uint_fast64_t next_block;
};

static void fill_block(const struct tensor_job *tj, uint64_t block, enum pd_dtype dtype,
                       float *tmp /* [PD_MK_BLOCK] */) {
    uint64_t start = block * PD_MK_BLOCK;
    size_t n = (size_t)(tj->n_elems - start < PD_MK_BLOCK ? tj->n_elems - start : PD_MK_BLOCK);
    uint64_t x = tj->stream ^ ((block + 1) * 0xD1B54A32D192ED03ull), s[4];
    for (int i = 0; i < 4; i++)
        s[i] = pd_splitmix64(&x);
    for (size_t i = 0; i < n; i += 2) {
        /* Box-Muller: u1 in (0, 1] keeps the log finite */
        double u1 = (double)((pd_xoshiro256ss(s) >> 11) + 1) * 0x1.0p-53;
        double u2 = (double)(pd_xoshiro256ss(s) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        tmp[i] = tj->mean + tj->std * (float)(r * cos(a));
        if (i + 1 < n)
            tmp[i + 1] = tj->mean + tj->std * (float)(r * sin(a));
    }
    pd_dtype_from_f32(dtype, tmp, tj->dst + start * pd_dtype_size(dtype), n);
}

struct worker {
    struct shard_job *job;
    float *tmp; /* [PD_MK_BLOCK] */
    pthread_t thread;
    bool started;
};

static void *worker_run(void *arg) {
    struct worker *w = arg;
    struct shard_job *j = w->job;
    size_t t = 0;
    for (;;) {
        uint64_t b = atomic_fetch_add(&j->next_block, 1);
        if (b >= j->n_blocks)
            break;
        /* each worker claims blocks in increasing order: its tensor index only moves forward */
        while (b >= j->t[t].first_block + (j->t[t].n_elems + PD_MK_BLOCK - 1) / PD_MK_BLOCK)
            t++;
        fill_block(&j->t[t], b - j->t[t].first_block, j->dtype, w->tmp);
    }
    return NULL;
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > PD_MK_MAX_THREADS ? PD_MK_MAX_THREADS : (int)n;
}

/* Fills every tensor of one shard; the calling thread works too, so a failed pthread_create
 * only costs speed. */
static int fill_shard(struct shard_job *j, int threads) {
    if ((uint64_t)threads > j->n_blocks)
        threads = j->n_blocks ? (int)j->n_blocks : 1;
    struct worker *w = pd_calloc((size_t)threads, sizeof(*w));
    if (!w)
        return pd_error_wrap(PD_ENOMEM, "starting weight generation");
    int rc = PD_OK;
    for (int i = 0; i < threads; i++) {
        w[i].job = j;
        w[i].tmp = pd_malloc(PD_MK_BLOCK * sizeof(float));
        if (!w[i].tmp) {
            rc = pd_error_wrap(PD_ENOMEM, "starting weight generation");
            goto out;
        }
    }
    atomic_store(&j->next_block, 0);
    for (int i = 1; i < threads; i++)
        w[i].started = pthread_create(&w[i].thread, NULL, worker_run, &w[i]) == 0;
    worker_run(&w[0]);
    for (int i = 1; i < threads; i++)
        if (w[i].started)
            pthread_join(w[i].thread, NULL);
out:
    for (int i = 0; i < threads; i++)
        pd_free(w[i].tmp);
    pd_free(w);
    return rc;
}

/* Values of a tensor spec. */
static uint64_t spec_elems(const struct pd_tensor_spec *s) {
    uint64_t n = 1;
    for (int d = 0; d < s->ndim; d++)
        n *= (uint64_t)s->shape[d];
    return n;
}

static void init_of(const struct pd_tensor_spec *s, float *mean, float *std) {
    size_t len = strlen(s->name);
    if (s->ndim >= 2) { /* 1 / sqrt(fan-in), a Conv3d's over its whole kernel */
        *mean = 0;
        *std = (float)(1.0 / sqrt((double)(spec_elems(s) / (uint64_t)s->shape[0])));
    } else if ((len >= 11 && strcmp(s->name + len - 11, "norm.weight") == 0) ||
               (len >= 13 && strcmp(s->name + len - 13, "norm1.weight") == 0) ||
               (len >= 12 && (strcmp(s->name + len - 12, "norm2.weight") == 0 ||
                              strcmp(s->name + len - 12, "norm1.weight") == 0 ||
                              strcmp(s->name + len - 11, "ln_q.weight") == 0))) {
        *mean = 1;
        *std = 0.05f;
    } else {
        *mean = 0; /* biases */
        *std = 0.1f;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Generates the tensors idx[0..count) of specs (shard `shard` of n_shards) into one buffer and
 * writes them as one safetensors file. */
static int write_shard(const char *dir, const struct pd_tensor_spec *specs, const uint64_t *nbytes,
                       const size_t *idx, size_t count, int shard, int n_shards,
                       const struct pd_mkmodel_opts *o) {
    int rc = PD_OK;
    uint64_t total = 0;
    for (size_t k = 0; k < count; k++)
        total += nbytes[idx[k]];
    char file[64], *path = NULL;
    pd_safetensors_shard_name(shard, n_shards, file, sizeof(file));
    unsigned char *buf = total == (size_t)total ? pd_malloc((size_t)total) : NULL;
    struct tensor_job *tj = pd_calloc(count, sizeof(*tj));
    struct pd_tensor_write *tw = pd_calloc(count, sizeof(*tw));
    size_t plen = strlen(dir) + sizeof(file) + 2;
    path = pd_malloc(plen);
    if (!buf || !tj || !tw || !path) {
        rc =
            pd_error_wrap(PD_ENOMEM, "generating %s (%llu bytes)", file, (unsigned long long)total);
        goto out;
    }
    snprintf(path, plen, "%s/%s", dir, file);

    struct shard_job job = {.t = tj, .n = count, .dtype = o->dtype};
    uint64_t off = 0;
    for (size_t k = 0; k < count; k++) {
        const struct pd_tensor_spec *s = &specs[idx[k]];
        uint64_t x = o->seed ^ pd_rotl64(name_hash(s->name), 23);
        tj[k].name = s->name;
        tj[k].n_elems = nbytes[idx[k]] / pd_dtype_size(o->dtype);
        tj[k].first_block = job.n_blocks;
        tj[k].dst = buf + off;
        tj[k].stream = pd_splitmix64(&x);
        init_of(s, &tj[k].mean, &tj[k].std);
        job.n_blocks += (tj[k].n_elems + PD_MK_BLOCK - 1) / PD_MK_BLOCK;
        tw[k] = (struct pd_tensor_write){
            .name = s->name, .dtype = o->dtype, .ndim = s->ndim, .data = buf + off};
        for (int d = 0; d < s->ndim; d++)
            tw[k].shape[d] = s->shape[d];
        off += nbytes[idx[k]];
    }
    double t0 = now_s();
    if ((rc = fill_shard(&job, o->threads > 0 ? o->threads : online_cpus())))
        goto out;
    double t1 = now_s();
    if ((rc = pd_safetensors_write(path, tw, count)))
        goto out;
    pd_info("wrote %s: %zu tensors, %llu bytes (generate %.2f s, write %.2f s)", path, count,
            (unsigned long long)total, t1 - t0, now_s() - t1);
out:
    pd_free(path);
    pd_free(tw);
    pd_free(tj);
    pd_free(buf);
    return rc;
}

/* ---- the directory ---- */

static int mkdir_p(const char *dir) {
    char *p = pd_strdup(dir);
    if (!p)
        return pd_error_wrap(PD_ENOMEM, "creating %s", dir);
    int rc = PD_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0)
            continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = pd_errorf(pd_status_from_errno(errno), "cannot create directory %s: %s", p,
                           strerror(errno));
            break;
        }
        *s = c;
        if (!c)
            break;
    }
    struct stat st;
    if (rc == PD_OK && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = pd_errorf(PD_EINVAL, "%s exists and is not a directory", dir);
    pd_free(p);
    return rc;
}

static bool is_checkpoint_file(const char *name) {
    int a, b, n = 0;
    if (strcmp(name, PD_SAFETENSORS_SINGLE_NAME) == 0 ||
        strcmp(name, PD_SAFETENSORS_INDEX_NAME) == 0)
        return true;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &n) == 2 && n > 0 && name[n] == 0;
}

static int remove_old_checkpoint(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return pd_errorf(pd_status_from_errno(errno), "cannot list %s: %s", dir, strerror(errno));
    int rc = PD_OK;
    struct dirent *e;
    while (rc == PD_OK && (e = readdir(d)) != NULL) {
        if (!is_checkpoint_file(e->d_name))
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) != 0)
            rc = pd_errorf(pd_status_from_errno(errno), "cannot remove old %s: %s", path,
                           strerror(errno));
        else
            pd_debug("removed old %s", path);
    }
    closedir(d);
    return rc;
}

static int write_text(const char *dir, const char *name, char *text /* freed here */) {
    if (!text)
        return pd_error_wrap(PD_ENOMEM, "writing %s/%s", dir, name);
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int rc = pd_file_write_all(path, text, strlen(text));
    pd_free(text);
    return rc;
}

/* The tiny vision encoder of a vision-language family, in the language model's width. */
static void tiny_vision(enum pd_mkmodel_family fam, const struct pd_model_config *lm,
                        struct pd_vision_config *vc) {
    memset(vc, 0, sizeof(*vc));
    vc->family = fam == PD_MKMODEL_QWEN2_VL ? PD_VISION_QWEN2_VL : PD_VISION_QWEN2_5_VL;
    vc->depth = 2;
    vc->embed_dim = 32;
    vc->num_heads = 2;
    vc->mlp_dim = 64;
    vc->out_dim = lm->hidden_size;
    vc->in_channels = 3;
    vc->patch_size = 14;
    vc->temporal_patch_size = 2;
    vc->spatial_merge_size = 2;
    vc->act = PD_ACT_QUICK_GELU;
    vc->rope_theta = 10000;
    vc->window_size = 112; /* 4 x 4 merge windows: block 0 attends in windows, block 1 whole */
    vc->n_fullatt = 1;
    vc->fullatt_block_indexes[0] = 1;
}

/* config.json of a vision-language model: the language model's, with vision_config added. */
static char *vl_config_json(const struct pd_model_config *cfg, const struct pd_vision_config *vc) {
    char *lm = pd_model_config_to_json(cfg), *text = NULL, *out = NULL;
    cJSON *root = lm ? cJSON_Parse(lm) : NULL, *v = pd_vision_config_json(vc);
    if (root && v && cJSON_AddItemToObject(root, "vision_config", v)) {
        v = NULL;
        text = cJSON_Print(root);
    }
    if (text && (out = pd_malloc(strlen(text) + 2)))
        snprintf(out, strlen(text) + 2, "%s\n", text);
    free(text); /* cJSON's */
    cJSON_Delete(v);
    cJSON_Delete(root);
    pd_free(lm);
    return out;
}

/* Appends the vision encoder's tensors to *specs (n_specs of them so far). */
static int add_vision_specs(const struct pd_vision_config *vc, struct pd_tensor_spec **specs,
                            size_t *n) {
    struct pd_tensor_spec *vs = NULL;
    size_t nv = 0;
    int rc = pd_vision_tensor_specs(vc, &vs, &nv);
    if (rc)
        return rc;
    struct pd_tensor_spec *all = pd_realloc(*specs, (*n + nv) * sizeof(*all));
    if (!all) {
        pd_free(vs);
        return pd_error_wrap(PD_ENOMEM, "listing the tensors");
    }
    memcpy(all + *n, vs, nv * sizeof(*vs));
    pd_free(vs);
    *specs = all;
    *n += nv;
    return PD_OK;
}

int pd_mkmodel_write(const struct pd_mkmodel_opts *o, const char *dir) {
    struct pd_model_config cfg;
    struct pd_tokgen tok;
    struct pd_tensor_spec *specs = NULL;
    uint64_t *nbytes = NULL;
    int *shard_of = NULL;
    size_t *idx = NULL; /* tensors of the shard being written */
    const char **names = NULL;
    size_t n = 0;
    double t0 = now_s();
    int rc;

    if (strlen(dir) > 3000)
        return pd_errorf(PD_EINVAL, "output directory path is too long");
    if ((rc = pd_mkmodel_config(o, &cfg)))
        return rc;
    const struct shape *s;
    enum pd_mkmodel_family fam;
    if ((rc = resolve_shape(o, &s, &fam)))
        return rc;
    if ((rc = pd_tokgen_build(family_tokenizer(fam), tokenizer_cap(fam, cfg.vocab_size), &tok)))
        return rc;
    /* Qwen's config.json names <|endoftext|> as bos_token_id although its tokenizer adds no
     * BOS (bos_token null); mirror that so readers meet the real files' quirk here too */
    cfg.bos_token_id = tok.bos_id >= 0 ? tok.bos_id : tok.pad_id;
    cfg.pad_token_id = tok.pad_id;
    cfg.n_eos_token_ids = tok.n_eos_ids;
    for (int i = 0; i < tok.n_eos_ids; i++)
        cfg.eos_token_ids[i] = tok.eos_ids[i];
    struct pd_vision_config vc;
    if (is_vl(fam)) {
        cfg.image_token_id = pd_tokgen_added_id(&tok, "<|image_pad|>");
        cfg.vision_start_token_id = pd_tokgen_added_id(&tok, "<|vision_start|>");
        cfg.vision_end_token_id = pd_tokgen_added_id(&tok, "<|vision_end|>");
        tiny_vision(fam, &cfg, &vc);
    }

    if ((rc = mkdir_p(dir)) || (rc = remove_old_checkpoint(dir)))
        goto fail_tok;
    if (is_vl(fam)) { /* the Qwen2-VL processor, pixel bounds for small test images */
        struct pd_image_processor_config pc;
        pd_image_processor_config_default(&pc);
        pc.max_pixels = 28 * 28 * 256;
        if ((rc = write_text(dir, "preprocessor_config.json",
                             pd_image_processor_config_to_json(&pc))))
            goto fail_tok;
    }
    if ((rc = write_text(dir, "config.json",
                         is_vl(fam) ? vl_config_json(&cfg, &vc) : pd_model_config_to_json(&cfg))) ||
        (rc = write_text(dir, "generation_config.json", pd_generation_config_to_json(&cfg))) ||
        (rc = write_text(dir, "tokenizer.json", pd_tokgen_tokenizer_json(&tok))) ||
        (rc = write_text(dir, "tokenizer_config.json",
                         pd_tokgen_tokenizer_config_json(&tok, cfg.max_position_embeddings))))
        goto fail_tok;

    if ((rc = pd_model_tensor_specs(&cfg, &specs, &n)) ||
        (is_vl(fam) && (rc = add_vision_specs(&vc, &specs, &n))))
        goto fail_specs;
    nbytes = pd_calloc(n, sizeof(*nbytes));
    shard_of = pd_calloc(n, sizeof(*shard_of));
    names = pd_calloc(n, sizeof(*names));
    idx = pd_calloc(n, sizeof(*idx));
    if (!nbytes || !shard_of || !names || !idx) {
        rc = pd_error_wrap(PD_ENOMEM, "planning shards of %zu tensors", n);
        goto fail_specs;
    }
    uint64_t total = 0, params = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t elems = spec_elems(&specs[i]);
        nbytes[i] = elems * pd_dtype_size(o->dtype);
        names[i] = specs[i].name;
        total += nbytes[i];
        params += elems;
    }
    int n_shards = pd_safetensors_shard_plan(nbytes, n, o->max_shard_bytes, shard_of);
    pd_info("%s %s, %llu parameters (%.1f MB %s) in %d file%s, tokenizer %d tokens, "
            "seed %llu -> %s",
            pd_mkmodel_family_names[fam], s->name, (unsigned long long)params, (double)total / 1e6,
            pd_dtype_name(o->dtype), n_shards, n_shards == 1 ? "" : "s", tok.n_tokens,
            (unsigned long long)o->seed, dir);
    for (int sh = 0; sh < n_shards && rc == PD_OK; sh++) {
        size_t count = 0;
        for (size_t i = 0; i < n; i++)
            if (shard_of[i] == sh)
                idx[count++] = i;
        rc = write_shard(dir, specs, nbytes, idx, count, sh, n_shards, o);
    }
    if (rc == PD_OK && n_shards > 1)
        rc = pd_safetensors_index_write(dir, names, shard_of, n, n_shards, total);
    if (rc == PD_OK)
        pd_info("done in %.2f s", now_s() - t0);

fail_specs:
    pd_free(idx);
    pd_free(names);
    pd_free(shard_of);
    pd_free(nbytes);
    pd_free(specs);
fail_tok:
    pd_tokgen_free(&tok);
    if (rc)
        pd_error_wrap(rc, "writing model to %s", dir);
    return rc;
}
