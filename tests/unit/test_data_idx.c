/* IDX reader and Fashion-MNIST loader: synthetic fixtures (raw and gzip,
 * written into a mkdtemp dir), corrupt inputs, and the real test split. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dtrain/data.h"
#include "tmpdir.h"

static char g_dir[256];

/* ---- fixture helpers ---- */

static int group_setup(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "idx");
}

static int group_teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

static const char *fpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* Write raw bytes to path, gzip-compressed if gz. */
static void write_bytes(const char *path, int gz, const uint8_t *p, size_t n) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        if (n) assert_int_equal(gzwrite(f, p, (unsigned)n), (int)n);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (n) assert_int_equal(fwrite(p, 1, n, f), n);
        assert_int_equal(fclose(f), 0);
    }
}

/* IDX file: magic 00 00 <type> <ndim>, big-endian dims, then data_len bytes of data. */
static void write_idx(const char *path, int gz, uint8_t type, int ndim, const uint32_t *dims,
                      const uint8_t *data, size_t data_len) {
    size_t hn = 4 + 4 * (size_t)ndim;
    uint8_t *buf = malloc(hn + data_len + 1);
    assert_non_null(buf);
    buf[0] = 0; buf[1] = 0; buf[2] = type; buf[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        buf[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        buf[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        buf[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        buf[7 + 4 * i] = (uint8_t)dims[i];
    }
    if (data_len) memcpy(buf + hn, data, data_len);
    write_bytes(path, gz, buf, hn + data_len);
    free(buf);
}

static uint8_t *pattern(size_t n) {
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) { x = x * 1103515245u + 12345u; p[i] = (uint8_t)(x >> 16); }
    return p;
}

static void assert_msg_has(const char *needle) {
    const char *m = dt_error_message();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" lacks \"%s\"", m, needle);
}

/* ---- IDX reader ---- */

static void test_idx_raw_images(void **state) {
    (void)state;
    uint32_t dims[3] = {5, 3, 4};
    uint8_t *data = pattern(60);
    const char *p = fpath("raw3.idx");
    write_idx(p, 0, 0x08, 3, dims, data, 60);
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_OK);
    assert_int_equal(x.ndim, 3);
    assert_int_equal(x.count, 5);
    assert_int_equal(x.dims[1], 3);
    assert_int_equal(x.dims[2], 4);
    assert_int_equal(x.item_size, 12);
    assert_memory_equal(x.data, data, 60);
    dt_idx_free(&x);
    assert_null(x.data);
    free(data);
}

static void test_idx_gz_labels(void **state) {
    (void)state;
    uint32_t dims[1] = {1000};
    uint8_t *data = pattern(1000);
    const char *p = fpath("labels.idx.gz");
    write_idx(p, 1, 0x08, 1, dims, data, 1000);
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_OK);
    assert_int_equal(x.ndim, 1);
    assert_int_equal(x.count, 1000);
    assert_int_equal(x.item_size, 1);
    assert_memory_equal(x.data, data, 1000);
    dt_idx_free(&x);
    free(data);
}

static void test_idx_gz_4d(void **state) {
    (void)state;
    uint32_t dims[4] = {2, 3, 4, 5};
    uint8_t *data = pattern(120);
    const char *p = fpath("four.idx.gz");
    write_idx(p, 1, 0x08, 4, dims, data, 120);
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_OK);
    assert_int_equal(x.ndim, 4);
    assert_int_equal(x.count, 2);
    assert_int_equal(x.item_size, 60);
    assert_memory_equal(x.data, data, 120);
    dt_idx_free(&x);
    free(data);
}

static void test_idx_truncated_data(void **state) {
    (void)state;
    uint32_t dims[3] = {100, 28, 28};   /* claims 78400 bytes */
    uint8_t *data = pattern(1000);
    for (int gz = 0; gz < 2; gz++) {
        const char *p = fpath(gz ? "trunc.idx.gz" : "trunc.idx");
        write_idx(p, gz, 0x08, 3, dims, data, 1000);
        dt_idx x;
        dt_error_clear();
        assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
        assert_null(x.data);
        assert_msg_has(p);
        assert_msg_has("truncated: expected 78400 bytes of data, got 1000");
    }
    free(data);
}

static void test_idx_truncated_gzip_stream(void **state) {
    (void)state;
    uint32_t dims[1] = {200000};
    uint8_t *data = pattern(200000);   /* incompressible, so cutting the file cuts the data */
    const char *p = fpath("cut.idx.gz");
    write_idx(p, 1, 0x08, 1, dims, data, 200000);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size / 2), 0);
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_null(x.data);
    assert_msg_has(p);
    assert_msg_has("truncated");
    free(data);
}

static void test_idx_corrupt_gzip_crc(void **state) {
    (void)state;
    uint32_t dims[1] = {4096};
    uint8_t *data = pattern(4096);
    const char *p = fpath("crc.idx.gz");
    write_idx(p, 1, 0x08, 1, dims, data, 4096);
    /* gzip trailer = CRC32 (4 bytes) + ISIZE (4 bytes): flip a CRC byte */
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -8, SEEK_END), 0);
    int c = fgetc(f);
    assert_int_not_equal(c, EOF);
    assert_int_equal(fseek(f, -8, SEEK_END), 0);
    fputc(c ^ 0xff, f);
    assert_int_equal(fclose(f), 0);
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_null(x.data);
    assert_msg_has("corrupt gzip stream");
    /* path named once, not repeated from zlib's own message */
    const char *m = dt_error_message();
    assert_null(strstr(m + strlen(p), p));
    free(data);
}

static void test_idx_bad_magic(void **state) {
    (void)state;
    const uint8_t junk[16] = {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 4, 1, 2, 3, 4};
    const char *p = fpath("magic.idx");
    write_bytes(p, 0, junk, 12);
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has(p);
    assert_msg_has("bad magic");

    /* right zeros, wrong element type (0x0D = float32) */
    uint32_t dims[1] = {4};
    write_idx(p, 0, 0x0D, 1, dims, junk, 16);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("element type 0x0d");
}

static void test_idx_bad_ndim(void **state) {
    (void)state;
    uint32_t dims[5] = {1, 1, 1, 1, 1};
    const uint8_t one = 7;
    const char *p = fpath("ndim.idx");
    dt_idx x;
    write_idx(p, 0, 0x08, 0, dims, &one, 1);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("ndim 0");
    write_idx(p, 0, 0x08, 5, dims, &one, 1);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("ndim 5");
}

static void test_idx_short_header(void **state) {
    (void)state;
    const char *p = fpath("short.idx");
    const uint8_t two[2] = {0, 0};
    dt_idx x;
    write_bytes(p, 0, two, 2);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("too short");
    /* magic declares 3 dims but only one follows */
    const uint8_t h[8] = {0, 0, 8, 3, 0, 0, 0, 9};
    write_bytes(p, 0, h, 8);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("truncated");
    /* empty file */
    write_bytes(p, 0, h, 0);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
}

static void test_idx_dims_overflow_and_zero(void **state) {
    (void)state;
    const char *p = fpath("huge.idx.gz");
    uint32_t dims[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    const uint8_t d[4] = {1, 2, 3, 4};
    dt_idx x;
    write_idx(p, 1, 0x08, 4, dims, d, 4);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("overflow");
    assert_null(x.data);

    uint32_t zd[3] = {4, 0, 28};
    write_idx(p, 1, 0x08, 3, zd, d, 4);
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("dimension 1 is zero");
}

static void test_idx_trailing_rejected(void **state) {
    (void)state;
    uint32_t dims[1] = {4};
    const uint8_t d[5] = {1, 2, 3, 4, 5};   /* one byte more than declared */
    const char *p = fpath("trail.idx");
    write_idx(p, 0, 0x08, 1, dims, d, 5);
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_EFORMAT);
    assert_msg_has("trailing");
}

static void test_idx_missing_file(void **state) {
    (void)state;
    const char *p = fpath("does-not-exist.gz");
    dt_idx x;
    assert_int_equal(dt_idx_load(p, &x), DT_EIO);
    assert_msg_has(p);
}

/* ---- Fashion-MNIST over synthetic fixtures ---- */

/* Writes <sub>/<prefix>-{images,labels}-*.gz with n images of 28x28. */
static void write_fmnist(const char *sub, const char *prefix, int gz, uint32_t n_img, uint32_t n_lab,
                         const uint8_t *px, const uint8_t *labels) {
    char d[512], p[600];
    snprintf(d, sizeof d, "%s/%s", g_dir, sub);
    mkdir(d, 0755);
    uint32_t idims[3] = {n_img, 28, 28}, ldims[1] = {n_lab};
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", d, prefix, gz ? ".gz" : "");
    write_idx(p, gz, 0x08, 3, idims, px, (size_t)n_img * 784);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", d, prefix, gz ? ".gz" : "");
    write_idx(p, gz, 0x08, 1, ldims, labels, n_lab);
}

static void test_fmnist_synthetic(void **state) {
    (void)state;
    uint8_t *px = pattern(3 * 784);
    px[0] = 0;
    px[1] = 255;
    const uint8_t labels[3] = {9, 0, 4};
    write_fmnist("fm_ok", "t10k", 1, 3, 3, px, labels);
    dt_image_dataset ds;
    assert_int_equal(dt_fashion_mnist_load(fpath("fm_ok"), "test", &ds), DT_OK);
    assert_int_equal(ds.count, 3);
    assert_int_equal(ds.rows, 28);
    assert_int_equal(ds.cols, 28);
    assert_int_equal(ds.n_classes, 10);
    /* the file's bytes are kept as they are */
    assert_memory_equal(ds.pixels, px, 3 * 784);
    assert_int_equal(ds.labels[0], 9);
    assert_int_equal(ds.labels[2], 4);

    /* dt_image_batch gathers the requested samples in order, normalised */
    int64_t idx[3] = {2, 0, 1};
    float x[3 * 784];
    int32_t y[3];
    dt_image_batch(&ds, idx, 3, x, y);
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 784; i++) {
            float want = ((float)px[idx[s] * 784 + i] / 255.0f - 0.2860f) / 0.3530f;
            assert_float_equal(x[s * 784 + i], want, 1e-5);
        }
    assert_float_equal(x[784], -0.2860f / 0.3530f, 1e-5);          /* sample 0, pixel 0: 0 */
    assert_float_equal(x[785], (1.0f - 0.2860f) / 0.3530f, 1e-5);   /* sample 0, pixel 1: 255 */
    assert_int_equal(y[0], 4);
    assert_int_equal(y[1], 9);
    assert_int_equal(y[2], 0);
    /* labels only */
    int32_t y2[1];
    dt_image_batch(&ds, idx, 1, NULL, y2);
    assert_int_equal(y2[0], 4);
    dt_image_dataset_free(&ds);
    assert_null(ds.pixels);
    free(px);
}

static void test_fmnist_raw_fallback(void **state) {
    (void)state;
    uint8_t *px = pattern(2 * 784);
    const uint8_t labels[2] = {1, 2};
    write_fmnist("fm_raw", "train", 0, 2, 2, px, labels);
    dt_image_dataset ds;
    assert_int_equal(dt_fashion_mnist_load(fpath("fm_raw"), "train", &ds), DT_OK);
    assert_int_equal(ds.count, 2);
    assert_int_equal(ds.labels[1], 2);
    dt_image_dataset_free(&ds);
    free(px);
}

static void test_fmnist_count_mismatch(void **state) {
    (void)state;
    uint8_t *px = pattern(3 * 784);
    const uint8_t labels[2] = {1, 2};
    write_fmnist("fm_cnt", "t10k", 1, 3, 2, px, labels);
    dt_image_dataset ds;
    assert_int_equal(dt_fashion_mnist_load(fpath("fm_cnt"), "test", &ds), DT_EFORMAT);
    assert_null(ds.pixels);
    assert_msg_has("count mismatch");
    assert_msg_has("t10k-labels-idx1-ubyte.gz");
    free(px);
}

static void test_fmnist_bad_label(void **state) {
    (void)state;
    uint8_t *px = pattern(2 * 784);
    const uint8_t labels[2] = {3, 10};
    write_fmnist("fm_lab", "t10k", 1, 2, 2, px, labels);
    dt_image_dataset ds;
    assert_int_equal(dt_fashion_mnist_load(fpath("fm_lab"), "test", &ds), DT_EFORMAT);
    assert_msg_has("label 10 at index 1");
    free(px);
}

static void test_fmnist_corrupt_files(void **state) {
    (void)state;
    uint8_t *px = pattern(4 * 784);
    const uint8_t labels[4] = {0, 1, 2, 3};
    dt_image_dataset ds;
    char p[600];

    /* images file cut short (gzip of a header claiming 4 images, 1 present) */
    write_fmnist("fm_trunc", "t10k", 1, 4, 4, px, labels);
    snprintf(p, sizeof p, "%s/fm_trunc/t10k-images-idx3-ubyte.gz", g_dir);
    uint32_t idims[3] = {4, 28, 28};
    write_idx(p, 1, 0x08, 3, idims, px, 784);
    assert_int_equal(dt_fashion_mnist_load(fpath("fm_trunc"), "test", &ds), DT_EFORMAT);
    assert_msg_has("t10k-images-idx3-ubyte.gz: truncated: expected 3136 bytes of data, got 784");

    /* labels file with bad magic */
    write_fmnist("fm_magic", "t10k", 1, 4, 4, px, labels);
    snprintf(p, sizeof p, "%s/fm_magic/t10k-labels-idx1-ubyte.gz", g_dir);
    const uint8_t junk[12] = {'P', 'K', 3, 4, 0, 0, 0, 4, 0, 1, 2, 3};
    write_bytes(p, 1, junk, 12);
    assert_int_equal(dt_fashion_mnist_load(fpath("fm_magic"), "test", &ds), DT_EFORMAT);
    assert_msg_has("t10k-labels-idx1-ubyte.gz: bad magic");

    /* images stored as a 1-D file */
    write_fmnist("fm_dims", "t10k", 1, 4, 4, px, labels);
    snprintf(p, sizeof p, "%s/fm_dims/t10k-images-idx3-ubyte.gz", g_dir);
    uint32_t flat[1] = {4 * 784};
    write_idx(p, 1, 0x08, 1, flat, px, 4 * 784);
    assert_int_equal(dt_fashion_mnist_load(fpath("fm_dims"), "test", &ds), DT_EFORMAT);
    assert_msg_has("expected 3 dims");
    free(px);
}

static void test_fmnist_bad_args(void **state) {
    (void)state;
    dt_image_dataset ds;
    assert_int_equal(dt_fashion_mnist_load(g_dir, "valid", &ds), DT_EINVAL);
    assert_msg_has("valid");
    assert_int_equal(dt_fashion_mnist_load(g_dir, NULL, &ds), DT_EINVAL);
    /* empty dir: files missing -> I/O error naming the file */
    assert_int_equal(dt_fashion_mnist_load(g_dir, "train", &ds), DT_EIO);
    assert_msg_has("train-images-idx3-ubyte");
}

/* ---- real data ---- */

static void test_fmnist_real_test_split(void **state) {
    (void)state;
    char probe[512];
    snprintf(probe, sizeof probe, "%s/t10k-images-idx3-ubyte.gz", DT_FASHION_MNIST_DIR);
    if (access(probe, R_OK) != 0) skip();
    dt_image_dataset ds;
    if (dt_fashion_mnist_load(NULL, "test", &ds) != DT_OK) fail_msg("%s", dt_error_message());
    assert_int_equal(ds.count, 10000);
    assert_int_equal(ds.rows, 28);
    assert_int_equal(ds.cols, 28);
    /* Fashion-MNIST test split: exactly 1000 of each class */
    int hist[10] = {0};
    for (int64_t i = 0; i < ds.count; i++) {
        assert_in_range(ds.labels[i], 0, 9);
        hist[ds.labels[i]]++;
    }
    for (int c = 0; c < 10; c++) assert_int_equal(hist[c], 1000);
    /* normalised with the dataset's own stats: mean ~0, std ~1, range [-0.81, 2.02] */
    double s = 0, s2 = 0, lo = 1e9, hi = -1e9;
    int64_t np = ds.count * 784;
    float *x = malloc((size_t)np * sizeof *x);
    int64_t *all = malloc((size_t)ds.count * sizeof *all);
    assert_non_null(x);
    assert_non_null(all);
    for (int64_t i = 0; i < ds.count; i++) all[i] = i;
    dt_image_batch(&ds, all, ds.count, x, NULL);
    for (int64_t i = 0; i < np; i++) {
        double v = x[i];
        s += v; s2 += v * v;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    free(x);
    free(all);
    double mean = s / (double)np, sd = sqrt(s2 / (double)np - mean * mean);
    assert_true(fabs(mean) < 0.02);
    assert_true(fabs(sd - 1.0) < 0.02);
    assert_float_equal(lo, -0.2860 / 0.3530, 1e-4);
    assert_float_equal(hi, (1.0 - 0.2860) / 0.3530, 1e-4);
    dt_image_dataset_free(&ds);
}

static void test_fmnist_real_train_split(void **state) {
    (void)state;
    char probe[512];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", DT_FASHION_MNIST_DIR);
    if (access(probe, R_OK) != 0) skip();
    dt_image_dataset ds;
    if (dt_fashion_mnist_load(DT_FASHION_MNIST_DIR, "train", &ds) != DT_OK) fail_msg("%s", dt_error_message());
    assert_int_equal(ds.count, 60000);
    int hist[10] = {0};
    for (int64_t i = 0; i < ds.count; i++) {
        assert_in_range(ds.labels[i], 0, 9);
        hist[ds.labels[i]]++;
    }
    for (int c = 0; c < 10; c++) assert_int_equal(hist[c], 6000);
    dt_image_dataset_free(&ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_raw_images),
        cmocka_unit_test(test_idx_gz_labels),
        cmocka_unit_test(test_idx_gz_4d),
        cmocka_unit_test(test_idx_truncated_data),
        cmocka_unit_test(test_idx_truncated_gzip_stream),
        cmocka_unit_test(test_idx_corrupt_gzip_crc),
        cmocka_unit_test(test_idx_bad_magic),
        cmocka_unit_test(test_idx_bad_ndim),
        cmocka_unit_test(test_idx_short_header),
        cmocka_unit_test(test_idx_dims_overflow_and_zero),
        cmocka_unit_test(test_idx_trailing_rejected),
        cmocka_unit_test(test_idx_missing_file),
        cmocka_unit_test(test_fmnist_synthetic),
        cmocka_unit_test(test_fmnist_raw_fallback),
        cmocka_unit_test(test_fmnist_count_mismatch),
        cmocka_unit_test(test_fmnist_bad_label),
        cmocka_unit_test(test_fmnist_corrupt_files),
        cmocka_unit_test(test_fmnist_bad_args),
        cmocka_unit_test(test_fmnist_real_test_split),
        cmocka_unit_test(test_fmnist_real_train_split),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
