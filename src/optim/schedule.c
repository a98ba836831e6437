/* Learning-rate schedule: linear warm-up, then cosine decay to min_lr. */
#include <math.h>
#include "dtrain/optim.h"

#define DT_PI 3.14159265358979323846

float dt_lr_at(const dt_lr_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    if (step < s->warmup)
        return (float)((double)s->lr * (double)(step + 1) / (double)s->warmup);
    if (s->total <= 0) return s->lr;
    if (step >= s->total) return s->min_lr;
    /* here warmup <= step < total, so the span is positive */
    double span = (double)(s->total - (s->warmup > 0 ? s->warmup : 0));
    double t = (double)(step - (s->warmup > 0 ? s->warmup : 0)) / span;
    double lr = s->lr, lo = s->min_lr;
    return (float)(lo + 0.5 * (lr - lo) * (1.0 + cos(DT_PI * t)));
}
