/* dtrain: command-line entry point. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "dtrain/version.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: dtrain <command> [options]\n\n"
               "commands:\n"
               "  train     train a model (dtrain train --help)\n"
               "  eval      evaluate saved weights (dtrain eval --help)\n"
               "  generate  sample text from a GPT-2 checkpoint (dtrain generate --help)\n"
               "  inspect   describe a checkpoint and verify its checksums (dtrain inspect --help)\n"
               "  plot      draw loss, learning rate, ms/step and per-rank time as SVG (dtrain plot --help)\n"
               "\n  dtrain --version   the version of dtrain (library and CLI)\n");
}

static int run_command(int argc, char **argv) {
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) { printf("dtrain %s\n", DTRAIN_VERSION); return 0; }
    if (!strcmp(argv[1], "train")) return dt_cli_train(argc, argv, 0);
    if (!strcmp(argv[1], "eval")) return dt_cli_train(argc, argv, 1);
    if (!strcmp(argv[1], "generate")) return dt_cli_generate(argc, argv);
    if (!strcmp(argv[1], "inspect")) return dt_cli_inspect(argc, argv);
    if (!strcmp(argv[1], "plot")) return dt_cli_plot(argc, argv);
    fprintf(stderr, "dtrain: unknown command '%s' (train, eval, generate, inspect, plot)\n", argv[1]);
    return 2;
}

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* may re-execute with OPENBLAS_CORETYPE set (ops.h) */
    if (argc < 2) { usage(stderr); return 2; }
    int rc = run_command(argc, argv);
    /* what a command printed must have reached its destination: a full disk
     * or a closed pipe under `dtrain generate > out.txt` is an error, not 0.
     * train and eval only warn: their result is the checkpoint and the
     * metrics (a completed job that failed here would be restarted). */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int warn = !strcmp(argv[1], "train") || !strcmp(argv[1], "eval");
        fprintf(stderr, "dtrain: %s: writing standard output: %s\n", warn ? "warning" : "error",
                errno ? strerror(errno) : "an earlier write failed");
        if (rc == 0 && !warn) rc = 1;
    }
    return rc;
}
