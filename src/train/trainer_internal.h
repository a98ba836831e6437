#ifndef DT_TRAIN_INTERNAL_H
#define DT_TRAIN_INTERNAL_H
#include "dtrain/train.h"
/* --freeze: each pattern's parameters get requires_grad = 0; then the
 * parameter groups; a pattern that matches none is an error naming it (freeze.c) */
dt_status dt_trainer_freeze(dt_trainer *t);
/* --unfreeze-at: the frozen parameters become trainable (before that step) */
dt_status dt_trainer_unfreeze(dt_trainer *t);
/* train.unfreeze_at with a strategy that cannot refresh the trainable set
 * (a pipeline): refused at creation, not after training up to that step */
dt_status dt_trainer_check_unfreeze(const dt_trainer *t);
/* what the data makes impossible, known once it is open (data_setup.c): a
 * batch larger than a rank's share of the training split, an empty
 * evaluation split (every run ends evaluating) */
dt_status dt_trainer_check_sizes(const dt_trainer *t);
/* dataset + batch buffers (data_setup.c) */
dt_status dt_trainer_load_data(dt_trainer *t);
/* sizes the built-in image models' input from the data's images (t->opts.model) */
dt_status dt_trainer_fit_model(dt_trainer *t);
/* fails naming the data and both shapes when the model does not take the
 * dataset's samples */
dt_status dt_trainer_check_data(dt_trainer *t);
/* samples t->idx[0..n) of split into the batch buffers */
dt_batch dt_trainer_batch(dt_trainer *t, dt_split split, int64_t n);
/* Batch buffers hold this many micro-batches (accum when the strategy takes
 * them all at once, else 1); slot k's indices are t->idx[k*batch ..]. */
/* DT_OK when t may be used by fn (a public entry point): not NULL, not
 * finished (its strategy is gone: only dt_trainer_free may follow) */
dt_status dt_trainer_usable(const dt_trainer *t, const char *fn);
int dt_trainer_batch_slots(const dt_trainer *t);
dt_batch dt_trainer_batch_in(dt_trainer *t, int slot, dt_split split, int64_t n);
void dt_trainer_free_data(dt_trainer *t);
/* --save, --trace, --metrics writable on the ranks that write them
 * (outputs.c): this rank's own check, at creation's start for one rank. */
dt_status dt_trainer_check_outputs(const dt_trainer *t);
/* After the configuration agreement (the first collective), on every rank:
 * with several ranks each checks its own paths there (a path only rank 0
 * writes fails on rank 0 alone), rank 0 locks a sharded train.save directory
 * (one writer per directory), and every rank then gets the lowest failing
 * rank's error, so the job fails at once and alike, before step 1
 * (collective over the world when the trainer's ranks are all of it). */
dt_status dt_trainer_claim_outputs(dt_trainer *t);
/* memcheck.c: refuses (collectively, alike on every rank) a run whose
 * estimate exceeds the memory available to a rank on its machine; before
 * the model is created. */
dt_status dt_trainer_check_memory(dt_trainer *t);
/* this rank's trace file: --trace, or FILE.rankN when world > 1 */
void dt_trainer_trace_path(const dt_trainer *t, char *buf, size_t n);
/* fingerprint.c: the configuration agreement through the strategy (collective;
 * before any other collective of the run). No strategy.agree: DT_OK. */
dt_status dt_trainer_agree(dt_trainer *t);
/* uneven.c (opts.uneven). Collective over the strategy: every rank's step
 * count from its own steps per epoch; sets own_steps, common_steps,
 * total_steps (the largest count) and lead_rank; fails on every rank alike,
 * naming the rank, when one would run no step. */
/* sample.c: train.sample_every refused up front where it cannot run (not
 * GPT-2, a strategy without the whole model on a rank); a sample logged */
dt_status dt_trainer_check_sample(const dt_trainer *t);
dt_status dt_trainer_sample(dt_trainer *t, int tty);
dt_status dt_trainer_uneven_steps(dt_trainer *t, int64_t steps_per_epoch);
/* Every rank runs step `step` (0-based): always, unless uneven past common_steps. */
int dt_trainer_all_ranks_step(const dt_trainer *t, int64_t step);
/* This rank ran its own steps: join (strategy) until every rank has, then
 * step = total_steps and one line saying so (unless quiet). */
dt_status dt_trainer_uneven_join(dt_trainer *t);
#endif
