/*
 * byte_level.h — GPT-2's byte-level alphabet and UTF-8 encoding, shared by the tokenizer
 * (tokenizer*.c) and the BPE trainer (bpe_train.c) so both agree on one mapping.
 * Defined in tokenizer.c.
 */
#ifndef PD_BYTE_LEVEL_H
#define PD_BYTE_LEVEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes take
 * code points 256.. in byte order. */
static inline bool pd__byte_is_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* GPT-2's byte ↔ character table: each byte maps to one code point in [0, 0x144). */
uint32_t pd__byte_to_char(uint8_t b);
/* The byte a code point stands for, or -1. */
int pd__char_to_byte(uint32_t cp);

/* Writes the UTF-8 form of cp to out; returns its byte length (1..4). */
size_t pd__utf8_encode(uint32_t cp, char out[4]);

#endif
