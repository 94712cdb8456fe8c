/* libFuzzer target: the tokenizer on arbitrary bytes (model/tokenizer/*.c) with real
 * tokenizer.json fixtures (byte-level BPE: gpt2; sentencepiece-style: llama2). Byte 0 picks the
 * tokenizer and flags; the rest is text to encode (invalid UTF-8 must be an error) and, read as
 * little-endian int32s, ids to decode in one go and step by step (out-of-vocab ids included). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/alloc.h"
#include "common/base/status.h"
#include "model/tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct pd_tokenizer *g_tok[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static const char *const dirs[2] = {PD_FIXTURES_DIR "/tokenizers/gpt2",
                                        PD_FIXTURES_DIR "/tokenizers/llama2"};
    for (int i = 0; i < 2; i++) {
        if (pd_tokenizer_new(dirs[i], &g_tok[i]) != 0) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", dirs[i], pd_error_msg());
            exit(1);
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const struct pd_tokenizer *t = g_tok[data[0] & 1];
    unsigned flags = (data[0] >> 1) & 3;
    bool skip_special = (data[0] & 8) != 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    struct pd_token_ids ids = {0};
    if (pd_tokenizer_encode(t, text, len, flags, &ids) == 0) {
        char *back = NULL;
        size_t back_len = 0;
        if (pd_tokenizer_decode(t, ids.ids, ids.n, false, &back, &back_len) == 0)
            pd_free(back);
    }
    pd_token_ids_free(&ids);

    size_t n = len / 4;
    int32_t *raw = pd_malloc(n ? n * sizeof(int32_t) : 1);
    if (!raw)
        return 0;
    memcpy(raw, text, n * 4);
    char *out = NULL;
    size_t out_len = 0;
    if (pd_tokenizer_decode(t, raw, n, skip_special, &out, &out_len) == 0)
        pd_free(out);
    struct pd_detok *d = NULL;
    if (pd_detok_new(t, skip_special, &d) == 0) {
        const char *piece;
        size_t piece_len;
        for (size_t i = 0; i < n; i++)
            (void)pd_detok_step(d, raw[i], &piece, &piece_len);
        (void)pd_detok_flush(d, &piece, &piece_len);
        pd_detok_free(d);
    }
    pd_free(raw);
    return 0;
}
