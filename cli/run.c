/* Runs a training or evaluation job in this process and reports errors as one line. */
#include <stdio.h>
#include "cli.h"

int dt_cli_run(const dt_train_opts *o, int eval_only) {
    dt_trainer *t = NULL;
    dt_status s = dt_trainer_create(o, NULL, &t);
    if (s == DT_OK) {
        if (eval_only) {
            double loss, acc;
            s = dt_trainer_evaluate(t, &loss, &acc);
            if (s == DT_OK) printf("%s loss: %.4f  accuracy: %.4f\n",
                                   o->data == DT_DATA_FASHION_MNIST ? "test" : "validation", loss, acc);
        } else {
            s = dt_trainer_run(t);
        }
    }
    if (s != DT_OK) fprintf(stderr, "dtrain: error: %s\n", dt_error_message());
    dt_trainer_free(t);
    return s == DT_OK ? 0 : 1;
}
