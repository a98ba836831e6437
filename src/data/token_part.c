/* The uneven split of a text directory: each part (data rank) trains on
 * whole files, file k (in name order) going to part k % world, so parts get
 * as many tokens as their files hold -- different numbers of batches.
 *
 * Input: tr = the first n_tr tokens of the directory's stream (the training
 * split; the held-out tail or --val-path stays the same on every part), and
 * f->end[k] = where file k ends in the stream. File k's training tokens are
 * [end[k-1], min(end[k], n_tr)); a part's tokens are its files' ones, in
 * file order, and its windows may span two of its files (as the unsplit
 * stream's span neighbouring files). Every part computes every part's size,
 * so a part that would be too short fails the same way on all of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dataset_internal.h"

/* file k's training span [*a, *b) */
static void file_span(const dt_text_files *f, int k, int64_t n_tr, int64_t *a, int64_t *b) {
    *a = k ? f->end[k - 1] : 0;
    *b = f->end[k] < n_tr ? f->end[k] : n_tr;
    if (*a > *b) *a = *b;
}

dt_status dt_tokens_keep_part(dt_token_dataset *tr, const dt_text_files *f, int rank, int world, int T,
                              const char *path) {
    if (world < 1 || rank < 0 || rank >= world)
        return DT_ERR(DT_EINVAL, "%s: uneven split: part %d of %d out of range", path, rank, world);
    if (f->n < world)
        return DT_ERR(DT_EINVAL, "%s: an uneven split over %d ranks needs at least %d files, the directory has %d",
                      path, world, world, f->n);
    const int64_t n_tr = tr->n_tokens;
    int64_t mine = 0;
    for (int r = 0; r < world; r++) {   /* every part's size, checked on every part */
        int64_t n = 0, a, b;
        for (int k = r; k < f->n; k += world) {
            file_span(f, k, n_tr, &a, &b);
            n += b - a;
        }
        if (n < (int64_t)T + 1)
            return DT_ERR(DT_EINVAL, "%s: uneven split: rank %d's files (every %d-th from file %d in name order) hold "
                          "%lld training tokens, fewer than one window of train.seq %d + 1", path, r, world, r,
                          (long long)n, T);
        if (r == rank) mine = n;
    }
    uint16_t *v = malloc((size_t)mine * sizeof *v);
    if (!v) return DT_ERR(DT_ENOMEM, "%s: out of memory (%lld tokens)", path, (long long)mine);
    int64_t at = 0, a, b;
    for (int k = rank; k < f->n; k += world) {
        file_span(f, k, n_tr, &a, &b);
        memcpy(v + at, tr->tokens + a, (size_t)(b - a) * sizeof *v);
        at += b - a;
    }
    free(tr->tokens);
    tr->tokens = v;
    tr->n_tokens = mine;
    return DT_OK;
}

dt_status dt_tokens_keep_range(dt_token_dataset *tr, int rank, int world, int T, const char *path) {
    if (world < 1 || rank < 0 || rank >= world)
        return DT_ERR(DT_EINVAL, "%s: uneven split: part %d of %d out of range", path, rank, world);
    const int64_t n_tr = tr->n_tokens;
    int64_t a, b;
    for (int r = 0; r < world; r++) {   /* every part's size, checked on every part */
        dt_part_range(n_tr, r, world, &a, &b);
        if (b - a < (int64_t)T + 1)
            return DT_ERR(DT_EINVAL, "%s: uneven split: rank %d's range (%d/%lld of the %lld training tokens) holds "
                          "%lld, fewer than one window of train.seq %d + 1", path, r, r + 1,
                          (long long)world * (world + 1) / 2, (long long)n_tr, (long long)(b - a), T);
    }
    dt_part_range(n_tr, rank, world, &a, &b);
    memmove(tr->tokens, tr->tokens + a, (size_t)(b - a) * sizeof *tr->tokens);
    tr->n_tokens = b - a;
    return DT_OK;
}
