/*
 * ct.c — constant-time comparison of secrets (see ct.h).
 *
 * The loop runs given_len times whatever the secret is: byte i of given meets byte i mod
 * secret_len of the secret (the index wraps without a branch), differences are OR-ed into one
 * accumulator, and the lengths are compared at the end, also without a branch. volatile keeps
 * the compiler from turning the loop into one that stops early.
 */
#include "common/base/ct.h"

bool pd_ct_equal(const void *given, size_t given_len, const void *secret, size_t secret_len) {
    static const unsigned char empty[1] = {0};
    const volatile unsigned char *g = given;
    const volatile unsigned char *s = secret_len ? secret : empty;
    size_t s_len = secret_len ? secret_len : 1;
    volatile unsigned char diff = 0;
    size_t j = 0;
    for (size_t i = 0; i < given_len; i++) {
        diff |= (unsigned char)(g[i] ^ s[j]);
        j++;
        j &= (size_t)0 - (size_t)(j < s_len); /* back to 0 at s_len */
    }
    /* nonzero when the lengths differ, without a comparison the compiler could branch on */
    size_t len_diff = given_len ^ secret_len;
    unsigned len_bad = (unsigned)((len_diff | ((size_t)0 - len_diff)) >> (sizeof(size_t) * 8 - 1));
    return (diff | len_bad) == 0;
}
