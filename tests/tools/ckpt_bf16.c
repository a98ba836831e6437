/* ckpt_bf16 CKPT GLOB: of the tensors of checkpoint CKPT (a file or a sharded
 * set) whose names match GLOB (fnmatch), counts the values that bfloat16
 * cannot hold exactly (low 16 bits of the float32 not zero) and the zeros.
 * Prints "T tensors, N values, K not bfloat16, Z zero"; exit 0 when read
 * (the caller judges the counts), 2 when unreadable or nothing matches.
 * Written for test_optim_bf16.sh: a bf16-state run saves its state widened,
 * so every value is a bfloat16; an fp32-state run's are mostly not. */
#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/io.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ckpt_bf16 CKPT GLOB\n");
        return 2;
    }
    dt_ckpt *c = NULL;
    if (dt_ckpt_open(argv[1], &c) != DT_OK) {
        fprintf(stderr, "ckpt_bf16: %s\n", dt_error_message());
        return 2;
    }
    size_t tensors = 0, values = 0, wide = 0, zeros = 0;
    int rc = 0;
    for (int i = 0; i < dt_ckpt_tensor_count(c) && rc == 0; i++) {
        dt_ckpt_info t;
        if (dt_ckpt_tensor_at(c, i, &t) != DT_OK) { rc = 2; break; }
        if (fnmatch(argv[2], t.name, 0) != 0) continue;
        size_t n = (size_t)(t.bytes / sizeof(float));
        float *x = malloc((n ? n : 1) * sizeof *x);
        if (!x || dt_ckpt_read(c, t.name, 0, n, x) != DT_OK) {
            fprintf(stderr, "ckpt_bf16: %s: %s\n", t.name, x ? dt_error_message() : "out of memory");
            rc = 2;
        }
        for (size_t k = 0; k < n && rc == 0; k++) {
            uint32_t u;
            memcpy(&u, &x[k], sizeof u);
            wide += (u & 0xffffu) != 0;
            zeros += x[k] == 0.0f;
        }
        free(x);
        tensors++;
        values += n;
    }
    dt_ckpt_close(c);
    if (rc == 0 && tensors == 0) {
        fprintf(stderr, "ckpt_bf16: no tensor of %s matches '%s'\n", argv[1], argv[2]);
        rc = 2;
    }
    if (rc == 0) printf("%zu tensors, %zu values, %zu not bfloat16, %zu zero\n", tensors, values, wide, zeros);
    return rc;
}
