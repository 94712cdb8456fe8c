/*
 * tokenize.c — pdserve-tokenize, as llama.cpp's llama-tokenize: the model directory's tokenizer
 * on the command line, so a user can check the ids a daemon will compute for a prompt.
 *
 * stdin → stdout, one output line per input line: text lines become space-separated ids;
 * with --decode, id lines become text; with --jsonl, every input and text output line is one
 * JSON string (for text with newlines); --chat FILE.json prints the rendered chat prompt of the
 * messages in FILE (a list, or an object with "messages"/"tools"/"add_generation_prompt")
 * instead of reading stdin. Errors name the input line and exit 1.
 */
#include "common/base/alloc.h"
#include "model/jinja/chat_template.h"
#include "common/base/file.h"
#include "common/base/flags.h"
#include "common/base/status.h"
#include "model/tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct opts {
    const char *model_path;
    const char *chat;
    const char *chat_template;
    bool no_special, decode, jsonl, skip_special, no_generation_prompt;
};

/* --jsonl output: text as one JSON string on a line of its own. */
static void print_json_line(const char *text) {
    cJSON *s = cJSON_CreateString(text);
    char *q = s ? cJSON_PrintUnformatted(s) : NULL;
    if (q)
        printf("%s\n", q);
    free(q);
    cJSON_Delete(s);
}

static int render_chat(const struct pd_tokenizer *tok, const struct opts *o) {
    char *json = NULL, *tmpl_src = NULL, *out = NULL;
    size_t len;
    cJSON *root = NULL;
    struct pd_chat_template *tmpl = NULL;
    int rc = pd_file_read_all(o->chat, &json, &len);
    if (rc != PD_OK)
        goto out;
    root = cJSON_ParseWithLength(json, len);
    if (!root) {
        rc = pd_errorf(PD_EFORMAT, "%s is not valid JSON", o->chat);
        goto out;
    }
    const cJSON *msgs = cJSON_IsArray(root) ? root : cJSON_GetObjectItem(root, "messages");
    const cJSON *tools = cJSON_IsObject(root) ? cJSON_GetObjectItem(root, "tools") : NULL;
    const cJSON *agp =
        cJSON_IsObject(root) ? cJSON_GetObjectItem(root, "add_generation_prompt") : NULL;
    if (!cJSON_IsArray(msgs)) {
        rc = pd_errorf(PD_EFORMAT, "%s: expected a list of messages or {\"messages\": [...]}",
                       o->chat);
        goto out;
    }
    const char *src = pd_tokenizer_chat_template(tok);
    if (o->chat_template) {
        rc = pd_file_read_all(o->chat_template, &tmpl_src, &len);
        if (rc != PD_OK)
            goto out;
        src = tmpl_src;
    }
    if (!src) {
        rc = pd_errorf(PD_ENOENT, "%s has no chat template; pass --chat-template FILE",
                       o->model_path);
        goto out;
    }
    rc = pd_chat_template_new(src, &tmpl);
    if (rc != PD_OK)
        goto out;
    struct pd_chat_args args = {
        .messages = msgs,
        .tools = cJSON_IsNull(tools) ? NULL : tools,
        .add_generation_prompt = agp ? cJSON_IsTrue(agp) : !o->no_generation_prompt,
        .bos_token = pd_tokenizer_bos_token(tok),
        .eos_token = pd_tokenizer_eos_token(tok),
    };
    rc = pd_chat_template_render(tmpl, &args, &out, &len);
    if (rc != PD_OK)
        goto out;
    if (o->jsonl) {
        print_json_line(out);
    } else {
        fwrite(out, 1, len, stdout);
    }
out:
    pd_free(out);
    pd_chat_template_free(tmpl);
    cJSON_Delete(root);
    pd_free(json);
    pd_free(tmpl_src);
    return rc;
}

static int encode_line(const struct pd_tokenizer *tok, const struct opts *o, const char *text,
                       size_t len) {
    struct pd_token_ids ids = {0};
    unsigned flags = o->no_special ? 0 : PD_TOK_DEFAULT;
    int rc = pd_tokenizer_encode(tok, text, len, flags, &ids);
    if (rc != PD_OK)
        return rc;
    for (size_t i = 0; i < ids.n; i++)
        printf(i ? " %d" : "%d", ids.ids[i]);
    putchar('\n');
    pd_token_ids_free(&ids);
    return PD_OK;
}

static int decode_line(const struct pd_tokenizer *tok, const struct opts *o, const char *line) {
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = PD_OK;
    const char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == ',' || *p == '[' || *p == ']')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            rc = pd_errorf(PD_EINVAL, "'%.20s' is not a token id", p);
            goto out;
        }
        if ((rc = pd_array_grow((void **)&ids, &cap, n + 1, sizeof(int32_t))) != PD_OK)
            goto out;
        ids[n++] = (int32_t)v;
        p = end;
    }
    char *text = NULL;
    size_t len;
    rc = pd_tokenizer_decode(tok, ids, n, o->skip_special, &text, &len);
    if (rc != PD_OK)
        goto out;
    if (o->jsonl) {
        print_json_line(text);
    } else {
        fwrite(text, 1, len, stdout);
        putchar('\n');
    }
    pd_free(text);
out:
    pd_free(ids);
    return rc;
}

int main(int argc, char **argv) {
    struct opts o = {0};
    int log_level = 1;
    struct pd_flagset fs;
    pd_flagset_init(&fs, "pdserve-tokenize",
                    "Tokenizes stdin with a model directory's tokenizer.json: one line of "
                    "space-separated ids per input line (or text per id line with --decode).");
    pd_flag_string(&fs, "--model-path", &o.model_path, "DIR",
                   "model directory with tokenizer.json (and tokenizer_config.json)")
        ->required = true;
    pd_flag_bool(&fs, "--no-special", &o.no_special,
                 "no BOS/EOS and no special-token matching in the text");
    pd_flag_bool(&fs, "--decode", &o.decode, "read lines of ids, print their text");
    pd_flag_bool(&fs, "--skip-special", &o.skip_special,
                 "with --decode: leave special tokens out of the text");
    pd_flag_bool(&fs, "--jsonl", &o.jsonl, "each text line (input or output) is a JSON string");
    pd_flag_string(&fs, "--chat", &o.chat, "FILE.json",
                   "print the chat prompt rendered from the messages in FILE");
    pd_flag_string(&fs, "--chat-template", &o.chat_template, "FILE",
                   "Jinja chat template to use instead of the model's");
    pd_flag_bool(&fs, "--no-generation-prompt", &o.no_generation_prompt,
                 "with --chat: render without add_generation_prompt");
    pd_flag_log_level(&fs, &log_level);
    if (pd_flags_parse(&fs, argc, argv) != PD_OK) {
        fprintf(stderr, "pdserve-tokenize: %s\n", pd_error_msg());
        return 2;
    }
    if (fs.help) {
        pd_flags_usage(&fs, stdout);
        return 0;
    }
    struct pd_tokenizer *tok = NULL;
    if (pd_tokenizer_new(o.model_path, &tok) != PD_OK) {
        fprintf(stderr, "pdserve-tokenize: %s\n", pd_error_msg());
        return 1;
    }
    int rc = PD_OK;
    if (o.chat) {
        rc = render_chat(tok, &o);
        if (rc != PD_OK)
            fprintf(stderr, "pdserve-tokenize: %s\n", pd_error_msg());
        pd_tokenizer_free(tok);
        return rc == PD_OK ? 0 : 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long line_no = 0;
    while (rc == PD_OK && (n = getline(&line, &cap, stdin)) >= 0) {
        line_no++;
        if (n > 0 && line[n - 1] == '\n')
            line[--n] = '\0';
        if (o.decode) {
            rc = decode_line(tok, &o, line);
        } else if (o.jsonl) {
            cJSON *s = cJSON_ParseWithLength(line, (size_t)n);
            if (!cJSON_IsString(s))
                rc = pd_errorf(PD_EFORMAT, "not a JSON string");
            else
                rc = encode_line(tok, &o, s->valuestring, strlen(s->valuestring));
            cJSON_Delete(s);
        } else {
            rc = encode_line(tok, &o, line, (size_t)n);
        }
        if (rc != PD_OK)
            fprintf(stderr, "pdserve-tokenize: stdin line %ld: %s\n", line_no, pd_error_msg());
    }
    free(line); /* getline's own allocation */
    pd_tokenizer_free(tok);
    return rc == PD_OK ? 0 : 1;
}
