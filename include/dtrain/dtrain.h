/* dtrain.h — umbrella header. Read the layer headers top to bottom:
 * error -> tensor -> autograd -> ops -> nn -> optim -> data -> io -> dist -> parallel. */
#ifndef DTRAIN_H
#define DTRAIN_H
#include "dtrain/error.h"
#include "dtrain/tensor.h"
#include "dtrain/autograd.h"
#include "dtrain/ops.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/train.h"
#include "dtrain/dist.h"
#include "dtrain/parallel.h"
#endif
