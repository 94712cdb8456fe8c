/*
 * chat_template.h — renders a model's chat template (the Jinja `chat_template` of
 * tokenizer_config.json or chat_template.jinja) for /v1/chat/completions, byte-identical to
 * transformers' apply_chat_template.
 *
 * It is an interpreter for the subset of Jinja that model templates use: text with {{ }},
 * {% %} and {# #} (whitespace control, and trim_blocks/lstrip_blocks on as transformers sets
 * them), if/elif/else, for (loop.*, else, `if` filter, unpacking), set (also on namespace
 * attributes and as a block), macro, break/continue, generation; expressions with Python's
 * semantics for strings, numbers, lists and dicts, slicing, filters (trim, tojson, length,
 * join, map, selectattr, ...), tests (defined, none, string, ...), string/dict methods
 * (startswith, split, strip, items, get, ...) and the globals transformers provides
 * (raise_exception, namespace, range, strftime_now). A template that goes beyond the subset
 * fails to compile (or render) with PD_EUNSUPPORTED naming the construct and its line.
 */
#ifndef PD_CHAT_TEMPLATE_H
#define PD_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

struct pd_chat_template;

/* Parses src once; a compiled template is immutable and may be rendered by many threads. */
int pd_chat_template_new(const char *src, struct pd_chat_template **out);
void pd_chat_template_free(struct pd_chat_template *t);

struct pd_chat_args {
    const cJSON *messages; /* [{"role": ..., "content": ...}, ...] (required) */
    const cJSON *tools;    /* NULL: the template sees tools = none */
    bool add_generation_prompt;
    const char *bos_token; /* NULL: undefined in the template */
    const char *eos_token;
    const cJSON *extra; /* more variables (an object), e.g. enable_thinking; may be NULL */
};

/* Renders into a fresh NUL-terminated string (caller pd_free's). raise_exception() in the
 * template gives PD_EINVAL with its message. */
int pd_chat_template_render(const struct pd_chat_template *t, const struct pd_chat_args *args,
                            char **out, size_t *out_len);

#endif
