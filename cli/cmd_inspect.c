/* dtrain inspect FILE|DIR: what a checkpoint holds (model and arch.*, step,
 * strategy and world, the tensor table, optimizer state) and whether every
 * recorded checksum matches its bytes. Reads through dt_ckpt (io.h), so a
 * single file, a ZeRO set and a pipeline set (directories with index.json)
 * are inspected alike. Exit 0: readable and every checksum good; 1: a bad
 * checksum (each tensor named) or an unreadable checkpoint; 2: usage.
 * Everything read from the checkpoint (names, metadata, file names, the
 * library's messages quoting them) is printed through E(): a name holding
 * ESC or a newline shows as \x1b / \x0a, never reaching the terminal raw. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/io.h"
#include "cli.h"
#include "text.h"

static const char *usage =
    "usage: dtrain inspect FILE|DIR\n\n"
    "Describe a checkpoint: a safetensors file, or a sharded set (a directory with index.json,\n"
    "written by --zero or --pp): model and architecture (arch.*), step, strategy and world size\n"
    "it was saved with, optimizer state, and every tensor (name, dtype, shape, bytes). Every\n"
    "recorded CRC-32 is checked against the tensor's bytes; each bad tensor is named. Control\n"
    "characters in names and metadata are shown escaped (ESC as \\x1b, a newline as \\x0a).\n\n"
    "Exit status: 0 all good, 1 a bad checksum or an unreadable checkpoint, 2 usage.\n";

/* s escaped for the terminal (text.h); valid until 16 more calls (a ring of
 * buffers, freed by E(NULL)); out of memory: a placeholder */
static const char *E(const char *s) {
    static char *ring[16];
    static int next;
    if (!s) {
        for (int i = 0; i < 16; i++) { free(ring[i]); ring[i] = NULL; }
        return NULL;
    }
    free(ring[next]);
    ring[next] = dt_cli_escape(s);
    const char *r = ring[next] ? ring[next] : "(out of memory)";
    next = (next + 1) % 16;
    return r;
}

/* metadata the summary shows by name; the rest is listed as is */
static const char *const shown[] = {"format", "model", "optimizer", "strategy", "step", "optim_step", "epoch",
                                    "cursor", "seed", "world", "arch.params"};

static int is_shown(const char *k) {
    if (!strncmp(k, "crc32.", 6)) return 1;   /* the table's crc column */
    if (!strncmp(k, "arch.", 5)) return 1;
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++)
        if (!strcmp(k, shown[i])) return 1;
    return 0;
}

static const char *meta_or(const dt_ckpt *c, const char *key, const char *dflt) {
    const char *v = dt_ckpt_get_meta(c, key);
    return v ? v : dflt;
}

static void human(uint64_t b, char *buf, size_t n) {
    if (b < 10 * 1024) snprintf(buf, n, "%" PRIu64 " B", b);
    else if (b < 10ull * 1024 * 1024) snprintf(buf, n, "%.1f KiB", (double)b / 1024);
    else if (b < 10ull * 1024 * 1024 * 1024) snprintf(buf, n, "%.1f MiB", (double)b / (1024.0 * 1024));
    else snprintf(buf, n, "%.1f GiB", (double)b / (1024.0 * 1024 * 1024));
}

static void summary(const dt_ckpt *c) {
    const char *model = dt_ckpt_get_meta(c, "model");
    printf("model       %s\n", model ? E(model) : "(not recorded: not written by dtrain train)");
    int na = 0;
    for (int i = 0; i < dt_ckpt_meta_count(c); i++) {
        const char *v, *k = dt_ckpt_meta_at(c, i, &v);
        if (strncmp(k, "arch.", 5) || !strcmp(k, "arch.params")) continue;
        printf("%s%s %s", na++ ? ", " : "arch        ", E(k + 5), E(v));
    }
    const char *ap = dt_ckpt_get_meta(c, "arch.params");
    if (ap) printf("%sparameters+buffers %s", na++ ? "; " : "arch        ", E(ap));
    if (na) printf("\n");
    const char *step = dt_ckpt_get_meta(c, "step");
    if (step)
        printf("step        %s (optimizer step %s; data epoch %s, cursor %s; seed %s)\n", E(step),
               E(meta_or(c, "optim_step", "?")), E(meta_or(c, "epoch", "?")), E(meta_or(c, "cursor", "?")),
               E(meta_or(c, "seed", "?")));
    /* "world" is the data-parallel world the run's sampler split the data over
     * (a pipeline's replicas); a sharded set also has one file per rank */
    const char *strat = dt_ckpt_get_meta(c, "strategy"), *world = dt_ckpt_get_meta(c, "world");
    if (strat || world) {
        printf("strategy    %s; data-parallel world %s", strat ? E(strat) : "(not recorded)", world ? E(world) : "?");
        if (dt_ckpt_is_sharded(c)) printf("; written by %d ranks (one file each)", dt_ckpt_file_count(c));
        printf("\n");
    }
    const char *fmt = dt_ckpt_get_meta(c, "format");
    if (fmt) printf("format      %s\n", E(fmt));
    int other = 0;
    for (int i = 0; i < dt_ckpt_meta_count(c); i++) {
        const char *v, *k = dt_ckpt_meta_at(c, i, &v);
        if (is_shown(k)) continue;
        printf("%s%s = %s\n", other++ ? "            " : "metadata    ", E(k), *v ? E(v) : "\"\"");
    }
}

/* optimizer state: "optim.<state>.<param>" tensors, counted per state */
static void optimizer(const dt_ckpt *c) {
    char states[8][32];
    int count[8] = {0}, ns = 0, total = 0;
    for (int i = 0; i < dt_ckpt_tensor_count(c); i++) {
        dt_ckpt_info t;
        if (dt_ckpt_tensor_at(c, i, &t) != DT_OK || strncmp(t.name, "optim.", 6)) continue;
        const char *st = t.name + 6, *dot = strchr(st, '.');
        size_t len = dot ? (size_t)(dot - st) : strlen(st);
        if (len >= sizeof states[0]) len = sizeof states[0] - 1;
        int k = 0;
        while (k < ns && (strlen(states[k]) != len || strncmp(states[k], st, len))) k++;
        if (k == ns && ns < 8) { memcpy(states[ns], st, len); states[ns][len] = 0; ns++; }
        if (k < ns) count[k]++;
        total++;
    }
    const char *opt = dt_ckpt_get_meta(c, "optimizer");
    if (!total) {
        printf("optimizer   %s%sno state saved (weights only)\n", opt ? E(opt) : "", opt ? ": " : "");
        return;
    }
    printf("optimizer   %s%s", opt ? E(opt) : "(not recorded)", ": ");
    for (int k = 0; k < ns; k++) printf("%s%s for %d parameters", k ? ", " : "", E(states[k]), count[k]);
    printf("\n");
}

int dt_cli_inspect(int argc, char **argv) {
    if (argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) { fputs(usage, stdout); return 0; }
    if (argc != 3 || argv[2][0] == '-') {
        fprintf(stderr, "dtrain: inspect takes one checkpoint, FILE or DIR (see dtrain inspect --help)\n");
        return 2;
    }
    const char *path = argv[2];
    dt_ckpt *c;
    if (dt_ckpt_open(path, &c) != DT_OK) {
        fprintf(stderr, "dtrain: error: %s\n", E(dt_error_message()));
        E(NULL);
        return 1;
    }
    int sharded = dt_ckpt_is_sharded(c), nf = dt_ckpt_file_count(c), nt = dt_ckpt_tensor_count(c);
    char hb[32];
    printf("checkpoint  %s (%s)\n", E(path), sharded ? "sharded set: index.json and one file per rank" : "safetensors file");
    for (int i = 0; i < nf; i++) {
        uint64_t b;
        const char *fp = dt_ckpt_file_at(c, i, &b);
        human(b, hb, sizeof hb);
        printf("%s%s (%s)\n", i ? "            " : "files       ", E(fp), hb);
    }
    summary(c);
    optimizer(c);

    int w = 4;
    for (int i = 0; i < nt; i++) {
        dt_ckpt_info t;
        if (dt_ckpt_tensor_at(c, i, &t) == DT_OK && (int)strlen(E(t.name)) > w) w = (int)strlen(E(t.name));
    }
    printf("\ntensors     %d\n  %-*s  %-5s  %-18s  %12s  %s  crc\n", nt, w, "name", "dtype", "shape", "bytes",
           sharded ? "pieces" : "   offset");
    int bad = 0, checked = 0, partly = 0, unchecked = 0;
    uint64_t total = 0;
    char **why = calloc((size_t)nt + 1, sizeof *why);
    for (int i = 0; i < nt; i++) {
        dt_ckpt_info t;
        if (dt_ckpt_tensor_at(c, i, &t) != DT_OK) continue;
        char sh[96];
        size_t k = (size_t)snprintf(sh, sizeof sh, "[");
        for (int d = 0; d < t.ndim && k < sizeof sh; d++)
            k += (size_t)snprintf(sh + k, sizeof sh - k, "%s%lld", d ? ", " : "", (long long)t.shape[d]);
        if (k < sizeof sh) snprintf(sh + k, sizeof sh - k, "]");
        int n_ok = 0;
        char crc[96] = "-";
        if (dt_ckpt_verify_tensor(c, i, &n_ok) != DT_OK) {
            snprintf(crc, sizeof crc, "BAD");
            bad++;
            if (why) why[i] = strdup(dt_error_message());
        } else if (t.checksummed && t.checksummed < t.pieces) {   /* the other pieces carry none: not "ok" */
            snprintf(crc, sizeof crc, "ok in %d of %d pieces; %d without a checksum", t.checksummed, t.pieces,
                     t.pieces - t.checksummed);
            partly++;
        } else if (t.checksummed) {
            snprintf(crc, sizeof crc, "ok");
            checked++;
        } else {
            unchecked++;
        }
        total += t.bytes;
        char where[32];
        if (sharded) snprintf(where, sizeof where, "%6d", t.pieces);
        else snprintf(where, sizeof where, "%9" PRIu64, t.offset);
        printf("  %-*s  %-5s  %-18s  %12" PRIu64 "  %s  %s\n", w, E(t.name), dt_dtype_name(t.dtype), sh, t.bytes, where, crc);
    }
    human(total, hb, sizeof hb);
    printf("  %d tensors, %" PRIu64 " bytes (%s)\n\n", nt, total, hb);
    if (bad) {
        printf("checksums   BAD: %d of %d tensors do not match their recorded CRC-32:\n", bad, nt);
        for (int i = 0; i < nt; i++) {
            dt_ckpt_info t;
            if (why && why[i] && dt_ckpt_tensor_at(c, i, &t) == DT_OK) printf("  %s: %s\n", E(t.name), E(why[i]));
        }
    } else if (!nt) {   /* not "ok: 0 tensors verified" */
        printf("checksums   nothing to verify: the checkpoint holds no tensors\n");
    } else if (!checked && !partly && unchecked) {   /* a file from elsewhere: nothing to verify, and not "ok" */
        printf("checksums   none recorded: %d tensors not checked\n", unchecked);
    } else {
        printf("checksums   ok: %d tensors verified", checked);
        if (partly)
            printf(", %d partly (the pieces with a recorded checksum match; the others have none, not checked)",
                   partly);
        if (unchecked) printf(", %d without a recorded checksum (not checked)", unchecked);
        printf("\n");
    }
    for (int i = 0; why && i < nt; i++) free(why[i]);
    free(why);
    dt_ckpt_close(c);
    if (bad) {
        fflush(stdout);
        fprintf(stderr, "dtrain: error: %s: %d tensor%s with a bad checksum (corrupt data)\n", E(path), bad,
                bad == 1 ? "" : "s");
        E(NULL);
        return 1;
    }
    E(NULL);
    return 0;
}
