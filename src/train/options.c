/* Training options: defaults and validation (contradictions fail loudly).
 * Whether the model takes the data's samples is checked when the data is
 * open (data_setup.c). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "dtrain/ops.h"
#include "dtrain/train.h"

/* Per rank and step, samples (batch x accum) and their targets or tokens
 * (x seq) stay far below int64's range, so every product the trainer forms
 * from them (x world, x bytes per sample) is exact. */
#define MAX_ITEMS_PER_STEP ((int64_t)1 << 40)
#define MAX_THREADS_PER_CORE 8

/* a * b, or -1 when it exceeds MAX_ITEMS_PER_STEP (a, b > 0) */
static int64_t bounded_mul(int64_t a, int64_t b) { return a > MAX_ITEMS_PER_STEP / b ? -1 : a * b; }

void dt_train_opts_default(dt_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = dt_model_cfg_default(DT_MODEL_MLP);
    o->data = DT_DATA_FASHION_MNIST;   /* the registry's name (data.h) */
    o->batch = 64;
    o->seq = 64;
    o->epochs = 1;
    o->accum = 1;
    o->optim = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    o->seed = 1;
}

dt_status dt_train_opts_validate(const dt_train_opts *o) {
    if (!o->build_model) DT_TRY(dt_model_cfg_validate(&o->model));
    DT_TRY(dt_optim_cfg_validate(&o->optim));
    DT_TRY(dt_dataset_check_name(o->data));
    DT_TRY(dt_gemm_backend_check());   /* DTRAIN_GEMM, read from the environment like DTRAIN_CONV */
    if ((unsigned)o->recompute > DT_RECOMPUTE_BLOCKS) return DT_ERR(DT_EINVAL, "train.recompute: unknown mode %d", (int)o->recompute);
    const char *seq_key = "";   /* a sequence model's longest sequence, and the setting that sets it (nn.h) */
    int max_seq = o->build_model ? 0 : dt_model_cfg_max_seq(&o->model, &seq_key), lm = max_seq > 0;
    if (o->batch <= 0) return DT_ERR(DT_EINVAL, "train.batch must be positive, got %lld", (long long)o->batch);
    if (lm && (o->seq <= 0 || o->seq > max_seq))
        return DT_ERR(DT_EINVAL, "train.seq %lld must be in 1..%d (the model's %s)", (long long)o->seq, max_seq, seq_key);
    if (o->steps < 0) return DT_ERR(DT_EINVAL, "train.steps must be >= 0");
    if (o->steps == 0 && o->epochs <= 0) return DT_ERR(DT_EINVAL, "give train.steps or a positive train.epochs");
    if (o->accum <= 0) return DT_ERR(DT_EINVAL, "train.accum must be >= 1");
    int64_t per_step = bounded_mul(o->batch, o->accum);
    if (per_step < 0 && !lm)
        return DT_ERR(DT_EINVAL, "train.batch %lld x train.accum %d is too large (at most 2^40 samples per rank and step)",
                      (long long)o->batch, o->accum);
    if (lm && (per_step < 0 || bounded_mul(per_step, o->seq) < 0))
        return DT_ERR(DT_EINVAL, "train.batch %lld x train.accum %d x train.seq %lld is too large (at most 2^40 tokens per rank and step)",
                      (long long)o->batch, o->accum, (long long)o->seq);
    if (o->eval_batches < 0) return DT_ERR(DT_EINVAL, "train.eval_batches must be >= 0 (0: all), got %lld", (long long)o->eval_batches);
    if (o->eval_batches > 0 && bounded_mul(o->eval_batches, o->batch) < 0)
        return DT_ERR(DT_EINVAL, "train.eval_batches %lld x train.batch %lld is too large (use 0 for all)", (long long)o->eval_batches,
                      (long long)o->batch);
    if (o->log_every < 0) return DT_ERR(DT_EINVAL, "train.log_every must be >= 0 (0: about 20 lines a run), got %lld", (long long)o->log_every);
    if (o->stop_after < 0) return DT_ERR(DT_EINVAL, "train.stop_after must be >= 0, got %lld", (long long)o->stop_after);
    if (o->clip < 0) return DT_ERR(DT_EINVAL, "train.clip must be >= 0");
    if ((unsigned)o->precision > DT_PREC_FP16) return DT_ERR(DT_EINVAL, "train.precision: unknown precision %d", o->precision);
    if ((unsigned)o->saved_activations > DT_SAVED_FP16)
        return DT_ERR(DT_EINVAL, "train.saved_activations: unknown mode %d", o->saved_activations);
    if (o->saved_activations == DT_SAVED_FP16 && !dt_train_loss_scaling(o))
        return DT_ERR(DT_EINVAL, "train.saved_activations fp16 needs loss scaling (train.loss_scale dynamic or a fixed "
                      "scale): an activation beyond 65504 is kept as inf, and only a loss-scaled step is skipped for it; "
                      "bf16 keeps fp32's range");
    if ((unsigned)o->param_dtype > DT_PARAMS_FP16)
        return DT_ERR(DT_EINVAL, "train.param_dtype: unknown mode %d", o->param_dtype);
    if ((unsigned)o->loss_scale > DT_LOSS_SCALE_DYNAMIC) return DT_ERR(DT_EINVAL, "train.loss_scale: unknown mode %d", o->loss_scale);
    /* (a subnormal scale is flushed to 0 with denormals off: from FLT_MIN up) */
    if (!(o->loss_scale_init >= 0.0f) || o->loss_scale_init > DT_LOSS_SCALE_MAX ||
        (o->loss_scale_init > 0.0f && o->loss_scale_init < FLT_MIN))
        return DT_ERR(DT_EINVAL, "train.loss_scale_init must be from 1.2e-38 up to 2^64 (0: 65536), got %g",
                      (double)o->loss_scale_init);
    if (o->loss_scale == DT_LOSS_SCALE_FIXED && o->loss_scale_init == 0.0f)
        return DT_ERR(DT_EINVAL, "train.loss_scale: a fixed loss scale needs its value (train.loss_scale_init)");
    if (o->loss_scale_window < 0) return DT_ERR(DT_EINVAL, "train.loss_scale_window must be >= 1 (0: 2000), got %d", o->loss_scale_window);
    if (o->uneven && dt_train_loss_scaling(o))   /* the verdict is a collective every rank must join */
        return DT_ERR(DT_EINVAL, "train.uneven does not combine with loss scaling (train.loss_scale, on by default with train.precision fp16): every rank must agree on each step's skip");
    if (o->min_lr < 0 || o->min_lr > o->optim.lr) return DT_ERR(DT_EINVAL, "train.min_lr must be in [0, train.optim.lr]");
    if (o->warmup < 0) return DT_ERR(DT_EINVAL, "train.warmup must be >= 0");
    if (o->threads < 0) return DT_ERR(DT_EINVAL, "train.threads must be >= 0");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (o->threads > MAX_THREADS_PER_CORE * cores)
        return DT_ERR(DT_EINVAL, "train.threads %d: at most %ld (%d x the %ld cores of this machine)", o->threads,
                      MAX_THREADS_PER_CORE * cores, MAX_THREADS_PER_CORE, cores);
    if (o->save_every < 0) return DT_ERR(DT_EINVAL, "train.save_every must be >= 0");
    if (o->save_every > 0 && !o->save) return DT_ERR(DT_EINVAL, "train.save_every needs train.save PATH");
    if (o->n_freeze < 0 || (o->n_freeze > 0 && !o->freeze)) return DT_ERR(DT_EINVAL, "train.freeze: %d patterns without a list", o->n_freeze);
    for (int k = 0; k < o->n_freeze; k++)
        if (!o->freeze[k] || !o->freeze[k][0]) return DT_ERR(DT_EINVAL, "train.freeze: pattern %d is empty", k + 1);
    if (o->unfreeze_at < 0) return DT_ERR(DT_EINVAL, "train.unfreeze_at must be >= 0 (0: never)");
    if (o->sample_every < 0) return DT_ERR(DT_EINVAL, "train.sample_every must be >= 0 (0: off), got %lld", (long long)o->sample_every);
    if (o->sample_tokens < 0 || o->sample_tokens > 1000000)
        return DT_ERR(DT_EINVAL, "train.sample_tokens must be in [1, 1000000] (0: 64), got %d", o->sample_tokens);
    if (o->unfreeze_at > 0 && o->n_freeze == 0) return DT_ERR(DT_EINVAL, "train.unfreeze_at needs train.freeze PATTERN (what to unfreeze)");
    if (o->n_groups < 0 || (o->n_groups > 0 && !o->groups))
        return DT_ERR(DT_EINVAL, "parameter groups: %d groups without a table", o->n_groups);
    if (o->init && o->resume) return DT_ERR(DT_EINVAL, "train.init and train.resume are exclusive (a checkpoint already holds the weights)");
    if (o->uneven) {   /* each rank's data position is its own: nothing a checkpoint records */
        /* (unfreezing is a collective a rank that ran out of data, already joined, never makes) */
        const char *bad = o->resume ? "train.resume" : o->save_every ? "train.save_every" : o->stop_after ? "train.stop_after"
                        : o->unfreeze_at > 0 ? "train.unfreeze_at" : NULL;
        if (bad) return DT_ERR(DT_EINVAL, "train.uneven does not combine with %s (ranks stop at different steps)", bad);
    }
    return DT_OK;
}

dt_dtype dt_train_saved_dtype(const dt_train_opts *o) {
    switch (o->saved_activations) {
    case DT_SAVED_BF16: return DT_BF16;
    case DT_SAVED_FP16: return DT_F16;
    case DT_SAVED_FP32: return DT_F32;
    default:   /* bf16 only where its products run in bf16: elsewhere the packing (~10% of W1's step) would
                  make --precision bf16 slower than fp32 for the same products (docs/PERFORMANCE.md) */
        return o->precision == DT_PREC_FP16 && dt_train_loss_scaling(o) ? DT_F16
             : o->precision == DT_PREC_BF16 && dt_gemm_bf16_available() ? DT_BF16 : DT_F32;
    }
}

dt_dtype dt_train_param_dtype(const dt_train_opts *o) {
    switch (o->param_dtype) {
    case DT_PARAMS_BF16: return DT_BF16;
    case DT_PARAMS_FP16: return DT_F16;
    case DT_PARAMS_FP32: return DT_F32;
    default:   /* fp32: a 16-bit copy costs fidelity (LayerNorm gains, train.h) and is opted into for
                  ZeRO's halved gathers */
        return DT_F32;
    }
}

int dt_train_loss_scaling(const dt_train_opts *o) {
    if (o->loss_scale == DT_LOSS_SCALE_AUTO) return o->precision == DT_PREC_FP16;
    return o->loss_scale != DT_LOSS_SCALE_OFF;
}
