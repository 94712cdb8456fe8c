/* libFuzzer target: the chat template renderer (model/jinja/chat_template.c). Byte 0 even: the rest
 * is a /v1/chat/completions body (the client's messages, content parts, tools,
 * chat_template_kwargs) rendered the way the daemon does (pd_api_parse, then
 * pd_api_render_chat_prompt) through a real model's template (byte 0 / 2 picks llama2, llama3,
 * qwen2 or mistral). Byte 0 odd: the rest is a template source (the model dir's, operator input)
 * compiled and rendered with fixed messages. Loops in a template must end (libFuzzer's -timeout
 * catches one that does not). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/base/alloc.h"
#include "common/api.h"
#include "model/jinja/chat_template.h"
#include "common/base/status.h"
#include "model/tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define N_MODELS 4
static struct pd_tokenizer *g_tok[N_MODELS];
static struct pd_chat_template *g_tpl[N_MODELS];
static cJSON *g_messages, *g_tools;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static const char *const names[N_MODELS] = {"llama2", "llama3", "qwen2", "mistral"};
    for (int i = 0; i < N_MODELS; i++) {
        char dir[512];
        snprintf(dir, sizeof(dir), "%s/tokenizers/%s", PD_FIXTURES_DIR, names[i]);
        const char *src = NULL;
        if (pd_tokenizer_new(dir, &g_tok[i]) != 0 ||
            !(src = pd_tokenizer_chat_template(g_tok[i])) ||
            pd_chat_template_new(src, &g_tpl[i]) != 0) {
            fprintf(stderr, "fuzz_chat_template: %s: %s\n", dir,
                    src ? pd_error_msg() : "no chat template");
            exit(1);
        }
    }
    g_messages =
        cJSON_Parse("[{\"role\":\"system\",\"content\":\"be brief\"},"
                    "{\"role\":\"user\",\"content\":\"hi\"},"
                    "{\"role\":\"assistant\",\"content\":\"hello\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}]");
    g_tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                          "{\"type\":\"object\"}}}]");
    if (!g_messages || !g_tools)
        exit(1);
    return 0;
}

static void render_body(int m, const char *body, size_t len) {
    struct pd_api_config cfg = {0};
    struct pd_api_request r;
    struct pd_api_error e = {0};
    if (pd_api_parse(PD_API_CHAT, body, len, &cfg, &r, &e) != 0)
        return;
    char *out = NULL;
    size_t out_len = 0;
    if (pd_api_render_chat_prompt(&r, g_tpl[m], pd_tokenizer_bos_token(g_tok[m]),
                                  pd_tokenizer_eos_token(g_tok[m]), &out, &out_len, &e) == 0)
        pd_free(out);
    pd_api_request_free(&r);
}

static void render_template(const char *src, size_t len, int flags) {
    char *s = pd_malloc(len + 1);
    if (!s)
        return;
    memcpy(s, src, len);
    s[len] = '\0';
    struct pd_chat_template *t = NULL;
    if (pd_chat_template_new(s, &t) == 0) {
        struct pd_chat_args a = {
            .messages = g_messages,
            .tools = (flags & 2) ? g_tools : NULL,
            .add_generation_prompt = (flags & 4) != 0,
            .bos_token = "<s>",
            .eos_token = "</s>",
        };
        char *out = NULL;
        size_t out_len = 0;
        if (pd_chat_template_render(t, &a, &out, &out_len) == 0)
            pd_free(out);
        pd_chat_template_free(t);
    }
    pd_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    if (data[0] & 1)
        render_template((const char *)data + 1, size - 1, data[0]);
    else
        render_body((data[0] >> 1) % N_MODELS, (const char *)data + 1, size - 1);
    return 0;
}
