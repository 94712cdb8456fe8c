/*
 * route_text.h — the text the cache_aware policy matches a request on (cache_tree.h), taken as
 * sglang-router's extract_text_for_routing takes it:
 *   /generate             "text"; without it "input_ids" as decimal ids joined by spaces
 *   /v1/completions       "prompt"; a list of strings joined by spaces (token-id prompts, which
 *                         sglang-router routes as empty text, become ids joined by spaces)
 *   /v1/chat/completions  every message's text content in order — a string content, or the
 *                         "text" parts of a content list joined by spaces — joined by spaces
 * A batch (a list of texts, of id lists) gives all of its entries joined by spaces. Nothing is
 * tokenized or templated: the router sees the request, not the prompt the worker builds, so the
 * tree approximates the worker's prefix cache (a chat's turns still extend each other's text).
 */
#ifndef PD_ROUTER_ROUTE_TEXT_H
#define PD_ROUTER_ROUTE_TEXT_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* route: PD_ROUTER_ROUTE_* (body.h); root: the body as cJSON parsed it (NULL when it is not
 * JSON). *out (NUL-terminated, *out_len bytes) is the caller's to pd_free; "" when the body
 * holds no text (or is not JSON: the body rewrite answers that 400). PD_OK or PD_ENOMEM. */
int pd_router_route_text(int route, const cJSON *root, char **out, size_t *out_len);

#endif
