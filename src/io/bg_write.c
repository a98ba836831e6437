/* Background checkpoint writes (io.h, "background writes").
 *
 * While a thread captures into a writer (dt_bg_writer_capture), the three
 * calls every checkpoint goes through change what they do:
 *   dt_safetensors_write    copies the entries' bytes, names and metadata
 *                           into one job and returns;
 *   dt_st_writer_*          (streaming) appends into a buffer of the
 *                           declared size; commit queues it as a job;
 *   dt_ckpt_write_index     queues the index of a sharded set; it is written
 *                           once every rank's shard file of the set is
 *                           visible in the directory (each shard appears
 *                           whole: temp file + rename).
 * The writer thread takes jobs in order and writes them with the same code
 * a synchronous save runs, so the files are the same bytes. It never calls
 * MPI: ranks learn of each other's writes through the directory, and of
 * failures when they next settle (dt_bg_writer_wait + the caller's own
 * agreement).
 *
 * Invariants: a job owns copies of everything it writes (the caller's memory
 * may change the moment the call returns); jobs finish in queue order; the
 * first failure since the last wait is kept (message copied: errors are
 * per thread). The shard files written since the last capture began are
 * remembered, so that a save the ranks agree failed removes them
 * (dt_bg_writer_abandon): a set that never commits leaves nothing behind. */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "bg_internal.h"
#include "ckpt_internal.h"

typedef struct bg_job {
    int index;                  /* 0: a file; 1: a set's index.json */
    int shard;                  /* a file: a shard of a sharded set */
    char *path;                 /* file path, or the set's directory */
    dt_st_entry *e; int n;      /* file: entries (data into `data`) */
    dt_st_meta *meta; int n_meta;
    void *data; size_t data_bytes, data_cap;
    char *strs;                 /* names, keys, values (and set) copied */
    char *set; int world, stage;          /* index */
    dt_ckpt_shape *shapes; int n_shapes;  /* index */
    struct bg_job *next;
} bg_job;

struct dt_bg_writer {
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    pthread_t thread;
    int thread_on, quit, cancel;          /* cancel: pending index jobs give up */
    bg_job *head, *tail;
    int files_pending, index_pending;     /* queued or running */
    size_t held, peak;                    /* snapshot bytes queued or being written */
    dt_status err;                        /* first failure since the last wait */
    char msg[1024];
    /* copy buffers of finished jobs, kept for the next save: a fresh 1 GB
     * allocation costs a page fault per page on the training thread */
    void *cache[2]; size_t cache_cap[2];
    char **shards; int n_shards, cap_shards;   /* shard files written since the capture began */
};

void *dt__bg_alloc(dt_bg_writer *w, size_t bytes, size_t *cap) {
    pthread_mutex_lock(&w->mu);
    int best = -1;
    for (int i = 0; i < 2; i++)
        if (w->cache[i] && w->cache_cap[i] >= bytes && (best < 0 || w->cache_cap[i] < w->cache_cap[best])) best = i;
    void *p = NULL;
    if (best >= 0) {
        p = w->cache[best];
        *cap = w->cache_cap[best];
        w->cache[best] = NULL;
    }
    pthread_mutex_unlock(&w->mu);
    if (!p) {
        p = malloc(bytes ? bytes : 1);
        *cap = bytes;
    }
    return p;
}

/* Pieces laid back to back into dst (total bytes), on every OpenMP thread
 * for a large copy in one parallel region: thread t copies bytes [lo, hi) of
 * dst, across pieces. The copy runs while the training thread waits, so its
 * threads are idle (about twice one thread's rate on the 2-core machines
 * measured, bench_memcpy). */
#define BG_PARALLEL_COPY (4u << 20)
typedef struct bg_span { const void *p; size_t n; } bg_span;
static void copy_spans(char *dst, const bg_span *s, int n, size_t total) {
    if (total < BG_PARALLEL_COPY || omp_get_max_threads() < 2 || omp_in_parallel()) {
        for (int i = 0; i < n; i++) {
            if (s[i].n) memcpy(dst, s[i].p, s[i].n);
            dst += s[i].n;
        }
        return;
    }
#pragma omp parallel
    {
        size_t k = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t per = (total / k + 4095) & ~(size_t)4095, lo = per * t, hi = lo + per < total ? lo + per : total;
        size_t at = 0;
        for (int i = 0; i < n && at < hi; i++) {
            size_t a = at > lo ? at : lo, z = at + s[i].n < hi ? at + s[i].n : hi;
            if (a < z) memcpy(dst + a, (const char *)s[i].p + (a - at), z - a);
            at += s[i].n;
        }
    }
}

void dt__bg_copy(void *dst, const void *src, size_t n) {
    bg_span one = {src, n};
    copy_spans(dst, &one, 1, n);
}

/* w->mu held: keep p (the two largest buffers), free what drops out */
static void cache_put(dt_bg_writer *w, void *p, size_t cap) {
    int slot = !w->cache[0] ? 0 : !w->cache[1] ? 1 : w->cache_cap[0] < w->cache_cap[1] ? 0 : 1;
    if (w->cache[slot] && w->cache_cap[slot] >= cap) {
        free(p);
        return;
    }
    free(w->cache[slot]);
    w->cache[slot] = p;
    w->cache_cap[slot] = cap;
}

static _Thread_local dt_bg_writer *tl_capture;
static _Thread_local int tl_shard;

dt_bg_writer *dt__bg_capturing(void) { return tl_capture; }
void dt__bg_next_is_shard(int on) { tl_shard = on; }

/* w->mu held */
static void forget_shards(dt_bg_writer *w) {
    for (int i = 0; i < w->n_shards; i++) free(w->shards[i]);
    w->n_shards = 0;
}

void dt_bg_writer_capture(dt_bg_writer *w) {
    if (w) {   /* a new save: the previous one was settled (committed) or abandoned */
        pthread_mutex_lock(&w->mu);
        forget_shards(w);
        pthread_mutex_unlock(&w->mu);
    }
    tl_capture = w;
}

/* w->mu held: remember j's file (best effort: without memory it stays, as
 * any file of an uncommitted set did before) */
static void remember_shard(dt_bg_writer *w, const bg_job *j) {
    if (w->n_shards == w->cap_shards) {
        int cap = w->cap_shards ? 2 * w->cap_shards : 4;
        char **p = realloc(w->shards, (size_t)cap * sizeof *p);
        if (!p) return;
        w->shards = p;
        w->cap_shards = cap;
    }
    char *path = strdup(j->path);
    if (path) w->shards[w->n_shards++] = path;
}

static void job_free(bg_job *j) {
    if (!j) return;
    free(j->path);
    free(j->e);
    free(j->meta);
    free(j->data);
    free(j->strs);
    free(j->shapes);
    free(j);
}

/* Copies n strings (NULL-safe) into one arena; out[i] points into it. */
static char *copy_strs(const char *const *in, int n, const char **out) {
    size_t total = 1;
    for (int i = 0; i < n; i++) total += strlen(in[i] ? in[i] : "") + 1;
    char *a = malloc(total), *p = a;
    if (!a) return NULL;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(in[i] ? in[i] : "") + 1;
        memcpy(p, in[i] ? in[i] : "", l);
        out[i] = p;
        p += l;
    }
    return a;
}

static size_t entry_bytes(const dt_st_entry *e) {
    size_t n = dt_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) n *= (size_t)e->shape[d];
    return n;
}

static void fail_into(dt_bg_writer *w, dt_status s) {   /* w->mu held */
    if (w->err != DT_OK || s == DT_OK) return;
    w->err = s;
    snprintf(w->msg, sizeof w->msg, "%s", dt_error_message());
}

/* Every rank's shard of j's set is in the directory (or we were told to stop). */
static int shards_visible(const bg_job *j) {
    for (int r = 0; r < j->world; r++) {
        char name[128], path[4096];
        struct stat sb;
        if (!dt__ckpt_shard_name(name, sizeof name, j->set, r) ||
            snprintf(path, sizeof path, "%s/%s", j->path, name) >= (int)sizeof path || stat(path, &sb) != 0)
            return 0;
    }
    return 1;
}

static dt_status run_job(dt_bg_writer *w, bg_job *j) {
    if (!j->index) return dt_safetensors_write(j->path, j->e, j->n, j->meta, j->n_meta);
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int stop = w->cancel || w->quit;
        pthread_mutex_unlock(&w->mu);
        if (shards_visible(j)) break;
        if (stop)
            return DT_ERR(DT_ESTATE, "sharded checkpoint %s: set %s not committed: not every rank's shard was written",
                          j->path, j->set);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return dt_ckpt_write_index(j->path, j->set, j->world, j->stage, j->shapes, j->n_shapes, j->meta, j->n_meta);
}

static void *writer_main(void *arg) {
    dt_bg_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->quit) pthread_cond_wait(&w->cv_job, &w->mu);
        if (!w->head) break;   /* quit with nothing left */
        bg_job *j = w->head;
        pthread_mutex_unlock(&w->mu);
        dt_status s = run_job(w, j);
        pthread_mutex_lock(&w->mu);
        fail_into(w, s);
        if (s == DT_OK && j->shard) remember_shard(w, j);
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        if (j->index) w->index_pending--;
        else w->files_pending--;
        w->held -= j->data_bytes;
        if (j->data) cache_put(w, j->data, j->data_cap);
        j->data = NULL;
        pthread_cond_broadcast(&w->cv_done);
        pthread_mutex_unlock(&w->mu);
        job_free(j);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

dt_status dt_bg_writer_create(dt_bg_writer **out) {
    *out = NULL;
    dt_bg_writer *w = calloc(1, sizeof *w);
    if (!w) return DT_ERR(DT_ENOMEM, "background writer: out of memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_job, NULL);
    pthread_cond_init(&w->cv_done, NULL);
    /* signals stay with the training thread (stop requests: train.h) */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&w->thread, NULL, writer_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&w->cv_done);
        pthread_cond_destroy(&w->cv_job);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return DT_ERR(DT_ENOMEM, "background writer: cannot start a thread: %s", strerror(rc));
    }
    w->thread_on = 1;
    *out = w;
    return DT_OK;
}

static void enqueue(dt_bg_writer *w, bg_job *j) {
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    if (j->index) w->index_pending++;
    else w->files_pending++;
    w->held += j->data_bytes;
    if (w->held > w->peak) w->peak = w->held;
    pthread_cond_signal(&w->cv_job);
    pthread_mutex_unlock(&w->mu);
}

/* A file job with copies of entries' names/shapes and meta; data: the
 * caller's snapshot (owned from now on), entries' data pointed into it. */
static dt_status file_job(const char *path, const dt_st_entry *e, int n, const dt_st_meta *meta, int n_meta,
                          void *data, size_t data_bytes, size_t data_cap, bg_job **out) {
    *out = NULL;
    bg_job *j = calloc(1, sizeof *j);
    int ns = n + 2 * n_meta + 1;
    const char **src = malloc((size_t)ns * sizeof *src), **dst = malloc((size_t)ns * sizeof *dst);
    if (j) {
        j->e = calloc((size_t)(n ? n : 1), sizeof *j->e);
        j->meta = calloc((size_t)(n_meta ? n_meta : 1), sizeof *j->meta);
    }
    if (!j || !src || !dst || !j->e || !j->meta) goto oom;
    for (int i = 0; i < n; i++) src[i] = e[i].name;
    for (int i = 0; i < n_meta; i++) {
        src[n + 2 * i] = meta[i].key;
        src[n + 2 * i + 1] = meta[i].value;
    }
    src[ns - 1] = path;
    if (!(j->strs = copy_strs(src, ns, dst))) goto oom;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        j->e[i] = e[i];
        j->e[i].name = dst[i];
        j->e[i].data = (char *)data + at;
        at += entry_bytes(&e[i]);
    }
    for (int i = 0; i < n_meta; i++) j->meta[i] = (dt_st_meta){dst[n + 2 * i], dst[n + 2 * i + 1]};
    j->n = n;
    j->n_meta = n_meta;
    j->shard = tl_shard;
    if (!(j->path = strdup(dst[ns - 1]))) goto oom;
    j->data = data;
    j->data_bytes = data_bytes;
    j->data_cap = data_cap;
    free(src);
    free(dst);
    *out = j;
    return DT_OK;
oom:
    free(src);
    free(dst);
    job_free(j);
    free(data);
    return DT_ERR(DT_ENOMEM, "%s: out of memory for a background checkpoint copy", path);
}

dt_status dt__bg_queue_copy(dt_bg_writer *w, const char *path, const dt_st_entry *e, int n, const dt_st_meta *meta,
                            int n_meta) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += entry_bytes(&e[i]);
    size_t cap = 0;
    char *data = dt__bg_alloc(w, total, &cap);
    if (!data) return DT_ERR(DT_ENOMEM, "%s: out of memory for a %zu-byte background checkpoint copy", path, total);
    bg_span *sp = malloc((size_t)(n > 0 ? n : 1) * sizeof *sp);
    if (!sp) {
        free(data);
        return DT_ERR(DT_ENOMEM, "%s: out of memory for a background checkpoint copy", path);
    }
    for (int i = 0; i < n; i++) sp[i] = (bg_span){e[i].data, entry_bytes(&e[i])};
    copy_spans(data, sp, n, total);
    free(sp);
    bg_job *j;
    DT_TRY(file_job(path, e, n, meta, n_meta, data, total, cap, &j));
    enqueue(w, j);
    return DT_OK;
}

dt_status dt__bg_queue_owned(dt_bg_writer *w, const char *path, const dt_st_entry *e, int n, const dt_st_meta *meta,
                             int n_meta, void *data, size_t data_bytes, size_t data_cap) {
    bg_job *j;
    DT_TRY(file_job(path, e, n, meta, n_meta, data, data_bytes, data_cap, &j));
    enqueue(w, j);
    return DT_OK;
}

dt_status dt__bg_queue_index(dt_bg_writer *w, const char *dir, const char *set, int world, int stage,
                             const dt_ckpt_shape *tensors, int n_tensors, const dt_st_meta *meta, int n_meta) {
    bg_job *j = calloc(1, sizeof *j);
    int ns = n_tensors + 2 * n_meta + 2;
    const char **src = malloc((size_t)ns * sizeof *src), **dst = malloc((size_t)ns * sizeof *dst);
    if (j) {
        j->shapes = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *j->shapes);
        j->meta = calloc((size_t)(n_meta ? n_meta : 1), sizeof *j->meta);
    }
    if (!j || !src || !dst || !j->shapes || !j->meta) goto oom;
    for (int i = 0; i < n_tensors; i++) src[i] = tensors[i].name;
    for (int i = 0; i < n_meta; i++) {
        src[n_tensors + 2 * i] = meta[i].key;
        src[n_tensors + 2 * i + 1] = meta[i].value;
    }
    src[ns - 2] = dir;
    src[ns - 1] = set;
    if (!(j->strs = copy_strs(src, ns, dst))) goto oom;
    for (int i = 0; i < n_tensors; i++) {
        j->shapes[i] = tensors[i];
        j->shapes[i].name = dst[i];
    }
    for (int i = 0; i < n_meta; i++) j->meta[i] = (dt_st_meta){dst[n_tensors + 2 * i], dst[n_tensors + 2 * i + 1]};
    if (!(j->path = strdup(dst[ns - 2]))) goto oom;
    j->set = (char *)dst[ns - 1];
    j->index = 1;
    j->world = world;
    j->stage = stage;
    j->n_shapes = n_tensors;
    j->n_meta = n_meta;
    free(src);
    free(dst);
    enqueue(w, j);
    return DT_OK;
oom:
    free(src);
    free(dst);
    job_free(j);
    return DT_ERR(DT_ENOMEM, "sharded checkpoint %s: out of memory for a background index", dir);
}

dt_status dt_bg_writer_wait(dt_bg_writer *w, int with_index) {
    if (!w) return DT_OK;
    pthread_mutex_lock(&w->mu);
    while (w->files_pending > 0 || (with_index && w->index_pending > 0)) pthread_cond_wait(&w->cv_done, &w->mu);
    dt_status s = w->err;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", w->msg);
    w->err = DT_OK;
    w->msg[0] = 0;
    pthread_mutex_unlock(&w->mu);
    return s == DT_OK ? DT_OK : DT_ERR(s, "%s", msg);
}

void dt_bg_writer_cancel_index(dt_bg_writer *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->cancel = 1;
    while (w->index_pending > 0) pthread_cond_wait(&w->cv_done, &w->mu);
    w->cancel = 0;
    pthread_mutex_unlock(&w->mu);
}

void dt_bg_writer_abandon(dt_bg_writer *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->cancel = 1;   /* an index waiting for shards gives up; files queued are written, then removed */
    while (w->files_pending > 0 || w->index_pending > 0) pthread_cond_wait(&w->cv_done, &w->mu);
    w->cancel = 0;
    /* (not a shard of a set whose index was committed -- a failure after the
     * commit, a peer's: that set is the one that loads, as for a direct save) */
    for (int i = 0; i < w->n_shards; i++)
        if (!dt__ckpt_shard_committed(w->shards[i])) unlink(w->shards[i]);
    forget_shards(w);
    w->err = DT_OK;   /* (the caller reported the failure) */
    w->msg[0] = 0;
    pthread_mutex_unlock(&w->mu);
}

int dt_bg_writer_busy(dt_bg_writer *w) {
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    int busy = w->files_pending + w->index_pending > 0;
    pthread_mutex_unlock(&w->mu);
    return busy;
}

size_t dt_bg_writer_peak_bytes(dt_bg_writer *w) {
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    size_t p = w->peak;
    pthread_mutex_unlock(&w->mu);
    return p;
}

void dt_bg_writer_free(dt_bg_writer *w) {
    if (!w) return;
    if (tl_capture == w) tl_capture = NULL;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;   /* files still queued are written; an index still waiting gives up */
    pthread_cond_broadcast(&w->cv_job);
    pthread_mutex_unlock(&w->mu);
    if (w->thread_on) pthread_join(w->thread, NULL);
    while (w->head) {
        bg_job *j = w->head;
        w->head = j->next;
        job_free(j);
    }
    free(w->cache[0]);
    free(w->cache[1]);
    forget_shards(w);
    free(w->shards);
    pthread_cond_destroy(&w->cv_done);
    pthread_cond_destroy(&w->cv_job);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
