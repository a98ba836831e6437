/* Checks for the multi-rank tests (tests/mpi/test_*.c): the one assertion
 * dialect of every program that runs under mpiexec. Single-process tests use
 * cmocka instead.
 *
 * Every rank runs every test in the same order. A failed check prints the
 * rank, file:line, the running test's name (t_begin) and the last dtrain
 * error, then MPI_Abort()s the job, so one rank failing makes mpiexec exit
 * non-zero instead of leaving the others hanging in a collective.
 *
 * Progress mode: t_init() leaves the choice to the library, which honours
 * DTRAIN_PROGRESS=poll|thread (unset: poll, the built-in default), and checks
 * that the mode it got is the one DTRAIN_PROGRESS asked for. ctest registers
 * every test under DTRAIN_PROGRESS=poll and some again (name suffix _thread)
 * under DTRAIN_PROGRESS=thread; see cmake/tests.cmake.
 *
 * The checks (each reports the caller's file:line):
 *   T_CHECK(cond)                       cond is true
 *   T_OK(expr)                          expr == DT_OK
 *   T_EXPECT(expr, code)                expr == code and an error message was set
 *   T_DTYPE_EQ(buf, dtype, want, n, what)  buf (of dtype) bitwise equal to the
 *                                       floats want rounded to dtype
 *   T_BITWISE(got, want, n, what)       float arrays bitwise equal
 *   T_NEAR(got, want, n, rtol, what)    ||got - want|| / ||want|| <= rtol
 *   T_SAME_ON_RANKS(x, n, what)         bitwise equal to rank 0's copy on every
 *                                       rank (collective on MPI_COMM_WORLD)
 */
#ifndef DT_TEST_MPI_CHECK_H
#define DT_TEST_MPI_CHECK_H

#include <math.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dtrain/dist.h"

/* ---- start-up, naming, ranks ---- */
/* dt_dist_init with the progress mode from DTRAIN_PROGRESS; then
 * T_CHECK(dt_dist_progress_mode() == t_expected_mode()). */
void t_init(int *argc, char ***argv);
/* What DTRAIN_PROGRESS asks for: "thread" -> DT_PROGRESS_THREAD, unset or
 * "poll" -> DT_PROGRESS_POLL (case-insensitive; anything else fails). */
dt_progress_mode t_expected_mode(void);
void t_begin(const char *name);   /* names the running test in failures */
void t_end(void);                 /* barrier, then "ok <name> (np, mode)" on rank 0 */
const char *t_name(void);
int t_rank(void);                 /* in MPI_COMM_WORLD, independent of dtrain */
int t_size(void);

/* ---- the checks ---- */
#if defined(__GNUC__)
__attribute__((noreturn))
#endif
void t_fail(const char *file, int line, const char *what);

#define T_CHECK(c) do { if (!(c)) t_fail(__FILE__, __LINE__, #c); } while (0)
#define T_OK(e) do { if ((e) != DT_OK) t_fail(__FILE__, __LINE__, #e " != DT_OK"); } while (0)
#define T_EXPECT(e, code) do { dt_error_clear(); if ((e) != (code)) t_fail(__FILE__, __LINE__, #e " != " #code); \
                               T_CHECK(dt_error_message()[0] != 0); } while (0)
#define T_DTYPE_EQ(buf, t, expect, n, what) t_dtype_eq_at(__FILE__, __LINE__, buf, t, expect, n, what)
#define T_BITWISE(got, want, n, what) t_bitwise_at(__FILE__, __LINE__, got, want, n, what)
#define T_NEAR(got, want, n, rtol, what) t_near_at(__FILE__, __LINE__, got, want, n, rtol, what)
#define T_SAME_ON_RANKS(x, n, what) t_same_on_ranks_at(__FILE__, __LINE__, x, n, what)

void t_dtype_eq_at(const char *file, int line, const void *buf, dt_dtype t, const float *expect, int64_t n,
                   const char *what);
void t_bitwise_at(const char *file, int line, const float *got, const float *want, size_t n, const char *what);
/* DTT_VERBOSE=1 in the environment prints every T_NEAR's difference on rank 0. */
void t_near_at(const char *file, int line, const float *got, const float *want, size_t n, double rtol,
               const char *what);
void t_same_on_ranks_at(const char *file, int line, const float *x, size_t n, const char *what);

/* ---- helpers (no checks) ---- */
double t_now(void);                                   /* CLOCK_MONOTONIC seconds */
float t_round(float x, dt_dtype t);                   /* float -> dtype -> float */
void *t_alloc(int64_t n, dt_dtype t);                 /* zeroed; never NULL (checked) */
void t_fill(void *buf, dt_dtype t, const float *src, int64_t n);   /* buf (dtype t) <- src */
/* First index where buf (dtype t) differs bitwise from expect rounded to t, or -1. */
int64_t t_mismatch(const void *buf, dt_dtype t, const float *expect, int64_t n);
/* ||a - b|| / ||b|| (0 when both are 0) */
double t_rel_diff(const float *a, const float *b, size_t n);
int t_differs(const float *a, const float *b, size_t n);   /* not bitwise equal */
float *t_copy(const float *x, size_t n);                    /* malloc'ed copy (checked) */

#endif
