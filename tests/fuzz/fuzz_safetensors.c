/* libFuzzer: a safetensors file through both readers — dt_safetensors_load
 * (every tensor looked up, metadata read) and dt_ckpt_open (the --init /
 * --resume path: every F32 tensor read whole). Bad input must be an error,
 * never a crash, overflow or leak. */
#include "dtrain/io.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/in.safetensors", fuzz_tmpdir());
    fuzz_write(path, data, size);
    dt_safetensors st;
    if (dt_safetensors_load(path, &st) == DT_OK) {
        for (int i = 0; i < st.n_tensors; i++) {
            const dt_st_tensor *t = dt_safetensors_find(&st, st.tensors[i].name);
            if (!t) abort();   /* every listed tensor is found by its name */
        }
        (void)dt_safetensors_meta(&st, "step");
        dt_safetensors_free(&st);
    }
    dt_ckpt *c;
    if (dt_ckpt_open(path, &c) == DT_OK) {
        (void)dt_ckpt_get_meta(c, "format");
        /* read every tensor the first reader listed, if it parsed too */
        if (dt_safetensors_load(path, &st) == DT_OK) {
            for (int i = 0; i < st.n_tensors; i++) {
                int nd;
                int64_t sh[DT_MAX_DIMS];
                if (!dt_ckpt_find(c, st.tensors[i].name, &nd, sh)) continue;
                size_t n = 1;
                for (int d = 0; d < nd; d++) n *= (size_t)sh[d];
                if (n > (1u << 20)) continue;
                float *buf = malloc((n ? n : 1) * sizeof *buf);
                if (buf) (void)dt_ckpt_read(c, st.tensors[i].name, 0, n, buf);
                free(buf);
            }
            dt_safetensors_free(&st);
        }
        dt_ckpt_close(c);
    }
    return 0;
}
