/* The data-parallel options every strategy shares (parallel.h, dt_dp_opts):
 * defaults and the checks that do not depend on the strategy. */
#include <string.h>
#include "common_internal.h"

const char *dt_par_wire_name(dt_dtype wire) {
    return wire == DT_F32 ? "f32" : wire == DT_BF16 ? "bf16" : wire == DT_F16 ? "fp16" : "?";
}

void dt_dp_opts_default(dt_dp_opts *o) {
    memset(o, 0, sizeof *o);
    o->first_bucket_bytes = (size_t)1 << 20;
    o->bucket_bytes = (size_t)1 << 20;
    o->broadcast_buffers = 1;
    o->wire = DT_F32;
    o->shm = DT_DP_SHM_AUTO;
}

dt_status dt_dp_opts_validate(const dt_dp_opts *o, const char *who) {
    if (o->first_bucket_bytes < 4 || o->bucket_bytes < 4)
        return DT_ERR(DT_EINVAL, "%s: dp.first_bucket_bytes and dp.bucket_bytes must be at least one float (got %zu "
                      "and %zu bytes)", who, o->first_bucket_bytes, o->bucket_bytes);
    if (o->wire != DT_F32 && o->wire != DT_BF16 && o->wire != DT_F16)
        return DT_ERR(DT_EINVAL, "%s: dp.wire must be f32, bf16 or fp16 (got dtype %d)", who, (int)o->wire);
    if ((unsigned)o->shm > DT_DP_SHM_REQUIRE) return DT_ERR(DT_EINVAL, "%s: unknown dp.shm mode %d", who, (int)o->shm);
    if (o->join && o->sync_bn)
        return DT_ERR(DT_EINVAL, "%s: dp.join and dp.sync_bn (SyncBatchNorm) are exclusive (its forward collectives depend on the "
                      "batch)", who);
    return DT_OK;
}
