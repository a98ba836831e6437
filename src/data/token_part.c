/* The uneven split of token data over parts (data ranks).
 *
 * A directory: each part trains on whole files, file k (in name order)
 * going to part k % world, so parts get as many tokens as their files hold
 * -- different numbers of batches. One file: a contiguous range per part
 * (dt_part_range).
 *
 * Input: all = the whole stream, one piece per file; its first n_tr tokens
 * are the training split (the held-out tail or --val-path stays the same on
 * every part). File k's training tokens are [start_k, min(end_k, n_tr)); a
 * part's stream is its files' views, in file order, and its windows may span
 * two of its files (as the unsplit stream's span neighbouring files). Every
 * part computes every part's size, so a part that would be too short fails
 * the same way on all of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dataset_internal.h"

/* file k's training span [*a, *b) */
static void file_span(const dt_token_stream *all, int k, int64_t n_tr, int64_t *a, int64_t *b) {
    *a = all->end[k] - all->piece[k].n;
    *b = all->end[k] < n_tr ? all->end[k] : n_tr;
    if (*a > *b) *a = *b;
}

dt_status dt_tokens_keep_part(const dt_token_stream *all, int64_t n_tr, int rank, int world, int T, const char *path,
                              dt_token_stream *out) {
    memset(out, 0, sizeof *out);
    out->vocab = all->vocab;
    if (world < 1 || rank < 0 || rank >= world)
        return DT_ERR(DT_EINVAL, "%s: uneven split: part %d of %d out of range", path, rank, world);
    if (all->n < world)
        return DT_ERR(DT_EINVAL, "%s: an uneven split over %d ranks needs at least %d files, the directory has %d",
                      path, world, world, all->n);
    for (int r = 0; r < world; r++) {   /* every part's size, checked on every part */
        int64_t n = 0, a, b;
        for (int k = r; k < all->n; k += world) {
            file_span(all, k, n_tr, &a, &b);
            n += b - a;
        }
        if (n < (int64_t)T + 1)
            return DT_ERR(DT_EINVAL, "%s: uneven split: rank %d's files (every %d-th from file %d in name order) hold "
                          "%lld training tokens, fewer than one window of train.seq %d + 1", path, r, world, r,
                          (long long)n, T);
    }
    int64_t a, b;
    for (int k = rank; k < all->n; k += world) {
        file_span(all, k, n_tr, &a, &b);
        dt_status s = dt_token_stream_push(out, all->piece[k].ids, all->piece[k].width, b - a, path);
        if (s != DT_OK) {
            dt_token_stream_free(out);
            return s;
        }
    }
    return DT_OK;
}

dt_status dt_tokens_keep_range(const dt_token_stream *all, int64_t n_tr, int rank, int world, int T,
                               const char *path, dt_token_stream *out) {
    memset(out, 0, sizeof *out);
    if (world < 1 || rank < 0 || rank >= world)
        return DT_ERR(DT_EINVAL, "%s: uneven split: part %d of %d out of range", path, rank, world);
    int64_t a, b;
    for (int r = 0; r < world; r++) {   /* every part's size, checked on every part */
        dt_part_range(n_tr, r, world, &a, &b);
        if (b - a < (int64_t)T + 1)
            return DT_ERR(DT_EINVAL, "%s: uneven split: rank %d's range (%d/%lld of the %lld training tokens) holds "
                          "%lld, fewer than one window of train.seq %d + 1", path, r, r + 1,
                          (long long)world * (world + 1) / 2, (long long)n_tr, (long long)(b - a), T);
    }
    dt_part_range(n_tr, rank, world, &a, &b);
    return dt_token_stream_slice(all, a, b, out, path);
}
