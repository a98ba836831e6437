/* TEMPORARY stand-in (gpipe, 1f1b) until the schedule module lands. */
#include <stdlib.h>
#include <string.h>
#include "pipe_schedule.h"

int dt_pipe_kind_parse(const char *s, dt_pipe_kind *out) {
    if (!strcmp(s, "gpipe")) { *out = DT_PIPE_GPIPE; return 0; }
    if (!strcmp(s, "1f1b")) { *out = DT_PIPE_1F1B; return 0; }
    if (!strcmp(s, "interleaved")) { *out = DT_PIPE_INTERLEAVED; return 0; }
    if (!strcmp(s, "zb-h1")) { *out = DT_PIPE_ZBH1; return 0; }
    return -1;
}
const char *dt_pipe_kind_name(dt_pipe_kind k) {
    return k == DT_PIPE_GPIPE ? "gpipe" : k == DT_PIPE_1F1B ? "1f1b" : k == DT_PIPE_INTERLEAVED ? "interleaved" : "zb-h1";
}
double dt_pipe_bubble_formula(dt_pipe_kind kind, int P, int M, int V) {
    double b = (double)(P - 1) / (double)(M + P - 1);
    return kind == DT_PIPE_INTERLEAVED ? b / V : b;
}
void dt_pipe_schedule_free(dt_pipe_schedule *s) {
    for (int r = 0; s->act && r < s->P; r++) free(s->act[r]);
    free(s->act); free(s->n);
    memset(s, 0, sizeof *s);
}
dt_status dt_pipe_schedule_build(dt_pipe_kind kind, int P, int M, int V, int max_outstanding, dt_pipe_schedule *out) {
    memset(out, 0, sizeof *out);
    if (kind != DT_PIPE_GPIPE && kind != DT_PIPE_1F1B) return DT_ERR(DT_EINVAL, "schedule not available yet");
    if (V != 1) return DT_ERR(DT_EINVAL, "V must be 1");
    out->kind = kind; out->P = P; out->M = M; out->V = 1; out->max_outstanding = max_outstanding;
    out->n = calloc((size_t)P, sizeof *out->n);
    out->act = calloc((size_t)P, sizeof *out->act);
    for (int s = 0; s < P; s++) {
        dt_pipe_action *a = out->act[s] = calloc((size_t)(2 * M), sizeof *a);
        int k = 0;
        if (kind == DT_PIPE_GPIPE) {
            for (int j = 0; j < M; j++) a[k++] = (dt_pipe_action){DT_PIPE_F, 0, j};
            for (int j = 0; j < M; j++) a[k++] = (dt_pipe_action){DT_PIPE_B, 0, j};
        } else {
            int warm = P - s - 1 < M ? P - s - 1 : M, f = 0, b = 0;
            for (; f < warm; f++) a[k++] = (dt_pipe_action){DT_PIPE_F, 0, f};
            while (f < M) { a[k++] = (dt_pipe_action){DT_PIPE_F, 0, f++}; a[k++] = (dt_pipe_action){DT_PIPE_B, 0, b++}; }
            while (b < M) a[k++] = (dt_pipe_action){DT_PIPE_B, 0, b++};
        }
        out->n[s] = k;
    }
    return DT_OK;
}
