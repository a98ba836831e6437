/* dtrain train's flags are parsed once (cli/train_flags.h): the defaults that
 * depend on another flag -- the optimizer's lr and weight decay, the model's
 * settings -- are resolved after the parse, and a flag given is never
 * overridden by them, wherever it stands on the command line. The models'
 * flags are the CLI's: spelled from the library's setting names
 * ("arch.max_t": --max-t), which the CLI's messages write as those flags. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tmpdir.h"
#include "train_flags.h"

/* A model registered for this test that shares GPT-2's --layers with another
 * default (2, GPT-2's is 4): a model's defaults are visible through it. */
static void tiny_defaults(dt_model_cfg *c) { c->n_layer = 2; }
static dt_status tiny_validate(const dt_model_cfg *c) {
    return c->n_layer > 0 ? DT_OK : DT_ERR(DT_EINVAL, "tiny: layers %d", c->n_layer);
}
static dt_status tiny_build(dt_model *m) { (void)m; return DT_ERR(DT_EINVAL, "tiny: not built in this test"); }
static const dt_model_setting tiny_settings[] = {
    {.key = "arch.layers", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, n_layer), .meta = "L",
     .help = "tiny layers (default 2)"},
};
static const dt_model_builtin tiny = {
    .name = "tiny", .data = "text", .defaults = tiny_defaults, .validate = tiny_validate, .build = tiny_build,
    .settings = tiny_settings, .n_settings = 1,
};

static cli_flags f;
static char err[512];

/* "dtrain train <args>" (args split at spaces) into f: the parse's result */
static int parse(const char *args) {
    char buf[512], *argv[64] = {"dtrain", "train"};
    int argc = 2;
    snprintf(buf, sizeof buf, "%s", args);
    for (char *tok = strtok(buf, " "); tok && argc < 64; tok = strtok(NULL, " ")) argv[argc++] = tok;
    err[0] = 0;
    return dt_cli_train_flags(&f, argc, argv, err, sizeof err);
}

static void parse_ok(const char *args) {
    if (parse(args) != 0) fail_msg("'%s': %s", args, err);
}

static void test_optimizer_defaults(void **state) {
    (void)state;
    parse_ok("");
    assert_int_equal(f.o.optim.kind, DT_OPTIM_ADAMW);
    assert_true(f.o.optim.lr == 1e-3f && f.o.optim.weight_decay == 0.01f);   /* --help: 1e-3 adamw, 0.01 adamw */
    assert_true(f.o.optim.beta1 == 0.9f && f.o.optim.beta2 == 0.999f && f.o.optim.eps == 1e-8f);
    const char *sgd[] = {"--optim sgd", "--optim=sgd", "--steps 3 --optim sgd --seed 2", "--optim adamw --optim sgd"};
    for (int i = 0; i < 4; i++) {
        parse_ok(sgd[i]);
        assert_int_equal(f.o.optim.kind, DT_OPTIM_SGD);
        assert_true(f.o.optim.lr == 1e-2f && f.o.optim.weight_decay == 0.0f);   /* --help: 1e-2 sgd, 0 sgd */
        assert_int_equal(f.o.optim.nesterov, 0);
    }
    parse_ok("--optim sgd --optim adamw");   /* the last one counts, with its defaults */
    assert_int_equal(f.o.optim.kind, DT_OPTIM_ADAMW);
    assert_true(f.o.optim.lr == 1e-3f && f.o.optim.weight_decay == 0.01f);
    assert_int_equal(parse("--optim lion"), -1);
    assert_string_equal(err, "--optim: unknown optimizer 'lion' (adamw, sgd)");
}

static void test_optimizer_flags_given_win(void **state) {
    (void)state;
    const char *lines[] = {"--lr 0.5 --wd 0.25 --optim sgd", "--optim sgd --lr 0.5 --wd 0.25", "--lr=0.5 --optim=sgd --wd=0.25"};
    for (int i = 0; i < 3; i++) {
        parse_ok(lines[i]);
        assert_int_equal(f.o.optim.kind, DT_OPTIM_SGD);
        if (f.o.optim.lr != 0.5f || f.o.optim.weight_decay != 0.25f)
            fail_msg("'%s': lr %g wd %g, wanted the flags' 0.5 and 0.25", lines[i], (double)f.o.optim.lr,
                     (double)f.o.optim.weight_decay);
    }
    parse_ok("--wd 0 --lr 0.01");   /* given values equal to another optimizer's defaults stay */
    assert_true(f.o.optim.kind == DT_OPTIM_ADAMW && f.o.optim.weight_decay == 0.0f && f.o.optim.lr == 0.01f);
    parse_ok("--momentum 0.9 --nesterov --optim sgd");
    assert_true(f.o.optim.momentum == 0.9f && f.o.optim.nesterov == 1 && f.o.optim.lr == 1e-2f);
    parse_ok("--beta1 0.8 --beta2 0.95 --eps 1e-6 --optim adamw");
    assert_true(f.o.optim.beta1 == 0.8f && f.o.optim.beta2 == 0.95f && f.o.optim.eps == 1e-6f);
    assert_true(f.o.optim.lr == 1e-3f && f.o.optim.weight_decay == 0.01f);
}

static void test_model_defaults(void **state) {
    (void)state;
    dt_model_kind tiny_kind;
    assert_int_equal(dt_model_builtin_find("tiny", &tiny_kind), DT_OK);
    parse_ok("");
    assert_int_equal(f.o.model.kind, DT_MODEL_MLP);
    assert_true(f.o.model.mlp_n_hidden == 2 && f.o.model.mlp_hidden[0] == 256);
    assert_string_equal(f.o.data, "fashion-mnist");
    /* the chosen model's defaults, also with --model=NAME and --model after its flags */
    const char *gpt[] = {"--model gpt2", "--model=gpt2", "--model tiny --model gpt2"};
    for (int i = 0; i < 3; i++) {
        parse_ok(gpt[i]);
        assert_int_equal(f.o.model.kind, DT_MODEL_GPT2);
        if (f.o.model.n_layer != 4) fail_msg("'%s': %d layers, GPT-2's default is 4", gpt[i], f.o.model.n_layer);
        assert_string_equal(f.o.data, "text");
    }
    const char *tinies[] = {"--model tiny", "--model=tiny", "--model gpt2 --model tiny"};
    for (int i = 0; i < 3; i++) {
        parse_ok(tinies[i]);
        assert_int_equal(f.o.model.kind, tiny_kind);
        if (f.o.model.n_layer != 2) fail_msg("'%s': %d layers, tiny's default is 2", tinies[i], f.o.model.n_layer);
    }
    assert_int_equal(parse("--model resnet"), -1);
    assert_non_null(strstr(err, "--model: unknown model 'resnet' (mlp, cnn, gpt2, tiny)"));
}

static void test_model_flags_given_win(void **state) {
    (void)state;
    const char *lines[] = {"--layers 3 --model tiny", "--model tiny --layers 3", "--layers=3 --model=gpt2",
                           "--model gpt2 --layers 3"};
    for (int i = 0; i < 4; i++) {
        parse_ok(lines[i]);
        if (f.o.model.n_layer != 3) fail_msg("'%s': %d layers, --layers said 3", lines[i], f.o.model.n_layer);
    }
    parse_ok("--embd 64 --dropout 0.1 --model gpt2");
    assert_true(f.o.model.n_embd == 64 && f.o.model.dropout == 0.1f && f.o.model.n_head == 4);
    parse_ok("--hidden 32 --model mlp");   /* list-valued settings */
    assert_true(f.o.model.mlp_n_hidden == 1 && f.o.model.mlp_hidden[0] == 32);
    parse_ok("--channels 3,5 --model cnn --fc 16");
    assert_true(f.o.model.cnn_c1 == 3 && f.o.model.cnn_c2 == 5 && f.o.model.cnn_fc == 16);
    assert_int_equal(parse("--model cnn --channels 3"), -1);
    assert_non_null(strstr(err, "--channels needs 2 values (C1,C2)"));
}

/* the rule, and every settable setting of every model a row of that name and its help */
static void test_model_flags_from_setting_names(void **state) {
    (void)state;
    char flag[40];
    assert_int_equal(dt_cli_model_flag("arch.max_t", flag, sizeof flag), 0);
    assert_string_equal(flag, "--max-t");
    assert_int_equal(dt_cli_model_flag("arch.layers", flag, sizeof flag), 0);
    assert_string_equal(flag, "--layers");
    assert_int_equal(dt_cli_model_flag("train.seq", flag, sizeof flag), -1);
    assert_int_equal(dt_cli_model_flag("arch.max_t", flag, 7), -1);   /* "--max-t" needs 8 bytes */
    assert_int_equal(dt_cli_model_flag("arch.max_t", flag, 8), 0);
    parse_ok("");
    /* the built-ins' flags in --help order, as before the library named settings by key */
    const char *want[] = {"--model", "--hidden", "--channels", "--fc", "--layers", "--embd", "--heads", "--vocab",
                          "--max-t", "--dropout", "--data"};
    for (int k = 0; k < 11; k++)
        if (strcmp(f.table[k].name, want[k])) fail_msg("row %d is %s, wanted %s", k, f.table[k].name, want[k]);
    for (int i = 0; i < dt_model_builtin_count(); i++) {
        const dt_model_builtin *b = dt_model_builtin_at(i, NULL);
        for (int k = 0; k < b->n_settings; k++) {
            const dt_model_setting *s = &b->settings[k];
            assert_int_equal(dt_cli_model_flag(s->key, flag, sizeof flag), 0);
            const dt_arg *row = NULL;
            for (int r = 0; r < f.n_table && !row; r++)
                if (!strcmp(f.table[r].name, flag)) row = &f.table[r];
            if (!s->meta) {   /* set by the library: no flag */
                if (row) fail_msg("%s %s: not settable, but a row %s", b->name, s->key, flag);
                continue;
            }
            if (!row) fail_msg("%s %s: no row %s", b->name, s->key, flag);
            assert_string_equal(row->meta, s->meta);
            if (strcmp(b->name, "tiny")) assert_string_equal(row->help, s->help);   /* tiny shares GPT-2's row */
        }
    }
}

/* library text names settings; the CLI writes the models' as their flags,
 * or what they are when they have none */
static void test_setting_names_in_messages(void **state) {
    (void)state;
    static const struct { const char *in, *out; } cases[] = {
        {"checkpoint x was saved with arch.layers 3, this run has 2", "checkpoint x was saved with --layers 3, this run has 2"},
        {"train.seq 200 must be in 1..128 (the model's arch.max_t)", "--seq 200 must be in 1..128 (the model's --max-t)"},
        {"arch.channels needs 2 values (C1,C2)", "--channels needs 2 values (C1,C2)"},
        {"arch.hidden, arch.dropout.", "--hidden, --dropout."},
        {"saved with arch.mlp_in 784", "saved with MLP input size 784"},
        {"arch.classes: rank 1 has 5", "CNN classes: rank 1 has 5"},
        {"arch.params, arch.layersx, arch.", "arch.params, arch.layersx, arch."},   /* not settings */
        {"train.steps and arch.max_t", "--steps and --max-t"},
        /* the trainer's settings (train.h dt_train_opts), longest name first */
        {"train.save_every needs train.save PATH", "--save-every needs --save PATH"},
        {"train.min_lr must be in [0, train.optim.lr]", "--min-lr must be in [0, --lr]"},
        {"train.init and train.resume are exclusive", "--init and --resume are exclusive"},
        {"train.eval_batches 3 x train.batch 64", "--eval-batches 3 x --batch 64"},
        {"/d (train.data text): samples", "/d (--data text): samples"},
        {"train.log_every, train.stop_after, train.threads, train.clip, train.warmup, train.recompute",
         "--log-every, --stop-after, --threads, --clip, --warmup, --recompute"},
        /* only whole words: not inside a tensor's name, a path or a longer name */
        {"no optimizer state 'optim.momentum.fc1.weight' (train.optim.momentum 0.9)",
         "no optimizer state 'optim.momentum.fc1.weight' (--momentum 0.9)"},
        {"/runs/train.steps/x, xtrain.steps, train.steps_done, arch.layers.0, train.steps.",
         "/runs/train.steps/x, xtrain.steps, train.steps_done, arch.layers.0, --steps."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[256];
        size_t need = dt_cli_flag_names(cases[i].in, out, sizeof out);
        assert_string_equal(out, cases[i].out);
        assert_int_equal(need, strlen(cases[i].out));
    }
}

/* The trainer's configuration agreement, captured by a strategy that only
 * agrees: every setting it names is written as a flag of this table (a
 * built-in's setting without one as what it is); the other entries are
 * descriptions the rewriting leaves alone. Both optimizers' lists. */
static char g_names[64][128];
static int g_n_names;

static dt_status capture_agree(void *self, dt_agree *a) {
    (void)self;
    const char *p = a->buf;
    g_n_names = 0;
    for (int i = 0; i < a->n && g_n_names < 64; i++) {
        snprintf(g_names[g_n_names++], sizeof g_names[0], "%s", p);
        p += strlen(p) + 1;   /* the name */
        p += strlen(p) + 1;   /* its value */
    }
    return DT_ERR(DT_EINVAL, "captured");
}

static int is_row(const char *flag) {
    for (int r = 0; r < f.n_table; r++)
        if (!strcmp(f.table[r].name, flag)) return 1;
    return 0;
}

static void expect_agreement_flags(const char *args, const char *must) {
    parse_ok(args);
    dt_strategy s = {.name = "capture", .rank = 0, .world = 1, .agree = capture_agree};
    dt_trainer *t = NULL;
    g_n_names = 0;
    assert_int_equal(dt_trainer_create(&f.o, &s, &t), DT_EINVAL);
    assert_string_equal(dt_error_message(), "captured");
    int settings = 0, seen_must = 0;
    for (int i = 0; i < g_n_names; i++) {
        const char *name = g_names[i];
        char out[256];
        dt_cli_flag_names(name, out, sizeof out);
        if (!strncmp(name, "--", 2)) fail_msg("'%s': the library names a flag", name);
        if (!strncmp(name, "train.", 6)) {
            settings++;
            if (!is_row(out)) fail_msg("'%s' is written '%s', not a flag of dtrain train", name, out);
            seen_must |= !strcmp(out, must);
        } else if (!strncmp(name, "arch.", 5)) {
            if (!strncmp(out, "arch.", 5)) fail_msg("'%s' is not written as a flag or what it is", name);
        } else if (strcmp(name, "strategy") && strcmp(name, "model parameters, buffers, blocks") &&
                   strncmp(name, "parameter ", 10) && strncmp(name, "buffer ", 7) && strncmp(name, "data set size", 13)) {
            fail_msg("'%s': neither a setting nor a known description", name);
        } else if (strcmp(out, name)) {
            fail_msg("description '%s' is rewritten to '%s'", name, out);
        }
    }
    if (settings < 25) fail_msg("'%s': only %d settings agreed on", args, settings);
    if (!seen_must) fail_msg("'%s': no setting written %s", args, must);
}

static void test_agreement_names_flags(void **state) {
    (void)state;
    expect_agreement_flags("--model mlp --hidden 16 --data fashion-mnist --optim sgd", "--nesterov");
    expect_agreement_flags("--model mlp --hidden 16 --data fashion-mnist", "--beta2");
    expect_agreement_flags("--model mlp --hidden 16", "--model");
}

static void test_help(void **state) {
    (void)state;
    assert_int_equal(parse("--model gpt2 --help"), 1);
    int rows = 0;
    for (int k = 0; k < f.n_table; k++) rows += !strcmp(f.table[k].name, "--layers");
    assert_int_equal(rows, 1);   /* a flag two models share is one row */
    assert_int_equal(parse("--bogus"), -1);
    assert_string_equal(err, "unknown option '--bogus' (see --help)");
}

/* The binary trains with what the parse resolved: the learning rate of its
 * first step, from its metrics line */
static void expect_lr(const char *dir, const char *flags, const char *lr) {
    char cmd[1024], path[160], line[512] = "";
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    remove(path);
    snprintf(cmd, sizeof cmd, "%s train --hidden 16 --batch 8 --steps 1 --eval-batches 1 --quiet --metrics %s %s",
             DT_CLI_PATH, path, flags);
    assert_int_equal(system(cmd), 0);
    FILE *m = fopen(path, "r");
    assert_non_null(m);
    if (!fgets(line, sizeof line, m)) line[0] = 0;
    fclose(m);
    if (!strstr(line, lr)) fail_msg("'%s': metrics '%s', wanted %s", flags, line, lr);
}

static void test_binary_uses_resolved_defaults(void **state) {
    (void)state;
    char dir[64];
    assert_int_equal(dt_test_tmpdir(dir, sizeof dir, "cli_flags"), 0);
    expect_lr(dir, "--optim sgd", "\"lr\":0.00999999978,");
    expect_lr(dir, "--lr 0.5 --optim sgd", "\"lr\":0.5,");
    expect_lr(dir, "", "\"lr\":0.00100000005,");
    dt_test_rm_rf(dir);
}

/* Under a pipeline the library's batch is a micro-batch and its accum the
 * micro-batch count: its messages name them so, never as a --batch or an
 * --accum the user did not give (--batch 200000 --microbatches 2 used to
 * read "--batch 100000 is more than the 60000 training samples"). */
static void test_pipeline_names_micro_batches(void **state) {
    (void)state;
    char out[512];
    parse_ok("--pp 1 --microbatches 2 --batch 8");
    dt_cli_flag_names("train.batch 4 x train.accum 2; train.eval_batches 6", out, sizeof out);
    assert_string_equal(out, "the micro-batch (--batch / --microbatches) 4 x --microbatches 2; "
                             "the evaluation's micro-batches (--eval-batches x --microbatches) 6");
    parse_ok("--batch 8");   /* no pipeline: the flags themselves */
    dt_cli_flag_names("train.batch 8 x train.accum 1", out, sizeof out);
    assert_string_equal(out, "--batch 8 x --accum 1");
    /* the binary's message */
    char cmd[512], line[512] = "";
    snprintf(cmd, sizeof cmd, "%s train --model mlp --pp 1 --microbatches 2 --batch 200000 --steps 1 2>&1", DT_CLI_PATH);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int said = 0;
    while (fgets(line, sizeof line, p)) {
        if (strstr(line, "--batch 100000")) fail_msg("quotes the micro-batch as --batch: %s", line);
        said |= strstr(line, "the micro-batch (--batch / --microbatches) 100000 is more than") != NULL;
    }
    assert_int_not_equal(pclose(p), 0);
    assert_true(said);
}

int main(void) {
    if (dt_model_register(&tiny, NULL) != DT_OK) {
        fprintf(stderr, "registering the tiny model: %s\n", dt_error_message());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_defaults),
        cmocka_unit_test(test_optimizer_flags_given_win),
        cmocka_unit_test(test_model_defaults),
        cmocka_unit_test(test_model_flags_given_win),
        cmocka_unit_test(test_model_flags_from_setting_names),
        cmocka_unit_test(test_setting_names_in_messages),
        cmocka_unit_test(test_agreement_names_flags),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_binary_uses_resolved_defaults),
        cmocka_unit_test(test_pipeline_names_micro_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
