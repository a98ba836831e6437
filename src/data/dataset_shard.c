/* llm.c token shards (.bin) as a dt_dataset: uint16 ids, windows of T; one
 * file, or every *.bin of a directory in name order (shard_dir.c). */
#include "dataset_internal.h"

dt_status dt_dataset_open_shard(const dt_dataset_opts *o, dt_dataset *out) {
    if (!o->path) return DT_ERR(DT_EINVAL, "train.data shard needs train.data_path FILE.bin or a directory of them");
    return dt_dataset_open_tokens(o->path, o, dt_token_shard_open, out);
}
