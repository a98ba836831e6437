/* Built-in communication hooks: plain average, and bf16/fp16 compression. */
#include <stdlib.h>
#include "ddp_internal.h"

static dt_status allreduce_launch(void *state, dt_pg *pg, dt_ddp_bucket *b, dt_work **w) {
    const dt_ddp *d = state;
    return dt_allreduce(pg, b->grad, b->grad, (int64_t)b->numel, DT_F32, DT_RED_AVG | d->red_flags, w);
}

void dt_ddp_hook_allreduce(dt_ddp *d, dt_ddp_comm_hook *h) {
    *h = (dt_ddp_comm_hook){allreduce_launch, NULL, d};
}

/* Compression: convert to 16-bit, average on the wire (float accumulation,
 * rounded to 16 bits per reduction step), convert back. */
typedef struct { dt_dtype wire; } compress_state;
static compress_state bf16_state = {DT_BF16}, fp16_state = {DT_F16};

static dt_status compress_launch(void *state, dt_pg *pg, dt_ddp_bucket *b, dt_work **w) {
    compress_state *cs = state;
    if (!b->scratch && !(b->scratch = malloc(b->numel * 2 + 2))) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_convert(b->scratch, cs->wire, b->grad, DT_F32, b->numel);
    return dt_allreduce(pg, b->scratch, b->scratch, (int64_t)b->numel, cs->wire, DT_RED_AVG, w);
}

static dt_status compress_finish(void *state, dt_pg *pg, dt_ddp_bucket *b) {
    (void)pg;
    compress_state *cs = state;
    dt_convert(b->grad, DT_F32, b->scratch, cs->wire, b->numel);
    return DT_OK;
}

void dt_ddp_hook_compress(dt_ddp *d, dt_ddp_comm_hook *h, dt_dtype wire) {
    (void)d;
    *h = (dt_ddp_comm_hook){compress_launch, compress_finish, wire == DT_BF16 ? &bf16_state : &fp16_state};
}
