/* Inside dtrain: whether the CPU converts fp16 in hardware (F16C), for the
 * layers that convert on their own (ops/gemm_fp16.c). */
#ifndef DT_TENSOR_CONVERT_INTERNAL_H
#define DT_TENSOR_CONVERT_INTERNAL_H
int dt_cpu_f16c(void);   /* 1: F16C and AVX usable */
#endif
