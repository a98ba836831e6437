/* --sample-every K (train.sample_every): every K steps the rank that reports
 * progress continues a prompt with the model as trained so far and logs the
 * text (dtrain/generate.h, KV cache; nothing on the tape, no collective, the
 * other ranks go on to the next step's reductions and wait there). The prompt
 * is the first tokens of the validation split (the same on every rank and in
 * every run); sampling is temperature 0.8, top-k 40, seeded by train.seed and
 * the step, so a run prints the same samples again. Only where the rank holds
 * the whole, current model: one process or DDP (ZeRO gathers parameters
 * asynchronously or keeps shards, a pipeline stage holds part of the model). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/generate.h"
#include "trainer_internal.h"
#include "util/log_internal.h"

#define PROMPT_MAX 8
#define BYTE_VOCAB 256

dt_status dt_trainer_check_sample(const dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    if (o->sample_every <= 0 || o->eval_only) return DT_OK;
    if (t->strat.owns_optimizer || t->strat.forward_backward)
        return DT_ERR(DT_EINVAL, "train.sample_every: strategy %s does not hold the whole model on one rank "
                      "between steps (one process or DDP does)", t->strat.name);
    dt_kv_cache *c = NULL;
    dt_status s = dt_kv_cache_create(t->model, &c);
    dt_kv_cache_free(c);
    if (s != DT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_error_message());
        return DT_ERR(DT_EINVAL, "train.sample_every: %s", why);
    }
    if (t->data.size[DT_SPLIT_EVAL] < 1 || t->data.sample.in[0].dtype != DT_I32)
        return DT_ERR(DT_EINVAL, "train.sample_every: the validation split of %s holds no token window to prompt with",
                      t->data.source);
    return DT_OK;
}

/* text of a byte vocabulary as it is, but control bytes (other than a
 * newline or tab) and bytes past ASCII as '?'; other vocabularies as ids */
static size_t put_tokens(char *b, size_t at, size_t cap, const int32_t *ids, int n, int bytes) {
    for (int i = 0; i < n && at + 16 < cap; i++) {
        if (bytes) {
            int c = ids[i];
            b[at++] = (char)((c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t' ? c : '?');
        } else {
            at += (size_t)snprintf(b + at, cap - at, "%s%d", i ? "," : "", (int)ids[i]);
        }
    }
    b[at] = 0;
    return at;
}

dt_status dt_trainer_sample(dt_trainer *t, int tty) {
    const dt_train_opts *o = &t->opts;
    const dt_dataset *d = &t->data;
    int T = (int)d->sample.in[0].dims[0], n_prompt = T < PROMPT_MAX ? T : PROMPT_MAX;
    int n = o->sample_tokens > 0 ? o->sample_tokens : 64;
    int32_t *x = malloc((size_t)T * sizeof *x), *y = malloc((size_t)d->sample.targets * sizeof *y);
    int32_t *out = malloc(((size_t)n + 1) * sizeof *out);
    size_t cap = ((size_t)n + PROMPT_MAX) * 12 + 64;
    char *text = malloc(cap);
    dt_status s = x && y && out && text ? DT_OK : DT_ERR(DT_ENOMEM, "train.sample_every: out of memory");
    if (s == DT_OK) {
        int64_t first = 0;
        void *xs[1] = {x};
        dt_dataset_batch(d, DT_SPLIT_EVAL, &first, 1, xs, y);
        dt_gen_opts g = {.temperature = 0.8f, .top_k = 40, .seed = o->seed * 1000003u + (uint64_t)t->step};
        s = dt_generate(t->model, x, n_prompt, n, &g, out, NULL, NULL);
    }
    if (s == DT_OK) {
        int bytes = t->model->cfg.vocab == BYTE_VOCAB && !strcmp(o->data, DT_DATA_TEXT);   /* a shard's 256 ids: not bytes */
        size_t at = put_tokens(text, 0, cap, x, n_prompt, bytes);
        if (!bytes) at += (size_t)snprintf(text + at, cap - at, " ->");
        if (!bytes && at + 2 < cap) text[at++] = ' ';
        put_tokens(text, at, cap, out, n, bytes);
        dt_log(DT_LOG_INFO, "%s--- sample at step %lld (%d tokens after the validation split's first %d) ---\n%s\n---\n",
               tty ? "\n" : "", (long long)t->step, n, n_prompt, text);
    }
    free(x);
    free(y);
    free(out);
    free(text);
    return s;
}
