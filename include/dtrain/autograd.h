/* dtrain/autograd.h — define-by-run tape, parameters, modules and hooks.
 *
 * A dt_graph is the context of one forward/backward: every op called with it
 * allocates its output from the graph's arena and (when grad is enabled)
 * appends a node to the tape. dt_graph_backward() walks the tape in reverse.
 *
 *   dt_graph_reset(g);                       // new step: tape cleared, arena rewound
 *   dt_tensor *loss = model->forward(...);   // ops record nodes
 *   dt_graph_backward(g, loss);              // grads accumulate into param->grad
 *
 * Parameters (dt_param) own a name, a value and a grad. Both are views the
 * layout code may re-point into flat buffers (see nn.h dt_model_set_layout).
 * Gradients always *accumulate* (+=); zero them with dt_model_zero_grad().
 *
 * Several tapes may be alive at once (micro-batches, pipeline stages): each
 * graph keeps its own per-parameter use counts, so the graphs only share the
 * parameters' gradient buffers, into which every backward accumulates.
 *
 * Hooks data parallel relies on:
 *  - grad-ready: fires during the backward of a graph marked *final*
 *    (dt_graph_set_final; default 1), once for every parameter used on its
 *    tape, as soon as that graph's pending uses of the parameter reach 0
 *    (all its uses, e.g. a tied embedding used twice, accumulated), in the
 *    order backward produces them. A non-final graph's backward fires no
 *    grad-ready hooks. With several micro-batches mark final the graph whose
 *    backward runs *last* (F1 F2 B1 B2: graph 2; F1 F2 B2 B1: graph 1): the
 *    hook then sees the step's whole gradient. The graph cannot know about
 *    the others — if a final graph's backward runs before another graph's,
 *    its hooks fire anyway and see the gradient without the later
 *    contributions. Parameters not used on the final tape get no call; query
 *    dt_graph_param_uses() after backward. A parameter whose weight gradient
 *    is deferred (dt_graph_defer_weights) fires in dt_graph_backward_weights.
 *  - module pre/post forward, pre/post backward (ZeRO-3 gathers,
 *    recompute). Pre-backward fires when backward reaches the last node the
 *    module recorded; post-backward after its first node has been processed.
 *    A checkpoint's replay (dt_graph_checkpoint) fires pre/post *recompute*
 *    instead of pre/post forward for the modules it re-runs, during backward;
 *    their pre/post backward follow as usual.
 */
#ifndef DTRAIN_AUTOGRAD_H
#define DTRAIN_AUTOGRAD_H

#include "dtrain/tensor.h"

typedef struct dt_graph dt_graph;
typedef struct dt_node dt_node;
typedef struct dt_module dt_module;
typedef struct dt_param dt_param;

/* ---- parameters ---- */
typedef dt_status (*dt_grad_ready_fn)(dt_param *p, void *user);

/* A parameter's own optimizer settings (its parameter group: optim.h,
 * dt_optim_apply_groups). NaN = not set: the optimizer's setting applies.
 * weight_decay, when set, applies whatever the parameter's shape. */
typedef struct dt_param_hparams { float lr_scale, weight_decay, beta1, beta2; } dt_param_hparams;

/* Tensor parallelism: a parameter that is one rank's part of a larger one
 * (nn.h dt_model_add_param_split). parts <= 1: whole (replicated on every
 * rank of its group). Else the full tensor's dimension `dim` is laid out as
 * [groups x parts x n] and this rank holds part `index` of every group, its
 * own dimension `dim` being [groups x n]: GPT-2's c_attn weight [C, 3C] at
 * T ranks is dim 1 = [3 (q, k, v) x T x C/T]. pad (groups 1 only): the
 * whole dimension is padded with `pad` zero slots at its end to a multiple of
 * parts (GPT-2's wte [V, C] split by rows when T does not divide V); the
 * padding is this layout's alone: whole shapes, checkpoints and the
 * architecture fingerprint leave it out. */
typedef struct dt_param_split { int dim, groups, parts, index, pad; } dt_param_split;

struct dt_param {
    char name[128];          /* "h.0.attn.c_attn.weight" */
    dt_param_split split;    /* zero: whole */
    dt_tensor value;         /* F32; value.param == this */
    dt_tensor grad;          /* F32, same shape; accumulates */
    int index;               /* registration order in its model */
    int weight_decay;        /* 1: decoupled weight decay applies (matrices) */
    dt_param_hparams hp;     /* group settings; all NaN after dt_param_init */
    int requires_grad;       /* 0: frozen; no grad, no hook */
    /* (uses on a tape are the graph's: dt_graph_param_uses) */
    /* 1: some tape recorded a use of this parameter (with requires_grad)
     * since the last dt_model_zero_grad, so backward gives it a gradient:
     * PyTorch's `p.grad is not None`. Set by recording, never cleared by a
     * graph (it spans micro-steps); cleared with the gradients. Optimizers
     * skip a parameter without (optim.h: dt_optim_segment.active), and DDP /
     * ZeRO with find_unused_params replace it by "on any rank". */
    int has_grad;
    dt_grad_ready_fn on_grad_ready;
    void *on_grad_ready_user;
    /* Lazily materialised gradient (ZeRO-2/3): when grad.data is NULL the
     * first backward write calls this to point grad.data at zeroed storage
     * (user = on_grad_ready_user). NULL hook + NULL data = error. */
    dt_status (*on_grad_alloc)(dt_param *p, void *user);
};

/* Allocate owned value+grad storage (zeroed). */
dt_status dt_param_init(dt_param *p, const char *name, int ndim, const int64_t *shape);
void dt_param_free(dt_param *p);

/* ---- modules ---- */
typedef enum dt_module_hook_kind {
    DT_HOOK_PRE_FORWARD = 0,
    DT_HOOK_POST_FORWARD,
    DT_HOOK_PRE_BACKWARD,
    DT_HOOK_POST_BACKWARD,
    DT_HOOK_PRE_RECOMPUTE,   /* a checkpoint replays the module's forward during backward */
    DT_HOOK_POST_RECOMPUTE,
    DT_HOOK_KINDS
} dt_module_hook_kind;

typedef dt_status (*dt_module_hook_fn)(dt_module *m, dt_module_hook_kind kind, void *user);

struct dt_module {
    char name[96];           /* "h.3.attn" */
    dt_param **params;       /* parameters owned directly by this module */
    int n_params;
    dt_module_hook_fn hook;  /* one hook function receives every kind; NULL = none */
    void *hook_user;
    int index;               /* registration order in its model */
};

/* Brackets a module's forward: fires PRE/POST_FORWARD (PRE/POST_RECOMPUTE in
 * a checkpoint's replay) and records markers so backward fires
 * PRE/POST_BACKWARD (in a checkpoint's first pass they are only listed: its
 * replay records them, or, no gradient reaching it, backward fires them from
 * the list). Returns the hook's status (DT_ENOMEM if the marker could not be
 * recorded). */
dt_status dt_module_enter(dt_graph *g, dt_module *m);
dt_status dt_module_leave(dt_graph *g, dt_module *m);

/* ---- the graph ---- */
dt_graph *dt_graph_create(void);
/* Never touches the parameters it recorded: may run before or after they are freed. */
void dt_graph_free(dt_graph *g);
/* Drop the tape and its parameter use counts, rewind the arena (memory is
 * kept for the next step), drop pending deferred weight-gradient work (see
 * dt_graph_defer_weights). Touches nothing outside the graph. */
void dt_graph_reset(dt_graph *g);
/* no-grad / eval: ops compute but record nothing. Returns previous value. */
int dt_graph_set_grad_enabled(dt_graph *g, int enabled);
int dt_graph_grad_enabled(const dt_graph *g);
/* Training flag read by dropout / batchnorm. */
void dt_graph_set_training(dt_graph *g, int training);
int dt_graph_training(const dt_graph *g);
/* 1 while a checkpoint's replay re-runs its function during backward
 * (dt_graph_checkpoint), else 0 (also in its first pass). An op with effects
 * outside the tape (batchnorm's running statistics) checks it to apply them
 * once per forward, as without recompute. */
int dt_graph_recomputing(const dt_graph *g);
/* Whether this graph's backward completes the step's gradients, i.e. fires
 * grad-ready hooks (see the top of this file). Default 1; kept across resets.
 * DDP / ZeRO set it in before_forward (final = the synchronising micro-step). */
void dt_graph_set_final(dt_graph *g, int final);
int dt_graph_final(const dt_graph *g);
/* Uses of p recorded on g's current tape (0 = not used in this forward, or
 * frozen: parameters with requires_grad = 0 are not counted). */
int dt_graph_param_uses(const dt_graph *g, const dt_param *p);
/* Called after each recorded forward op and between backward nodes (about
 * every op); DDP/ZeRO use it to poll MPI progress while forward and backward
 * compute. NULL to disable. */
typedef void (*dt_graph_tick_fn)(void *user);
void dt_graph_set_tick(dt_graph *g, dt_graph_tick_fn fn, void *user);

/* Backward from any tensor `out` of this tape, given its upstream gradient
 * (out->numel floats: copied into out's gradient, or added if out already has
 * one). Nodes recorded after out that it does not depend on contribute
 * nothing but still release their parameter uses. Once per tape: a second
 * call is DT_ESTATE, as is an out that does not require grad or a forward
 * that ran out of memory; NULL out / upstream is DT_EINVAL. */
dt_status dt_graph_backward_from(dt_graph *g, dt_tensor *out, const float *upstream);
/* Backward from a scalar: dloss = 1 (times grad_scale in _scaled). */
dt_status dt_graph_backward(dt_graph *g, dt_tensor *loss);
dt_status dt_graph_backward_scaled(dt_graph *g, dt_tensor *loss, float grad_scale);
/* A leaf tensor viewing the caller's data[numel] (not copied, never written;
 * must stay valid until backward), e.g. a pipeline stage's received
 * activation. With requires_grad its gradient is accumulated on backward and
 * read with dt_graph_grad. */
dt_tensor *dt_graph_input(dt_graph *g, int ndim, const int64_t *shape, const float *data, int requires_grad);
/* After backward: t's gradient (t->numel floats in the graph's arena, valid
 * until reset; zeros if no gradient reached t). NULL + error if t does not
 * require grad or is a parameter's value (its gradient is p->grad). */
const float *dt_graph_grad(dt_graph *g, dt_tensor *t);
/* Activation memory: high-water mark of the main arena plus that of the
 * recompute scratch arena (an upper bound of their joint peak), over every
 * step since creation. Compare recompute on / off with it. */
size_t dt_graph_arena_bytes(const dt_graph *g);

/* ---- activation recompute (torch.utils.checkpoint) ----
 * dt_graph_checkpoint runs fn(g, x, ctx) keeping only x (may be NULL: fn reads
 * its inputs from ctx), ctx and the rng state; on backward it re-runs fn into
 * a sub-tape and back-propagates through it. ctx, and any tensor fn reads
 * through it, must stay valid until backward. Returns fn's output (a fresh
 * tensor in g's arena); every other tensor fn creates is gone when the
 * checkpoint returns (do not keep them through ctx).
 *
 * Memory: the first pass allocates in a scratch arena and records no node
 * (fn's intermediate activations are not kept); only the copied output and
 * one checkpoint node stay on the tape. Parameter uses are counted as usual,
 * so grad-ready fires once, after all uses (a weight used inside and outside
 * a checkpoint fires after both), in the order a plain backward would.
 * rng (may be NULL) is a generator fn draws from (dtrain's dropout draws
 * from none: it is keyed by position, ops.h; a user's own random op): the replay
 * starts from the state the first pass started from, and the state after
 * the replay is restored, so masks match and the stream is undisturbed.
 * fn must run the same ops both times (else backward fails naming the
 * difference); an op with effects outside the tape repeats them on replay
 * unless it checks dt_graph_recomputing(). A checkpoint whose output gets no
 * gradient is not replayed: its parameter uses are released at once and its
 * modules' PRE/POST_BACKWARD hooks fire, as for a plain run's unreached
 * modules (PRE/POST_RECOMPUTE do not: nothing is recomputed).
 * Errors: NULL g / fn (DT_EINVAL), a checkpoint inside fn (DT_ESTATE: nested
 * checkpoints are not supported), fn failing (NULL, fn's message; on replay
 * backward fails with it). With grad disabled, fn simply runs. */
typedef dt_tensor *(*dt_checkpoint_fn)(dt_graph *g, dt_tensor *x, void *ctx);
dt_tensor *dt_graph_checkpoint(dt_graph *g, dt_checkpoint_fn fn, dt_tensor *x, void *ctx, dt_rng *rng);

/* ---- activations kept in 16 bits (mixed precision) ----
 * dt_graph_pack16 runs fn(g, x, ctx) and records its ops as usual, then keeps
 * what backward needs in half the memory: every float32 tensor an op of fn
 * outputs is stored as `dtype` (DT_BF16 or DT_F16, rounded to nearest even)
 * until backward, which widens them back and back-propagates through fn's
 * own nodes. Returns fn's output (an exact float32 copy in g's arena; every
 * other tensor fn creates is gone when the call returns, as with
 * dt_graph_checkpoint); a fn that records no op and returns a tensor that
 * requires grad from outside the region (x, a parameter's value) gets that
 * tensor itself back, so its gradient flows as without pack16. The ops' own
 * saved state (statistics, masks, parameters, fn's output) stays exact unless an op declared it roundable
 * (dt_graph_saved_may_round): only an op's backward reading another op's
 * output, or such a buffer, sees 16-bit values. PyTorch's autocast saves bf16 activations
 * the same way; fp16 turns values beyond +-65504 into inf, so the step's
 * gradients are not finite (train with loss scaling, which skips such a step;
 * a model whose activations exceed fp16's range every step needs bf16). Module hooks fire as without it. Same value of fn's output
 * and of the loss; gradients differ from float32 by the rounding.
 * Under a split backward (dt_graph_defer_weights) nothing inside the region
 * is deferred: its weight gradients are computed in B, as in a checkpoint's
 * replay. DT_F32 or grad disabled: fn simply runs. Errors: NULL g / fn, another
 * dtype (DT_EINVAL), called inside a checkpoint or another pack16 (DT_ESTATE). */
dt_tensor *dt_graph_pack16(dt_graph *g, dt_checkpoint_fn fn, dt_tensor *x, void *ctx, dt_dtype dtype);
/* For ops: `data[n]`, a float32 buffer the op saved for its backward, may be
 * read back rounded to 16 bits (a softmax's probabilities, say, which
 * autocast keeps in bf16): inside dt_graph_pack16 it is packed like an
 * output. Anywhere else, nothing happens. */
void dt_graph_saved_may_round(dt_graph *g, float *data, int64_t n);
/* For ops: `data[n]` (typically the op's input, another op's output) is read
 * by the op's backward where 16-bit rounding would hurt -- LayerNorm's and
 * BatchNorm's input against their exact mean and rstd: when a row's (a
 * channel's) mean dwarfs its spread, x's rounding error is of the order of
 * x - mean. Inside dt_graph_pack16 it is
 * kept exact (autocast keeps the residual stream, LayerNorm's input, in fp32
 * too). Anywhere else, nothing happens. */
void dt_graph_saved_keep_exact(dt_graph *g, const float *data, int64_t n);

/* ---- split backward: input gradients now, weight gradients later ----
 * Zero-bubble pipeline schedules (ZB-H1) and tied weights on several pipeline
 * stages need a graph's backward in two passes: B computes the activation
 * (input) gradients, W later the parameter (weight) gradients.
 *
 *   dt_graph_defer_weights(g, defer_all, NULL);  // once; kept across resets
 *   dt_graph_backward_from(g, out, dy);          // B: dt_graph_grad(g, in) is ready
 *   ... send it upstream, run other micro-batches' B ...
 *   dt_graph_backward_weights(g);                // W: the deferred gradients
 *
 * B: a node with an input that is the value of a parameter p with
 * p->requires_grad and pred(p, user) = 1 runs its backward with p's gradient
 * hidden (dt_grad_of returns NULL for it, so the op skips dW / db) and is
 * queued. Its uses of such parameters stay pending (their grad-ready does not
 * fire yet); its uses of other parameters are released as usual.
 * W: the queued nodes run again in queue order (the order B reached them)
 * with every gradient hidden but the deferred parameters' (dt_grad_of returns
 * NULL, without allocating, for any other tensor; dt_grad_alias and
 * dt_grad_in_place return 0); after each node its deferred uses are released
 * (grad-ready fires here, on a final graph, in that order), then the tick
 * runs. Module markers fire no hooks in W.
 *
 * The point: each parameter's gradient accumulates in the order of a plain
 * backward. When the W passes of several graphs (micro-batches sharing the
 * parameters) run in the order of their B passes — B0 B1 B2 W0 W1 W2,
 * B0 W0 B1 B2 W1 W2, ... — the gradients are bitwise those of plain
 * backward of g0, g1, g2 in turn, provided each parameter's contributions are
 * all deferred or all not (pred looks at the parameter only, so just the
 * checkpoint rule below can split them).
 *
 * Rules:
 *  - Nothing inside a checkpoint's replay (dt_graph_checkpoint) is deferred:
 *    those nodes compute their weight gradients in B, since their saved
 *    tensors die when the replay ends. A deferred parameter used both inside
 *    and outside a checkpoint therefore gets its contributions in B and W:
 *    the sum is right but its order (and bits) differ from plain backward.
 *  - W reads what B read: the tape's activations and gradients (kept until
 *    reset) and caller memory an op reads in backward (dt_graph_input data,
 *    embedding ids, cross-entropy targets) must stay valid until W.
 *  - dt_graph_reset drops pending W work: those gradients are never computed
 *    and their grad-ready hooks never fire.
 *  - In B, dt_grad_in_place declines (returns 0) when x's storage overlaps an
 *    input or the output gradient of a queued node, which W will read.
 *  - Ops: a backward computes each of dx / dw / db only when dt_grad_of gives
 *    it a buffer, and communicates only for its input gradient, which W never
 *    asks for: SyncBatchNorm's exchange thus runs once, in B. An op that
 *    communicated for a weight gradient could not be deferred. Nor may a
 *    weight gradient read the parameter's own value (none of dtrain's ops
 *    does): between B and W its storage may be gone (ZeRO-3 inside a
 *    pipeline stage frees gathered parameters and does not gather for W).
 * pred is read during B only: changing it between B and W changes nothing
 * already queued. */
/* predicate: 1 = this parameter's gradient is deferred to the W pass */
typedef int (*dt_defer_fn)(const dt_param *p, void *user);
/* Defer weight gradients on g: pred NULL = none (the default). Kept across resets. */
void dt_graph_defer_weights(dt_graph *g, dt_defer_fn pred, void *user);
/* After dt_graph_backward(_scaled, _from): run the deferred weight-gradient work.
 * Exactly once per successful backward, also when nothing was deferred (then
 * a no-op returning DT_OK). DT_ESTATE before the graph's backward (since its
 * creation or reset), for a second call, or after a failed backward; NULL g
 * is DT_EINVAL. An op's error stops W (the remaining work is dropped). */
dt_status dt_graph_backward_weights(dt_graph *g);
/* Nodes waiting for the W pass (0 after it, or when nothing was deferred). */
int dt_graph_deferred_nodes(const dt_graph *g);

/* ---- for op implementers ---- */
/* Uninitialised F32 tensor from the arena (64-byte aligned). NULL+msg on OOM.
 * Inside a checkpoint function (first pass or replay) it comes from the
 * recompute scratch and lives until the checkpoint (or replay) ends. */
dt_tensor *dt_graph_tensor(dt_graph *g, int ndim, const int64_t *shape);
dt_tensor *dt_graph_tensor_zeros(dt_graph *g, int ndim, const int64_t *shape);
/* Raw scratch from the arena, lives until dt_graph_reset (inside a
 * checkpoint function: as dt_graph_tensor). */
void *dt_graph_scratch(dt_graph *g, size_t bytes);

typedef void (*dt_backward_fn)(dt_graph *g, dt_node *n);
#define DT_NODE_MAX_INPUTS 6
struct dt_node {
    dt_backward_fn backward;       /* NULL for module markers */
    const char *op;                /* "linear", for traces and errors */
    dt_tensor *out;
    dt_tensor *in[DT_NODE_MAX_INPUTS];
    int n_in;
    void *saved;                   /* op-specific, from the arena */
    float f[4];                    /* op-specific scalars */
    int64_t i[4];
    dt_module *module;             /* markers only */
    int marker;                    /* 0 op, 1 module enter, 2 module leave */
    int param_rec[DT_NODE_MAX_INPUTS];   /* graph's record of in[i]'s parameter; -1: none (set by the graph) */
};
/* Record an op whose output is `out`. Returns NULL when grad is disabled or
 * no input requires grad (then the op need not save anything). Sets
 * out->requires_grad / grad_fn and bumps the graph's parameter use counts.
 * In a checkpoint's first pass it also returns NULL (nothing recorded, uses
 * counted, out->requires_grad set, grad_fn NULL). */
dt_node *dt_graph_record(dt_graph *g, const char *op, dt_backward_fn bw, dt_tensor *out,
                         int n_in, dt_tensor *const *in);
/* Gradient buffer of t for a backward fn to accumulate into (+=).
 * Returns NULL if t does not require grad, or while the split backward hides
 * t's gradient (see dt_graph_defer_weights). Lazily zero-allocated (in a
 * checkpoint replay: in the scratch for the replay's own tensors, in the
 * main arena for tensors from outside it). */
float *dt_grad_of(dt_graph *g, dt_tensor *t);
/* For a view op's backward (y shares x's elements in the same order): when x
 * has no gradient yet, make y's gradient buffer x's and return 1 — no copy,
 * no second buffer. Safe because every consumer of y was recorded after the
 * view, so y's gradient is final and dead once the view's backward runs.
 * Returns 0 (the caller accumulates as usual) when x already has a gradient,
 * is a parameter, or would outlive y's gradient (a recompute scratch). */
int dt_grad_alias(dt_graph *g, dt_tensor *x, dt_tensor *y);
/* For a backward that may overwrite its input x's values with x's gradient
 * (the caller knows nothing reads them later): when x has no gradient yet,
 * x's gradient becomes x's own storage, returns 1; the caller then *writes*
 * (not accumulates) dx. 0: use dt_grad_of and accumulate. */
int dt_grad_in_place(dt_graph *g, dt_tensor *x);

#endif
