/* dtrain.h — umbrella header. The layers, bottom to top; each header includes
 * only headers of the layers below it (scripts/check_layers.sh checks this):
 *
 *   error, log (util) -> tensor -> autograd -> ops -> nn -> optim -> data
 *   -> io (+ trace) -> dist -> strategy -> parallel (+ zero, pipeline) -> train
 *
 * Read them in that order; docs/ARCHITECTURE.md walks one training step
 * through all of them. */
#ifndef DTRAIN_H
#define DTRAIN_H
#include "dtrain/version.h"
#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/tensor.h"
#include "dtrain/autograd.h"
#include "dtrain/ops.h"
#include "dtrain/nn.h"
#include "dtrain/generate.h"
#include "dtrain/optim.h"
#include "dtrain/data.h"
#include "dtrain/trace.h"
#include "dtrain/io.h"
#include "dtrain/dist.h"
#include "dtrain/strategy.h"
#include "dtrain/parallel.h"
#include "dtrain/zero.h"
#include "dtrain/pipeline.h"
#include "dtrain/train.h"
#endif
