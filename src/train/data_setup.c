/* Loading the datasets a run needs and assembling batches. */
#include <stdlib.h>
#include <string.h>
#include "trainer_internal.h"

dt_status dt_trainer_load_data(dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    if (o->data == DT_DATA_FASHION_MNIST) {
        const char *dir = o->data_path ? o->data_path : DT_FASHION_MNIST_DIR;
        DT_TRY(dt_fashion_mnist_load(dir, "train", &t->img_train));
        DT_TRY(dt_fashion_mnist_load(dir, "test", &t->img_test));
        if (t->opts.model.kind == DT_MODEL_MLP && t->opts.model.mlp_in != t->img_train.rows * t->img_train.cols)
            return DT_ERR(DT_EINVAL, "mlp input size %d does not match %dx%d images",
                          t->opts.model.mlp_in, t->img_train.rows, t->img_train.cols);
        return DT_OK;
    }
    dt_token_dataset all = {0};
    if (o->data == DT_DATA_TEXT) DT_TRY(dt_text_load(o->data_path ? o->data_path : DT_FORTUNES_DIR, &all));
    else {
        if (!o->data_path) return DT_ERR(DT_EINVAL, "--data shard needs --data-path FILE.bin");
        DT_TRY(dt_token_shard_load(o->data_path, &all));
    }
    if (all.vocab > o->model.vocab) {
        dt_token_dataset_free(&all);
        return DT_ERR(DT_EINVAL, "data has token ids up to %d but the model vocab is %d (--vocab)",
                      all.vocab - 1, o->model.vocab);
    }
    if (o->val_path) {
        t->tok_train = all;
        dt_status s = o->data == DT_DATA_TEXT ? dt_text_load(o->val_path, &t->tok_val)
                                              : dt_token_shard_load(o->val_path, &t->tok_val);
        return s;
    }
    /* split: last 10% held out for validation */
    int64_t n_val = all.n_tokens / 10, n_tr = all.n_tokens - n_val;
    t->tok_train.tokens = all.tokens;
    t->tok_train.n_tokens = n_tr;
    t->tok_train.vocab = all.vocab;
    t->tok_val.tokens = malloc((size_t)(n_val ? n_val : 1) * sizeof(uint16_t));
    if (!t->tok_val.tokens) return DT_ERR(DT_ENOMEM, "out of memory");
    memcpy(t->tok_val.tokens, all.tokens + n_tr, (size_t)n_val * sizeof(uint16_t));
    t->tok_val.n_tokens = n_val;
    t->tok_val.vocab = all.vocab;
    if (dt_token_windows(&t->tok_train, (int)o->seq) < 1)
        return DT_ERR(DT_EINVAL, "text data too short: %lld tokens for sequence length %lld",
                      (long long)n_tr, (long long)o->seq);
    return DT_OK;
}

int64_t dt_trainer_train_size(const dt_trainer *t) {
    return t->opts.data == DT_DATA_FASHION_MNIST ? t->img_train.count
                                                 : dt_token_windows(&t->tok_train, (int)t->opts.seq);
}

/* Fill the batch buffers with samples idx[0..n) from the training (or eval) set. */
void dt_trainer_fill_batch(dt_trainer *t, int eval, const int64_t *idx, int64_t n, dt_batch *b) {
    memset(b, 0, sizeof *b);
    b->B = n;
    b->y = t->y;
    if (t->opts.data == DT_DATA_FASHION_MNIST) {
        dt_image_batch(eval ? &t->img_test : &t->img_train, idx, n, t->x_img, t->y);
        b->x_img = t->x_img;
        b->T = 1;
    } else {
        dt_token_batch(eval ? &t->tok_val : &t->tok_train, idx, n, (int)t->opts.seq, t->x_ids, t->y);
        b->x_ids = t->x_ids;
        b->T = t->opts.seq;
    }
}

void dt_trainer_free_data(dt_trainer *t) {
    dt_image_dataset_free(&t->img_train);
    dt_image_dataset_free(&t->img_test);
    dt_token_dataset_free(&t->tok_train);
    dt_token_dataset_free(&t->tok_val);
}
