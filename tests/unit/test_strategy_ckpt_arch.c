/* The architecture a checkpoint records (strategy.h, dt_checkpoint_meta) and
 * its check on load (dt_checkpoint_check_identity), for a user-built model
 * (name + parameter names and shapes) and a built-in (config fields named by
 * setting, arch.layers). Metadata goes through a plain key -> value table here, as a file's
 * __metadata__ would. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include "dtrain/strategy.h"

typedef struct table { const dt_st_meta *m; int n; const char *drop; } table;

static const char *get(const void *src, const char *key) {
    const table *t = src;
    if (t->drop && !strcmp(key, t->drop)) return NULL;
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->m[i].key, key)) return t->m[i].value;
    return NULL;
}

static dt_tensor *no_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    (void)m; (void)g; (void)b; (void)logits;
    return NULL;
}

/* "net": fc0 4 -> 6, fc1 6 -> out, and fc2 out -> out when extra. */
static dt_model *net(int64_t out, int extra) {
    dt_model *m;
    assert_int_equal(dt_model_new("net", 1, &m), DT_OK);
    assert_non_null(dt_nn_add_linear(m, "fc0", 4, 6));
    assert_non_null(dt_nn_add_linear(m, "fc1", 6, out));
    if (extra) assert_non_null(dt_nn_add_linear(m, "fc2", out, out));
    m->forward = no_forward;
    assert_int_equal(dt_model_build(m), DT_OK);
    return m;
}

static dt_run run_of(dt_model *m, const dt_optim_cfg *o) {
    static int64_t step;
    return (dt_run){.model = m, .optim = o, .step = &step, .world = 1};
}

static void test_user_model_parameters(void **state) {
    (void)state;
    dt_optim_cfg o = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_sampler smp;
    assert_int_equal(dt_sampler_init(&smp, 16, 1, 1, 0, 1, 0), DT_OK);
    dt_model *a = net(3, 0), *same = net(3, 0), *wider = net(5, 0), *deeper = net(3, 1);
    dt_run ra = run_of(a, &o);
    ra.sampler = &smp;
    dt_ckpt_meta mb;
    dt_checkpoint_meta(&ra, "ddp", 0, &mb);
    table t = {mb.m, mb.n, NULL};
    assert_string_equal(get(&t, "strategy"), "ddp");
    assert_string_equal(get(&t, "model"), "net");
    assert_non_null(get(&t, "arch.params"));
    assert_null(get(&t, "arch.layers"));   /* no config fields for a user's model */

    dt_run r = run_of(same, &o);
    assert_int_equal(dt_checkpoint_check_identity(&r, get, &t, "ck.st"), DT_OK);
    r = run_of(wider, &o);
    assert_int_equal(dt_checkpoint_check_identity(&r, get, &t, "ck.st"), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "ck.st"));
    assert_non_null(strstr(dt_error_message(), "other parameters"));
    r = run_of(deeper, &o);
    assert_int_equal(dt_checkpoint_check_identity(&r, get, &t, "ck.st"), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "4 parameters"));   /* the checkpoint's: 2 linears */
    assert_non_null(strstr(dt_error_message(), "this run's has 6"));
    /* a checkpoint from before the fingerprint existed is not checked */
    table old = {mb.m, mb.n, "arch.params"};
    assert_int_equal(dt_checkpoint_check_identity(&r, get, &old, "old.st"), DT_OK);
    dt_model_free(a); dt_model_free(same); dt_model_free(wider); dt_model_free(deeper);
    dt_sampler_free(&smp);
}

static void test_builtin_fields(void **state) {
    (void)state;
    dt_optim_cfg o = dt_optim_cfg_default(DT_OPTIM_SGD);
    dt_model_cfg c3 = dt_model_cfg_default(DT_MODEL_GPT2), c2 = c3;
    c3.n_layer = 3; c3.n_embd = 16; c3.n_head = 2; c3.vocab = 32; c3.max_t = 8;
    c2 = c3;
    c2.n_layer = 2;
    dt_model *m3, *m2;
    assert_int_equal(dt_model_create(&c3, 1, &m3), DT_OK);
    assert_int_equal(dt_model_create(&c2, 1, &m2), DT_OK);
    dt_sampler smp;
    assert_int_equal(dt_sampler_init(&smp, 16, 1, 1, 0, 1, 0), DT_OK);
    dt_run r3 = run_of(m3, &o);
    r3.sampler = &smp;
    dt_ckpt_meta mb;
    dt_checkpoint_meta(&r3, "zero-2", 0, &mb);
    table t = {mb.m, mb.n, NULL};
    assert_string_equal(get(&t, "arch.layers"), "3");
    assert_string_equal(get(&t, "arch.heads"), "2");
    dt_run r2 = run_of(m2, &o);
    assert_int_equal(dt_checkpoint_check_identity(&r2, get, &t, "ck.st"), DT_EINVAL);
    assert_string_equal(dt_error_message(), "checkpoint ck.st was saved with arch.layers 3, this run has 2");
    dt_model_free(m3);
    dt_model_free(m2);
    dt_sampler_free(&smp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_model_parameters),
        cmocka_unit_test(test_builtin_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
