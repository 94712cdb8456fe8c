/*
 * ct.h — comparing secrets (the API key, the cluster key) with what a peer presented, in time
 * that tells the peer nothing about the secret: not where the first differing byte is, and not
 * the secret's length either. The time depends on the presented length only, which the peer
 * knows anyway. Nothing here allocates or fails.
 */
#ifndef PD_CT_H
#define PD_CT_H

#include <stdbool.h>
#include <stddef.h>

/* true when given[0..given_len) equals secret[0..secret_len). Every byte of given is compared
 * (against secret repeated, so a length mismatch costs the same as a content mismatch) and the
 * verdict is taken once at the end. Either pointer may be NULL when its length is 0. */
bool pd_ct_equal(const void *given, size_t given_len, const void *secret, size_t secret_len);

#endif
