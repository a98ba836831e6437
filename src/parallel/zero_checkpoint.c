/* Placeholder until the sharded / consolidated ZeRO checkpoints land. */
#include "zero_internal.h"
dt_status dt_zero_save(dt_zero *z, dt_trainer *t, const char *path, dt_zero_ckpt_format fmt) {
    (void)z; (void)t; (void)fmt;
    return DT_ERR(DT_EINVAL, "zero: checkpoints not implemented yet (%s)", path);
}
dt_status dt_zero_load(dt_zero *z, dt_trainer *t, const char *path) {
    (void)z; (void)t;
    return DT_ERR(DT_EINVAL, "zero: checkpoints not implemented yet (%s)", path);
}
