/* Inspecting a checkpoint (io.h, "inspecting"): its metadata, tensors and
 * files by position, and every recorded checksum against the bytes on disk. */
#include <string.h>
#include "ckpt_internal.h"

int dt_ckpt_meta_count(const dt_ckpt *c) {
    if (!c) return 0;
    if (c->sharded) return c->n_meta;
    return c->n_files ? c->files[0].hdr.n_meta : 0;
}

const char *dt_ckpt_meta_at(const dt_ckpt *c, int i, const char **value) {
    if (i < 0 || i >= dt_ckpt_meta_count(c)) return NULL;
    const char *const *k = c->sharded ? (const char *const *)c->mk : (const char *const *)c->files[0].hdr.meta_keys;
    const char *const *v = c->sharded ? (const char *const *)c->mv : (const char *const *)c->files[0].hdr.meta_values;
    if (value) *value = v[i];
    return k[i];
}

int dt_ckpt_tensor_count(const dt_ckpt *c) { return c ? c->n_t : 0; }

dt_status dt_ckpt_tensor_at(const dt_ckpt *c, int i, dt_ckpt_info *out) {
    if (!c || !out || i < 0 || i >= c->n_t)
        return DT_ERR(DT_EINVAL, "dt_ckpt_tensor_at: no tensor %d in %s", i, c ? c->path : "(null)");
    const dt_ckpt_tensor *t = &c->t[i];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->bytes = t->numel * dt_dtype_size(t->dtype);
    out->pieces = t->n_sp;
    for (int k = 0; k < t->n_sp; k++) out->checksummed += c->files[t->sp[k].file].e[t->sp[k].entry].has_crc;
    if (!c->sharded && t->n_sp == 1) out->offset = t->sp[0].off;
    return DT_OK;
}

int dt_ckpt_file_count(const dt_ckpt *c) { return c ? c->n_files : 0; }

const char *dt_ckpt_file_at(const dt_ckpt *c, int i, uint64_t *bytes) {
    if (!c || i < 0 || i >= c->n_files) return NULL;
    if (bytes) *bytes = c->files[i].size;
    return c->files[i].path;
}

dt_status dt_ckpt_verify_tensor(dt_ckpt *c, int i, int *checked) {
    if (checked) *checked = 0;
    if (!c || i < 0 || i >= c->n_t)
        return DT_ERR(DT_EINVAL, "dt_ckpt_verify_tensor: no tensor %d in %s", i, c ? c->path : "(null)");
    const dt_ckpt_tensor *t = &c->t[i];
    for (int k = 0; k < t->n_sp; k++) {
        dt_ckpt_file *f = &c->files[t->sp[k].file];
        if (!f->e[t->sp[k].entry].has_crc) continue;
        DT_TRY(dt_ckpt_file_verify(f, t->sp[k].entry));
        if (checked) (*checked)++;
    }
    return DT_OK;
}
