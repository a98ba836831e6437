/* Distributed sampler: per-epoch permutation of [0, n), strided across ranks.
 *
 * perm = Fisher-Yates of the identity with dt_rng seeded from
 * seed ^ (epoch * odd constant) (identity when shuffle = 0). Local position p
 * of rank r maps to global position g = r + p * world, wrapped mod n when
 * pad = 1 pushes g past the end. per_rank = n / world (pad = 0) or
 * ceil(n / world) (pad = 1), identical on every rank.
 *
 * dt_sampler_next contract: each epoch ends with exactly one short call
 * (k < batch, possibly 0); that call already advances to (epoch + 1, 0), so
 * the following call draws from the new epoch. Invariant: perm always
 * matches `epoch`, and 0 <= cursor <= per_rank.
 */
#include <stdlib.h>
#include <string.h>
#include "dtrain/data.h"
#include "dtrain/tensor.h"

#define SAMPLER_EPOCH_MIX 0x9e3779b97f4a7c15ull   /* odd: epoch -> seed is injective */

static void sampler_build_perm(dt_sampler *s) {
    for (int64_t i = 0; i < s->n; i++) s->perm[i] = i;
    if (!s->shuffle) return;
    dt_rng r;
    dt_rng_seed(&r, s->seed ^ ((uint64_t)s->epoch * SAMPLER_EPOCH_MIX));
    for (int64_t i = s->n - 1; i > 0; i--) {
        int64_t j = (int64_t)dt_rng_below(&r, (uint64_t)i + 1);
        int64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
}

dt_status dt_sampler_init(dt_sampler *s, int64_t n, uint64_t seed, int shuffle, int rank, int world, int pad) {
    if (!s) return DT_ERR(DT_EINVAL, "sampler: NULL sampler");
    memset(s, 0, sizeof *s);
    if (world < 1) return DT_ERR(DT_EINVAL, "sampler: world size %d must be >= 1", world);
    if (rank < 0 || rank >= world)
        return DT_ERR(DT_EINVAL, "sampler: rank %d out of range [0, %d)", rank, world);
    if (n < world)
        return DT_ERR(DT_EINVAL, "sampler: dataset of %lld samples is smaller than world size %d",
                      (long long)n, world);
    if ((uint64_t)n > SIZE_MAX / sizeof(int64_t))
        return DT_ERR(DT_ENOMEM, "sampler: dataset of %lld samples too large", (long long)n);
    s->perm = malloc((size_t)n * sizeof(int64_t));
    if (!s->perm) return DT_ERR(DT_ENOMEM, "sampler: out of memory for %lld indices", (long long)n);
    s->n = n;
    s->seed = seed;
    s->shuffle = shuffle != 0;
    s->rank = rank;
    s->world = world;
    s->pad = pad != 0;
    s->per_rank = s->pad ? (n + world - 1) / world : n / world;
    s->epoch = 0;
    s->cursor = 0;
    sampler_build_perm(s);
    return DT_OK;
}

void dt_sampler_free(dt_sampler *s) {
    if (!s) return;
    free(s->perm);
    memset(s, 0, sizeof *s);
}

/* batch <= 0 (or no perm / no out) writes nothing and leaves the position alone. */
int64_t dt_sampler_next(dt_sampler *s, int64_t batch, int64_t *out) {
    if (!s || !s->perm || !out || batch <= 0) return 0;
    int64_t k = s->per_rank - s->cursor;
    if (k > batch) k = batch;
    for (int64_t i = 0; i < k; i++) {
        int64_t g = s->rank + (s->cursor + i) * (int64_t)s->world;
        if (g >= s->n) g %= s->n;   /* only reachable with pad = 1 */
        out[i] = s->perm[g];
    }
    s->cursor += k;
    if (k < batch) {   /* short call ends the epoch */
        s->epoch++;
        s->cursor = 0;
        sampler_build_perm(s);
    }
    return k;
}

dt_status dt_sampler_seek(dt_sampler *s, int64_t epoch, int64_t cursor) {
    if (!s || !s->perm) return DT_ERR(DT_ESTATE, "sampler: seek on an uninitialised sampler");
    if (epoch < 0) return DT_ERR(DT_EINVAL, "sampler: seek to negative epoch %lld", (long long)epoch);
    if (cursor < 0 || cursor > s->per_rank)
        return DT_ERR(DT_EINVAL, "sampler: seek cursor %lld out of range [0, %lld]", (long long)cursor,
                      (long long)s->per_rank);
    if (epoch != s->epoch) {
        s->epoch = epoch;
        sampler_build_perm(s);
    }
    s->cursor = cursor;
    return DT_OK;
}
