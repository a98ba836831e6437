/* Shared set-up of the MPI tests that train through dt_trainer on a small
 * text corpus (test_ddp_trainer, test_tp_*_memory, test_tp_user_model). */
#ifndef DT_TEST_MPI_TRAINER_H
#define DT_TEST_MPI_TRAINER_H
#include <stddef.h>
#include "dtrain/train.h"

/* Rank 0 makes a temporary directory dir (named after tag) holding
 * corpus.txt: `lines` lines "<first> quick brown fox <i*7%13> jumps over the
 * lazy dog."; every rank receives its path in path. Remove dir on rank 0
 * with dt_test_rm_rf when done. Collective (MPI_COMM_WORLD). */
void t_text_corpus(const char *tag, const char *first, int lines, char dir[128], char path[256]);
/* A trainer of o under s (NULL: every rank alone) run for `steps` steps
 * (loss[0..steps-1]) and one evaluation (loss[steps]); returns the tape
 * arena's high-water mark (dt_graph_arena_bytes), the run's activations. */
size_t t_train_arena(const dt_train_opts *o, const dt_strategy *s, int steps, double *loss);
#endif
