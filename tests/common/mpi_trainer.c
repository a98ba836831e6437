#include <mpi.h>
#include <stdio.h>
#include "mpi_check.h"
#include "mpi_trainer.h"
#include "tmpdir.h"

void t_text_corpus(const char *tag, const char *first, int lines, char dir[128], char path[256]) {
    if (t_rank() == 0) {
        T_CHECK(dt_test_tmpdir(dir, 128, tag) == 0);
        snprintf(path, 256, "%s/corpus.txt", dir);
        FILE *f = fopen(path, "w");
        T_CHECK(f != NULL);
        for (int i = 0; i < lines; i++) fprintf(f, "%s quick brown fox %d jumps over the lazy dog.\n", first, i * 7 % 13);
        fclose(f);
    }
    MPI_Bcast(path, 256, MPI_CHAR, 0, MPI_COMM_WORLD);
}

size_t t_train_arena(const dt_train_opts *o, const dt_strategy *s, int steps, double *loss) {
    dt_trainer *t;
    T_OK(dt_trainer_create(o, s, &t));
    for (int i = 0; i < steps; i++) T_OK(dt_trainer_step(t, &loss[i]));
    double acc;
    T_OK(dt_trainer_evaluate(t, &loss[steps], &acc));
    size_t arena = dt_graph_arena_bytes(t->graph);
    dt_trainer_free(t);
    return arena;
}
