/* ckpt_cmp [--only GLOB] REF OTHER [KEY...]: every tensor of the single-file
 * checkpoint REF (or sharded set: then through dt_ckpt, ref_set below)
 * (with --only: those whose names match GLOB, fnmatch; at
 * least one must) must exist in OTHER (a file or a sharded set) with the same
 * shape and the same bits; OTHER may have no extra tensors. Metadata keys
 * named after the paths must be equal too (e.g. step optim_step epoch
 * cursor). Prints the first difference; exit 0 = identical, 1 = different,
 * 2 = unreadable. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dtrain/io.h"

/* REF a sharded set (a directory): each of its tensors read whole, compared
 * the same way. */
static int ref_set(const char *only, int argc, char **argv) {
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
        if (only && fnmatch(only, t.name, 0) != 0) continue;
        n_cmp++;
        int nd;
        int64_t sh[DT_MAX_DIMS];
        if (!dt_ckpt_find(other, t.name, &nd, sh)) { printf("missing in %s: %s\n", argv[2], t.name); bad = 1; break; }
        size_t n = (size_t)(t.bytes / sizeof(float));
        float *x = malloc((n ? n : 1) * sizeof(float)), *want = malloc((n ? n : 1) * sizeof(float));
        if (!x || !want || dt_ckpt_read(ref, t.name, 0, n, want) != DT_OK || dt_ckpt_read(other, t.name, 0, n, x) != DT_OK) {
            printf("unreadable %s: %s\n", t.name, dt_error_message());
            bad = 1;
        }
        for (size_t k = 0; k < n && !bad; k++)
            if (memcmp(&x[k], &want[k], sizeof(float))) {
                printf("differs: %s[%zu] = %.9g, reference %.9g\n", t.name, k, (double)x[k], (double)want[k]);
                bad = 1;
            }
        compared += n;
        free(x);
        free(want);
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

int main(int argc, char **argv) {
    const char *only = NULL;
    if (argc > 2 && !strcmp(argv[1], "--only")) {
        only = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 3) { fprintf(stderr, "usage: ckpt_cmp [--only GLOB] REF.safetensors OTHER [META_KEY...]\n"); return 2; }
    struct stat st;
    if (stat(argv[1], &st) == 0 && S_ISDIR(st.st_mode)) return ref_set(only, argc, argv);
    dt_safetensors ref;
    dt_ckpt *other = NULL;
    if (dt_safetensors_load(argv[1], &ref) != DT_OK || dt_ckpt_open(argv[2], &other) != DT_OK) {
        fprintf(stderr, "ckpt_cmp: %s\n", dt_error_message());
        return 2;
    }
    int bad = 0, n_cmp = 0;
    size_t compared = 0;
    for (int i = 0; i < ref.n_tensors && !bad; i++) {
        const dt_st_tensor *t = &ref.tensors[i];
        if (only && fnmatch(only, t->name, 0) != 0) continue;
        n_cmp++;
        int nd;
        int64_t sh[DT_MAX_DIMS];
        if (!dt_ckpt_find(other, t->name, &nd, sh)) { printf("missing in %s: %s\n", argv[2], t->name); bad = 1; break; }
        size_t n = t->nbytes / sizeof(float);
        float *x = malloc((n ? n : 1) * sizeof(float));
        if (!x || dt_ckpt_read(other, t->name, 0, n, x) != DT_OK) {
            printf("unreadable %s: %s\n", t->name, dt_error_message());
            free(x);
            bad = 1;
            break;
        }
        for (size_t k = 0; k < n; k++)
            if (memcmp(&x[k], (const char *)t->data + k * sizeof(float), sizeof(float))) {
                float want;
                memcpy(&want, (const char *)t->data + k * sizeof(float), sizeof want);
                printf("differs: %s[%zu] = %.9g, reference %.9g\n", t->name, k, (double)x[k], (double)want);
                bad = 1;
                break;
            }
        compared += n;
        free(x);
    }
    for (int a = 3; a < argc && !bad; a++) {
        const char *va = dt_safetensors_meta(&ref, argv[a]), *vb = dt_ckpt_get_meta(other, argv[a]);
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
    dt_safetensors_free(&ref);
    return bad;
}
