/*
 * generate.c — pdserve-generate: one process, no network. Loads a Hugging Face model directory,
 * runs the prompts through the same engine the daemons use (chunked extend, then batched decode
 * with the sampler), prints each completion. It is the single-process reference the
 * disaggregated path is checked against, so it uses no shortcut the daemons do not.
 *
 * Prompts: positional arguments (text), --prompt-file (one per line), or --prompt-ids "1 2 3"
 * (several prompts separated by ';'). Output: one line per prompt, the text (and the ids with
 * --ids). --logits-out writes each prompt's last-position logits, raw little-endian f32,
 * [n_prompts][vocab], for comparison with other engines.
 * Pages are handed out here in order, one contiguous run per prompt: no page allocator needed.
 * --image (Qwen2-VL / Qwen2.5-VL): the images of a single prompt, one per image placeholder in
 * it, decoded, processed and encoded (model/vision/, on a cpu backend of its own), their
 * placeholders expanded, M-RoPE positions planned, and their embeddings handed to each chunk
 * that covers them.
 */
#include "common/base/alloc.h"
#include "common/server_args.h"
#include "common/base/log.h"
#include "model/model.h"
#include "model/sampling.h"
#include "common/base/status.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tp_group.h"
#include "common/base/file.h"
#include "model/vision/image_decode.h"
#include "model/vision/image_processor.h"
#include "model/vision/vision_encoder.h"
#include "model/vision/vision_prompt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct prompt {
    int32_t *ids; /* [n + max_new_tokens] prompt then output */
    int n, n_out;
    int32_t *pages; /* [n_pages] */
    int n_pages;
    struct pd_sampler sampler;
    bool done;
    double logprob_sum;
};

struct args {
    const char *model_path, *prompt_file, *prompt_ids, *logits_out, *stop_ids, *images;
    int device, base_gpu_id, threads, page_size, chunk, max_new_tokens, top_k, logprobs, log_level;
    int kv_cache_dtype; /* index into pd_kv_cache_dtype_names */
    int tp_size;
    double temperature, top_p, min_p, rep, freq, pres;
    int64_t seed;
    bool ids, ignore_eos, no_tokenizer, raw_prompt;
};

/* Parses "1 2 3" into out (appending); PD_EINVAL naming the bad word. */
static int parse_ids(const char *s, struct pd_token_ids *out) {
    while (*s) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        if (!*s)
            break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX)
            return pd_errorf(PD_EINVAL, "token id list: bad entry at \"%.20s\"", s);
        if (pd_array_grow((void **)&out->ids, &out->cap, out->n + 1, sizeof(int32_t)))
            return PD_ENOMEM;
        out->ids[out->n++] = (int32_t)v;
        s = end;
    }
    return PD_OK;
}

/* Collects every prompt's ids. */
static int collect_prompts(const struct args *a, int n_args, char **args,
                           const struct pd_tokenizer *tok, struct pd_token_ids **out, int *n_out) {
    struct pd_token_ids *ps = NULL;
    size_t cap = 0;
    int n = 0, rc = PD_OK;
    char *buf = NULL;
    /* texts: positional args, then lines of the prompt file */
    char **texts = NULL;
    size_t ntext = 0, tcap = 0;
    for (int i = 0; i < n_args; i++) {
        if (pd_array_grow((void **)&texts, &tcap, ntext + 1, sizeof(char *)))
            goto nomem;
        texts[ntext++] = args[i];
    }
    if (a->prompt_file) {
        FILE *f = fopen(a->prompt_file, "r");
        if (!f) {
            rc = pd_errorf(pd_status_from_errno(errno), "opening --prompt-file %s: %s",
                           a->prompt_file, strerror(errno));
            goto fail;
        }
        size_t len = 0, bcap = 0;
        int c;
        while ((c = fgetc(f)) != EOF) {
            if (pd_array_grow((void **)&buf, &bcap, len + 2, 1)) {
                fclose(f);
                goto nomem;
            }
            buf[len++] = (char)c;
        }
        fclose(f);
        if (!buf)
            goto done_file;
        buf[len] = '\0';
        for (char *line = buf; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl)
                *nl = '\0';
            if (*line) {
                if (pd_array_grow((void **)&texts, &tcap, ntext + 1, sizeof(char *)))
                    goto nomem;
                texts[ntext++] = line;
            }
            line = nl ? nl + 1 : NULL;
        }
    }
done_file:
    if (ntext && !tok) {
        rc = pd_errorf(PD_EINVAL, "text prompts need the model's tokenizer.json; give token ids "
                                  "with --prompt-ids instead");
        goto fail;
    }
    for (size_t i = 0; i < ntext; i++) {
        if (pd_array_grow((void **)&ps, &cap, (size_t)n + 1, sizeof(*ps)))
            goto nomem;
        memset(&ps[n], 0, sizeof(ps[n]));
        rc = pd_tokenizer_encode(tok, texts[i], strlen(texts[i]),
                                 a->raw_prompt ? 0 : PD_TOK_DEFAULT, &ps[n]);
        n++;
        if (rc)
            goto fail;
    }
    if (a->prompt_ids) {
        const char *s = a->prompt_ids;
        while (*s) {
            const char *semi = strchr(s, ';');
            size_t len = semi ? (size_t)(semi - s) : strlen(s);
            char *one = pd_strndup(s, len);
            if (!one || pd_array_grow((void **)&ps, &cap, (size_t)n + 1, sizeof(*ps))) {
                pd_free(one);
                goto nomem;
            }
            memset(&ps[n], 0, sizeof(ps[n]));
            rc = parse_ids(one, &ps[n]);
            pd_free(one);
            n++;
            if (rc)
                goto fail;
            s += len + (semi ? 1 : 0);
        }
    }
    for (int i = 0; i < n; i++)
        if (ps[i].n == 0) {
            rc = pd_errorf(PD_EINVAL, "prompt %d is empty", i);
            goto fail;
        }
    if (n == 0) {
        rc = pd_errorf(PD_EINVAL, "no prompts: give text arguments, --prompt-file or --prompt-ids");
        goto fail;
    }
    pd_free(texts);
    pd_free(buf);
    *out = ps;
    *n_out = n;
    return PD_OK;
nomem:
    rc = PD_ENOMEM;
fail:
    for (int i = 0; i < n; i++)
        pd_token_ids_free(&ps[i]);
    pd_free(ps);
    pd_free(texts);
    pd_free(buf);
    return rc;
}

static void print_result(const struct args *a, const struct pd_tokenizer *tok,
                         const struct prompt *p) {
    const int32_t *out = p->ids + p->n;
    if (tok) {
        char *text = NULL;
        size_t len = 0;
        if (pd_tokenizer_decode(tok, out, (size_t)p->n_out, true, &text, &len) == PD_OK) {
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
        }
        pd_free(text);
    }
    if (a->ids || !tok) {
        for (int i = 0; i < p->n_out; i++)
            printf(i ? " %d" : "%d", (int)out[i]);
        fputc('\n', stdout);
    }
    if (a->logprobs)
        printf("# sum logprob %.6f over %d tokens\n", p->logprob_sum, p->n_out);
}

/* The images of a prompt: their embeddings and the prompt made ready for them. */
struct vision_input {
    struct pd_vision_prompt vp;
    float **emb; /* [vp.n_images] host [tokens][hidden] */
    bool on;
};

static void vision_input_free(struct vision_input *v) {
    for (int i = 0; v->emb && i < v->vp.n_images; i++)
        pd_free(v->emb[i]);
    pd_free(v->emb);
    pd_vision_prompt_free(&v->vp);
}

/* One image file through the decoder and the processor. */
static int load_image(const struct pd_image_processor_config *pc, const char *path,
                      struct pd_image_patches *out) {
    char *bytes;
    size_t len;
    int rc = pd_file_read_all(path, &bytes, &len);
    if (rc != PD_OK)
        return rc;
    struct pd_image img;
    struct pd_image_decode_opts o = {.alpha = PD_IMAGE_ALPHA_ON_WHITE};
    rc = pd_image_decode(bytes, len, &o, &img);
    pd_free(bytes);
    if (rc == PD_OK) {
        rc = pd_image_process(pc, &img, out);
        pd_image_free(&img);
    }
    return rc ? pd_error_wrap(rc, "--image %s", path) : PD_OK;
}

/* --image: encodes each file (comma-separated) with the model's vision encoder on a cpu backend
 * of its own, then expands the prompt's placeholders in *ids and plans its M-RoPE positions. */
static int encode_images(const struct args *a, const struct pd_model_config *lm,
                         struct pd_token_ids *ids, struct vision_input *v) {
    struct pd_vision_config vc;
    struct pd_image_processor_config pc;
    struct pd_checkpoint *ck = NULL;
    struct pd_backend *be = NULL;
    struct pd_vision_encoder *enc = NULL;
    struct pd_image_patches *imgs = NULL;
    int(*grids)[3] = NULL, n_img = 1, rc;
    char path[4096], *list = NULL;
    for (const char *c = a->images; *c; c++)
        n_img += *c == ',';
    snprintf(path, sizeof(path), "%s/preprocessor_config.json", a->model_path);
    if ((rc = pd_vision_config_load(a->model_path, &vc)) ||
        (rc = pd_image_processor_config_load(path, &pc)) ||
        (rc = pd_checkpoint_open(a->model_path, &ck)))
        goto out;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = a->threads};
    struct pd_vision_encoder_opts eo = {
        .max_patches = (int)(pc.max_pixels / ((int64_t)pc.patch_size * pc.patch_size))};
    if ((rc = pd_backend_new(&bo, &be)) || (rc = pd_vision_encoder_new(be, &vc, ck, &eo, &enc)))
        goto out;
    imgs = pd_calloc((size_t)n_img, sizeof(*imgs));
    grids = pd_calloc((size_t)n_img, sizeof(*grids));
    v->emb = pd_calloc((size_t)n_img, sizeof(float *));
    list = pd_malloc(strlen(a->images) + 1);
    if (!imgs || !grids || !v->emb || !list) {
        rc = PD_ENOMEM;
        goto out;
    }
    strcpy(list, a->images);
    char *save = NULL, *file = strtok_r(list, ",", &save);
    for (int i = 0; i < n_img; i++, file = strtok_r(NULL, ",", &save)) {
        if (!file) {
            rc = pd_errorf(PD_EINVAL, "--image: an empty file name in '%s'", a->images);
            goto out;
        }
        if ((rc = load_image(&pc, file, &imgs[i])))
            goto out;
        grids[i][0] = imgs[i].grid_t, grids[i][1] = imgs[i].grid_h, grids[i][2] = imgs[i].grid_w;
        int64_t tok = pd_vision_tokens(&vc, imgs[i].grid_t, imgs[i].grid_h, imgs[i].grid_w);
        if (!(v->emb[i] = pd_malloc((size_t)tok * (size_t)vc.out_dim * sizeof(float)))) {
            rc = PD_ENOMEM;
            goto out;
        }
        if ((rc = pd_vision_encode(enc, &imgs[i], v->emb[i])))
            goto out;
    }
    if (vc.out_dim != lm->hidden_size) {
        rc = pd_errorf(PD_EMISMATCH, "the vision encoder's output (%d) is not the model's width %d",
                       vc.out_dim, lm->hidden_size);
        goto out;
    }
    if ((rc = pd_vision_prompt_build(lm, vc.spatial_merge_size, ids->ids, (int)ids->n,
                                     (const int(*)[3])grids, n_img, &v->vp)))
        goto out;
    /* the prompt, expanded */
    pd_token_ids_free(ids);
    if (!(ids->ids = pd_malloc((size_t)v->vp.n * sizeof(int32_t)))) {
        rc = PD_ENOMEM;
        goto out;
    }
    memcpy(ids->ids, v->vp.ids, (size_t)v->vp.n * sizeof(int32_t));
    ids->n = ids->cap = (size_t)v->vp.n;
    v->on = true;
out:
    for (int i = 0; imgs && i < n_img; i++)
        pd_image_patches_free(&imgs[i]);
    pd_free(imgs);
    pd_free(grids);
    pd_free(list);
    pd_vision_encoder_free(enc);
    pd_backend_free(be);
    pd_checkpoint_free(ck);
    return rc ? pd_error_wrap(rc, "--image") : PD_OK;
}

static int run(const struct args *a, int n_texts, char **texts_in) {
    struct pd_tp_group *tp = NULL;
    struct pd_tokenizer *tok = NULL;
    struct pd_token_ids *pids = NULL;
    struct prompt *ps = NULL;
    struct pd_model_seq *seqs = NULL;
    int32_t *next = NULL;
    float *logits = NULL;
    struct pd_sampling_scratch scratch = {0};
    FILE *lf = NULL;
    struct vision_input vis = {0};
    struct pd_model_embeds *spans = NULL;
    int n = 0, rc;

    if (!a->no_tokenizer) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/tokenizer.json", a->model_path);
        FILE *f = fopen(path, "r");
        if (f) {
            fclose(f);
            if ((rc = pd_tokenizer_new(a->model_path, &tok)) != PD_OK)
                goto out;
        }
    }
    if ((rc = collect_prompts(a, n_texts, texts_in, tok, &pids, &n)) != PD_OK)
        goto out;
    /* the pool's size needs the context length, which needs the config: read it first */
    struct pd_model_config mcfg;
    if ((rc = pd_model_config_load(a->model_path, &mcfg)) != PD_OK)
        goto out;
    if (a->images && n != 1) {
        rc = pd_errorf(PD_EINVAL, "--image goes with one prompt, not %d", n);
        goto out;
    }
    if (a->images && (rc = encode_images(a, &mcfg, &pids[0], &vis)) != PD_OK)
        goto out;
    if (vis.on && !(spans = pd_calloc((size_t)vis.vp.n_images, sizeof(*spans)))) {
        rc = PD_ENOMEM;
        goto out;
    }
    int max_prompt = 0;
    for (int i = 0; i < n; i++)
        max_prompt = (int)pids[i].n > max_prompt ? (int)pids[i].n : max_prompt;
    int per_req = max_prompt + a->max_new_tokens;
    if (per_req > mcfg.max_position_embeddings)
        per_req = mcfg.max_position_embeddings;
    int pages_per = (per_req + a->page_size - 1) / a->page_size;
    enum pd_dtype kv_dtype;
    bool kv_auto = !pd_kv_cache_dtype_of(a->kv_cache_dtype, &kv_dtype);
    struct pd_tp_group_opts go = {
        .size = a->tp_size,
        .backend = {.kind = a->device == PD_DEVICE_CUDA ? PD_BACKEND_CUDA : PD_BACKEND_CPU,
                    .threads = a->threads,
                    .device_index = a->base_gpu_id},
        .model_path = a->model_path,
        .model = {.max_tokens = a->chunk,
                  .max_reqs = n,
                  .max_logit_rows = n,
                  .page_size = a->page_size},
        .kv_dtype = kv_dtype,
        .kv_dtype_auto = kv_auto,
        .n_pages = (int64_t)pages_per * n,
    };
    if ((rc = pd_tp_group_new(&go, &tp)) != PD_OK)
        goto out;
    const struct pd_model_config *cfg = pd_model_config_of(pd_tp_group_model(tp, 0));
    int vocab = cfg->vocab_size, ctx = pd_model_context_length(pd_tp_group_model(tp, 0));
    ps = pd_calloc((size_t)n, sizeof(*ps));
    seqs = pd_calloc((size_t)n, sizeof(*seqs));
    next = pd_calloc((size_t)n, sizeof(int32_t));
    logits = pd_calloc((size_t)n * (size_t)vocab, sizeof(float));
    if (!ps || !seqs || !next || !logits || (rc = pd_sampling_scratch_init(&scratch, vocab))) {
        rc = rc ? rc : PD_ENOMEM;
        goto out;
    }
    if (a->logits_out && !(lf = fopen(a->logits_out, "wb"))) {
        rc = pd_errorf(pd_status_from_errno(errno), "opening --logits-out %s: %s", a->logits_out,
                       strerror(errno));
        goto out;
    }
    struct pd_sampling_params sp;
    pd_sampling_params_default(&sp);
    sp.temperature = (float)a->temperature;
    sp.top_k = a->top_k;
    sp.top_p = (float)a->top_p;
    sp.min_p = (float)a->min_p;
    sp.repetition_penalty = (float)a->rep;
    sp.frequency_penalty = (float)a->freq;
    sp.presence_penalty = (float)a->pres;
    sp.max_new_tokens = a->max_new_tokens;
    sp.ignore_eos = a->ignore_eos;
    sp.n_logprobs = a->logprobs;
    sp.has_seed = a->seed >= 0;
    sp.seed = (uint64_t)a->seed;
    if (a->stop_ids) {
        struct pd_token_ids st = {0};
        if ((rc = parse_ids(a->stop_ids, &st)) != PD_OK)
            goto out;
        for (size_t i = 0; i < st.n && i < PD_SAMPLING_MAX_STOP_IDS; i++)
            sp.stop_token_ids[sp.n_stop_token_ids++] = st.ids[i];
        pd_token_ids_free(&st);
    }
    for (int i = 0; i < n; i++) {
        struct prompt *p = &ps[i];
        p->n = (int)pids[i].n;
        if (p->n > ctx) {
            rc = pd_errorf(PD_ERANGE, "prompt %d has %d tokens, longer than the context length %d",
                           i, p->n, ctx);
            goto out;
        }
        p->ids = pd_calloc((size_t)p->n + (size_t)a->max_new_tokens + 1, sizeof(int32_t));
        p->pages = pd_calloc((size_t)pages_per, sizeof(int32_t));
        if (!p->ids || !p->pages) {
            rc = PD_ENOMEM;
            goto out;
        }
        memcpy(p->ids, pids[i].ids, sizeof(int32_t) * (size_t)p->n);
        p->n_pages = pages_per;
        for (int j = 0; j < pages_per; j++)
            p->pages[j] = i * pages_per + j;
        if ((rc = pd_sampler_init(&p->sampler, &sp, vocab, p->ids, p->n, cfg->eos_token_ids,
                                  cfg->n_eos_token_ids)) != PD_OK)
            goto out;
    }
    /* prefill: each prompt in chunks of the step budget; its last chunk yields its logits */
    for (int i = 0; i < n; i++) {
        struct prompt *p = &ps[i];
        for (int done = 0; done < p->n;) {
            int len = p->n - done < a->chunk ? p->n - done : a->chunk;
            struct pd_model_seq s = {.tokens = p->ids + done,
                                     .n_new = len,
                                     .n_cached = done,
                                     .pages = p->pages,
                                     .n_pages = p->n_pages};
            if (vis.on) { /* the images' positions and the part of their embeddings here */
                s.mpos = vis.vp.mpos + (size_t)done * 3;
                s.embeds = spans;
                s.n_embeds = pd_vision_prompt_spans(&vis.vp, (const float *const *)vis.emb,
                                                    cfg->hidden_size, done, len, spans);
            }
            if ((rc = pd_tp_group_extend(tp, &s, 1, false, logits + (size_t)i * vocab)) != PD_OK)
                goto out;
            done += len;
        }
        if (lf &&
            fwrite(logits + (size_t)i * vocab, sizeof(float), (size_t)vocab, lf) != (size_t)vocab) {
            rc = pd_errorf(PD_EIO, "writing --logits-out %s", a->logits_out);
            goto out;
        }
    }
    if (lf) {
        fclose(lf);
        lf = NULL;
    }
    /* decode: every unfinished prompt advances one token per step, in one batch */
    for (int i = 0; i < n; i++)
        ps[i].done = a->max_new_tokens == 0;
    for (;;) {
        int nb = 0;
        for (int i = 0; i < n; i++) {
            struct prompt *p = &ps[i];
            if (p->done)
                continue;
            struct pd_sample smp;
            pd_sampler_next(&p->sampler, &scratch, logits + (size_t)i * vocab, &smp);
            p->ids[p->n + p->n_out++] = smp.token;
            p->logprob_sum += smp.logprob;
            int total = p->n + p->n_out;
            if (smp.finish || total >= ctx) {
                p->done = true;
                continue;
            }
            seqs[nb] = (struct pd_model_seq){.tokens = &p->ids[total - 1],
                                             .n_new = 1,
                                             .n_cached = total - 1,
                                             .pages = p->pages,
                                             .n_pages = p->n_pages,
                                             .pos_delta = vis.on ? vis.vp.pos_delta : 0};
            next[nb++] = i;
        }
        if (!nb)
            break;
        /* batch row b belongs to prompt next[b] >= b: spread the rows back in place, last
         * first, so no row is overwritten before it has moved */
        if ((rc = pd_tp_group_decode(tp, seqs, nb, logits)) != PD_OK)
            goto out;
        for (int b = nb - 1; b >= 0; b--)
            if (next[b] != b)
                memmove(logits + (size_t)next[b] * vocab, logits + (size_t)b * vocab,
                        sizeof(float) * (size_t)vocab);
    }
    for (int i = 0; i < n; i++)
        print_result(a, tok, &ps[i]);
    fflush(stdout);
out:
    if (lf)
        fclose(lf);
    vision_input_free(&vis);
    pd_free(spans);
    for (int i = 0; ps && i < n; i++) {
        pd_sampler_free(&ps[i].sampler);
        pd_free(ps[i].ids);
        pd_free(ps[i].pages);
    }
    for (int i = 0; pids && i < n; i++)
        pd_token_ids_free(&pids[i]);
    pd_free(pids);
    pd_free(ps);
    pd_free(seqs);
    pd_free(next);
    pd_free(logits);
    pd_sampling_scratch_free(&scratch);
    pd_tp_group_free(tp);
    pd_tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv) {
    struct args a = {
        .threads = 0,
        .tp_size = 1,
        .page_size = 16,
        .chunk = 512,
        .max_new_tokens = 32,
        .temperature = 0.0,
        .top_p = 1.0,
        .rep = 1.0,
        .seed = -1,
        .log_level = PD_LOG_WARNING,
    };
    struct pd_flagset fs;
    pd_flagset_init(&fs, "pdserve-generate",
                    "Generates completions for prompts with the serving engine, in one process. "
                    "Prompts are the positional arguments (text), --prompt-file lines, or "
                    "--prompt-ids \"1 2 3; 4 5\". Greedy unless --temperature > 0.");
    pd_flag_string(&fs, "--model-path", &a.model_path, "DIR", "Hugging Face model directory")
        ->required = true;
    pd_flag_string(&fs, "--prompt-file", &a.prompt_file, "FILE", "one text prompt per line");
    pd_flag_string(&fs, "--prompt-ids", &a.prompt_ids, "IDS",
                   "prompts as token ids, prompts separated by ';'");
    pd_flag_bool(&fs, "--ids", &a.ids, "print the generated token ids too");
    pd_flag_string(&fs, "--image", &a.images, "FILE[,FILE...]",
                   "images of the one prompt (PNG or JPEG; qwen2_vl / qwen2_5_vl models): one per "
                   "image placeholder (<|image_pad|>) in it, in order");
    pd_flag_string(&fs, "--logits-out", &a.logits_out, "FILE",
                   "write each prompt's last-position logits, raw little-endian f32");
    pd_flag_bool(&fs, "--raw-prompt", &a.raw_prompt, "encode text without BOS/special tokens");
    pd_flag_bool(&fs, "--no-tokenizer", &a.no_tokenizer, "ignore tokenizer.json (ids only)");
    pd_flag_int(&fs, "--max-new-tokens", &a.max_new_tokens, "N", 0, 1 << 20, "tokens to generate");
    pd_flag_double(&fs, "--temperature", &a.temperature, "T", 0, 100, "0 = greedy");
    pd_flag_int(&fs, "--top-k", &a.top_k, "K", -1, 1 << 30, "keep the K most likely (<= 0: all)");
    pd_flag_double(&fs, "--top-p", &a.top_p, "P", 1e-6, 1, "nucleus mass");
    pd_flag_double(&fs, "--min-p", &a.min_p, "P", 0, 1, "drop tokens below P x the top one");
    pd_flag_double(&fs, "--repetition-penalty", &a.rep, "F", 1e-3, 100, "over prompt + output");
    pd_flag_double(&fs, "--frequency-penalty", &a.freq, "F", -2, 2, "per use, over output");
    pd_flag_double(&fs, "--presence-penalty", &a.pres, "F", -2, 2, "once per output token seen");
    pd_flag_int64(&fs, "--seed", &a.seed, "N", -1, 9e18, "sampling seed (-1 = from the clock)");
    pd_flag_bool(&fs, "--ignore-eos", &a.ignore_eos, "do not stop at EOS");
    pd_flag_string(&fs, "--stop-token-ids", &a.stop_ids, "IDS", "stop at any of these ids");
    pd_flag_int(&fs, "--logprobs", &a.logprobs, "N", 0, PD_SAMPLING_MAX_LOGPROBS,
                "report logprobs (sum of the chosen tokens')");
    pd_flag_choice(&fs, "--device", &a.device, pd_device_names, "compute backend");
    pd_flag_int(&fs, "--base-gpu-id", &a.base_gpu_id, "N", 0, 1023,
                "--device cuda: index of the GPU to run on");
    pd_flag_int(&fs, "--threads", &a.threads, "N", 0, 1024,
                "cpu threads (all ranks together), 0 = one per core");
    pd_flag_int(&fs, "--tp-size", &a.tp_size, "N", 1, PD_TP_MAX,
                "tensor parallelism: the model's heads and MLP split over N ranks of this "
                "process (cpu: threads summing in shared memory; cuda: GPUs --base-gpu-id .. +N-1 "
                "over NCCL); the all-reduce changes only the float summation order");
    pd_flag_int(&fs, "--page-size", &a.page_size, "TOKENS", 1, 1024, "tokens per KV page");
    pd_flag_choice(&fs, "--kv-cache-dtype", &a.kv_cache_dtype, pd_kv_cache_dtype_names,
                   pd_kv_cache_dtype_help);
    pd_flag_int(&fs, "--chunked-prefill-size", &a.chunk, "TOKENS", 1, 1 << 20,
                "prompt tokens per extend step");
    pd_flag_log_level(&fs, &a.log_level);
    /* flags and text prompts may be mixed: known "--name" words (and their values) go to the
     * flag parser, every other word is a prompt; "--" ends the flags */
    char **flag_argv = calloc((size_t)argc + 1, sizeof(char *));
    char **texts = calloc((size_t)argc + 1, sizeof(char *));
    if (!flag_argv || !texts) {
        fprintf(stderr, "pdserve-generate: out of memory\n");
        return 1;
    }
    int nf = 1, nt = 0;
    flag_argv[0] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *w = argv[i];
        if (strcmp(w, "--") == 0) {
            while (++i < argc)
                texts[nt++] = argv[i];
            break;
        }
        if (w[0] != '-' || w[1] != '-') {
            texts[nt++] = argv[i];
            continue;
        }
        flag_argv[nf++] = argv[i]; /* unknown flags too: the parser names them */
        for (int f = 0; f < fs.n; f++) {
            size_t len = strlen(fs.flags[f].name);
            if (strncmp(w, fs.flags[f].name, len) == 0 && w[len] == '\0' &&
                fs.flags[f].kind != PD_FLAG_BOOL && i + 1 < argc)
                flag_argv[nf++] = argv[++i];
        }
    }
    int rc = pd_flags_parse(&fs, nf, flag_argv);
    if (rc) {
        fprintf(stderr, "pdserve-generate: %s\n", pd_error_msg());
        free(flag_argv);
        free(texts);
        return 2;
    }
    if (fs.help) {
        pd_flags_usage(&fs, stdout);
        free(flag_argv);
        free(texts);
        return 0;
    }
    pd_log_set_level((enum pd_log_level)a.log_level);
    rc = run(&a, nt, texts);
    free(flag_argv);
    free(texts);
    if (rc) {
        fprintf(stderr, "pdserve-generate: %s\n", pd_error_msg());
        return 1;
    }
    return 0;
}
