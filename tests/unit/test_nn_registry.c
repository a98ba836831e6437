/* The model registry (nn.h section 4b): every built-in found by name and by
 * kind, unknown names refused listing the built-ins, defaults that validate,
 * checkpoint fields byte for byte as before the registry and round-tripping
 * through their descriptors, sizing from the data, and a model registered
 * here -- one file's worth -- created, recorded in checkpoints and trained
 * through the same paths as the built-ins. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tmpdir.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/train.h"

static void assert_msg_has(const char *needle) {
    if (!strstr(dt_error_message(), needle)) fail_msg("error message lacks '%s': %s", needle, dt_error_message());
}

/* ---- a bigram language model: the next token's logits are a row of one table ---- */

static dt_tensor *bigram_next(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)x; (void)user;
    const dt_tensor *ids = dt_batch_input(b, "ids", DT_I32, "bigram");
    dt_module *table = m->modules[0];
    if (!ids || dt_module_enter(g, table) != DT_OK) return NULL;
    int64_t shape[3] = {b->B, b->T, m->cfg.vocab};
    dt_tensor *y = dt_op_embedding(g, &table->params[0]->value, ids->data, b->B * b->T, 3, shape);
    return y && dt_module_leave(g, table) == DT_OK ? y : NULL;
}

static dt_status bigram_build(dt_model *m) {
    const dt_model_cfg *c = &m->cfg;
    dt_input_spec in = {.name = "ids", .dtype = DT_I32, .ndim = 1, .dims = {-(int64_t)c->max_t}, .int_limit = c->vocab};
    DT_TRY(dt_model_add_input(m, &in));
    dt_module *table = dt_model_add_module(m, "next");
    dt_model_add_param(m, table, "weight", 2, (int64_t[]){c->vocab, c->vocab}, DT_INIT_GAUSS(0.02f));
    int64_t out[2] = {DT_DIM_SEQ, c->vocab};
    DT_TRY(dt_model_add_block(m, "next", bigram_next, NULL, 0, NULL, 2, out));
    return dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, c->vocab);
}

static void bigram_defaults(dt_model_cfg *c) { c->vocab = 256; c->max_t = 32; }

static dt_status bigram_validate(const dt_model_cfg *c) {
    if (c->vocab < 2 || c->vocab > 4096 || c->max_t <= 0)
        return DT_ERR(DT_EINVAL, "bigram: vocab %d outside 2..4096 or max_t %d not positive", c->vocab, c->max_t);
    return DT_OK;
}

/* arch.vocab and arch.max_t are GPT-2's settings too: the same fields, so one CLI flag each */
static const dt_model_setting bigram_settings[] = {
    {.key = "arch.vocab", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, vocab), .meta = "V", .help = "vocabulary"},
    {.key = "arch.max_t", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, max_t), .meta = "T", .help = "context length"},
};

static const dt_model_builtin bigram = {
    .name = "bigram", .data = "text", .max_seq = "arch.max_t",
    .defaults = bigram_defaults, .validate = bigram_validate, .build = bigram_build,
    .settings = bigram_settings, .n_settings = 2,
};
static dt_model_kind bigram_kind;

/* the same model with a setting the ranks agree on but checkpoints do not record */
static const dt_model_setting bigram_settings_unrecorded[] = {
    bigram_settings[0], bigram_settings[1],
    {.key = "arch.dropout", .type = DT_SETTING_FLOAT, .at = offsetof(dt_model_cfg, dropout), .meta = "P", .help = "dropout",
     .unrecorded = 1},
};
static const dt_model_builtin bigram_unrecorded = {
    .name = "bigram_u", .data = "text", .max_seq = "arch.max_t",
    .defaults = bigram_defaults, .validate = bigram_validate, .build = bigram_build,
    .settings = bigram_settings_unrecorded, .n_settings = 3,
};

/* ---- the built-ins ---- */

static void test_builtins_by_name_and_kind(void **state) {
    (void)state;
    static const struct { const char *name; dt_model_kind kind; } want[] = {
        {"mlp", DT_MODEL_MLP}, {"cnn", DT_MODEL_CNN}, {"gpt2", DT_MODEL_GPT2}};
    for (int i = 0; i < 3; i++) {
        dt_model_kind k = DT_MODEL_CUSTOM, at = DT_MODEL_CUSTOM;
        assert_int_equal(dt_model_builtin_find(want[i].name, &k), DT_OK);
        assert_int_equal(k, want[i].kind);
        assert_int_equal(dt_model_kind_parse(want[i].name, &k), 0);
        assert_int_equal(k, want[i].kind);
        assert_string_equal(dt_model_kind_name(k), want[i].name);
        const dt_model_builtin *b = dt_model_builtin_of(k);
        assert_non_null(b);
        assert_ptr_equal(dt_model_builtin_at(i, &at), b);
        assert_int_equal(at, want[i].kind);
        assert_int_equal(dt_model_builtin_check(b), DT_OK);
    }
    assert_null(dt_model_builtin_of(DT_MODEL_CUSTOM));
    assert_null(dt_model_builtin_of((dt_model_kind)99));
    assert_null(dt_model_builtin_at(dt_model_builtin_count(), NULL));
    assert_string_equal(dt_model_kind_name(DT_MODEL_CUSTOM), "custom");
    dt_model_kind k = DT_MODEL_GPT2;
    assert_int_equal(dt_model_kind_parse("resnet", &k), -1);
    assert_int_equal(k, DT_MODEL_GPT2);   /* untouched */
    assert_int_equal(dt_model_builtin_find("resnet", &k), DT_EINVAL);
    assert_msg_has("unknown model 'resnet' (mlp, cnn, gpt2");
    assert_int_equal(dt_model_builtin_find(NULL, NULL), DT_EINVAL);
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    c.kind = DT_MODEL_CUSTOM;
    assert_int_equal(dt_model_cfg_validate(&c), DT_EINVAL);
    assert_msg_has("unknown model kind 3 (the built-ins are mlp, cnn, gpt2");
    char names[128];
    assert_non_null(strstr(dt_model_builtin_names(names, sizeof names, "|"), "mlp|cnn|gpt2"));
}

static void test_defaults_validate_and_build(void **state) {
    (void)state;
    for (int i = 0; i < dt_model_builtin_count(); i++) {
        dt_model_kind k;
        const dt_model_builtin *b = dt_model_builtin_at(i, &k);
        dt_model_cfg c = dt_model_cfg_default(k);
        assert_int_equal(c.kind, k);
        if (dt_model_cfg_validate(&c) != DT_OK) fail_msg("%s: defaults invalid: %s", b->name, dt_error_message());
        dt_model *m;
        assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
        assert_string_equal(m->name, b->name);
        assert_int_equal(m->cfg.kind, k);
        assert_true(dt_model_flops_per_item(m, 8) >= 6.0 * (double)m->n_elems * (b->flops ? 0.1 : 1.0));
        dt_model_free(m);
    }
    /* every kind's configuration carries every built-in's defaults (the CLI sets any model's flags) */
    dt_model_cfg mlp = dt_model_cfg_default(DT_MODEL_MLP), gpt = dt_model_cfg_default(DT_MODEL_GPT2);
    assert_int_equal(mlp.n_layer, 4);
    assert_int_equal(gpt.mlp_hidden[1], 256);
    assert_int_equal(gpt.cnn_c2, 64);
    assert_int_equal(gpt.max_t, 128);   /* GPT-2's own, though the bigram model below says 32 */
    /* the old defaults */
    assert_int_equal(mlp.mlp_in, 784);
    assert_int_equal(mlp.mlp_n_hidden, 2);
    assert_int_equal(mlp.cnn_h, 28);
    assert_true(gpt.n_embd == 128 && gpt.n_head == 4 && gpt.vocab == 256 && gpt.dropout == 0.0f);
}

/* ---- checkpoint fields: the text is what checkpoints written before hold ---- */

/* a setting's key, what it is to a user (a settable one: its help), its text */
typedef struct want_field { const char *key, *help, *value; } want_field;

static const dt_model_setting *setting_of(const dt_model_cfg *c, const char *key) {
    const dt_model_builtin *b = dt_model_builtin_of(c->kind);
    for (int k = 0; b && k < b->n_settings; k++)
        if (!strcmp(b->settings[k].key, key)) return &b->settings[k];
    return NULL;
}

static void expect_fields(const dt_model_cfg *c, const want_field *w, int n) {
    dt_arch_field f[DT_ARCH_FIELDS_MAX], all[DT_ARCH_FIELDS_MAX];
    assert_int_equal(dt_model_arch_fields(c, f), n);
    assert_int_equal(dt_model_settings(c, all), n);   /* every built-in setting is recorded */
    for (int i = 0; i < n; i++) {
        assert_string_equal(f[i].key, w[i].key);
        const dt_model_setting *s = setting_of(c, f[i].key);
        assert_non_null(s);
        assert_string_equal(s->help, w[i].help);
        assert_string_equal(f[i].value, w[i].value);
        assert_string_equal(all[i].value, w[i].value);
    }
}

static void test_arch_fields_as_before(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    want_field mlp[] = {{"arch.mlp_in", "MLP input size", "784"}, {"arch.hidden", "MLP hidden sizes (default 256,256)", "256,256"},
                        {"arch.mlp_out", "MLP output size", "10"}};
    expect_fields(&c, mlp, 3);
    c.mlp_n_hidden = 0;
    mlp[1].value = "none";
    expect_fields(&c, mlp, 3);
    c.mlp_n_hidden = 3; c.mlp_hidden[2] = 7;
    mlp[1].value = "256,256,7";
    expect_fields(&c, mlp, 3);

    c = dt_model_cfg_default(DT_MODEL_CNN);
    c.cnn_c1 = 2; c.cnn_c2 = 4; c.cnn_fc = 8;
    want_field cnn[] = {{"arch.channels", "CNN conv channels (default 32,64)", "2,4"},
                        {"arch.fc", "CNN hidden fully-connected size (default 128)", "8"}, {"arch.classes", "CNN classes", "10"}};
    expect_fields(&c, cnn, 3);

    c = dt_model_cfg_default(DT_MODEL_GPT2);
    want_field gpt[] = {{"arch.layers", "GPT-2 layers (default 4)", "4"}, {"arch.embd", "GPT-2 embedding width (default 128)", "128"},
                        {"arch.heads", "GPT-2 attention heads (default 4)", "4"},
                        {"arch.vocab", "GPT-2 vocabulary (default 256: bytes)", "256"},
                        {"arch.max_t", "GPT-2 context length (default 128)", "128"}, {"arch.dropout", "GPT-2 dropout (default 0)", "0"}};
    expect_fields(&c, gpt, 6);
    c.dropout = 0.1f;
    gpt[5].value = "0.100000001";   /* %.9g of the float */
    expect_fields(&c, gpt, 6);

    c.kind = DT_MODEL_CUSTOM;   /* a user's model has none */
    dt_arch_field f[DT_ARCH_FIELDS_MAX];
    assert_int_equal(dt_model_arch_fields(&c, f), 0);
}

/* parse a setting's text back through the library (what reads checkpoints) */
static void parse_into(const dt_model_setting *s, dt_model_cfg *c, const char *text) {
    if (dt_model_setting_parse(s, c, text) != DT_OK) fail_msg("%s '%s': %s", s->key, text, dt_error_message());
}

/* texts that are no value of the setting are refused naming key and text;
 * a list's `none` is no values */
static void test_setting_parse_refuses(void **state) {
    (void)state;
    const dt_model_builtin *cnn = dt_model_builtin_of(DT_MODEL_CNN), *mlp = dt_model_builtin_of(DT_MODEL_MLP);
    const dt_model_builtin *gpt = dt_model_builtin_of(DT_MODEL_GPT2);
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    const char *bad_int[] = {"", "3x", "x", "99999999999", "3 "};
    for (size_t i = 0; i < sizeof bad_int / sizeof bad_int[0]; i++) {
        assert_int_equal(dt_model_setting_parse(&gpt->settings[0], &c, bad_int[i]), DT_EINVAL);
        assert_msg_has("arch.layers");
    }
    assert_int_equal(dt_model_setting_parse(&gpt->settings[5], &c, "nan"), DT_EINVAL);   /* arch.dropout */
    assert_msg_has("arch.dropout: 'nan'");
    assert_int_equal(c.n_layer, dt_model_cfg_default(DT_MODEL_GPT2).n_layer);   /* unchanged by a refusal */
    c = dt_model_cfg_default(DT_MODEL_CNN);
    assert_int_equal(dt_model_setting_parse(&cnn->settings[0], &c, "3"), DT_EINVAL);   /* needs 2 values */
    assert_int_equal(dt_model_setting_parse(&cnn->settings[0], &c, "3,,5"), DT_EINVAL);
    assert_msg_has("arch.channels: '3,,5'");
    assert_int_equal(dt_model_setting_parse(&cnn->settings[0], &c, "3,5"), DT_OK);
    assert_true(c.cnn_c1 == 3 && c.cnn_c2 == 5);
    assert_int_equal(dt_model_setting_parse(&mlp->settings[1], &c, "none"), DT_OK);   /* arch.hidden */
    assert_int_equal(c.mlp_n_hidden, 0);
}

static void test_settings_round_trip(void **state) {
    (void)state;
    for (int i = 0; i < dt_model_builtin_count(); i++) {
        dt_model_kind k;
        const dt_model_builtin *b = dt_model_builtin_at(i, &k);
        dt_model_cfg c = dt_model_cfg_default(k), back = dt_model_cfg_default(k);
        for (int j = 0; j < b->n_settings; j++) {   /* every setting off its default */
            const dt_model_setting *s = &b->settings[j];
            int v;
            memcpy(&v, (char *)&c + s->at, sizeof v);
            if (s->type == DT_SETTING_FLOAT) {
                float x = 0.25f;
                memcpy((char *)&c + s->at, &x, sizeof x);
            } else if (s->type == DT_SETTING_INT) {
                v += 3;
                memcpy((char *)&c + s->at, &v, sizeof v);
            } else {
                int vals[DT_SETTING_INTS_MAX];
                for (int q = 0; q < s->n_max; q++) vals[q] = 5 + q;
                assert_int_equal(dt_model_setting_set_ints(s, &c, vals, s->n_max), DT_OK);
            }
        }
        dt_arch_field f[DT_ARCH_FIELDS_MAX], g[DT_ARCH_FIELDS_MAX];
        int n = dt_model_settings(&c, f);
        assert_int_equal(n, b->n_settings);
        for (int j = 0; j < n; j++) parse_into(&b->settings[j], &back, f[j].value);
        assert_int_equal(dt_model_settings(&back, g), n);
        for (int j = 0; j < n; j++) {
            if (strcmp(f[j].value, g[j].value))
                fail_msg("%s %s: '%s' read back as '%s'", b->name, f[j].key, f[j].value, g[j].value);
            if (b->settings[j].type == DT_SETTING_INTS) assert_non_null(strchr(f[j].value, ','));
        }
    }
}

static void test_set_ints(void **state) {
    (void)state;
    const dt_model_builtin *cnn = dt_model_builtin_of(DT_MODEL_CNN), *mlp = dt_model_builtin_of(DT_MODEL_MLP);
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_CNN);
    assert_int_equal(dt_model_setting_set_ints(&cnn->settings[0], &c, (int[]){3}, 1), DT_EINVAL);
    assert_string_equal(dt_error_message(), "arch.channels needs 2 values (C1,C2)");
    assert_int_equal(dt_model_setting_set_ints(&cnn->settings[0], &c, (int[]){3, 5}, 2), DT_OK);
    assert_true(c.cnn_c1 == 3 && c.cnn_c2 == 5 && c.cnn_fc == 128);
    assert_int_equal(dt_model_setting_set_ints(&cnn->settings[1], &c, (int[]){3}, 1), DT_EINVAL);   /* arch.fc: one int */
    assert_int_equal(dt_model_setting_set_ints(&mlp->settings[1], &c, (int[]){9, 8, 7}, 3), DT_OK);
    assert_true(c.mlp_n_hidden == 3 && c.mlp_hidden[0] == 9 && c.mlp_hidden[2] == 7);
}

/* ---- sizing from the data ---- */

static void test_fit_to_samples(void **state) {
    (void)state;
    dt_sample_shape img = {.n_inputs = 1, .in = {{.name = "image", .dtype = DT_F32, .ndim = 3, .dims = {1, 20, 12}}},
                           .targets = 1, .classes = 10};
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    assert_int_equal(dt_model_cfg_fit(&c, &img), DT_OK);
    assert_int_equal(c.mlp_in, 240);
    c = dt_model_cfg_default(DT_MODEL_CNN);
    assert_int_equal(dt_model_cfg_fit(&c, &img), DT_OK);
    assert_true(c.cnn_h == 20 && c.cnn_w == 12);
    img.in[0].dims[0] = 3;   /* three channels: the CNN keeps its size */
    c = dt_model_cfg_default(DT_MODEL_CNN);
    assert_int_equal(dt_model_cfg_fit(&c, &img), DT_OK);
    assert_true(c.cnn_h == 28 && c.cnn_w == 28);
    img.in[0].dims[0] = 1; img.in[0].dims[1] = 2;
    assert_int_equal(dt_model_cfg_fit(&c, &img), DT_EINVAL);
    assert_msg_has("cnn: images of 2x12");
    dt_sample_shape ids = {.n_inputs = 1, .in = {{.name = "ids", .dtype = DT_I32, .ndim = 1, .dims = {64}}},
                           .targets = 64, .classes = 256};
    c = dt_model_cfg_default(DT_MODEL_GPT2);
    dt_model_cfg before = c;
    assert_int_equal(dt_model_cfg_fit(&c, &ids), DT_OK);
    assert_memory_equal(&c, &before, sizeof c);
    assert_ptr_equal(dt_sample_input(&ids, "ids", DT_I32), &ids.in[0]);
    assert_null(dt_sample_input(&ids, "ids", DT_F32));
    const char *key = NULL;
    assert_int_equal(dt_model_cfg_max_seq(&c, &key), 128);
    assert_string_equal(key, "arch.max_t");
    c = dt_model_cfg_default(DT_MODEL_MLP);
    assert_int_equal(dt_model_cfg_max_seq(&c, NULL), 0);
}

/* ---- entries the registry refuses ---- */

static dt_status no_build(dt_model *m) { (void)m; return DT_OK; }
static void gpt_like_defaults(dt_model_cfg *c) { c->n_embd = 8; c->vocab = 16; }
static dt_status always_ok(const dt_model_cfg *c) { (void)c; return DT_OK; }
static dt_status never_ok(const dt_model_cfg *c) { (void)c; return DT_ERR(DT_EINVAL, "never"); }

static void test_bad_entries(void **state) {
    (void)state;
    dt_model_builtin b = {.name = "odd", .data = "text", .defaults = gpt_like_defaults, .validate = always_ok};
    assert_int_equal(dt_model_register(&b, NULL), DT_EINVAL);
    assert_msg_has("model odd: the entry has no build");
    b.build = no_build;
    assert_int_equal(dt_model_builtin_check(&b), DT_OK);
    dt_model_builtin dup = b;
    dup.name = "gpt2";
    assert_int_equal(dt_model_register(&dup, NULL), DT_EINVAL);
    assert_msg_has("a model 'gpt2' is already registered");
    dt_model_setting s = {.key = "arch.vocab", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, n_embd),
                          .meta = "V", .help = "vocabulary"};
    b.settings = &s;
    b.n_settings = 1;
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);   /* GPT-2's arch.vocab is another field */
    assert_msg_has("arch.vocab is also a setting of model gpt2");
    s.key = "arch.width";
    s.at = sizeof(dt_model_cfg);
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);
    assert_msg_has("arch.width: offset");
    assert_msg_has("is not a field of dt_model_cfg");
    s.at = offsetof(dt_model_cfg, n_embd);
    /* a setting's name is arch.<name>: a front end spells its flag from it */
    const char *bad_keys[] = {"width", "--width", "arch.", "arch.Width", "arch.max-t", "arch.a.b",
                              "arch.abcdefghijklmnopqrstuvwxyz012345"   /* 32 */};
    for (int i = 0; i < 7; i++) {
        s.key = bad_keys[i];
        if (dt_model_builtin_check(&b) != DT_EINVAL) fail_msg("key '%s' accepted", bad_keys[i]);
        assert_msg_has("must be named arch.<name>, name of 1..31 characters a-z, 0-9, _");
    }
    s.key = NULL;
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);
    assert_msg_has("setting '(no key)' must be named arch.<name>");
    s.key = "arch.abcdefghijklmnopqrstuvwxyz_1234"   /* 31: the longest */;
    assert_int_equal(dt_model_builtin_check(&b), DT_OK);
    s.key = "arch.width";
    s.help = NULL;   /* settable: needs a help */
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);
    assert_msg_has("arch.width: a setting with a meta (settable) needs a help text");
    s.meta = NULL;   /* set by the model itself: the help is optional */
    assert_int_equal(dt_model_builtin_check(&b), DT_OK);
    s.meta = "W";
    s.help = "width";
    dt_model_setting two[2] = {s, s};
    b.settings = two;
    b.n_settings = 2;
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);
    assert_msg_has("two settings named arch.width");
    b.settings = &s;
    b.n_settings = 1;
    b.max_seq = "arch.max_t";   /* not one of its settings */
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);
    assert_msg_has("max_seq 'arch.max_t'");
    b.max_seq = NULL;
    b.validate = never_ok;
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);
    assert_msg_has("model odd: its defaults do not validate: never");
    b.validate = always_ok;
    b.name = "custom";
    assert_int_equal(dt_model_builtin_check(&b), DT_EINVAL);
    /* a --model value, listed with the others ("mlp, cnn, gpt2, ..."): no separators */
    const char *bad_names[] = {"has space", "a,b", "x|y", "path/x"};
    for (int i = 0; i < 4; i++) {
        b.name = bad_names[i];
        if (dt_model_builtin_check(&b) != DT_EINVAL) fail_msg("model name '%s' accepted", bad_names[i]);
        assert_msg_has("may hold letters, digits, '_' and '-' only");
    }
    b.name = "wide_2-x";
    assert_int_equal(dt_model_builtin_check(&b), DT_OK);
}

/* ---- the registered model goes every built-in's way ---- */

static void test_registered_model(void **state) {
    (void)state;
    assert_int_not_equal(bigram_kind, DT_MODEL_CUSTOM);
    assert_ptr_equal(dt_model_builtin_of(bigram_kind), &bigram);
    assert_ptr_equal(dt_model_builtin_at(dt_model_builtin_count() - 1, NULL), &bigram);
    dt_model_kind k;
    assert_int_equal(dt_model_builtin_find("bigram", &k), DT_OK);
    assert_int_equal(k, bigram_kind);
    assert_string_equal(dt_model_kind_name(k), "bigram");
    assert_int_equal(dt_model_register(&bigram, NULL), DT_EINVAL);   /* once */
    dt_model_cfg c = dt_model_cfg_default(bigram_kind);
    assert_true(c.vocab == 256 && c.max_t == 32 && c.n_layer == 4);
    want_field w[] = {{"arch.vocab", "vocabulary", "256"}, {"arch.max_t", "context length", "32"}};
    expect_fields(&c, w, 2);
    assert_int_equal(dt_model_cfg_max_seq(&c, NULL), 32);
    dt_model_cfg u = dt_model_cfg_default(bigram_kind);
    assert_int_equal(dt_model_builtin_find("bigram_u", &u.kind), DT_OK);
    dt_arch_field f[DT_ARCH_FIELDS_MAX];
    assert_int_equal(dt_model_arch_fields(&u, f), 2);   /* arch.dropout is not recorded */
    assert_string_equal(f[1].key, "arch.max_t");
    assert_int_equal(dt_model_settings(&u, f), 3);      /* but the ranks agree on it */
    assert_string_equal(f[2].key, "arch.dropout");
    assert_string_equal(f[2].value, "0");
    c.vocab = 1;
    assert_int_equal(dt_model_cfg_validate(&c), DT_EINVAL);
    assert_msg_has("bigram: vocab 1");
    c.vocab = 16;
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 7, &m), DT_OK);
    assert_string_equal(m->name, "bigram");
    assert_int_equal(m->n_params, 1);
    assert_true(dt_model_flops_per_item(m, 4) == 6.0 * 16 * 16);
    /* a forward: at initialisation the loss is about ln(vocab) */
    int32_t ids[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8}, y[2 * 4] = {2, 3, 4, 5, 6, 7, 8, 9};
    dt_batch b = {.B = 2, .T = 4, .y = y};
    assert_int_equal(dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){2, 4}, ids), DT_OK);
    dt_graph *g = dt_graph_create();
    assert_non_null(g);
    dt_tensor *loss = dt_model_forward(m, g, &b, NULL);
    assert_non_null(loss);
    assert_true(fabsf(dt_f32(loss)[0] - logf(16.0f)) < 0.05f);
    dt_graph_free(g);
    dt_model_free(m);
}

static char dir[64], text_path[128];

static void test_registered_model_trains(void **state) {
    (void)state;
    assert_int_equal(dt_test_tmpdir(dir, sizeof dir, "registry"), 0);
    snprintf(text_path, sizeof text_path, "%s/corpus.txt", dir);
    FILE *f = fopen(text_path, "w");
    assert_non_null(f);
    for (int i = 0; i < 200; i++) fprintf(f, "abcabcabd %d\n", i % 7);
    fclose(f);
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.model = dt_model_cfg_default(bigram_kind);
    o.data = dt_model_builtin_of(bigram_kind)->data;
    o.data_path = text_path;
    o.batch = 8; o.seq = 64; o.steps = 6; o.quiet = 1;
    o.optim.lr = 0.05f;
    dt_trainer *t;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_EINVAL);   /* train.seq beyond the model's arch.max_t */
    assert_string_equal(dt_error_message(), "train.seq 64 must be in 1..32 (the model's arch.max_t)");
    o.seq = 16;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    double first = 0, last = 0;
    for (int i = 0; i < 6; i++) assert_int_equal(dt_trainer_step(t, i ? &last : &first), DT_OK);
    assert_true(last < first);
    char ck[160];
    snprintf(ck, sizeof ck, "%s/bigram.safetensors", dir);
    assert_int_equal(dt_checkpoint_save(t, ck), DT_OK);
    dt_trainer_free(t);
    o.model.max_t = 24;   /* same parameters, another setting: the recorded field names it */
    o.resume = ck;
    o.steps = 8;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_EINVAL);
    assert_msg_has("was saved with arch.max_t 32, this run has 24");
    o.model.max_t = 32;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    assert_int_equal(dt_trainer_step(t, NULL), DT_OK);
    dt_trainer_free(t);
    dt_test_rm_rf(dir);
}

int main(void) {
    if (dt_model_register(&bigram_unrecorded, NULL) != DT_OK || dt_model_register(&bigram, &bigram_kind) != DT_OK) {
        fprintf(stderr, "registering the bigram model: %s\n", dt_error_message());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins_by_name_and_kind),
        cmocka_unit_test(test_defaults_validate_and_build),
        cmocka_unit_test(test_arch_fields_as_before),
        cmocka_unit_test(test_settings_round_trip),
        cmocka_unit_test(test_setting_parse_refuses),
        cmocka_unit_test(test_set_ints),
        cmocka_unit_test(test_fit_to_samples),
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_registered_model),
        cmocka_unit_test(test_registered_model_trains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
