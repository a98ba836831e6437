/* A model of your own, trained data-parallel: a residual MLP on Fashion-MNIST.
 *
 *   mpiexec -n 2 ./resmlp                 # DDP over 2 ranks
 *   mpiexec -n 2 ./resmlp --zero 3        # ZeRO-3: parameters sharded too
 *   options: --steps N  --width W  --depth D  --recompute  --data DIR
 *
 * The model: stem (flatten, linear 784 -> W, ReLU), D residual blocks
 * x + fc2(relu(fc1(ln(x)))), head (ln, linear W -> 10). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/dtrain.h"

typedef struct resblock { dt_module *ln, *fc1, *fc2; } resblock;
typedef struct net { int64_t width; int depth; dt_module *stem, *ln_f, *out; resblock res[9]; } net;

/* stem: the batch's "image" [B, 1, 28, 28] -> [B, W] */
static dt_tensor *stem(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)x;
    const dt_tensor *img = dt_batch_input(b, "image", DT_F32, "resmlp");
    if (!img) return NULL;
    dt_tensor *flat = dt_graph_tensor(g, 2, (int64_t[]){b->B, 784});
    if (!flat) return NULL;
    flat->data = img->data;   /* a view: the batch outlives the step */
    dt_tensor *h = dt_nn_linear(g, ((net *)user)->stem, flat);   /* enters module "stem" (ZeRO-3 gathers it) */
    return h ? dt_op_relu(g, h) : NULL;
}

/* residual block: [B, W] -> [B, W] */
static dt_tensor *residual(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)b;
    resblock *r = user;
    dt_tensor *h;
    if (!(h = dt_nn_layernorm(g, r->ln, x)) || !(h = dt_nn_linear(g, r->fc1, h)) || !(h = dt_op_relu(g, h)) ||
        !(h = dt_nn_linear(g, r->fc2, h)))
        return NULL;   /* the failing op set the message */
    return dt_op_add(g, x, h);
}

/* head: [B, W] -> logits [B, 10] */
static dt_tensor *head(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)b;
    net *n = user;
    dt_tensor *h = dt_nn_layernorm(g, n->ln_f, x);
    return h ? dt_nn_linear(g, n->out, h) : NULL;
}

/* The trainer calls this on every rank with the same seed. */
static dt_status build(void *user, uint64_t seed, dt_model **out) {
    net *n = user;
    dt_model *m;
    DT_TRY(dt_model_new("resmlp", seed, &m));
    int64_t W = n->width, classes = 10;
    dt_model_add_input(m, &(dt_input_spec){.name = "image", .dtype = DT_F32, .ndim = 3, .dims = {1, 28, 28}});
    n->stem = dt_nn_add_linear(m, "stem", 784, W);
    dt_model_add_block(m, "stem", stem, n, 0, NULL, 1, &W);
    for (int i = 0; i < n->depth; i++) {
        char name[32];
        snprintf(name, sizeof name, "res.%d.ln", i);   /* parameters res.{i}.ln.weight, ... */
        n->res[i].ln = dt_nn_add_layernorm(m, name, W);
        snprintf(name, sizeof name, "res.%d.fc1", i);
        n->res[i].fc1 = dt_nn_add_linear(m, name, W, W);
        snprintf(name, sizeof name, "res.%d.fc2", i);
        n->res[i].fc2 = dt_nn_add_linear(m, name, W, W);
        snprintf(name, sizeof name, "res.%d", i);
        dt_model_add_block(m, name, residual, &n->res[i], 1, &W, 1, &W);
    }
    n->ln_f = dt_nn_add_layernorm(m, "ln_f", W);
    n->out = dt_nn_add_linear(m, "out", W, classes);
    dt_model_add_block(m, "head", head, n, 1, &W, 1, &classes);
    dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, classes);
    dt_status s = dt_model_build(m);   /* reports the first failed add_* */
    if (s != DT_OK) { dt_model_free(m); return s; }
    *out = m;
    return DT_OK;
}

int main(int argc, char **argv) {
    net n = {.width = 128, .depth = 2};
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.build_model = build;
    o.build_user = &n;
    o.steps = 200;
    int zero = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--recompute")) { o.recompute = DT_RECOMPUTE_BLOCKS; continue; }
        if (!strcmp(a, "--zero")) zero = atoi(v);
        else if (!strcmp(a, "--steps")) o.steps = atoll(v);
        else if (!strcmp(a, "--width")) n.width = atoll(v);
        else if (!strcmp(a, "--depth")) n.depth = atoi(v);
        else if (!strcmp(a, "--data")) o.data_path = v;
        else { fprintf(stderr, "resmlp: unknown option %s (see the comment at the top)\n", a); return 2; }
        i++;
    }
    if (n.depth < 0 || n.depth > 9 || n.width < 1) { fprintf(stderr, "resmlp: --depth 0..9, --width >= 1\n"); return 2; }

    dt_pg *world = NULL;
    dt_strategy strat;
    dt_trainer *t = NULL;
    dt_zero_opts zo;
    dt_ddp_opts ddp;
    dt_zero_opts_default(&zo);
    dt_ddp_opts_default(&ddp);
    zo.stage = zero;
    dt_status s = dt_dist_init(&argc, &argv, NULL);
    if (s == DT_OK) s = dt_pg_world(&world);
    if (s == DT_OK) s = zero ? dt_zero_strategy(world, &zo, DT_ZERO_CKPT_SHARDED, &strat) : dt_ddp_strategy(world, &ddp, &strat);
    if (s == DT_OK) s = dt_trainer_create(&o, &strat, &t);   /* owns strat from here, even on failure */
    double first = 0, loss = 0, acc = 0;
    for (int64_t k = 0; s == DT_OK && k < o.steps; k++) {
        s = dt_trainer_step(t, &loss);
        if (k == 0) first = loss;
    }
    if (s == DT_OK) s = dt_trainer_evaluate(t, NULL, &acc);
    if (s == DT_OK && dt_pg_rank(world) == 0)
        printf("resmlp: %s%s, loss %.4f -> %.4f over %lld steps, test accuracy %.4f\n", zero ? "zero" : "ddp",
               o.recompute == DT_RECOMPUTE_BLOCKS ? " with recompute" : "", first, loss, (long long)o.steps, acc);
    if (s != DT_OK) fprintf(stderr, "resmlp: error: %s\n", dt_error_message());
    dt_trainer_free(t);
    if (world) dt_pg_free(world);
    dt_dist_finalize();
    return s == DT_OK ? 0 : 1;
}
