/* Shared by the libFuzzer harnesses: the readers under test take paths, so
 * each input is written to a file in a private temporary directory first. */
#ifndef DT_FUZZ_COMMON_H
#define DT_FUZZ_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[64];

static void fuzz_cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (fuzz_dir[0] && system(cmd) != 0) fprintf(stderr, "fuzz: cannot remove %s\n", fuzz_dir);
}

/* The directory (created on first use, removed at exit). */
static const char *fuzz_tmpdir(void) {
    if (!fuzz_dir[0]) {
        const char *base = getenv("TMPDIR");   /* else /dev/shm (memory) when present */
        if (!base && access("/dev/shm", W_OK) == 0) base = "/dev/shm";
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/dtfuzz.XXXXXX", base && strlen(base) < 40 ? base : "/tmp");
        if (!mkdtemp(fuzz_dir)) { perror("fuzz: mkdtemp"); abort(); }
        atexit(fuzz_cleanup);
    }
    return fuzz_dir;
}

/* path := bytes (aborts on a write error: that is the harness, not the reader) */
static void fuzz_write(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) { perror(path); abort(); }
}
#endif
