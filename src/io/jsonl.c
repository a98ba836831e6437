/* Metrics JSONL: one compact JSON object per line, appended and flushed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "dtrain/io.h"

dt_status dt_jsonl_open(dt_jsonl *j, const char *path) {
    if (!j) return DT_ERR(DT_EINVAL, "dt_jsonl_open: NULL handle");
    j->f = NULL;
    if (!path || !*path) return DT_ERR(DT_EINVAL, "dt_jsonl_open: empty path");
    j->f = fopen(path, "a");
    if (!j->f) return DT_ERR(DT_EIO, "%s: cannot open for appending: %s", path, strerror(errno));
    snprintf(j->path, sizeof j->path, "%s", path);
    return DT_OK;
}

/* Integral values (|v| < 1e15) print as integers, others with 9 significant
 * digits (enough for float32); NaN and infinities have no JSON spelling: null. */
static void fmt_number(double v, char *buf, size_t cap) {
    if (!isfinite(v)) snprintf(buf, cap, "null");
    else if (v == trunc(v) && fabs(v) < 1e15) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.9g", v);
    /* A locale with a decimal comma would produce invalid JSON. */
    for (char *p = buf; *p; p++)
        if (*p == ',') *p = '.';
}

dt_status dt_jsonl_write(dt_jsonl *j, int n_fields, const char *const *keys, const double *values) {
    if (!j || !j->f) return DT_ERR(DT_ESTATE, "dt_jsonl_write: file is not open");
    if (n_fields < 0 || (n_fields > 0 && (!keys || !values)))
        return DT_ERR(DT_EINVAL, "dt_jsonl_write: bad field list (n_fields = %d)", n_fields);
    cJSON *obj = cJSON_CreateObject();
    int ok = obj != NULL;
    for (int i = 0; ok && i < n_fields; i++) {
        if (!keys[i]) {
            cJSON_Delete(obj);
            return DT_ERR(DT_EINVAL, "dt_jsonl_write: field %d has a NULL key", i);
        }
        char num[40];
        fmt_number(values[i], num, sizeof num);
        cJSON *v = cJSON_CreateRaw(num);
        ok = v && cJSON_AddItemToObject(obj, keys[i], v);
        if (!ok) cJSON_Delete(v);
    }
    char *line = ok ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!line) return DT_ERR(DT_ENOMEM, "dt_jsonl_write: out of memory");
    size_t n = strlen(line);
    line[n] = '\n';   /* replace the terminator; write exactly n + 1 bytes */
    int bad = fwrite(line, 1, n + 1, j->f) != n + 1 || fflush(j->f) != 0;
    int e = errno;
    cJSON_free(line);
    if (bad) return DT_ERR(DT_EIO, "%s: metrics write failed: %s", j->path, strerror(e));
    return DT_OK;
}

dt_status dt_jsonl_close(dt_jsonl *j) {
    if (!j || !j->f) return DT_OK;
    int bad = fclose(j->f) != 0;
    int e = errno;
    j->f = NULL;
    if (bad) return DT_ERR(DT_EIO, "%s: metrics close failed: %s", j->path, strerror(e));
    return DT_OK;
}
