/* Loss scaling's state machine and step factor (strategy.h, "loss
 * scaling"): the scale is run state, like the step, so it lives beside the
 * checkpoint metadata that records it. One concern: no collective here --
 * whoever steps computes the global norm and hands it in. */
#include <float.h>
#include <math.h>
#include "dtrain/strategy.h"

dt_status dt_loss_scaler_init(dt_loss_scaler *ls, float scale, int dynamic, int window) {
    if (!(scale > 0.0f) || !isfinite(scale) || scale > DT_LOSS_SCALE_MAX)
        return DT_ERR(DT_EINVAL, "train.loss_scale_init: the loss scale must be > 0 and at most 2^64 (%g), got %g",
                      (double)DT_LOSS_SCALE_MAX, (double)scale);
    if (window < 1) return DT_ERR(DT_EINVAL, "train.loss_scale_window must be >= 1, got %d", window);
    *ls = (dt_loss_scaler){.scale = scale, .dynamic = dynamic != 0, .window = window};
    return DT_OK;
}

int dt_loss_scaler_verdict(const dt_loss_scaler *ls, double sumsq, float clip, float *scale) {
    *scale = 1.0f;
    if (sumsq >= 0 || isnan(sumsq)) {   /* taken */
        if (!isfinite(sumsq)) return 1;
        /* the unscaled norm; S a power of two (dynamic) makes both divisions exact */
        if (clip > 0) *scale = dt_clip_scale(sqrt(sumsq) / (double)ls->scale, clip);
    }
    *scale /= ls->scale;
    return 0;
}

void dt_loss_scaler_update(dt_loss_scaler *ls, int skipped) {
    if (skipped) {
        ls->skipped++;
        ls->good = 0;
        if (ls->dynamic && ls->scale * 0.5f >= FLT_MIN) ls->scale *= 0.5f;   /* stays a normal float */
        return;
    }
    if (!ls->dynamic) return;
    if (++ls->good >= ls->window) {
        ls->good = 0;
        if (ls->scale * 2.0f <= DT_LOSS_SCALE_MAX) ls->scale *= 2.0f;   /* 1 / S stays a normal float */
    }
}
