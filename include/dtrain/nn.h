/* dtrain/nn.h — models: named parameters, buffers, modules, flat layout.
 *
 * Sections: 1 inputs and batches, 2 building a model, 3 blocks, 4 the
 * built-in models (MLP, CNN, GPT-2, built with 2-3) and their registry
 * (4b: how to add one), 5 the model.
 *
 * A model registers parameters in a fixed order (PyTorch's named_parameters
 * order; GPT-2 uses Hugging Face names and layouts so checkpoints are
 * interchangeable). By default parameters and gradients live in two flat
 * buffers, laid out in *reverse* registration order (≈ the order backward
 * produces gradients), so a DDP bucket or ZeRO shard is a contiguous range.
 * Parallel strategies may impose another layout (padding, alignment) with
 * dt_model_set_layout.
 */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/ops.h"

typedef struct dt_named_buffer {
    char name[128];          /* "bn1.running_mean" */
    dt_tensor value;         /* F32, owned */
} dt_named_buffer;

/* ---- 1. Inputs: named tensors ----
 * A dataset describes one sample as named inputs (per-sample dims, batch
 * excluded) plus integer targets; a model declares the inputs it takes with
 * the same struct. Built-in datasets: fashion-mnist gives "image" float
 * [1, 28, 28] and 1 target; text/shard give "ids" int32 [T] and T targets.
 *
 * In a model's declaration a dim may also be 0 (any size) or -n (at most n),
 * and `flat` accepts any shape with the same number of elements (a model
 * that flattens its input). */
#define DT_MAX_INPUTS 4
typedef struct dt_input_spec {
    char name[16];           /* "image", "ids" */
    dt_dtype dtype;          /* DT_F32 or DT_I32 */
    int ndim;                /* 0..3 */
    int64_t dims[3];
    int flat;                /* model side: only the element count must match */
    int64_t int_limit;       /* model side, DT_I32: every value < int_limit (0 = any) */
} dt_input_spec;

typedef struct dt_sample_shape {
    int n_inputs;
    dt_input_spec in[DT_MAX_INPUTS];
    int64_t targets;         /* int32 targets per sample */
    int64_t classes;         /* every target (and token id) is < classes */
} dt_sample_shape;
int64_t dt_input_numel(const dt_input_spec *s);      /* elements per sample */
size_t dt_input_bytes(const dt_input_spec *s);       /* bytes per sample */
/* "float [1, 28, 28] (10 classes)" / "int32 [64] (vocab 256)"; returns buf. */
const char *dt_sample_shape_str(const dt_sample_shape *s, char *buf, size_t n);
/* The input called name of dtype, or NULL. */
const dt_input_spec *dt_sample_input(const dt_sample_shape *s, const char *name, dt_dtype dtype);

/* A batch of B samples: named input tensors [B, dims...] (views of the
 * caller's buffers) and targets y[B * T] (< 0: ignored).
 * row_keys[B] (the caller's, may be NULL): one dropout key per sample, what
 * every random op of the forward draws from (ops.h dt_op_dropout). The
 * trainer sets them for training batches from (seed, step, the sample's
 * position in the epoch's global order): dt_dropout_row_key. A model that
 * trains with dropout fails on a training batch without them. */
typedef struct dt_batch {
    int64_t B, T;            /* T: targets per sample (1 for images) */
    int n_inputs;
    const char *names[DT_MAX_INPUTS];
    dt_tensor in[DT_MAX_INPUTS];
    const int32_t *y;
    const uint64_t *row_keys;
} dt_batch;
/* B samples of shape s: x[k] holds B samples of input k, y B * s->targets. */
dt_batch dt_batch_of(const dt_sample_shape *s, int64_t B, void *const *x, const int32_t *y);
/* Append input `name` (a string that outlives the batch): a view of data,
 * shape [B, ...] (shape[0] must be b->B). DT_EINVAL when full or mismatched. */
dt_status dt_batch_add_input(dt_batch *b, const char *name, dt_dtype dtype, int ndim, const int64_t *shape,
                             const void *data);
/* Input `name` of the batch (of dtype, for messages: who asks), or NULL +
 * DT_EINVAL naming what the batch has. */
const dt_tensor *dt_batch_input(const dt_batch *b, const char *name, dt_dtype dtype, const char *who);

/* ---- 2. Building a model ----
 * A model is parameters, buffers and modules under dotted names, the inputs
 * it takes, an ordered list of blocks and a loss head:
 *
 *   dt_model *m;
 *   dt_model_new("resmlp", seed, &m);                    // seeded initialisers
 *   dt_model_add_input(m, &(dt_input_spec){"image", DT_F32, 3, {1, 28, 28}});
 *   dt_module *fc1 = dt_nn_add_linear(m, "fc1", 784, 256);   // fc1.weight, fc1.bias
 *   dt_model_add_block(m, "fc1", fc1_forward, user, 0, NULL, 1, (int64_t[]){256});
 *   ...
 *   dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, 10);
 *   DT_TRY(dt_model_build(m));                           // first error of any add_*, or layout
 *
 * Parameters are initialised when added, in registration order, from the
 * model's seeded generator (same seed, same weights). A failed add_* returns
 * NULL and is remembered: later adds do nothing and dt_model_build reports it,
 * so a builder may check once at the end. */
typedef enum dt_init_kind { DT_INIT_ZEROS = 0, DT_INIT_CONST, DT_INIT_UNIFORM, DT_INIT_NORMAL } dt_init_kind;
typedef struct dt_init { dt_init_kind kind; float a; } dt_init;   /* const a | uniform(-a, a) | normal(0, a) */
#define DT_INIT_ZERO ((dt_init){DT_INIT_ZEROS, 0.f})
#define DT_INIT_FILL(v) ((dt_init){DT_INIT_CONST, (v)})
#define DT_INIT_UNIF(bound) ((dt_init){DT_INIT_UNIFORM, (bound)})
#define DT_INIT_GAUSS(std) ((dt_init){DT_INIT_NORMAL, (std)})

typedef struct dt_model dt_model;
/* An empty model. name identifies it in checkpoints ("mlp", "gpt2", yours). */
dt_status dt_model_new(const char *name, uint64_t seed, dt_model **out);
dt_module *dt_model_add_module(dt_model *m, const char *name);
/* Parameter "<module name>.<leaf>" (mod NULL: "<leaf>"), initialised now.
 * weight_decay defaults to 1 for ndim >= 2 (set p->weight_decay to change). */
dt_param *dt_model_add_param(dt_model *m, dt_module *mod, const char *leaf, int ndim, const int64_t *shape,
                             dt_init init);
/* Tensor parallelism: a parameter of which this rank holds one part
 * (autograd.h dt_param_split): full_shape is the whole tensor's; it is
 * initialised whole from the model's generator, exactly as
 * dt_model_add_param would, and only this rank's part kept, so T ranks hold
 * the slices of the model one process builds from the same seed (costs one
 * whole tensor of scratch per call). split.parts <= 1: dt_model_add_param. */
dt_param *dt_model_add_param_split(dt_model *m, dt_module *mod, const char *leaf, int ndim, const int64_t *full_shape,
                                   dt_init init, dt_param_split split);
/* The whole tensor's shape of p (its own shape when not split); returns ndim. */
int dt_param_full_shape(const dt_param *p, int64_t *shape);
/* Copy part `part` of a split tensor between the whole tensor (full, of
 * full_shape) and one part (local): to_full 0 slices full into local, 1
 * places local into full. */
void dt_split_copy(const dt_param_split *s, int ndim, const int64_t *full_shape, int part, float *full, float *local,
                   int to_full);
/* A non-trained tensor saved in checkpoints (BatchNorm running stats). Its
 * name is its own (not another buffer's or a parameter's). Under a pipeline
 * the stage that saves it is the one whose blocks use the module its name
 * starts with ("bn1.running_mean": module bn1), else the first stage: name
 * a buffer a block updates under that block's module, or the saved value is
 * the first stage's copy. */
dt_named_buffer *dt_model_add_buffer(dt_model *m, const char *name, int ndim, const int64_t *shape, float fill);
dt_status dt_model_add_input(dt_model *m, const dt_input_spec *spec);

/* ---- 3. Blocks ----
 * The forward pass is the blocks in order, then the loss head:
 *   x1 = block0(batch), x2 = block1(x1), ..., loss = head(xn, targets)
 * A block maps one float activation [B, in dims] to one [B, out dims]; a
 * block declared with in_ndim = 0 reads the batch's inputs instead (x is
 * NULL). Any contiguous range of blocks can run on its own (a pipeline
 * stage). Dims are per sample; DT_DIM_SEQ stands for the batch's T (tokens
 * per sample), so one declaration serves every sequence length. Inside, a
 * block brackets the ops that use a module's parameters with
 * dt_module_enter/leave (or uses the dt_nn_* helpers below, which do), so
 * ZeRO-3 can gather them. */
#define DT_DIM_SEQ (-1)
/* This rank's share of the batch's T under sequence parallelism: T /
 * cfg.tp_size when cfg.tp_seq is set (and tp_size > 1), else T. */
#define DT_DIM_SEQ_PART (-2)
#define DT_MAX_BLOCKS 1024
typedef dt_tensor *(*dt_block_fn)(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user);
typedef struct dt_block {
    char name[64];
    dt_block_fn forward;
    void *user;
    int in_ndim, out_ndim;   /* per-sample dims (batch excluded); in_ndim 0: reads the batch */
    int64_t in_dims[3], out_dims[3];
    int recompute;           /* 1: keep only the input; re-run forward in backward */
    dt_dtype saved_dtype;    /* DT_BF16 / DT_F16: activations kept in 16 bits until backward
                                (dt_graph_pack16); DT_F32 (0): as computed. recompute wins */
} dt_block;
dt_status dt_model_add_block(dt_model *m, const char *name, dt_block_fn fn, void *user, int in_ndim,
                             const int64_t *in_dims, int out_ndim, const int64_t *out_dims);
/* Loss head on the last block's output [B, ..., classes]: mean cross-entropy
 * over the B*T targets; the metric is accuracy (argmax == target). Set
 * before dt_model_build (after it: DT_ESTATE, and the model's build error). */
typedef enum dt_loss_kind { DT_LOSS_CROSS_ENTROPY = 0, DT_LOSS_VOCAB_PARALLEL = 1 } dt_loss_kind;
dt_status dt_model_set_loss(dt_model *m, dt_loss_kind kind, int64_t classes);
/* Tensor parallelism: the loss head over logits split by columns
 * (DT_LOSS_VOCAB_PARALLEL): the last block returns this rank's part
 * [B, .., dt_vocab_part(classes, parts)] (rank r: classes [r n, r n + n),
 * the columns past `classes` padding) and the loss and accuracy run over the
 * model's m->tp group (of `parts` ranks) with
 * dt_op_vocab_parallel_cross_entropy and dt_count_correct_vocab_parallel:
 * no rank holds [B*T, classes]. parts <= 1: dt_model_set_loss. */
dt_status dt_model_set_loss_split(dt_model *m, int64_t classes, int parts);
/* Validate (inputs, blocks chain, loss) and move parameters into the flat
 * layout. Returns the first builder error if there was one. */
dt_status dt_model_build(dt_model *m);

/* Activation recompute: DT_RECOMPUTE_BLOCKS marks every block but the last
 * (its output feeds the loss head, which keeps it anyway: a replay would only
 * hold it twice). Mark single blocks with blocks[i].recompute. */
typedef enum dt_recompute { DT_RECOMPUTE_NONE = 0, DT_RECOMPUTE_BLOCKS = 1 } dt_recompute;
void dt_model_set_recompute(dt_model *m, dt_recompute r);
int dt_recompute_parse(const char *s, dt_recompute *out);   /* "none" | "blocks"; 0 ok */
/* Mixed precision: every block but the last (as for recompute: the loss
 * head keeps its output anyway) keeps the activations its backward reads in
 * `d` (DT_BF16 / DT_F16; DT_F32: as computed), through dt_graph_pack16 --
 * about half the activation memory. A block marked for recompute keeps only
 * its input instead. Set single blocks with blocks[i].saved_dtype. */
void dt_model_set_saved_dtype(dt_model *m, dt_dtype d);

/* Modules with the usual layers (torch.nn defaults for initialisation):
 * linear: weight [out, in] and bias [out], uniform(+-1/sqrt(in)).
 * layernorm: weight [n] = 1, bias [n] = 0. */
dt_module *dt_nn_add_linear(dt_model *m, const char *name, int64_t in, int64_t out);
dt_module *dt_nn_add_layernorm(dt_model *m, const char *name, int64_t n);
/* Run them: enter the module, op, leave. x [.., in] -> [.., out]. */
dt_tensor *dt_nn_linear(dt_graph *g, dt_module *mod, dt_tensor *x);
dt_tensor *dt_nn_layernorm(dt_graph *g, dt_module *mod, dt_tensor *x);
/* Tensor-parallel linear layers (Megatron's), registered for rank `rank` of
 * `parts` with the same names and initial values as dt_nn_add_linear's
 * slices (parts <= 1: dt_nn_add_linear):
 *   _col: weight [out/T, in], bias [out/T]: this rank's output columns;
 *         y = tp_copy(x) W^T + b: [.., in] -> [.., out/T]
 *   _row: weight [out, in/T], bias [out] whole: this rank's input rows;
 *         y = tp_reduce(x W^T) + b: [.., in/T] -> [.., out], the same on every rank
 * Run them with the model's group, m->tp (the tp strategy sets it; a whole
 * module ignores it). A column-parallel layer followed by a row-parallel one
 * is GPT-2's MLP split (src/nn/gpt2.c); outside them every rank must compute
 * the same bits, so replicated parameters need no reduction over the group.
 * Train under dtrain's tp strategy (parallel.h dt_tp_strategy) with
 * dt_train_opts.build_model building the rank's part: see
 * tests/mpi/test_tp_user_model.c. */
dt_module *dt_nn_add_linear_col(dt_model *m, const char *name, int64_t in, int64_t out, int parts, int rank);
dt_module *dt_nn_add_linear_row(dt_model *m, const char *name, int64_t in, int64_t out, int parts, int rank);
dt_tensor *dt_nn_linear_col(dt_graph *g, dt_module *mod, dt_tensor *x, const dt_tp_comm *c);
dt_tensor *dt_nn_linear_row(dt_graph *g, dt_module *mod, dt_tensor *x, const dt_tp_comm *c);

/* ---- 4. Built-in models ----
 * Built with sections 2-3 from a configuration the CLI fills; each is one
 * file (src/nn/mlp.c, cnn.c, gpt2.c) holding its entry of the model registry
 * (below):
 *   MLP:   input "image" (flattened), one block per linear layer (ReLU between).
 *   CNN:   input "image" [1, H, W] (default 28x28, at least 4x4); blocks conv1+bn1,
 *          conv2+bn2, fc1, fc2.
 * The trainer sizes the MLP's input and the CNN's H, W from the data's images
 * (dt_model_cfg_fit, called by dt_trainer_create), so either takes any image
 * size it can.
 *   GPT-2: input "ids" [T]; blocks: embeddings (wte + wpe), one per
 *          transformer layer, ln_f + the lm-head tied to wte. */
typedef enum dt_model_kind { DT_MODEL_MLP = 0, DT_MODEL_CNN = 1, DT_MODEL_GPT2 = 2,
                              DT_MODEL_CUSTOM = 3 /* built by dt_model_new */ } dt_model_kind;

#define DT_MLP_MAX_LAYERS 16
#define DT_CNN_MIN_SIDE 4        /* two 2x2 max-pools leave at least 1x1 */
#define DT_CNN_MAX_SIDE 65535
typedef struct dt_model_cfg {
    dt_model_kind kind;
    /* MLP: in -> hidden[0] -> ... -> out, ReLU between */
    int mlp_in, mlp_out, mlp_n_hidden, mlp_hidden[DT_MLP_MAX_LAYERS];
    /* CNN (Fashion-MNIST): conv(1->c1,5x5,pad 2)+BN+ReLU+pool2, conv(c1->c2)+BN+ReLU+pool2,
     * fc(c2*(H/4)*(W/4) -> fc) + ReLU, fc(->10); images [1, cnn_h, cnn_w], each side >= 4 */
    int cnn_c1, cnn_c2, cnn_fc, cnn_classes, cnn_h, cnn_w;
    /* GPT-2 */
    int n_layer, n_embd, n_head, vocab, max_t;
    float dropout;           /* residual / attention-output dropout (0 = off) */
    /* Tensor parallelism (GPT-2 only): build this rank's part (tp_rank of
     * tp_size) of the model; 0 or 1: whole. Not a setting (checkpoints hold
     * the whole model): the strategy sets it (dt_strategy.prepare_model). */
    int tp_size, tp_rank;
    /* Sequence parallelism (with tp_size > 1; set by the strategy too):
     * between the split layers this rank holds positions [tp_rank S,
     * tp_rank S + S) of each sample, S = T / tp_size (blocks declare them
     * DT_DIM_SEQ_PART). */
    int tp_seq;
} dt_model_cfg;

/* Defaults: MLP 784-[256,256]-10; CNN 28x28 c1=32 c2=64 fc=128 classes 10;
 * GPT-2 tiny L=4 C=128 H=4 V=256 maxT=128. Every built-in's fields are set
 * (to its defaults), so changing kind afterwards still gives a valid
 * configuration. */
dt_model_cfg dt_model_cfg_default(dt_model_kind kind);
dt_status dt_model_cfg_validate(const dt_model_cfg *c);

/* A built-in's name ("mlp" | "cnn" | "gpt2" | a registered one): 0 and *out,
 * or -1. dt_model_kind_name: "custom" for a kind no entry has. */
int dt_model_kind_parse(const char *s, dt_model_kind *out);
const char *dt_model_kind_name(dt_model_kind k);

/* What defines a model's architecture, as checkpoints record it. A built-in's
 * configuration fields as text ("arch.layers" = "3"), each named by its
 * setting (the key: what messages name, "saved with arch.layers 3"); a
 * user-built model has none. */
typedef struct dt_arch_field { const char *key; char value[192]; } dt_arch_field;
#define DT_ARCH_FIELDS_MAX 8
int dt_model_arch_fields(const dt_model_cfg *c, dt_arch_field *out);   /* returns the count */
/* Every setting of c's built-in, recorded in checkpoints or not (unrecorded), as text:
 * what the ranks of a run must agree on. Returns the count. */
int dt_model_settings(const dt_model_cfg *c, dt_arch_field *out);

/* Sizes the configuration from the data's samples (the built-in's fit: the
 * MLP's input width, the CNN's H x W), then validates it: DT_EINVAL with why
 * the model cannot take them. */
dt_status dt_model_cfg_fit(dt_model_cfg *c, const dt_sample_shape *s);
/* A built-in's size without building it (the trainer's memory check, before
 * anything is allocated): its parameter elements, and the bytes one sample's
 * training forward keeps for backward (seq tokens for a sequence model;
 * recompute: every block but the last keeps only its input; saved_bytes 2:
 * activations kept in 16 bits, dt_model_set_saved_dtype, else 4) -- a rough
 * floor. 0 for a kind without a formula (a registered model). */
size_t dt_model_cfg_num_params(const dt_model_cfg *c);
double dt_model_cfg_act_bytes(const dt_model_cfg *c, int64_t seq, int recompute, int saved_bytes);
/* A sequence model's longest sequence (GPT-2: max_t) and, in *key
 * (optional), the setting that sets it ("arch.max_t"); 0 for a model of
 * fixed-size samples. */
int dt_model_cfg_max_seq(const dt_model_cfg *c, const char **key);

/* ---- 4b. The model registry ----
 * Every built-in is one dt_model_builtin entry; nothing outside the
 * registry (src/nn/registry.c) asks which model it holds: creation,
 * validation, checkpoint fields, sizing from the data, FLOPs, the
 * configuration agreement and the CLI's --model names and flags all read the
 * entry. A new built-in is one file plus one line:
 *
 *   // src/nn/bigram.c (new configuration fields go into dt_model_cfg; this
 *   // model reuses GPT-2's vocab and max_t)
 *   static void defaults(dt_model_cfg *c) { c->vocab = 256; c->max_t = 128; }
 *   static dt_status validate(const dt_model_cfg *c) {
 *       if (c->vocab <= 0) return DT_ERR(DT_EINVAL, "bigram: vocab %d must be positive", c->vocab);
 *       return DT_OK;
 *   }
 *   static dt_status build(dt_model *m) { ... sections 2-3 from m->cfg, then dt_model_set_loss }
 *   static const dt_model_setting settings[] = {
 *       {.key = "arch.vocab", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, vocab),
 *        .meta = "V", .help = "vocabulary (default 256)"},
 *       {.key = "arch.max_t", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, max_t),
 *        .meta = "T", .help = "context length (default 128)"},
 *   };
 *   const dt_model_builtin dt_builtin_bigram = {
 *       .name = "bigram", .data = "text", .max_seq = "arch.max_t",
 *       .defaults = defaults, .validate = validate, .build = build,
 *       .settings = settings, .n_settings = 2,
 *   };
 *
 *   // src/nn/registry.c: its name in the list
 *   #define BUILTINS(X) X(mlp) X(cnn) X(gpt2) X(bigram)
 *
 * `dtrain train --model bigram --vocab 512` then works: the CLI makes a flag
 * of every setting with a meta, spelled from its name (arch.max_t: --max-t;
 * a setting two models share, as arch.vocab here, is one flag and must set
 * the same field), checkpoints record "arch.vocab" and refuse a resume with
 * another value naming arch.vocab (the CLI writes --vocab), the ranks agree
 * on every setting, train.seq is checked against arch.max_t. The library
 * names a setting by its key only; flags are the CLI's. The first three keep their
 * kinds (DT_MODEL_MLP..GPT2); later entries get kinds 4, 5, ... by position
 * (3 is DT_MODEL_CUSTOM): find them by name. A program may also add an entry
 * at start-up with dt_model_register: tests/unit/test_nn_registry.c holds
 * this model in full, registers it and trains it. */
typedef enum dt_setting_type {
    DT_SETTING_INT,          /* one int: "%d" */
    DT_SETTING_FLOAT,        /* one float: "%.9g" */
    DT_SETTING_INTS          /* consecutive ints: "32,64" (or `none` for no values) */
} dt_setting_type;
#define DT_SETTING_INTS_MAX 16
#define DT_SETTING_NAME_MAX 31   /* the <name> of "arch.<name>" */

/* One configuration field of a built-in. Its text (dt_model_settings) is
 * what checkpoints record under key and what the ranks compare; the key
 * names it in messages ("checkpoint X was saved with arch.layers 3"). */
typedef struct dt_model_setting {
    const char *key;         /* its name and checkpoint metadata key: "arch.<name>", <name> of a-z, 0-9, _ */
    dt_setting_type type;
    size_t at;               /* offsetof(dt_model_cfg, field); INTS: the first int, the others follow it
                                (an array, or adjacent fields: static_assert it) */
    size_t count_at;         /* INTS: offsetof the int holding how many (0: always n_max) */
    int n_min, n_max;        /* INTS: how many values, 0 <= n_min <= n_max <= DT_SETTING_INTS_MAX */
    const char *none;        /* INTS: the text of no values ("none") */
    const char *meta, *help; /* settable by a user (the CLI's flag): "L", "GPT-2 layers (default 4)";
                                meta NULL: set by the library (sized from the data), help (optional)
                                says what it is ("MLP input size") */
    int unrecorded;          /* 1: not in checkpoints (dt_model_arch_fields); the ranks still agree on it */
} dt_model_setting;

typedef struct dt_model_builtin {
    const char *name;        /* --model name and checkpoint identity ("gpt2"), 1..31 characters */
    const char *data;        /* the dataset it trains on when none is named ("fashion-mnist", "text") */
    const char *max_seq;     /* sequence models: the key of the INT setting bounding train.seq
                                ("arch.max_t"); NULL: samples of a fixed size */
    void (*defaults)(dt_model_cfg *c);              /* sets its fields, nothing else */
    dt_status (*validate)(const dt_model_cfg *c);   /* DT_EINVAL naming the model and the field */
    /* Registers into an empty model (dt_model_new(name), m->cfg set) with
     * sections 2-3, ending with the loss head; dt_model_build follows. */
    dt_status (*build)(dt_model *m);
    /* Optional: size c from the data's samples (dt_model_cfg_fit; leave it
     * alone when they do not fit: validation then says so). */
    void (*fit)(dt_model_cfg *c, const dt_sample_shape *s);
    /* Optional: training FLOPs per target (dt_model_flops_per_item); NULL:
     * 6 per parameter. */
    double (*flops)(const dt_model *m, int64_t T);
    const dt_model_setting *settings;
    int n_settings;          /* at most DT_ARCH_FIELDS_MAX */
} dt_model_builtin;

/* Entries in registry order (the built-ins, then registered ones): entry i
 * and its kind (optional out), NULL past the end. */
int dt_model_builtin_count(void);
const dt_model_builtin *dt_model_builtin_at(int i, dt_model_kind *kind);
/* The entry of a kind; NULL for DT_MODEL_CUSTOM and unknown kinds. */
const dt_model_builtin *dt_model_builtin_of(dt_model_kind kind);
/* By name: DT_OK and *kind (optional), or DT_EINVAL "unknown model 'x'
 * (mlp, cnn, gpt2)". */
dt_status dt_model_builtin_find(const char *name, dt_model_kind *kind);
/* "mlp, cnn, gpt2" (sep ", ") into buf; returns buf. */
const char *dt_model_builtin_names(char *buf, size_t n, const char *sep);
/* DT_OK if the entry is complete and consistent (names, hooks, settings
 * inside dt_model_cfg, a setting another entry shares has the same field, its
 * defaults validate), else DT_EINVAL naming the entry and what is wrong. */
dt_status dt_model_builtin_check(const dt_model_builtin *b);
/* Adds an entry (checked; its name must be new; it must outlive its use) and
 * gives its kind. At start-up, before other threads use the registry. */
dt_status dt_model_register(const dt_model_builtin *b, dt_model_kind *kind);
/* Sets an INTS setting to v[0..n): DT_EINVAL "arch.channels needs 2 values
 * (C1,C2)" when n is out of its range. */
dt_status dt_model_setting_set_ints(const dt_model_setting *s, dt_model_cfg *c, const int *v, int n);
/* Sets s in c from its text as dt_model_settings writes it and checkpoints
 * record it ("3", "0.1", "32,64", or the setting's `none`): DT_EINVAL naming
 * the key and the text when it is not one. */
dt_status dt_model_setting_parse(const dt_model_setting *s, dt_model_cfg *c, const char *text);

/* ---- 5. The model ----
 * Built models are used through these functions; the struct is open for
 * strategies (parallel/) that lay out, shard and hook parameters. */
struct dt_model {
    char name[32];                   /* checkpoint identity: "mlp", "cnn", "gpt2", a user's */
    dt_param **params; int n_params;
    dt_named_buffer **buffers; int n_buffers;
    dt_module **modules; int n_modules;
    dt_input_spec inputs[DT_MAX_INPUTS]; int n_inputs;
    dt_block *blocks; int n_blocks;
    dt_loss_kind loss; int64_t classes;
    int loss_parts;                  /* DT_LOSS_VOCAB_PARALLEL: the logits' parts (dt_model_set_loss_split) */
    dt_flat param_flat, grad_flat;   /* every param's value / grad is a view into these */
    size_t *offsets;                 /* offsets[i]: element offset of params[i] in param_flat */
    size_t *grad_offsets;            /* grad_offsets[i]: params[i]'s gradient in grad_flat; SIZE_MAX: it
                                        has none (frozen when the gradients were laid out). grad_flat
                                        is param_flat's layout minus frozen parameters' elements
                                        (see dt_model_grad_offset); NULL without a grad_flat */
    size_t n_elems;                  /* sum of param numel (no padding) */
    dt_rng init_rng;                 /* initialisers, in registration order */
    uint64_t dropout_seed;           /* dt_model_new's seed: the trainer's row keys use it (checkpointed) */
    dt_bn_sync bn_sync;              /* SyncBatchNorm reducer; fn NULL = local stats */
    const dt_tp_comm *tp;            /* tensor-parallel group of a model built with cfg.tp_size > 1
                                        (set by the strategy before the first forward) */
    dt_status build_err;             /* first failed add_*; reported by dt_model_build */
    int built;
    /* Optional: replaces blocks + loss head in dt_model_forward (tests,
     * models that are not a list of blocks). */
    dt_tensor *(*forward)(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits);
    /* Optional: the built-ins' configuration and private state. */
    dt_model_cfg cfg;
    /* Set by dt_model_build, kept when a pipeline stage drops parameters:
     * CRC-32 of every parameter's and buffer's "name[whole shape];" in registration
     * order, and their number (checkpoints compare them: same names, shapes). */
    uint32_t arch_crc; int arch_n;
    void (*destroy)(dt_model *m);
    void *impl;
    char build_msg[512];             /* build_err's message (later errors overwrite the thread's) */
};

/* A built-in model from its configuration, built by its registry entry
 * (section 4b; seeded: same seed -> same weights). */
dt_status dt_model_create(const dt_model_cfg *cfg, uint64_t seed, dt_model **out);
void dt_model_free(dt_model *m);
/* Whole forward: every block, then the loss head. Returns the scalar mean
 * loss; *logits (optional) gets [B*T, classes]. */
dt_tensor *dt_model_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits);
/* Blocks [first, last) on x (NULL when blocks[first] reads the batch); returns
 * the activation blocks[last-1] made, [B, out dims]. */
dt_tensor *dt_model_run_blocks(dt_model *m, dt_graph *g, const dt_batch *b, int first, int last, dt_tensor *x);
/* The loss head on the last block's output. */
dt_tensor *dt_model_loss(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor *x, dt_tensor **logits);
/* The metric of the loss head: rows of logits (what dt_model_forward gave)
 * whose argmax is labels[row] (dt_count_correct; split logits:
 * dt_count_correct_vocab_parallel, collective over m->tp). -1 + error. */
int64_t dt_model_count_correct(const dt_model *m, const dt_tensor *logits, const int32_t *labels);
/* Shape of the activation block i takes (in = 1) or returns for batch b:
 * [B, dims...] with DT_DIM_SEQ resolved; returns ndim (0: reads the batch). */
int dt_model_block_shape(const dt_model *m, int i, int in, const dt_batch *b, int64_t *shape);
/* DT_OK if the model takes samples of shape s, else DT_EINVAL with what it
 * expects ("model cnn takes 'image' float [1, 28, 28]"). */
dt_status dt_model_check_sample(const dt_model *m, const dt_sample_shape *s);
size_t dt_model_num_params(const dt_model *m);
/* The whole model's parameter elements when this one holds split parts
 * (tensor parallelism: each split parameter counted at its full shape);
 * dt_model_num_params otherwise. */
size_t dt_model_num_params_whole(const dt_model *m);
/* Elements of the trainable (requires_grad) parameters: what has gradients
 * and optimizer state. */
size_t dt_model_num_trainable(const dt_model *m);
/* requires_grad = 0 for every parameter whose name matches the glob pattern
 * (fnmatch, no flags: '*' also crosses dots). Returns how many matched.
 * Call it before a strategy wraps the model, then dt_model_refresh_grads to
 * release the frozen parameters' gradient memory (the trainer and the
 * strategies do it when they start). */
int dt_model_freeze(dt_model *m, const char *pattern);
/* Gradients to zero and every parameter's has_grad to 0 (autograd.h). */
void dt_model_zero_grad(dt_model *m);
/* Gradient storage: drop it (every grad NULL, no buffer; ZeRO-2/3 keep
 * gradients per bucket instead), or allocate it back (zeros; no-op if
 * present). Gradients exist for trainable parameters only: grad_flat is laid
 * out like param_flat with the elements of parameters frozen at that time
 * left out, so frozen parameters cost no gradient memory (grad.data NULL). */
void dt_model_drop_grads(dt_model *m);
dt_status dt_model_alloc_grads(dt_model *m);
/* After requires_grad changed (dt_model_freeze, unfreezing): lay the
 * gradients out again for the trainable set of now, keeping present
 * gradients of parameters that stay trainable; newly trainable ones get
 * zeros, newly frozen ones lose theirs. In place in a caller's buffer
 * (dt_model_set_grad_buffer) while it is large enough, else a new private
 * one. No-op when the layout
 * already matches or the model has no gradient buffer. DDP and ZeRO call it
 * in their refresh_trainable; buckets pointing into the old buffer must be
 * rebuilt. */
dt_status dt_model_refresh_grads(dt_model *m);
/* Where flat offset `offset` of param_flat (a trainable parameter's start or
 * a bucket's) lies in grad_flat: offset minus the frozen elements below it. */
size_t dt_model_grad_offset(const dt_model *m, size_t offset);
/* Elements the gradient layout of the current trainable set takes:
 * param_flat.numel minus the frozen parameters' elements. */
size_t dt_model_grad_numel(const dt_model *m);
/* Move the gradients (values kept) into buf, owned by the caller: room for
 * dt_model_grad_numel floats, at the gradient layout above; the caller must
 * move them out again (buf = NULL: back into a private allocation) before
 * freeing buf. DDP uses it for node-shared memory (dist.h section 6). A
 * refresh (dt_model_refresh_grads) that needs more than buf holds moves them
 * into a private allocation. */
dt_status dt_model_set_grad_buffer(dt_model *m, float *buf);
/* Move the parameter values into buf, owned by the caller (param_flat.numel
 * floats at the current layout; filled: buf holds them already, e.g.
 * node-shared memory one rank filled), or back into a private allocation
 * (buf NULL, values copied). The caller moves them out again before freeing
 * buf. ZeRO's node-shared parameters use it (zero.h). */
dt_status dt_model_set_param_buffer(dt_model *m, float *buf, int filled);
dt_param *dt_model_find_param(const dt_model *m, const char *name);
/* A 16-bit working copy of the parameters (mixed precision's param dtype,
 * train.h: param_dtype). The float32 values in param_flat are the masters:
 * the optimizer steps them, checkpoints hold them. For a training step (and
 * an evaluation) enter() points every parameter's value at a float32 buffer
 * holding the masters rounded to dtype (nearest even), so every op -- matrix
 * products, convolutions, the embedding lookup -- computes with the rounded
 * weights, the same values a ZeRO gather of 16-bit shards gives (zero.h:
 * param_dtype): layouts agree bit for bit. Parameters of fewer than two
 * dimensions (biases, LayerNorm's gains and shifts) stay exact: they are no
 * product's input, they are a sliver of the bytes, and gains near 1 would
 * round to steps of 2^-8..2^-7 in bf16, which AdamW's updates of about the
 * learning rate do not reach for many steps (docs/PERFORMANCE.md).
 * leave() points the values back at the masters (before the optimizer
 * step). dtype DT_F32: both do nothing. The buffer is param_flat.numel
 * floats, allocated at the first enter(); fp16 refuses a master beyond 65504
 * (it would compute as inf). */
typedef struct dt_working_copy {
    dt_dtype dtype;      /* DT_F32 (off), DT_BF16 or DT_F16 */
    float *buf;          /* round(param_flat), param_flat's layout */
    size_t n;
    int active;          /* the views point into buf */
} dt_working_copy;
dt_status dt_working_copy_enter(dt_working_copy *w, dt_model *m);
/* 1: p keeps float32 values in a 16-bit working copy (fewer than 2 dimensions) */
int dt_param_copy_exact(const dt_param *p);
/* dst = the working copy of src, both param_flat.numel floats at m's layout:
 * every parameter rounded to `to` (nearest even) but the exact ones, copied
 * (dst == src: rounded in place, the exact ones left). Gaps: rounded zeros. */
void dt_model_round_params(const dt_model *m, float *dst, const float *src, dt_dtype to);
/* Before rounding src (m's layout) to fp16: an element of a rounded
 * parameter that would become inf (|x| >= 65520, beyond fp16's 65504) is an
 * error naming the parameter, the element and its value. */
dt_status dt_model_check_f16_range(const dt_model *m, const float *src);
void dt_working_copy_leave(dt_working_copy *w, dt_model *m);
void dt_working_copy_free(dt_working_copy *w);
/* Re-point values and grads into new flat buffers: values in `total`
 * elements where params[i] starts at offsets[i], gradients at the gradient
 * layout that follows from it (values and grads copied, gaps zero). A model
 * whose parameters have no gradient storage (dt_model_drop_grads) gets no
 * gradient buffer. Values move before gradients, so at most
 * one new buffer exists beside the old ones. */
dt_status dt_model_set_layout(dt_model *m, const size_t *offsets, size_t total);
/* Keep only the parameters with keep[p->index] != 0 (a pipeline stage's):
 * the others are freed and leave params and their modules, the kept ones are
 * renumbered (index = new position) and laid out again (default layout). Blocks that used a dropped parameter must
 * not run any more. */
dt_status dt_model_keep_params(dt_model *m, const unsigned char *keep);
/* Training FLOPs per target (sample or token): the built-in's own count
 * (GPT-2: 6*N + attention; CNN: its convolutions), else 6*N. */
double dt_model_flops_per_item(const dt_model *m, int64_t T);

#endif
