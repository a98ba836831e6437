/* dtrain/generate.h — sampling text from a language model (the nn layer).
 *
 * A KV cache runs a built GPT-2 (nn.h section 4) one token at a time: each
 * layer keeps the keys and values of every position it has seen, so the next
 * token costs one token's forward (its attention reads the cache) instead of
 * a forward over the whole prefix, and generating N tokens costs N such steps.
 * It reads the model's parameters in place (names as gpt2.c registers them)
 * and records nothing on a tape; dropout is off (inference).
 *
 *   dt_model *m;  ... dt_model_create(&cfg, 0, &m), then load its weights
 *   dt_gen_opts o = {.temperature = 0.8f, .top_k = 40, .seed = 1};
 *   int32_t out[100];
 *   DT_TRY(dt_generate(m, prompt, n_prompt, 100, &o, out, NULL, NULL));
 *
 * The same model, prompt and options give the same tokens (one generator,
 * seeded from o.seed, draws one uniform number per token drawn at a
 * temperature above 0 with top_k other than 1; greedy picks draw none).
 */
#ifndef DTRAIN_GENERATE_H
#define DTRAIN_GENERATE_H

#include "dtrain/nn.h"

typedef struct dt_kv_cache dt_kv_cache;
/* A cache for model m (a built GPT-2 holding all its parameters; it must
 * outlive the cache) with room for arch.max_t positions. DT_EINVAL naming
 * what is wrong when m is not one (another model, a pipeline stage's part). */
dt_status dt_kv_cache_create(dt_model *m, dt_kv_cache **out);
void dt_kv_cache_free(dt_kv_cache *c);
void dt_kv_cache_clear(dt_kv_cache *c);          /* back to no positions */
int dt_kv_cache_len(const dt_kv_cache *c);       /* positions held */
int dt_kv_cache_capacity(const dt_kv_cache *c);  /* arch.max_t */
/* Runs tokens ids[0..n) at positions len .. len+n-1 (one forward over the n
 * rows; each attends to the cache and to the rows before it), appends their
 * keys and values, and writes the logits of the last one into logits[vocab].
 * DT_EINVAL when len + n exceeds the capacity or an id is outside the
 * vocabulary (naming it); the cache is unchanged then. */
dt_status dt_kv_cache_forward(dt_kv_cache *c, const int32_t *ids, int n, float *logits);

/* Without a cache: the model's own blocks (dt_model_run_blocks, eval mode)
 * over ids[0..n) at positions 0..n-1, logits of the last position into
 * logits[vocab]. A forward over the whole prefix: the reference the cache is
 * tested against, O(n) tokens of work per call. Any model taking "ids". */
dt_status dt_model_next_logits(dt_model *m, const int32_t *ids, int n, float *logits);

typedef struct dt_gen_opts {
    float temperature;   /* 0: greedy (the largest logit; the lowest id among equals); > 0: logits / T */
    int top_k;           /* > 0: sample among the k largest logits only; 0: the whole vocabulary */
    uint64_t seed;       /* the sampling generator's seed */
    int no_cache;        /* 1: recompute the whole prefix for every token (dt_model_next_logits; slow,
                            for comparison); 0: the KV cache */
} dt_gen_opts;

/* One token from logits[V]: greedy at temperature 0 or top_k 1 (rng may be
 * NULL then), else a draw from softmax(logits / temperature) restricted to
 * the top_k largest (ties at the k-th value broken by lower id), using one
 * dt_rng_uniform of rng; when the largest logit is infinite, the kept ids
 * equal to it are drawn evenly. scratch holds 2 * V floats' room (NULL:
 * allocated here). Returns the id, or -1 with DT_EINVAL for a negative or
 * infinite temperature, a negative top_k, a NaN logit, V < 1. */
int32_t dt_gen_pick(const float *logits, int V, float temperature, int top_k, dt_rng *rng, float *scratch);

/* Called with each new token as it is chosen (i: 0 .. n_new-1); a non-zero
 * return stops generation early (dt_generate returns DT_OK, out holds i+1). */
typedef int (*dt_gen_token_fn)(int32_t token, int i, void *user);

/* Generates n_new tokens after prompt[0..n_prompt) (n_prompt >= 1: the model
 * needs a first token) into out[0..n_new), calling fn (optional) with each;
 * out may be NULL when fn is given (tokens streamed, none kept).
 * The context is arch.max_t (a longer prompt keeps its last max_t tokens; a
 * model of one's own, with o.no_cache, takes an "ids" input declared [-T]):
 * once the prompt and the tokens so far fill it,
 * the cache is refilled from the last max_t / 2 of them (positions restart at
 * 0; one prefix forward) and generation goes on, so n_new is unbounded and
 * the cost stays linear in it. DT_EINVAL naming the culprit: a prompt id
 * outside the vocabulary, bad options, a model without "ids" input or
 * without a context bound. */
dt_status dt_generate(dt_model *m, const int32_t *prompt, int n_prompt, int n_new, const dt_gen_opts *o,
                      int32_t *out, dt_gen_token_fn fn, void *user);

#endif
