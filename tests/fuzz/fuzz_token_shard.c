/* libFuzzer: an llm.c token shard through dt_token_shard_load. */
#include "dtrain/data.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/in.bin", fuzz_tmpdir());
    fuzz_write(path, data, size);
    dt_token_dataset d;
    if (dt_token_shard_load(path, &d) == DT_OK) dt_token_dataset_free(&d);
    return 0;
}
