/* Seeded parameter initialisers. */
#include "model_internal.h"

void dt_init_uniform(dt_param *p, dt_rng *r, float bound) {
    float *x = dt_f32(&p->value);
    for (int64_t i = 0; i < p->value.numel; i++) x[i] = (2.f * dt_rng_uniform(r) - 1.f) * bound;
}

void dt_init_normal(dt_param *p, dt_rng *r, float std) {
    float *x = dt_f32(&p->value);
    for (int64_t i = 0; i < p->value.numel; i++) x[i] = std * dt_rng_normal(r);
}

void dt_init_const(dt_param *p, float v) {
    float *x = dt_f32(&p->value);
    for (int64_t i = 0; i < p->value.numel; i++) x[i] = v;
}
