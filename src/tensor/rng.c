/* Deterministic RNG: splitmix64 seeding, xoroshiro128** stream. */
#include <math.h>
#include "dtrain/tensor.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void dt_rng_seed(dt_rng *r, uint64_t seed) {
    uint64_t x = seed;
    r->s[0] = splitmix64(&x);
    r->s[1] = splitmix64(&x);
    if (!r->s[0] && !r->s[1]) r->s[1] = 1;
}

static uint64_t next64(dt_rng *r) {
    uint64_t s0 = r->s[0], s1 = r->s[1];
    uint64_t out = rotl(s0 * 5, 7) * 9;
    s1 ^= s0;
    r->s[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    r->s[1] = rotl(s1, 37);
    return out;
}

uint32_t dt_rng_u32(dt_rng *r) { return (uint32_t)(next64(r) >> 32); }

float dt_rng_uniform(dt_rng *r) { return (float)(next64(r) >> 40) * (1.0f / 16777216.0f); }

float dt_rng_normal(dt_rng *r) {
    double u1 = ((double)(next64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);  /* (0, 1] */
    double u2 = (double)(next64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t dt_rng_below(dt_rng *r, uint64_t n) {
    /* Lemire-style rejection to avoid modulo bias. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do { x = next64(r); } while (x >= limit);
    return x % n;
}
