/* The memory check before allocating (issue 31 item 7): the parameter count
 * a configuration implies equals the built model's for every built-in; the
 * per-rank estimate follows the strategy's shares (ZeRO 1/2/3, pipeline),
 * evaluation and frozen parameters; what may still be allocated is read from
 * a cgroup (v2 memory.max - memory.current over the cgroup and its
 * ancestors, v1 memory.limit_in_bytes - usage) and MemAvailable, the smallest
 * named; and the trainer refuses a run that does not fit before it allocates
 * the model, naming both figures and the option that skips the check. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dtrain/train.h"
#include "tmpdir.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "memcheck");
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

static void put(const char *rel, const char *text) {
    char p[512], dir[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    snprintf(dir, sizeof dir, "%s", p);
    for (char *s = dir + strlen(g_dir) + 1; (s = strchr(s, '/')); s++) {   /* mkdir -p */
        *s = 0;
        mkdir(dir, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void counts_match(dt_model_cfg c) {
    dt_model *m = NULL;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    assert_int_equal(dt_model_cfg_num_params(&c), dt_model_num_params(m));
    dt_model_free(m);
}

static void test_param_counts(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    counts_match(c);
    c.mlp_n_hidden = 3; c.mlp_hidden[2] = 17; c.mlp_in = 33;
    counts_match(c);
    c = dt_model_cfg_default(DT_MODEL_CNN);
    counts_match(c);
    c.cnn_h = 20; c.cnn_w = 12; c.cnn_c1 = 3; c.cnn_fc = 9;
    counts_match(c);
    c = dt_model_cfg_default(DT_MODEL_GPT2);
    counts_match(c);
    c.n_layer = 3; c.n_embd = 48; c.n_head = 3; c.vocab = 300; c.max_t = 24;
    counts_match(c);
    /* tensor parallelism: one rank's part, for every rank (V = 301: rank
     * parts padded at T = 2 and 4) */
    size_t whole = dt_model_cfg_num_params(&c);
    c.n_head = 12; c.vocab = 301;
    for (int T = 2; T <= 4; T += 2)
        for (int r = 0; r < T; r++) {
            c.tp_size = T; c.tp_rank = r;
            counts_match(c);
            assert_true(dt_model_cfg_num_params(&c) < whole / T + whole / 5);   /* mostly split */
        }
    c.tp_size = 0; c.tp_rank = 0;
    c.kind = DT_MODEL_CUSTOM;
    assert_int_equal(dt_model_cfg_num_params(&c), 0);
}

static void test_estimate_shares(void **state) {
    (void)state;
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.model = dt_model_cfg_default(DT_MODEL_GPT2);
    o.seq = 64; o.batch = 4;   /* AdamW: 2 states */
    double n = (double)dt_model_cfg_num_params(&o.model);
    dt_mem_estimate e, z;
    dt_train_memory_estimate(&o, NULL, &e);
    assert_true(e.params == 4 * n && e.grads == 4 * n && e.optim == 8 * n && e.copy == 0);
    assert_true(e.acts > 0 && e.acts == 4 * dt_model_cfg_act_bytes(&o.model, 64, 0, 4));
    assert_true(e.total == e.params + e.grads + e.optim + e.acts);
    dt_strategy zero2 = {.mem_div = {1, 4, 4, 0}};
    dt_train_memory_estimate(&o, &zero2, &z);
    assert_true(z.params == 4 * n && z.grads == n && z.optim == 2 * n && z.acts == e.acts);
    dt_strategy pipe = {.mem_div = {2, 2, 2, 2}};
    dt_train_memory_estimate(&o, &pipe, &z);
    assert_true(z.params == 2 * n && z.acts == e.acts / 2);
    o.recompute = DT_RECOMPUTE_BLOCKS;
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.acts < e.acts);
    o.recompute = DT_RECOMPUTE_NONE;
    /* activations in 16 bits (asked, or --precision fp16's default): the
     * blocks' share halves, the logits and one widened block stay fp32 --
     * never below half; at 12 layers of a byte vocabulary the blocks dominate */
    o.saved_activations = DT_SAVED_BF16;
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.acts < e.acts * 0.9 && z.acts > e.acts * 0.5 && z.params == e.params);
    o.saved_activations = DT_SAVED_FP32;
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.acts == e.acts);
    o.saved_activations = DT_SAVED_AUTO;
    o.precision = DT_PREC_FP16;
    o.model.n_layer = 12;   /* (one block is widened at a time: deep models gain most) */
    dt_mem_estimate e12;
    dt_train_memory_estimate(&o, NULL, &z);
    o.precision = DT_PREC_FP32;
    dt_train_memory_estimate(&o, NULL, &e12);
    assert_true(z.acts < e12.acts * 0.7 && z.acts > e12.acts * 0.5);
    o.model = dt_model_cfg_default(DT_MODEL_GPT2);
    o.model.tp_size = 2;   /* tensor parallelism: the split layers' activations halve, the rest stays */
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.params < e.params * 0.6 && z.acts < e.acts && z.acts > e.acts / 2);
    o.model.tp_size = 0;
    /* a 16-bit working copy of the weights: one process / DDP keep a full
     * fp32-sized copy beside the masters, ZeRO-1/2 (owning the optimizer)
     * a float32 master per owned element, ZeRO-3 nothing more */
    o.param_dtype = DT_PARAMS_BF16;
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.params == 8 * n && z.optim == e.optim && z.total == e.total + 4 * n);
    dt_strategy zero2_owner = {.mem_div = {1, 4, 4, 0}, .owns_optimizer = 1};
    dt_train_memory_estimate(&o, &zero2_owner, &z);
    assert_true(z.params == 5 * n);
    dt_strategy zero3_owner = {.mem_div = {4, 4, 4, 0}, .owns_optimizer = 1};
    dt_train_memory_estimate(&o, &zero3_owner, &z);
    assert_true(z.params == n);
    o.save = "x"; o.save_sync = 0;   /* the copy a background save takes holds the masters only */
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.copy == 12 * n);
    o.save = NULL;
    o.param_dtype = DT_PARAMS_AUTO;
    o.save = "x"; o.save_sync = 0;   /* a background save copies parameters and optimizer state */
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.copy == 12 * n);
    o.save = NULL;
    /* bf16 optimizer state: 2 bytes per state value (AdamW: 2 values, SGD momentum: 1), shares as before */
    o.optim.state_dtype = DT_OPTIM_STATE_BF16;
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.params == 4 * n && z.grads == 4 * n && z.optim == 4 * n);
    dt_train_memory_estimate(&o, &zero2, &z);
    assert_true(z.optim == n);
    o.save = "x"; o.save_sync = 0;   /* the background copy holds the state widened to fp32 */
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.optim == 4 * n && z.copy == 12 * n);
    o.save = NULL;
    o.optim = dt_optim_cfg_default(DT_OPTIM_SGD);
    o.optim.momentum = 0.9f;
    o.optim.state_dtype = DT_OPTIM_STATE_BF16;
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.optim == 2 * n);
    o.optim = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    o.eval_only = 1;
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.grads == 0 && z.optim == 0 && z.params == 4 * n);
    o.eval_only = 0;
    o.build_model = (dt_model_build_fn)1;   /* a user's model: no estimate (never called) */
    dt_train_memory_estimate(&o, NULL, &z);
    assert_true(z.total == 0);
}

static void test_available(void **state) {
    (void)state;
    dt_mem_avail a;
    put("proc/meminfo", "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    2097152 kB\n");
    /* no cgroup file: MemAvailable */
    assert_int_equal(dt_memory_available(g_dir, &a), DT_OK);
    assert_true(a.bytes == 2147483648.0);
    assert_string_equal(a.source, "MemAvailable in /proc/meminfo");
    /* v2: the limit of an ancestor (the job's own cgroup says "max") */
    put("proc/self/cgroup", "0::/job/step\n");
    put("sys/fs/cgroup/job/step/memory.max", "max\n");
    put("sys/fs/cgroup/job/step/memory.current", "1000\n");
    put("sys/fs/cgroup/job/memory.max", "1073741824\n");
    put("sys/fs/cgroup/job/memory.current", "104857600\n");
    assert_int_equal(dt_memory_available(g_dir, &a), DT_OK);
    if (a.bytes != 1073741824.0 - 104857600.0) fail_msg("%.0f from %s", a.bytes, a.source);
    assert_string_equal(a.source, "cgroup /job memory.max 1.0 GiB, 100 MiB of it in use");
    /* a limit above MemAvailable: MemAvailable is the smaller figure */
    put("sys/fs/cgroup/job/memory.max", "8589934592\n");
    assert_int_equal(dt_memory_available(g_dir, &a), DT_OK);
    assert_string_equal(a.source, "MemAvailable in /proc/meminfo");
    /* v1: the memory controller's line */
    put("proc/self/cgroup", "4:memory:/dtest\n3:cpu,cpuacct:/\n0::/\n");
    put("sys/fs/cgroup/memory/dtest/memory.limit_in_bytes", "209715200\n");
    put("sys/fs/cgroup/memory/dtest/memory.usage_in_bytes", "10485760\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");   /* the root: no limit */
    assert_int_equal(dt_memory_available(g_dir, &a), DT_OK);
    assert_true(a.bytes == 209715200.0 - 10485760.0);
    assert_string_equal(a.source, "cgroup /dtest memory.limit_in_bytes 200 MiB, 10 MiB of it in use");
    /* nothing readable */
    char empty[300];
    snprintf(empty, sizeof empty, "%s/none", g_dir);
    assert_int_equal(dt_memory_available(empty, &a), DT_EIO);
}

/* the trainer refuses a model far beyond any machine before allocating it;
 * train.no_memory_check lets the same configuration past the check */
static void test_trainer_refuses(void **state) {
    (void)state;
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.model = dt_model_cfg_default(DT_MODEL_GPT2);
    o.model.n_layer = 4; o.model.n_embd = 65536; o.model.n_head = 4; o.model.max_t = 8;   /* ~206 G parameters */
    o.data = DT_DATA_TEXT;
    o.seq = 8; o.batch = 2; o.steps = 1; o.quiet = 1;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_ENOMEM);
    assert_null(t);
    const char *m = dt_error_message();
    if (!strstr(m, "memory: this run needs about ") || !strstr(m, "per rank (parameters ") ||
        !strstr(m, "1 rank on this machine, but only ") || !strstr(m, "train.no_memory_check skips this check"))
        fail_msg("unexpected refusal: %s", m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_counts),
        cmocka_unit_test(test_estimate_shares),
        cmocka_unit_test_setup_teardown(test_available, setup, teardown),
        cmocka_unit_test(test_trainer_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
