/* libFuzzer: a sharded checkpoint set through dt_ckpt_open. The directory
 * holds a valid two-rank set (written once with the library's writers); an
 * input is index.json, optionally followed by a NUL byte and the bytes that
 * replace rank 1's shard file for this run. Tensors "w" [3, 4] and "b" [5]
 * are read whole when the index opens. */
#include "dtrain/io.h"
#include "fuzz_common.h"

static char set_dir[128], shard1[256];
static uint8_t *shard1_bytes;
static size_t shard1_n;

static void make_set(void) {
    static const float w[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, b[5] = {-1, -2, -3, -4, -5};
    char set[DT_CKPT_SET_MAX];
    snprintf(set_dir, sizeof set_dir, "%s/set", fuzz_tmpdir());
    dt_ckpt_set_id(1, 0xabcdu, set);
    dt_ckpt_piece r0[2] = {{"w", 0, 6, w}, {"b", 0, 5, b}}, r1[1] = {{"w", 6, 6, w + 6}};
    dt_ckpt_shape shapes[2] = {{"w", 2, {3, 4}}, {"b", 1, {5}}};
    dt_st_meta meta = {"step", "1"};
    if (dt_ckpt_prepare_dir(set_dir) != DT_OK || dt_ckpt_write_shard(set_dir, set, 0, 2, r0, 2) != DT_OK ||
        dt_ckpt_write_shard(set_dir, set, 1, 2, r1, 1) != DT_OK ||
        dt_ckpt_write_index(set_dir, set, 2, 1, shapes, 2, &meta, 1) != DT_OK) {
        fprintf(stderr, "fuzz_ckpt_index: cannot write the set: %s\n", dt_error_message());
        abort();
    }
    snprintf(shard1, sizeof shard1, "%s/shard-%s-r1.safetensors", set_dir, set);
    FILE *f = fopen(shard1, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0) abort();
    shard1_n = (size_t)ftell(f);
    rewind(f);
    shard1_bytes = malloc(shard1_n);
    if (!shard1_bytes || fread(shard1_bytes, 1, shard1_n, f) != shard1_n) abort();
    fclose(f);
}

static void read_whole(const dt_ckpt *c, const char *name) {
    int nd;
    int64_t sh[DT_MAX_DIMS];
    if (!dt_ckpt_find(c, name, &nd, sh)) return;
    size_t n = 1;
    for (int d = 0; d < nd; d++) n *= (size_t)sh[d];
    if (n > (1u << 20)) return;
    float *buf = malloc((n ? n : 1) * sizeof *buf);
    if (buf) (void)dt_ckpt_read(c, name, 0, n, buf);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!set_dir[0]) make_set();
    const uint8_t *nul = memchr(data, 0, size);
    size_t n_index = nul ? (size_t)(nul - data) : size;
    char path[192];
    snprintf(path, sizeof path, "%s/index.json", set_dir);
    fuzz_write(path, data, n_index);
    if (nul) fuzz_write(shard1, nul + 1, size - n_index - 1);
    else fuzz_write(shard1, shard1_bytes, shard1_n);
    dt_ckpt *c;
    if (dt_ckpt_open(set_dir, &c) == DT_OK) {
        (void)dt_ckpt_get_meta(c, "step");
        read_whole(c, "w");
        read_whole(c, "b");
        dt_ckpt_close(c);
    }
    return 0;
}
