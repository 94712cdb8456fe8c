/*
 * prompt_size.h — the router's prompt size in tokens without a tokenizer, for
 * --local-prefill-max-tokens: ids counted as given, text at a rate in bytes a token learned from
 * the decodes' own answers (the prompt_tokens they report for prompts the router measured), 4
 * bytes a token until the first answer. Byte-level BPE runs 3.5-4.5 bytes a token on English,
 * far less on code, digits or non-Latin text: learned, the estimate follows the served traffic.
 */
#ifndef PD_ROUTER_PROMPT_SIZE_H
#define PD_ROUTER_PROMPT_SIZE_H

#include "router/body.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PD_ROUTER_BYTES_PER_TOKEN_DEFAULT 4.0
/* the learned rate stays in [MIN, MAX]: a byte-level tokenizer never makes more than one token
 * of a byte, and above 8 bytes a token one odd answer (a run of spaces) would weigh too much */
#define PD_ROUTER_BYTES_PER_TOKEN_MIN 1.0
#define PD_ROUTER_BYTES_PER_TOKEN_MAX 8.0

/* Text bytes and text tokens of the answers seen, each older answer's weight decayed by
 * PD_ROUTER_RATE_DECAY per newer one (about the last 50 answers count, longer prompts more). */
struct pd_router_token_rate {
    double bytes, tokens;
    uint64_t answers; /* answers learned from */
};
#define PD_ROUTER_RATE_DECAY 0.98

/* Bytes a token: the learned rate, or the default before any answer. */
double pd_router_token_rate_get(const struct pd_router_token_rate *r);

/* The prompt's tokens at the current rate (text rounded up). */
long pd_router_prompt_tokens(const struct pd_router_prompt_size *sz,
                             const struct pd_router_token_rate *r);

/* The "prompt_tokens": N an answer reports (SGLang's meta_info, OpenAI's usage; the first
 * occurrence, the first event of a stream); false when there is none or it is not a count. */
bool pd_router_answer_prompt_tokens(const char *answer, size_t len, long *out);

/* Learns from one answer: the prompt measured as sz, the decode counted prompt_tokens. An answer
 * whose count leaves no text tokens (ids only, or fewer than the ids and message markers) says
 * nothing about text and is skipped; returns whether it was used. */
bool pd_router_token_rate_learn(struct pd_router_token_rate *r,
                                const struct pd_router_prompt_size *sz, long prompt_tokens);

#endif
