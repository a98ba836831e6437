/* The model builder: parameters, buffers, modules and inputs under names,
 * then dt_model_build validates and lays the parameters out flat.
 * A failed add_* records its error in m->build_err; every later add_* is a
 * no-op returning NULL / that error, and dt_model_build returns it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

void *dt_nn_build_failed(dt_model *m, dt_status s) {
    if (m->build_err == DT_OK) {
        m->build_err = s;
        snprintf(m->build_msg, sizeof m->build_msg, "%s", dt_error_message());
    }
    return NULL;
}

/* A failure below the builder (a shape, an allocation), named after what was added. */
static void *failed_adding(dt_model *m, dt_status s, const char *what, const char *name) {
    char why[400];
    snprintf(why, sizeof why, "%s", dt_error_message());
    return dt_nn_build_failed(m, DT_ERR(s, "model %s: %s '%s': %s", m->name, what, name, why));
}

/* Builder calls after dt_model_build, or after an earlier failure, do
 * nothing; on a NULL model they fail (the error names what was added). */
static int closed(dt_model *m, const char *what, const char *name) {
    if (!m) {
        DT_ERR(DT_EINVAL, "cannot add %s '%s': the model is NULL", what, name ? name : "(null)");
        return 1;
    }
    if (m->build_err != DT_OK) return 1;
    if (m->built) {
        dt_nn_build_failed(m, DT_ERR(DT_ESTATE, "model %s: cannot add %s '%s' after dt_model_build", m->name, what, name));
        return 1;
    }
    return 0;
}

dt_status dt_model_new(const char *name, uint64_t seed, dt_model **out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_model_new: out is NULL");
    *out = NULL;
    if (!name || !*name || strlen(name) >= sizeof ((dt_model *)0)->name)
        return DT_ERR(DT_EINVAL, "model name '%s' must be 1..%zu characters", name ? name : "(null)",
                      sizeof ((dt_model *)0)->name - 1);
    dt_model *m = calloc(1, sizeof *m);
    if (!m) return DT_ERR(DT_ENOMEM, "out of memory creating model %s", name);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->cfg.kind = DT_MODEL_CUSTOM;
    dt_rng_seed(&m->init_rng, seed);
    m->dropout_seed = seed;
    *out = m;
    return DT_OK;
}

static int name_ok(dt_model *m, const char *what, const char *name, size_t cap) {
    if (name && *name && strlen(name) < cap) return 1;
    dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: %s name '%s' must be 1..%zu characters", m->name, what,
                     name ? name : "(null)", cap - 1));
    return 0;
}

/* a shape for a parameter or buffer: dims given when ndim > 0 */
static int shape_ok(dt_model *m, const char *what, const char *name, int ndim, const int64_t *shape) {
    if (ndim <= 0 || shape) return 1;
    dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: %s '%s' has %d dimensions but no shape (NULL)", m->name, what,
                                 name, ndim));
    return 0;
}

dt_module *dt_model_add_module(dt_model *m, const char *name) {
    if (closed(m, "module", name) || !name_ok(m, "module", name, sizeof ((dt_module *)0)->name)) return NULL;
    for (int i = 0; i < m->n_modules; i++)
        if (!strcmp(m->modules[i]->name, name))
            return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: module '%s' added twice", m->name, name));
    dt_module *mod = calloc(1, sizeof *mod);
    dt_module **arr = dt_nn_grow(m->modules, m->n_modules, sizeof *arr);
    if (!mod || !arr) {
        free(mod);
        return dt_nn_build_failed(m, DT_ERR(DT_ENOMEM, "out of memory adding module %s", name));
    }
    m->modules = arr;
    snprintf(mod->name, sizeof mod->name, "%s", name);
    mod->index = m->n_modules;
    m->modules[m->n_modules++] = mod;
    return mod;
}

void dt_nn_init_values(float *x, int64_t n, dt_rng *r, dt_init in) {
    switch (in.kind) {
    case DT_INIT_ZEROS: for (int64_t i = 0; i < n; i++) x[i] = 0.f; break;
    case DT_INIT_CONST: for (int64_t i = 0; i < n; i++) x[i] = in.a; break;
    case DT_INIT_UNIFORM: for (int64_t i = 0; i < n; i++) x[i] = (2.f * dt_rng_uniform(r) - 1.f) * in.a; break;
    case DT_INIT_NORMAL: for (int64_t i = 0; i < n; i++) x[i] = in.a * dt_rng_normal(r); break;
    }
}

dt_param *dt_model_add_param(dt_model *m, dt_module *mod, const char *leaf, int ndim, const int64_t *shape,
                             dt_init init) {
    char name[160];
    snprintf(name, sizeof name, "%s%s%s", mod ? mod->name : "", mod ? "." : "", leaf ? leaf : "");
    if (closed(m, "parameter", name) || !name_ok(m, "parameter", name, sizeof ((dt_param *)0)->name)) return NULL;
    if (!leaf || !*leaf)
        return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: parameter '%s' has no leaf name", m->name, name));
    if (mod && (mod->index < 0 || mod->index >= m->n_modules || m->modules[mod->index] != mod))
        return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: parameter '%s': module %s is not this model's",
                                            m->name, name, mod->name));
    if (!shape_ok(m, "parameter", name, ndim, shape)) return NULL;
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0)   /* the optimizer, the layouts and the checkpoints all need an element */
            return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: parameter '%s' has dimension %d of size 0 (a "
                                                "parameter needs at least one element)", m->name, name, i));
    if ((unsigned)init.kind > DT_INIT_NORMAL)
        return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: parameter %s has unknown initialiser %d", m->name, name,
                                (int)init.kind));
    if (dt_model_find_param(m, name))
        return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: parameter '%s' added twice", m->name, name));
    for (int i = 0; i < m->n_buffers; i++)   /* a checkpoint: one name, one tensor */
        if (!strcmp(m->buffers[i]->name, name))
            return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: parameter '%s' has a buffer's name", m->name, name));
    dt_param *p = calloc(1, sizeof *p);
    dt_param **arr = dt_nn_grow(m->params, m->n_params, sizeof *arr);
    if (!p || !arr) {
        free(p);
        return dt_nn_build_failed(m, DT_ERR(DT_ENOMEM, "out of memory adding parameter %s", name));
    }
    m->params = arr;
    dt_status s = dt_param_init(p, name, ndim, shape);
    if (s != DT_OK) { free(p); return failed_adding(m, s, "parameter", name); }
    p->index = m->n_params;
    m->params[m->n_params++] = p;
    if (mod) {
        dt_param **mp = dt_nn_grow(mod->params, mod->n_params, sizeof *mp);
        if (!mp) return dt_nn_build_failed(m, DT_ERR(DT_ENOMEM, "out of memory adding parameter %s", name));
        mod->params = mp;
        mod->params[mod->n_params++] = p;
    }
    dt_nn_init_values(dt_f32(&p->value), p->value.numel, &m->init_rng, init);
    return p;
}

dt_named_buffer *dt_model_add_buffer(dt_model *m, const char *name, int ndim, const int64_t *shape, float fill) {
    if (closed(m, "buffer", name) || !name_ok(m, "buffer", name, sizeof ((dt_named_buffer *)0)->name)) return NULL;
    if (!shape_ok(m, "buffer", name, ndim, shape)) return NULL;
    /* a checkpoint holds parameters and buffers under their names: one name, one tensor */
    for (int i = 0; i < m->n_buffers; i++)
        if (!strcmp(m->buffers[i]->name, name))
            return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: buffer '%s' added twice", m->name, name));
    if (dt_model_find_param(m, name))
        return dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: buffer '%s' has a parameter's name", m->name, name));
    dt_named_buffer *b = calloc(1, sizeof *b);
    dt_named_buffer **arr = dt_nn_grow(m->buffers, m->n_buffers, sizeof *arr);
    if (!b || !arr) {
        free(b);
        return dt_nn_build_failed(m, DT_ERR(DT_ENOMEM, "out of memory adding buffer %s", name));
    }
    m->buffers = arr;
    snprintf(b->name, sizeof b->name, "%s", name);
    dt_status s = dt_tensor_alloc(&b->value, DT_F32, ndim, shape);
    if (s != DT_OK) { free(b); return failed_adding(m, s, "buffer", name); }
    for (int64_t i = 0; i < b->value.numel; i++) dt_f32(&b->value)[i] = fill;
    m->buffers[m->n_buffers++] = b;
    return b;
}

dt_status dt_model_add_input(dt_model *m, const dt_input_spec *spec) {
    if (closed(m, "input", spec ? spec->name : "?")) return !m ? DT_EINVAL : m->build_err ? m->build_err : DT_ESTATE;
    const char *bad = !spec ? "is NULL"
                    : !spec->name[0] || !memchr(spec->name, 0, sizeof spec->name) ? "has no name"
                    : spec->dtype != DT_F32 && spec->dtype != DT_I32 ? "must be DT_F32 or DT_I32"
                    : spec->ndim < 0 || spec->ndim > 3 ? "must have 0..3 dims"
                    : m->n_inputs == DT_MAX_INPUTS ? "is one too many" : NULL;
    for (int i = 0; !bad && i < m->n_inputs; i++)
        if (!strcmp(m->inputs[i].name, spec->name)) bad = "is declared twice";
    if (bad) {
        dt_nn_build_failed(m, DT_ERR(DT_EINVAL, "model %s: input '%s' %s", m->name,
                         spec && memchr(spec->name, 0, sizeof spec->name) ? spec->name : "?", bad));
        return m->build_err;
    }
    m->inputs[m->n_inputs++] = *spec;
    return DT_OK;
}

static dt_status default_layout(dt_model *m) {
    size_t *off = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *off);
    if (!off) return DT_ERR(DT_ENOMEM, "out of memory");
    size_t pos = 0;
    for (int i = m->n_params - 1; i >= 0; i--) {   /* reverse registration order */
        off[i] = pos;
        pos += (size_t)m->params[i]->value.numel;
    }
    m->n_elems = pos;
    dt_status s = dt_model_set_layout(m, off, pos);
    free(off);
    return s;
}

dt_status dt_model_build(dt_model *m) {
    if (!m) return DT_ERR(DT_EINVAL, "dt_model_build: the model is NULL");
    if (m->build_err != DT_OK) return DT_ERR(m->build_err, "%s", m->build_msg);   /* the first builder error */
    if (m->built) return DT_ERR(DT_ESTATE, "model %s: dt_model_build called twice", m->name);
    if (!m->forward) DT_TRY(dt_model_check_blocks(m));
    DT_TRY(default_layout(m));
    dt_model_arch_fingerprint(m);
    m->built = 1;
    return DT_OK;
}

void dt_model_free(dt_model *m) {
    if (!m) return;
    if (m->destroy) m->destroy(m);
    for (int i = 0; i < m->n_params; i++) { dt_param_free(m->params[i]); free(m->params[i]); }
    for (int i = 0; i < m->n_buffers; i++) { dt_tensor_free(&m->buffers[i]->value); free(m->buffers[i]); }
    for (int i = 0; i < m->n_modules; i++) { free(m->modules[i]->params); free(m->modules[i]); }
    free(m->params); free(m->buffers); free(m->modules); free(m->offsets); free(m->grad_offsets); free(m->blocks);
    dt_flat_free(&m->param_flat);
    dt_flat_free(&m->grad_flat);
    free(m);
}

size_t dt_model_num_params(const dt_model *m) { return m->n_elems; }

dt_param *dt_model_find_param(const dt_model *m, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i]->name, name)) return m->params[i];
    return NULL;
}
