/* Parameters: a named value with a gradient of the same shape. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dtrain/autograd.h"

dt_status dt_param_init(dt_param *p, const char *name, int ndim, const int64_t *shape) {
    memset(p, 0, sizeof *p);
    if (strlen(name) >= sizeof p->name)
        return DT_ERR(DT_EINVAL, "parameter name too long: %s", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    DT_TRY(dt_tensor_alloc(&p->value, DT_F32, ndim, shape));
    if (dt_tensor_alloc(&p->grad, DT_F32, ndim, shape) != DT_OK) {
        dt_tensor_free(&p->value);
        return DT_ENOMEM;
    }
    p->value.param = p;
    p->value.requires_grad = 1;
    p->requires_grad = 1;
    p->weight_decay = ndim >= 2;
    p->hp = (dt_param_hparams){NAN, NAN, NAN, NAN};
    return DT_OK;
}

void dt_param_free(dt_param *p) {
    dt_tensor_free(&p->value);
    dt_tensor_free(&p->grad);
}
