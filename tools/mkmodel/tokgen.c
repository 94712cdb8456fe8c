/*
 * tokgen.c — the family-specific half of tokenizer generation: which special tokens exist and
 * where, the split regexes of Llama-3 and Qwen2 (public data from their tokenizer.json files),
 * chat templates in each family's format, and the JSON text of tokenizer.json and
 * tokenizer_config.json laid out as the Hugging Face tokenizers library writes them.
 *
 * JSON is emitted with a small append-only buffer rather than built as a cJSON tree: the
 * vocabulary must keep id order and merges their priority order, and a flat writer makes that
 * ordering (and byte-identical output for a seed) evident. Strings go through one escaper.
 */
#include "tools/mkmodel/tokgen.h"
#include "common/base/alloc.h"
#include "common/base/status.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The Split pre-tokenizer patterns, verbatim. Llama-3 groups up to three digits, Qwen2 one. */
static const char llama3_split_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char qwen2_split_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *const llama3_added[] = {"<|begin_of_text|>", "<|end_of_text|>",
                                           "<|start_header_id|>", "<|end_header_id|>",
                                           "<|eot_id|>"};
static const char *const qwen_added[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
/* Qwen2-VL's added tokens in their published order (151643 ...): ChatML's, the grounding
 * markers, then the vision ones (<|image_pad|> is the image placeholder, 151655 there). */
static const char *const qwen_vl_added[] = {
    "<|endoftext|>",      "<|im_start|>",     "<|im_end|>",     "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>",    "<|box_end|>",    "<|quad_start|>",
    "<|quad_end|>",       "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>",      "<|video_pad|>"};
static const char *const sp_prefix[] = {"<unk>", "<s>", "</s>"};

/* Chat templates in each family's format (tool calling left out). "\\n" is a Jinja escape. */
static const char llama3_template[] =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}";
static const char llama2_template[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";
static const char mistral_template[] =
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}";
static const char qwen2_template[] =
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}";
/* Qwen2-VL-Instruct's, which Qwen2.5-VL shares: a content list's image parts (type image or
 * image_url, or an image key) become <|vision_start|><|image_pad|><|vision_end|>, its text parts
 * their text. */
static const char qwen_vl_template[] =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
static const char qwen3_template[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static bool is_sentencepiece(enum pd_tokgen_flavor f) {
    return f == PD_TOKGEN_LLAMA2 || f == PD_TOKGEN_MISTRAL;
}

static bool is_qwen(enum pd_tokgen_flavor f) {
    return f == PD_TOKGEN_QWEN2 || f == PD_TOKGEN_QWEN3 || f == PD_TOKGEN_QWEN2_VL;
}

/* The added tokens of a byte-level flavor. */
static const char *const *added_of(enum pd_tokgen_flavor f, int *n) {
    if (f == PD_TOKGEN_QWEN2_VL) {
        *n = (int)PD_ARRAY_LEN(qwen_vl_added);
        return qwen_vl_added;
    }
    *n = is_qwen(f) ? (int)PD_ARRAY_LEN(qwen_added) : (int)PD_ARRAY_LEN(llama3_added);
    return is_qwen(f) ? qwen_added : llama3_added;
}

int pd_tokgen_added_id(const struct pd_tokgen *t, const char *text) {
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i], text) == 0)
            return t->bpe.n_tokens + i;
    return -1;
}

const char *pd_tokgen_flavor_name(enum pd_tokgen_flavor f) {
    static const char *const names[] = {"llama3", "llama2", "mistral",
                                        "qwen2",  "qwen3",  "qwen2_vl"};
    return (unsigned)f < PD_ARRAY_LEN(names) ? names[f] : "unknown";
}

int pd_tokgen_min_tokens(enum pd_tokgen_flavor f) {
    if (is_sentencepiece(f))
        return pd_bpe_min_tokens(PD_BPE_SENTENCEPIECE, (int)PD_ARRAY_LEN(sp_prefix));
    int added;
    added_of(f, &added);
    return pd_bpe_min_tokens(PD_BPE_BYTE_LEVEL, 0) + added;
}

int pd_tokgen_build(enum pd_tokgen_flavor f, int max_tokens, struct pd_tokgen *out) {
    memset(out, 0, sizeof(*out));
    out->flavor = f;
    int min = pd_tokgen_min_tokens(f);
    if (max_tokens < min)
        return pd_errorf(PD_ERANGE,
                         "the %s tokenizer needs a vocabulary of at least %d tokens, got %d",
                         pd_tokgen_flavor_name(f), min, max_tokens);

    struct pd_bpe_train_opts o = {
        .corpus = pd_tokgen_corpus,
        .corpus_len = pd_tokgen_corpus_len,
    };
    if (is_sentencepiece(f)) {
        o.style = PD_BPE_SENTENCEPIECE;
        o.prefix_tokens = sp_prefix;
        o.n_prefix = (int)PD_ARRAY_LEN(sp_prefix);
        o.max_tokens = max_tokens;
    } else {
        o.style = PD_BPE_BYTE_LEVEL;
        o.max_digits = is_qwen(f) ? 1 : 3;
        out->added = added_of(f, &out->n_added);
        o.max_tokens = max_tokens - out->n_added;
    }
    int rc = pd_bpe_train(&o, &out->bpe);
    if (rc)
        return pd_error_wrap(rc, "training the %s tokenizer", pd_tokgen_flavor_name(f));
    int base = out->bpe.n_tokens;
    out->n_tokens = base + out->n_added;
    out->pad_id = -1;
    out->unk_id = -1;
    switch (f) {
    case PD_TOKGEN_LLAMA3:
        out->bos_id = base + 0;
        out->eos_id = base + 4; /* <|eot_id|> ends a turn ... */
        out->eos_ids[0] = base + 4;
        out->eos_ids[1] = base + 1; /* ... <|end_of_text|> ends a document */
        out->n_eos_ids = 2;
        break;
    case PD_TOKGEN_QWEN2:
    case PD_TOKGEN_QWEN3:
    case PD_TOKGEN_QWEN2_VL:
        out->bos_id = -1;
        out->eos_id = base + 2; /* <|im_end|> */
        out->eos_ids[0] = base + 2;
        out->eos_ids[1] = base + 0; /* <|endoftext|> */
        out->n_eos_ids = 2;
        out->pad_id = base + 0;
        break;
    case PD_TOKGEN_LLAMA2:
    case PD_TOKGEN_MISTRAL:
        out->unk_id = 0;
        out->bos_id = 1;
        out->eos_id = 2;
        out->eos_ids[0] = 2;
        out->n_eos_ids = 1;
        break;
    }
    return PD_OK;
}

void pd_tokgen_free(struct pd_tokgen *t) {
    if (!t)
        return;
    pd_bpe_vocab_free(&t->bpe);
    memset(t, 0, sizeof(*t));
}

/* ---- JSON text ---- */

struct jbuf {
    char *p;
    size_t len, cap;
    bool failed; /* an append ran out of memory; everything after it is dropped */
};

static void jb_putn(struct jbuf *b, const char *s, size_t n) {
    if (b->failed)
        return;
    if (pd_array_grow((void **)&b->p, &b->cap, b->len + n + 1, 1)) {
        b->failed = true;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void jb_puts(struct jbuf *b, const char *s) {
    jb_putn(b, s, strlen(s));
}

static void jb_printf(struct jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jb_printf(struct jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    PD_ASSERT(n >= 0 && (size_t)n < sizeof(tmp)); /* only short fixed formats come here */
    jb_putn(b, tmp, (size_t)n);
}

/* The inside of a JSON string literal: quotes, backslashes and control bytes escaped; UTF-8
 * passes through unchanged. */
static void jb_escaped(struct jbuf *b, const char *s) {
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        jb_putn(b, run, (size_t)(s - run));
        run = s + 1;
        switch (c) {
        case '"': jb_puts(b, "\\\""); break;
        case '\\': jb_puts(b, "\\\\"); break;
        case '\n': jb_puts(b, "\\n"); break;
        case '\r': jb_puts(b, "\\r"); break;
        case '\t': jb_puts(b, "\\t"); break;
        default: jb_printf(b, "\\u%04x", c); break;
        }
    }
    jb_putn(b, run, (size_t)(s - run));
}

static void jb_str(struct jbuf *b, const char *s) {
    jb_putn(b, "\"", 1);
    jb_escaped(b, s);
    jb_putn(b, "\"", 1);
}

static char *jb_finish(struct jbuf *b, const char *what) {
    if (b->failed) {
        pd_free(b->p);
        pd_error_wrap(PD_ENOMEM, "writing %s", what);
        return NULL;
    }
    return b->p;
}

static const char *token_text(const struct pd_tokgen *t, int id) {
    return id < t->bpe.n_tokens ? t->bpe.tokens[id] : t->added[id - t->bpe.n_tokens];
}

/* Special tokens of the family, in id order: SentencePiece's live inside the BPE vocabulary. */
static void special_ids(const struct pd_tokgen *t, int *first, int *count) {
    if (is_sentencepiece(t->flavor)) {
        *first = 0;
        *count = (int)PD_ARRAY_LEN(sp_prefix);
    } else {
        *first = t->bpe.n_tokens;
        *count = t->n_added;
    }
}

/* TemplateProcessing that puts `bos` before each sequence, as Llama tokenizers do. */
static void jb_bos_template(struct jbuf *b, const char *bos, int bos_id, const char *indent) {
    jb_printf(b, "{\n%s  \"type\": \"TemplateProcessing\",\n%s  \"single\": [\n", indent, indent);
    jb_printf(b, "%s    {\"SpecialToken\": {\"id\": ", indent);
    jb_str(b, bos);
    jb_printf(b, ", \"type_id\": 0}},\n%s    {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}\n",
              indent);
    jb_printf(b, "%s  ],\n%s  \"pair\": [\n%s    {\"SpecialToken\": {\"id\": ", indent, indent,
              indent);
    jb_str(b, bos);
    jb_printf(b, ", \"type_id\": 0}},\n%s    {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},\n",
              indent);
    jb_printf(b, "%s    {\"SpecialToken\": {\"id\": ", indent);
    jb_str(b, bos);
    jb_printf(b, ", \"type_id\": 1}},\n%s    {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}\n",
              indent);
    jb_printf(b, "%s  ],\n%s  \"special_tokens\": {\n%s    ", indent, indent, indent);
    jb_str(b, bos);
    jb_puts(b, ": {\"id\": ");
    jb_str(b, bos);
    jb_printf(b, ", \"ids\": [%d], \"tokens\": [", bos_id);
    jb_str(b, bos);
    jb_printf(b, "]}\n%s  }\n%s}", indent, indent);
}

char *pd_tokgen_tokenizer_json(const struct pd_tokgen *t) {
    struct jbuf b = {0};
    bool sp = is_sentencepiece(t->flavor), qwen = is_qwen(t->flavor);
    int first, count;
    special_ids(t, &first, &count);

    jb_puts(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n");
    jb_puts(&b, "  \"added_tokens\": [\n");
    for (int i = 0; i < count; i++) {
        jb_printf(&b, "    {\"id\": %d, \"content\": ", first + i);
        jb_str(&b, token_text(t, first + i));
        jb_printf(&b,
                  ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                  "\"normalized\": false, \"special\": true}%s\n",
                  i + 1 < count ? "," : "");
    }
    jb_puts(&b, "  ],\n");

    if (sp) {
        jb_puts(&b, "  \"normalizer\": {\n    \"type\": \"Sequence\",\n    \"normalizers\": [\n"
                    "      {\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},\n"
                    "      {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                    "\"content\": \"\xE2\x96\x81\"}\n    ]\n  },\n");
        jb_puts(&b, "  \"pre_tokenizer\": null,\n  \"post_processor\": ");
        jb_bos_template(&b, token_text(t, t->bos_id), t->bos_id, "  ");
        jb_puts(&b, ",\n  \"decoder\": {\n    \"type\": \"Sequence\",\n    \"decoders\": [\n"
                    "      {\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"}, "
                    "\"content\": \" \"},\n"
                    "      {\"type\": \"ByteFallback\"},\n      {\"type\": \"Fuse\"},\n"
                    "      {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}\n"
                    "    ]\n  },\n");
    } else {
        jb_puts(&b,
                qwen ? "  \"normalizer\": {\"type\": \"NFC\"},\n" : "  \"normalizer\": null,\n");
        jb_puts(&b,
                "  \"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n    \"pretokenizers\": [\n"
                "      {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
        jb_str(&b, qwen ? qwen2_split_regex : llama3_split_regex);
        jb_printf(&b,
                  "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
                  "      {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                  "\"trim_offsets\": %s, \"use_regex\": false}\n    ]\n  },\n",
                  qwen ? "false" : "true");
        if (qwen) {
            jb_puts(&b, "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                        "false, \"trim_offsets\": false, \"use_regex\": false},\n"
                        "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                        "\"trim_offsets\": false, \"use_regex\": false},\n");
        } else {
            jb_puts(&b, "  \"post_processor\": {\n    \"type\": \"Sequence\",\n"
                        "    \"processors\": [\n      {\"type\": \"ByteLevel\", "
                        "\"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": "
                        "true},\n      ");
            jb_bos_template(&b, token_text(t, t->bos_id), t->bos_id, "      ");
            jb_puts(&b, "\n    ]\n  },\n  \"decoder\": {\"type\": \"ByteLevel\", "
                        "\"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": "
                        "true},\n");
        }
    }

    jb_puts(&b, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n");
    jb_puts(&b, sp ? "    \"unk_token\": \"<unk>\",\n" : "    \"unk_token\": null,\n");
    jb_printf(&b,
              "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
              "    \"fuse_unk\": %s,\n    \"byte_fallback\": %s,\n    \"ignore_merges\": %s,\n",
              sp ? "true" : "false", sp ? "true" : "false",
              t->flavor == PD_TOKGEN_LLAMA3 ? "true" : "false");
    jb_puts(&b, "    \"vocab\": {\n");
    for (int i = 0; i < t->bpe.n_tokens; i++) {
        jb_puts(&b, "      ");
        jb_str(&b, t->bpe.tokens[i]);
        jb_printf(&b, ": %d%s\n", i, i + 1 < t->bpe.n_tokens ? "," : "");
    }
    jb_puts(&b, "    },\n    \"merges\": [\n");
    for (int i = 0; i < t->bpe.n_merges; i++) {
        const char *l = t->bpe.tokens[t->bpe.merges[i][0]], *r = t->bpe.tokens[t->bpe.merges[i][1]];
        /* "left right" is only unambiguous because no token text holds a space: byte-level
         * spells it "Ġ", sentencepiece "▁" */
        PD_ASSERT(!strchr(l, ' ') && !strchr(r, ' '));
        jb_puts(&b, "      \"");
        jb_escaped(&b, l);
        jb_puts(&b, " ");
        jb_escaped(&b, r);
        jb_puts(&b, "\"");
        jb_puts(&b, i + 1 < t->bpe.n_merges ? ",\n" : "\n");
    }
    jb_puts(&b, "    ]\n  }\n}\n");
    return jb_finish(&b, "tokenizer.json");
}

char *pd_tokgen_tokenizer_config_json(const struct pd_tokgen *t, int model_max_length) {
    struct jbuf b = {0};
    bool sp = is_sentencepiece(t->flavor), qwen = is_qwen(t->flavor);
    int first, count;
    special_ids(t, &first, &count);

    jb_printf(&b, "{\n  \"add_bos_token\": %s,\n  \"add_eos_token\": false,\n",
              t->bos_id >= 0 ? "true" : "false");
    jb_puts(&b, "  \"added_tokens_decoder\": {\n");
    for (int i = 0; i < count; i++) {
        jb_printf(&b, "    \"%d\": {\n      \"content\": ", first + i);
        jb_str(&b, token_text(t, first + i));
        jb_printf(&b,
                  ",\n      \"lstrip\": false,\n      \"normalized\": false,\n"
                  "      \"rstrip\": false,\n      \"single_word\": false,\n"
                  "      \"special\": true\n    }%s\n",
                  i + 1 < count ? "," : "");
    }
    jb_puts(&b, "  },\n  \"bos_token\": ");
    if (t->bos_id >= 0)
        jb_str(&b, token_text(t, t->bos_id));
    else
        jb_puts(&b, "null");
    const char *tmpl = t->flavor == PD_TOKGEN_LLAMA3    ? llama3_template
                       : t->flavor == PD_TOKGEN_LLAMA2  ? llama2_template
                       : t->flavor == PD_TOKGEN_MISTRAL ? mistral_template
                       : t->flavor == PD_TOKGEN_QWEN2   ? qwen2_template
                       : t->flavor == PD_TOKGEN_QWEN3   ? qwen3_template
                                                        : qwen_vl_template;
    jb_puts(&b, ",\n  \"chat_template\": ");
    jb_str(&b, tmpl);
    jb_printf(&b, ",\n  \"clean_up_tokenization_spaces\": false,\n  \"eos_token\": ");
    jb_str(&b, token_text(t, t->eos_id));
    if (qwen)
        jb_puts(&b, ",\n  \"errors\": \"replace\"");
    if (sp)
        jb_puts(&b, ",\n  \"legacy\": false");
    jb_puts(&b, ",\n  \"model_input_names\": [\"input_ids\", \"attention_mask\"]");
    jb_printf(&b, ",\n  \"model_max_length\": %d,\n  \"pad_token\": ", model_max_length);
    if (t->pad_id >= 0)
        jb_str(&b, token_text(t, t->pad_id));
    else
        jb_puts(&b, "null");
    if (qwen)
        jb_puts(&b, ",\n  \"split_special_tokens\": false");
    jb_puts(&b, ",\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"unk_token\": ");
    if (t->unk_id >= 0)
        jb_str(&b, token_text(t, t->unk_id));
    else
        jb_puts(&b, "null");
    jb_puts(&b, "\n}\n");
    return jb_finish(&b, "tokenizer_config.json");
}
