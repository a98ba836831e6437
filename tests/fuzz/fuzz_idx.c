/* libFuzzer: an IDX file (plain or gzip) through dt_idx_load. */
#include "dtrain/data.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/in.idx", fuzz_tmpdir());
    fuzz_write(path, data, size);
    dt_idx x;
    if (dt_idx_load(path, &x) == DT_OK) dt_idx_free(&x);
    return 0;
}
