/* ckpt_cmp [--only GLOB] REF OTHER [KEY...]: every tensor of checkpoint REF
 * (with --only: those whose names match GLOB, fnmatch; at least one must)
 * must exist in OTHER with the same shape and the same bits, and OTHER may
 * hold no tensor REF lacks (among those GLOB selects). REF and OTHER are
 * each a single file or a sharded set (both read whole through dt_ckpt).
 * Metadata keys named after the paths must be equal too (e.g. step
 * optim_step epoch cursor). Prints the first difference; exit 0 = identical,
 * 1 = different, 2 = unreadable. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/io.h"

static int selected(const char *only, const char *name) { return !only || fnmatch(only, name, 0) == 0; }

/* tensor t of ref against the same name in other: 0 equal, 1 not (printed) */
static int cmp_tensor(dt_ckpt *ref, dt_ckpt *other, const char *other_path, const dt_ckpt_info *t) {
    int nd;
    int64_t sh[DT_MAX_DIMS];
    if (!dt_ckpt_find(other, t->name, &nd, sh)) { printf("missing in %s: %s\n", other_path, t->name); return 1; }
    if (nd != t->ndim || memcmp(sh, t->shape, (size_t)nd * sizeof *sh)) {
        printf("shape differs: %s (%d dims in %s)\n", t->name, nd, other_path);
        return 1;
    }
    size_t n = (size_t)(t->bytes / sizeof(float));
    float *x = malloc((n ? n : 1) * sizeof(float)), *want = malloc((n ? n : 1) * sizeof(float));
    int bad = 0;
    if (!x || !want || dt_ckpt_read(ref, t->name, 0, n, want) != DT_OK || dt_ckpt_read(other, t->name, 0, n, x) != DT_OK) {
        printf("unreadable %s: %s\n", t->name, dt_error_message());
        bad = 1;
    }
    for (size_t k = 0; k < n && !bad; k++)
        if (memcmp(&x[k], &want[k], sizeof(float))) {
            printf("differs: %s[%zu] = %.9g, reference %.9g\n", t->name, k, (double)x[k], (double)want[k]);
            bad = 1;
        }
    free(x);
    free(want);
    return bad;
}

int main(int argc, char **argv) {
    const char *only = NULL;
    if (argc > 2 && !strcmp(argv[1], "--only")) {
        only = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 3) { fprintf(stderr, "usage: ckpt_cmp [--only GLOB] REF OTHER [META_KEY...]\n"); return 2; }
    dt_ckpt *ref = NULL, *other = NULL;
    if (dt_ckpt_open(argv[1], &ref) != DT_OK || dt_ckpt_open(argv[2], &other) != DT_OK) {
        fprintf(stderr, "ckpt_cmp: %s\n", dt_error_message());
        dt_ckpt_close(ref);
        return 2;
    }
    int bad = 0, n_cmp = 0;
    size_t compared = 0;
    for (int i = 0; i < dt_ckpt_tensor_count(ref) && !bad; i++) {
        dt_ckpt_info t;
        if (dt_ckpt_tensor_at(ref, i, &t) != DT_OK) { printf("unreadable: %s\n", dt_error_message()); bad = 1; break; }
        if (!selected(only, t.name)) continue;
        n_cmp++;
        bad = cmp_tensor(ref, other, argv[2], &t);
        compared += (size_t)(t.bytes / sizeof(float));
    }
    for (int i = 0; i < dt_ckpt_tensor_count(other) && !bad; i++) {   /* nothing extra in OTHER */
        dt_ckpt_info t;
        int nd;
        int64_t sh[DT_MAX_DIMS];
        if (dt_ckpt_tensor_at(other, i, &t) != DT_OK) { printf("unreadable: %s\n", dt_error_message()); bad = 1; break; }
        if (selected(only, t.name) && !dt_ckpt_find(ref, t.name, &nd, sh)) {
            printf("extra in %s: %s\n", argv[2], t.name);
            bad = 1;
        }
    }
    for (int a = 3; a < argc && !bad; a++) {
        const char *va = dt_ckpt_get_meta(ref, argv[a]), *vb = dt_ckpt_get_meta(other, argv[a]);
        if (!va || !vb || strcmp(va, vb)) {
            printf("metadata %s: %s vs %s\n", argv[a], va ? va : "(none)", vb ? vb : "(none)");
            bad = 1;
        }
    }
    if (!bad && only && n_cmp == 0) {
        printf("no tensor of %s matches '%s'\n", argv[1], only);
        bad = 1;
    }
    if (!bad) printf("identical: %d tensors, %zu floats\n", n_cmp, compared);
    dt_ckpt_close(other);
    dt_ckpt_close(ref);
    return bad;
}
