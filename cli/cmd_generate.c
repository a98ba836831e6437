/* dtrain generate: sample from a GPT-2 checkpoint. The model is the one the
 * checkpoint records (dt_checkpoint_read_model: "model" and arch.*), its
 * weights are loaded from the file or set, and dtrain/generate.h runs it
 * with a KV cache. A byte vocabulary (arch.vocab 256, trained on the text
 * dataset, whose tokens are bytes) prints text; any other prints token ids. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dtrain/generate.h"
#include "dtrain/train.h"
#include "args.h"
#include "cli.h"

#define BYTE_VOCAB 256

typedef struct gen_flags {
    const char *init, *resume, *prompt, *prompt_ids;
    int tokens, top_k, threads, ids, no_cache;
    float temperature;
    uint64_t seed;
} gen_flags;

typedef struct gen_out { int text; int n; } gen_out;

/* a token as it comes; a failed write (a full disk, a closed pipe) stops
 * generation, and main reports it */
static int print_token(int32_t tok, int i, void *user) {
    gen_out *o = user;
    if (o->text) putchar((unsigned char)tok);
    else printf("%s%d", i ? "," : "", (int)tok);
    o->n++;
    return fflush(stdout) != 0 || ferror(stdout);
}

/* "1,2,3" -> ids (malloc'd); -1 with a message in err */
static int parse_ids(const char *s, int32_t **out, int *n, char *err, int errlen) {
    int32_t *v = malloc((strlen(s) / 2 + 1) * sizeof *v);   /* at most one id per two characters, plus one */
    int k = 0, ok = v != NULL && *s;
    for (const char *p = s; ok && *p;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        ok = end != p && *p >= '0' && *p <= '9' && !errno && x <= INT32_MAX && (*end == ',' || !*end) &&
             !(*end == ',' && !end[1]);
        if (ok) v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!ok) {
        snprintf(err, (size_t)errlen, "--prompt-ids: invalid list '%s' (expected ids >= 0 separated by commas)", s);
        free(v);
        return -1;
    }
    *out = v;
    *n = k;
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "dtrain: error: %s\n", what);
    return 1;
}

int dt_cli_generate(int argc, char **argv) {
    gen_flags f = {.tokens = 200, .top_k = 40, .temperature = 0.8f, .seed = 1};
    const dt_arg table[] = {
        {"--init", DT_ARG_STR, &f.init, "CKPT", "checkpoint to sample from: a file, a ZeRO set or a pipeline set "
                                                "(a directory); the model is the one it records", 0, 0},
        {"--resume", DT_ARG_STR, &f.resume, "CKPT", "the same as --init (only the weights are read)", 0, 0},
        {"--prompt", DT_ARG_STR, &f.prompt, "TEXT", "text to continue, for a byte vocabulary (a model trained with --data text); "
                                                   "default a newline", 0, 0},
        {"--prompt-ids", DT_ARG_STR, &f.prompt_ids, "LIST", "token ids to continue, comma-separated (any vocabulary; "
                                                           "needed for others)", 0, 0},
        {"--tokens", DT_ARG_INT, &f.tokens, "N", "tokens to generate (default 200)", 0, 0},
        {"--temperature", DT_ARG_FLOAT, &f.temperature, "T", "softmax temperature; 0: greedy (default 0.8)", 0, 0},
        {"--top-k", DT_ARG_INT, &f.top_k, "K", "sample among the K most likely tokens; 0: all (default 40)", 0, 0},
        {"--seed", DT_ARG_U64, &f.seed, "S", "sampling seed: the same seed gives the same text (default 1)", 0, 0},
        {"--ids", DT_ARG_FLAG, &f.ids, NULL, "print token ids even for a byte vocabulary", 0, 0},
        {"--no-cache", DT_ARG_FLAG, &f.no_cache, NULL, "recompute the whole prefix for every token instead of "
                                                      "the KV cache (same tokens, quadratic time)", 0, 0},
        {"--threads", DT_ARG_INT, &f.threads, "N", "OpenMP/OpenBLAS threads (default: OMP_NUM_THREADS, else all cores)", 0, 0},
    };
    char err[512];
    int r = dt_args_parse(table, (int)(sizeof table / sizeof table[0]), argc, argv, 2, NULL, err, sizeof err);
    if (r == 1) {
        dt_args_help(table, (int)(sizeof table / sizeof table[0]),
                     "usage: dtrain generate --init CKPT [--prompt TEXT | --prompt-ids LIST] [options]\n\n"
                     "Continue a prompt with a GPT-2 checkpoint (no model flags: the checkpoint records them).\n"
                     "A byte vocabulary (models trained with --data text) prints the prompt and its continuation\n"
                     "as text; other vocabularies print the generated token ids, comma-separated.",
                     "Once the context (arch.max_t) is full, it is refilled from its last half and generation goes on.\n");
        return 0;
    }
    if (r < 0) { fprintf(stderr, "dtrain: %s\n", err); return 2; }
    if (f.init && f.resume) { fprintf(stderr, "dtrain: --init and --resume are exclusive\n"); return 2; }
    const char *path = f.init ? f.init : f.resume;
    if (!path) { fprintf(stderr, "dtrain: generate needs --init CKPT (see --help)\n"); return 2; }
    if (f.prompt && f.prompt_ids) { fprintf(stderr, "dtrain: --prompt and --prompt-ids are exclusive\n"); return 2; }
    if (f.tokens < 0) { fprintf(stderr, "dtrain: --tokens must be >= 0 (got %d)\n", f.tokens); return 2; }
    if (f.temperature < 0) { fprintf(stderr, "dtrain: --temperature must be >= 0 (got %g)\n", (double)f.temperature); return 2; }
    if (f.top_k < 0) { fprintf(stderr, "dtrain: --top-k must be >= 0 (got %d)\n", f.top_k); return 2; }
    if (f.threads < 0) { fprintf(stderr, "dtrain: --threads must be >= 0 (got %d)\n", f.threads); return 2; }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);   /* as train's bound (OpenMP crashed creating 99999 threads) */
    if (cores < 1) cores = 1;
    if (f.threads > 8 * cores) {
        fprintf(stderr, "dtrain: --threads %d: at most %ld (8 x the %ld cores of this machine)\n", f.threads, 8 * cores,
                cores);
        return 2;
    }
    if (f.threads > 0) omp_set_num_threads(f.threads);

    dt_ckpt_model cm;
    if (dt_checkpoint_read_model(path, &cm) != DT_OK) return fail(dt_error_message());
    char msg[1024];
    if (!cm.builtin || strcmp(cm.name, "gpt2")) {
        snprintf(msg, sizeof msg, "%s: generate needs a gpt2 checkpoint; this one records %s%s%s", path,
                 cm.name[0] ? "model '" : "no model (not written by dtrain train)", cm.name, cm.name[0] ? "'" : "");
        return fail(msg);
    }
    /* bytes: 256 tokens, trained on text (a checkpoint that does not say which
     * data: taken as text); a token shard's 256 ids are a tokenizer's, not bytes */
    int byte_vocab = cm.cfg.vocab == BYTE_VOCAB && (!cm.data[0] || !strcmp(cm.data, "text"));
    char what[96];
    if (cm.cfg.vocab == BYTE_VOCAB) snprintf(what, sizeof what, "trained on --data %s: token ids", cm.data);
    else snprintf(what, sizeof what, "arch.vocab %d", cm.cfg.vocab);
    if (f.prompt && !byte_vocab) {
        snprintf(msg, sizeof msg, "--prompt: the vocabulary of %s (%s) is not bytes; give token ids "
                 "with --prompt-ids", path, what);
        return fail(msg);
    }
    if (!f.prompt && !f.prompt_ids && !byte_vocab) {
        snprintf(msg, sizeof msg, "%s has a vocabulary of %d tokens (%s), not bytes: give the prompt as "
                 "--prompt-ids", path, cm.cfg.vocab, what);
        return fail(msg);
    }
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (f.prompt_ids) {
        if (parse_ids(f.prompt_ids, &prompt, &n_prompt, err, sizeof err)) { fprintf(stderr, "dtrain: %s\n", err); return 2; }
    } else {
        const char *text = f.prompt ? f.prompt : "\n";
        n_prompt = (int)strlen(text);
        if (n_prompt == 0) { fprintf(stderr, "dtrain: --prompt is empty (the model needs a first token)\n"); return 2; }
        prompt = malloc((size_t)n_prompt * sizeof *prompt);
        for (int i = 0; prompt && i < n_prompt; i++) prompt[i] = (unsigned char)text[i];
    }
    for (int i = 0; prompt && i < n_prompt; i++)   /* before anything is printed */
        if (prompt[i] < 0 || prompt[i] >= cm.cfg.vocab) {
            fprintf(stderr, "dtrain: --prompt-ids: id %d (number %d of the list) is outside the vocabulary of %s "
                    "(0..%d)\n", (int)prompt[i], i + 1, path, cm.cfg.vocab - 1);
            free(prompt);
            return 2;
        }
    dt_model *m = NULL;   /* (tokens are streamed through print_token, none kept) */
    dt_status s = prompt ? DT_OK : DT_ERR(DT_ENOMEM, "out of memory");
    if (s == DT_OK) s = dt_model_create(&cm.cfg, 0, &m);
    if (s == DT_OK) s = dt_model_load_params(m, path);
    int text = byte_vocab && !f.ids;
    gen_out go = {.text = text};
    for (int i = 0; s == DT_OK && text && i < n_prompt; i++) putchar((unsigned char)prompt[i]);   /* the prompt, then what follows */
    dt_gen_opts o = {.temperature = f.temperature, .top_k = f.top_k, .seed = f.seed, .no_cache = f.no_cache};
    if (s == DT_OK) s = dt_generate(m, prompt, n_prompt, f.tokens, &o, NULL, print_token, &go);
    if (s == DT_OK || go.n) putchar('\n');
    fflush(stdout);
    dt_model_free(m);
    free(prompt);
    return s == DT_OK ? 0 : fail(dt_error_message());
}
