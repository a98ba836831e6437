/* A model's architecture as checkpoints record it, beyond a built-in's
 * settings (settings.c): a fingerprint of every parameter's and buffer's
 * name and shape. */
#include <stdio.h>
#include <zlib.h>
#include "model_internal.h"

static uLong add_tensor(uLong crc, const char *name, int ndim, const int64_t *shape) {
    char buf[320];
    int k = snprintf(buf, sizeof buf, "%s[", name);
    for (int d = 0; d < ndim && k < (int)sizeof buf; d++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (k < (int)sizeof buf) k += snprintf(buf + k, sizeof buf - (size_t)k, "];");
    if (k > (int)sizeof buf - 1) k = (int)sizeof buf - 1;
    return crc32(crc, (const Bytef *)buf, (uInt)k);
}

void dt_model_arch_fingerprint(dt_model *m) {
    uLong crc = crc32(0L, Z_NULL, 0);
    int64_t shape[DT_MAX_DIMS];   /* a tensor-parallel part counts as the whole: checkpoints hold the whole */
    for (int i = 0; i < m->n_params; i++) {
        int nd = dt_param_full_shape(m->params[i], shape);
        crc = add_tensor(crc, m->params[i]->name, nd, shape);
    }
    for (int i = 0; i < m->n_buffers; i++)
        crc = add_tensor(crc, m->buffers[i]->name, m->buffers[i]->value.ndim, m->buffers[i]->value.shape);
    m->arch_crc = (uint32_t)crc;
    m->arch_n = m->n_params + m->n_buffers;
}
