/* Text as a dt_dataset: every byte a token (vocab 256), windows of T. */
#include "dataset_internal.h"

dt_status dt_dataset_open_text(const dt_dataset_opts *o, dt_dataset *out) {
    return dt_dataset_open_tokens(o->path ? o->path : DT_FORTUNES_DIR, o, dt_text_open, out);
}
