/*
 * rng.h — the one pseudo-random generator family used across pdserve: splitmix64 (seeding, and
 * a quick stream of its own) and xoshiro256** (Blackman & Vigna). Deterministic for a given
 * seed on every platform; not for secrets.
 */
#ifndef PD_RNG_H
#define PD_RNG_H

#include <stdint.h>

static inline uint64_t pd_rotl64(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* One splitmix64 step: advances *x and returns the mixed value. */
static inline uint64_t pd_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One xoshiro256** step over s[4] (must not be all zero). */
static inline uint64_t pd_xoshiro256ss(uint64_t s[4]) {
    uint64_t r = pd_rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = pd_rotl64(s[3], 45);
    return r;
}

#endif
