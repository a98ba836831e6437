/* Table-driven flag parsing: the table that parses also prints --help. */
#ifndef DT_CLI_ARGS_H
#define DT_CLI_ARGS_H
#include <stddef.h>
#include <stdint.h>

typedef enum dt_arg_type { DT_ARG_INT, DT_ARG_I64, DT_ARG_U64, DT_ARG_FLOAT, DT_ARG_STR, DT_ARG_FLAG, DT_ARG_LIST,
                           DT_ARG_STRS } dt_arg_type;

typedef struct dt_arg {
    const char *name;       /* "--lr" */
    dt_arg_type type;
    void *dst;              /* int*, int64_t*, uint64_t*, float*, const char**, int* (flag / list count) */
    const char *meta;       /* "N", "FILE" */
    const char *help;
    void *list;             /* DT_ARG_LIST: int array; DT_ARG_STRS: const char * array, one per
                               repetition of the flag (dst = int *count for both) */
    int list_cap;           /* capacity of list */
} dt_arg;

/* Parses argv[from..argc). Unknown flags, missing values and malformed numbers
 * produce one line in err (returns -1). Returns 1 if --help was given.
 * given (NULL, or n bytes): given[k] is set to 1 when row k's flag is given,
 * to 0 otherwise -- how a default that depends on other flags is resolved
 * after the one parse without overriding a value the user gave. */
int dt_args_parse(const dt_arg *table, int n, int argc, char **argv, int from, unsigned char *given, char *err,
                  int errlen);
/* Defaults resolved after the parse: the rows whose dst lies inside `staged`
 * (size bytes) were parsed into it; each one given is copied to the same
 * offset of `out`, which holds the defaults. Rows outside `staged`, and
 * DT_ARG_LIST / DT_ARG_STRS rows (their values are elsewhere), are skipped. */
void dt_args_overlay(const dt_arg *table, int n, const unsigned char *given, const void *staged, size_t size, void *out);
void dt_args_help(const dt_arg *table, int n, const char *usage, const char *footer);
#endif
