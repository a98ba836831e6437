/* Freezing parameters by name: a glob (fnmatch without flags, so '*' also
 * crosses dots: "h.0.*", "*.bias"). A frozen parameter (requires_grad = 0)
 * records no use on a tape, so it never has a gradient and no optimizer
 * steps it (optim.h: skipping); DDP gives it no bucket. */
#include <fnmatch.h>
#include "dtrain/nn.h"

size_t dt_model_num_trainable(const dt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->requires_grad) n += (size_t)m->params[i]->value.numel;
    return n;
}

int dt_model_freeze(dt_model *m, const char *pattern) {
    int n = 0;
    for (int i = 0; pattern && i < m->n_params; i++)
        if (fnmatch(pattern, m->params[i]->name, 0) == 0) {
            m->params[i]->requires_grad = 0;
            n++;
        }
    return n;
}
