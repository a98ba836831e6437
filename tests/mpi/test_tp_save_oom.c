/* A tensor-parallel save on a rank that runs out of memory fails on every
 * rank at once, each with a message, and leaves no file; the strategy then
 * saves normally once memory is back. Before, the short rank left the
 * save's gathers and its peers waited in them until the collective timeout
 * (30 s here: the test would fail by it, naming no rank).
 * GPT-2 with a vocabulary of 50304 x 192 (wte: 38.6 MB whole, above glibc's
 * 32 MiB mmap ceiling, so gathering it needs fresh address space), at tp W
 * (W = the world) and, at 4 ranks, tp 2 x ZeRO-1 over 2 replicas. Rank 1's
 * address space is capped at its current size + 4 MiB (RLIMIT_AS) for the
 * save: the gather buffer cannot be had there.
 * Not under ASan (its allocator reports an allocation failure as an error
 * of its own instead of returning NULL, and reserves terabytes of address
 * space). */
#include <sys/resource.h>
#include "mpi_check.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"
#include "dtrain/zero.h"
#include "mpi_trainer.h"
#include "tmpdir.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

enum { SEQ = 8, VOCAB = 50304, EMBD = 192 };
static dt_pg *world;
static char dir[128], text_path[256];

static void opts(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = 1; o->model.n_embd = EMBD; o->model.n_head = 4; o->model.max_t = SEQ; o->model.vocab = VOCAB;
    o->data = DT_DATA_TEXT;
    o->data_path = text_path;
    o->batch = 2; o->seq = SEQ; o->steps = 1; o->quiet = 1; o->eval_batches = 1;
}

/* this process's address space in bytes (/proc/self/statm: pages) */
static size_t vm_bytes(void) {
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

static void save_short_of_memory(const dt_strategy *s, const char *what) {
    t_begin(what);
    dt_train_opts o;
    opts(&o);
    dt_trainer *t;
    T_OK(dt_trainer_create(&o, s, &t));
    double loss;
    T_OK(dt_trainer_step(t, &loss));
    char path[256];
    snprintf(path, sizeof path, "%s/tp.safetensors", dir);
    struct rlimit old;
    T_CHECK(getrlimit(RLIMIT_AS, &old) == 0);
    if (t_rank() == 1) {
        struct rlimit cap = {.rlim_cur = vm_bytes() + ((size_t)4 << 20), .rlim_max = old.rlim_max};
        T_CHECK(setrlimit(RLIMIT_AS, &cap) == 0);
    }
    dt_error_clear();
    double t0 = MPI_Wtime();
    dt_status st = dt_trainer_save(t, path);
    double took = MPI_Wtime() - t0;
    if (t_rank() == 1) T_CHECK(setrlimit(RLIMIT_AS, &old) == 0);
    T_CHECK(st != DT_OK);
    const char *msg = dt_error_message();
    if (t_rank() == 1) T_CHECK(strstr(msg, "out of memory") != NULL);
    else T_CHECK(strstr(msg, "failed on rank 1") != NULL);
    if (st == DT_OK || took > 20) fprintf(stderr, "rank %d: save: %s after %.1f s\n", t_rank(), msg, took);
    T_CHECK(took < 20);   /* not the 30 s timeout */
    MPI_Barrier(MPI_COMM_WORLD);
    T_CHECK(!exists(path));
    /* memory back: the same trainer saves, and the file holds the step */
    T_OK(dt_trainer_save(t, path));
    MPI_Barrier(MPI_COMM_WORLD);
    dt_ckpt *c;
    T_OK(dt_ckpt_open(path, &c));
    const char *step = dt_ckpt_get_meta(c, "step");
    T_CHECK(step && !strcmp(step, "1"));
    dt_ckpt_close(c);
    dt_trainer_free(t);
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) remove(path);
    t_end();
}

int main(int argc, char **argv) {
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 0);
    dt_dist_opts d = {.progress = DT_PROGRESS_DEFAULT, .collective_timeout_s = 30};
    if (dt_dist_init(&argc, &argv, &d) != DT_OK) {
        fprintf(stderr, "dt_dist_init: %s\n", dt_error_message());
        return 1;
    }
    if (UNDER_ASAN) {
        if (t_rank() == 0) printf("SKIP: an allocation failure under ASan is its own error, not NULL\n");
        dt_dist_finalize();
        return 77;
    }
    T_OK(dt_pg_world(&world));
    t_text_corpus("tp_save_oom", "the", 200, dir, text_path);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    dt_strategy s;
    dt_tp_opts to = {.size = t_size()};
    dt_ddp_opts_default(&to.ddp);
    T_OK(dt_tp_strategy(world, &to, &s));
    save_short_of_memory(&s, "tp W: a save short of memory on rank 1 fails on every rank at once");
    if (t_size() == 4) {
        dt_tp_opts t2 = {.size = 2};
        dt_ddp_opts_default(&t2.ddp);
        dt_zero_opts zo;
        dt_zero_opts_default(&zo);
        zo.stage = 1;
        T_OK(dt_tp_zero_strategy(world, &t2, &zo, &s));
        save_short_of_memory(&s, "tp 2 x ZeRO-1: a save short of memory on rank 1 fails on every rank at once");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) dt_test_rm_rf(dir);
    T_OK(dt_dist_finalize());
    return 0;
}
