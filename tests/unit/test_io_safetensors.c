/* safetensors: round trips, hand-built files, corrupt-file rejection,
 * writer validation and the streaming writer. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <zlib.h>
#include "dtrain/io.h"
#include "tmpdir.h"

/* ---- helpers ---- */

static char g_dir[64];

static int setup_dir(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "io_safetensors");
}

static int teardown_dir(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

static const char *path_in(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static int count_temp_files(void) {
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A safetensors file built by hand per the spec: u64 LE length (declared),
 * header bytes, data bytes. Independent of the library's writer. */
static void write_raw(const char *path, uint64_t declared, const char *hdr, size_t hlen,
                      const unsigned char *data, size_t dlen) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 8; i++) fputc((int)((declared >> (8 * i)) & 0xFF), f);
    assert_int_equal(fwrite(hdr, 1, hlen, f), hlen);
    if (dlen) assert_int_equal(fwrite(data, 1, dlen, f), dlen);
    assert_int_equal(fclose(f), 0);
}

static void write_hdr(const char *path, const char *hdr, size_t dlen) {
    unsigned char data[512];
    assert_true(dlen <= sizeof data);
    for (size_t i = 0; i < dlen; i++) data[i] = (unsigned char)(0x41 + i % 26);
    write_raw(path, strlen(hdr), hdr, strlen(hdr), data, dlen);
}

/* Load must fail with DT_EFORMAT, leave st zeroed, and mention the file
 * and each of the given substrings. */
static void expect_format_error(const char *path, const char *s1, const char *s2) {
    dt_safetensors st;
    memset(&st, 0x5A, sizeof st);
    dt_status s = dt_safetensors_load(path, &st);
    const char *msg = dt_error_message();
    if (s != DT_EFORMAT || !strstr(msg, path) || (s1 && !strstr(msg, s1)) ||
        (s2 && !strstr(msg, s2)))
        print_error("status %d, message: %s (wanted '%s', '%s')\n", (int)s, msg,
                    s1 ? s1 : "", s2 ? s2 : "");
    assert_int_equal(s, DT_EFORMAT);
    assert_non_null(strstr(msg, path));
    if (s1) assert_non_null(strstr(msg, s1));
    if (s2) assert_non_null(strstr(msg, s2));
    assert_null(st.tensors);
    assert_null(st.file_bytes);
    assert_int_equal(st.n_tensors, 0);
}

static void fill_pattern(void *p, size_t n, unsigned seed) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed + i * 37u + (i >> 3) * 11u);
}

static uint64_t rd_u64le(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

/* ---- round trips ---- */

static void test_roundtrip_dtypes(void **state) {
    (void)state;
    float a[6];
    uint32_t bits[6] = {0x3f800000u, 0x80000000u /* -0 */, 0x7fc12345u /* NaN payload */,
                        0x00000001u /* denormal */, 0x7f800000u /* inf */, 0xc0490fdbu};
    memcpy(a, bits, sizeof a);
    float s0 = 42.5f;
    uint16_t bf[12], h[3], h0 = 0x3c00;
    fill_pattern(bf, sizeof bf, 5);
    fill_pattern(h, sizeof h, 9);
    dt_st_entry e[] = {
        {"a", DT_F32, 2, {2, 3}, a},
        {"scalar.f32", DT_F32, 0, {0}, &s0},
        {"empty", DT_F32, 2, {0, 5}, NULL},
        {"b.4d", DT_BF16, 4, {2, 1, 3, 2}, bf},
        {"h", DT_F16, 1, {3}, h},
        {"h.scalar", DT_F16, 0, {0}, &h0},
    };
    const char *p = path_in("rt.safetensors");
    assert_int_equal(dt_safetensors_write(p, e, 6, NULL, 0), DT_OK);
    assert_int_equal(count_temp_files(), 0);

    /* Raw layout: 8 + N is 8-aligned, header padded with spaces, valid JSON. */
    size_t fsz;
    unsigned char *raw = read_all(p, &fsz);
    assert_non_null(raw);
    uint64_t n = rd_u64le(raw);
    assert_int_equal((8 + n) % 8, 0);
    assert_int_equal(fsz, 8 + n + sizeof a + 4 + sizeof bf + sizeof h + 2);
    char *hdr = malloc(n + 1);
    memcpy(hdr, raw + 8, n);
    hdr[n] = 0;
    cJSON *root = cJSON_Parse(hdr);
    assert_non_null(root);
    cJSON *ja = cJSON_GetObjectItemCaseSensitive(root, "b.4d");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(ja, "dtype")->valuestring, "BF16");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(ja, "data_offsets");
    assert_int_equal(cJSON_GetArrayItem(offs, 0)->valueint, 28);
    assert_int_equal(cJSON_GetArrayItem(offs, 1)->valueint, 52);
    /* the only metadata: each tensor's zlib CRC-32 as 8 hex digits */
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    assert_int_equal(cJSON_GetArraySize(meta), 6);
    for (int i = 0; i < 6; i++) {
        char key[64], want[16];
        snprintf(key, sizeof key, "crc32.%s", e[i].name);
        int64_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++) numel *= e[i].shape[d];
        uLong c = crc32(0L, e[i].data, (uInt)((size_t)numel * dt_dtype_size(e[i].dtype)));
        snprintf(want, sizeof want, "%08lx", (unsigned long)c);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
        assert_true(cJSON_IsString(v));
        assert_string_equal(v->valuestring, want);
    }
    cJSON_Delete(root);
    free(hdr);
    free(raw);

    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
    assert_int_equal(st.n_tensors, 6);
    assert_string_equal(st.path, p);
    for (int i = 0; i < 6; i++) {
        const dt_st_tensor *t = dt_safetensors_find(&st, e[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, e[i].dtype);
        assert_int_equal(t->ndim, e[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++) {
            assert_int_equal(t->shape[d], e[i].shape[d]);
            numel *= e[i].shape[d];
        }
        assert_int_equal(t->nbytes, (size_t)numel * dt_dtype_size(e[i].dtype));
        if (t->nbytes) assert_memory_equal(t->data, e[i].data, t->nbytes);
        if (t->dtype == DT_F32) assert_int_equal((uintptr_t)t->data % 4, 0);
    }
    const dt_st_tensor *ta = dt_safetensors_find(&st, "a");
    assert_int_equal((uintptr_t)ta->data % 64, 0);
    const float *fa = ta->data;
    assert_true(fa[0] == 1.0f);
    assert_true(dt_safetensors_find(&st, "scalar.f32")->shape[0] == 1);
    assert_true(*(const float *)dt_safetensors_find(&st, "scalar.f32")->data == 42.5f);
    assert_null(dt_safetensors_find(&st, "nope"));
    assert_null(dt_safetensors_meta(&st, "anything"));
    assert_true(dt_safetensors_find(&st, "a")->has_crc);
    dt_safetensors_free(&st);
    assert_null(st.tensors);
}

static void test_metadata_roundtrip(void **state) {
    (void)state;
    float w[4] = {1, 2, 3, 4};
    dt_st_entry e = {"w", DT_F32, 1, {4}, w};
    dt_st_meta m[] = {{"step", "1200"}, {"format", "pt"}, {"quote\"d\\key", "line\nbreak\t\"q\""},
                      {"utf8", "h\xc3\xa9llo \xe2\x82\xac"}, {"empty", ""}};
    const char *p = path_in("meta.safetensors");
    assert_int_equal(dt_safetensors_write(p, &e, 1, m, 5), DT_OK);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
    assert_int_equal(st.n_meta, 5 + 1);   /* + crc32.w */
    for (int i = 0; i < 5; i++) {
        const char *v = dt_safetensors_meta(&st, m[i].key);
        assert_non_null(v);
        assert_string_equal(v, m[i].value);
    }
    assert_null(dt_safetensors_meta(&st, "w"));
    assert_null(dt_safetensors_meta(&st, "missing"));
    dt_safetensors_free(&st);
}

static void test_empty_file(void **state) {
    (void)state;
    const char *p = path_in("empty.safetensors");
    assert_int_equal(dt_safetensors_write(p, NULL, 0, NULL, 0), DT_OK);
    size_t n;
    unsigned char *raw = read_all(p, &n);
    assert_int_equal(n, 8 + rd_u64le(raw));
    free(raw);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
    assert_int_equal(st.n_tensors, 0);
    dt_safetensors_free(&st);
}

/* File assembled byte by byte per the spec, with every header-length
 * alignment (the data section is not 8-aligned in the file for k != 0). */
static void test_handwritten_file(void **state) {
    (void)state;
    const char *body =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]},"
        "\"w.f32\":{\"shape\":[1,2],\"dtype\":\"F32\",\"data_offsets\":[0,8]}}";
    const unsigned char data[14] = {0x00, 0x00, 0x80, 0x3F,  /* 1.0f */
                                    0x00, 0x00, 0x20, 0xC0,  /* -2.5f */
                                    0x80, 0x3F,              /* bf16 1.0 */
                                    0x00, 0xC0,              /* bf16 -2.0 */
                                    0x00, 0x3F};             /* bf16 0.5 */
    const char *p = path_in("hand.safetensors");
    for (int k = 0; k < 8; k++) {
        char hdr[512];
        size_t hl = (size_t)snprintf(hdr, sizeof hdr, "%s%*s", body, k, "");
        write_raw(p, hl, hdr, hl, data, sizeof data);
        dt_safetensors st;
        assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
        assert_int_equal(st.n_tensors, 2);
        assert_string_equal(dt_safetensors_meta(&st, "format"), "pt");
        const dt_st_tensor *f = NULL, *b = NULL;
        int64_t sf[2] = {1, 2}, sb[1] = {3};
        assert_int_equal(dt_safetensors_expect(&st, "w.f32", DT_F32, 2, sf, &f), DT_OK);
        assert_int_equal(dt_safetensors_expect(&st, "w.bf16", DT_BF16, 1, sb, &b), DT_OK);
        assert_int_equal(f->nbytes, 8);
        assert_int_equal(b->nbytes, 6);
        assert_int_equal((uintptr_t)f->data % 4, 0);
        const float *fv = f->data;
        assert_true(fv[0] == 1.0f && fv[1] == -2.5f);
        uint16_t hv[3];
        memcpy(hv, b->data, sizeof hv);
        assert_true(dt_bf16_to_f32(hv[0]) == 1.0f);
        assert_true(dt_bf16_to_f32(hv[1]) == -2.0f);
        assert_true(dt_bf16_to_f32(hv[2]) == 0.5f);
        assert_ptr_equal((const unsigned char *)b->data, (const unsigned char *)f->data + 8);
        dt_safetensors_free(&st);
    }
}

/* ---- corrupt files ---- */

static void test_corrupt_truncated(void **state) {
    (void)state;
    float w[16];
    uint16_t g[6];
    fill_pattern(w, sizeof w, 1);
    fill_pattern(g, sizeof g, 2);
    dt_st_entry e[] = {{"w", DT_F32, 2, {4, 4}, w}, {"g", DT_BF16, 1, {6}, g}};
    const char *good = path_in("good.safetensors");
    assert_int_equal(dt_safetensors_write(good, e, 2, NULL, 0), DT_OK);
    size_t n;
    unsigned char *raw = read_all(good, &n);
    size_t hn = (size_t)rd_u64le(raw);
    size_t cuts[] = {0, 1, 7, 8, 9, 8 + hn / 2, 8 + hn - 1, 8 + hn, 8 + hn + 3, n - 1};
    const char *p = path_in("trunc.safetensors");
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_bytes(p, raw, cuts[i]);
        expect_format_error(p, NULL, NULL);
    }
    /* Cut inside the data section: the message names the tensor at fault. */
    write_bytes(p, raw, n - 1);
    expect_format_error(p, "'g'", "out of range");
    free(raw);
}

static void test_corrupt_header_length(void **state) {
    (void)state;
    float w[4] = {1, 2, 3, 4};
    dt_st_entry e = {"w", DT_F32, 1, {4}, w};
    const char *good = path_in("good2.safetensors");
    assert_int_equal(dt_safetensors_write(good, &e, 1, NULL, 0), DT_OK);
    size_t n;
    unsigned char *raw = read_all(good, &n);
    uint64_t hn = rd_u64le(raw);
    uint64_t bad[] = {0, 1, hn - 1, hn + 1, hn + 8, n - 8 + 1, n, UINT64_MAX, hn ^ (1ull << 40),
                      hn ^ (1ull << 63)};
    const char *p = path_in("hlen.safetensors");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int b = 0; b < 8; b++) raw[b] = (unsigned char)(bad[i] >> (8 * b));
        write_bytes(p, raw, n);
        expect_format_error(p, NULL, NULL);
    }
    for (int b = 0; b < 8; b++) raw[b] = (unsigned char)(hn >> (8 * b));
    write_bytes(p, raw, n);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);   /* control: restored is fine */
    dt_safetensors_free(&st);
    free(raw);
}

typedef struct bad_case { const char *hdr; size_t dlen; const char *s1, *s2; } bad_case;

static void test_corrupt_headers(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "JSON", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, "JSON", NULL},
        {"", 0, "JSON", NULL},
        {"[1,2]", 0, "not a JSON object", NULL},
        {"{\"a\":5}", 0, "'a'", "not a JSON object"},
        /* overlapping / gaps / uncovered bytes */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "'b'", "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, "'z'", "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, "'b'", "gap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "'a'", "uncovered"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "'a'", "trailing"},
        {"{}", 4, "no tensors", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "'a'", "duplicate"},
        /* dtype */
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "'a'", "F64"},
        {"{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'a'", "dtype"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'a'", "dtype"},
        /* shape */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "'a'", "do not match"},
        {"{\"h.0.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[384,1152],"
         "\"data_offsets\":[0,100]}}", 100, "tensor 'h.0.attn.c_attn.weight': data_offsets [0, 100] "
         "do not match shape [384, 1152] F32 (1769472 bytes)", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'a'", "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":7,\"data_offsets\":[0,4]}}", 4, "'a'", "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "'a'", "rank 5"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "'a'", "negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "'a'", "integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "'a'", "integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
         "\"data_offsets\":[0,4]}}", 4, "'a'", "overflow"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, "'a'", "integer"},
        /* data_offsets */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'a'", "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "'a'", "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "'a'", "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "'a'", "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", 4, "'a'", "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "'a'", "out of range"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}", 8, "'a'", "out of range"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 4,
         "'a'", "data_offsets"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 6, "'b'", "multiple"},
        /* metadata */
        {"{\"__metadata__\":{\"k\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         4, "metadata 'k'", "not a string"},
        {"{\"__metadata__\":[1],\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "__metadata__", NULL},
        {"{\"__metadata__\":{},\"__metadata__\":{},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
         "\"data_offsets\":[0,4]}}", 4, "__metadata__", "duplicate"},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "'k'", "duplicate"},
        /* an escaped NUL: as a C string "a\u0000x" is "a", another tensor's name */
        {"{\"a\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "NUL", "\\u0000"},
        {"{\"__metadata__\":{\"step\":\"3\\u0000\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         4, "NUL", NULL},
    };
    const char *p = path_in("bad.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_hdr(p, cases[i].hdr, cases[i].dlen);
        expect_format_error(p, cases[i].s1, cases[i].s2);
    }
    /* A NUL byte inside the header. */
    const char nul_hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}\0  ";
    unsigned char d4[4] = {0};
    write_raw(p, sizeof nul_hdr - 1, nul_hdr, sizeof nul_hdr - 1, d4, 4);
    expect_format_error(p, "NUL", NULL);
    /* Control: a well-formed variant of the same header loads. */
    write_hdr(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
    dt_safetensors_free(&st);
    /* an escaped backslash before "u0000" is text, not a NUL: the name is a\u0000 */
    write_hdr(p, "{\"a\\\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
    assert_string_equal(st.tensors[0].name, "a\\u0000");
    dt_safetensors_free(&st);
}

/* Random byte flips and truncations: load never crashes, and either fails
 * with DT_EFORMAT or returns tensors that lie inside the file buffer. */
static void test_corrupt_random(void **state) {
    (void)state;
    float w[8];
    uint16_t g[5];
    fill_pattern(w, sizeof w, 4);
    fill_pattern(g, sizeof g, 6);
    dt_st_entry e[] = {{"w", DT_F32, 2, {2, 4}, w}, {"g", DT_BF16, 1, {5}, g}};
    dt_st_meta m[] = {{"k", "v"}};
    const char *good = path_in("fuzz_src.safetensors"), *p = path_in("fuzz.safetensors");
    assert_int_equal(dt_safetensors_write(good, e, 2, m, 1), DT_OK);
    size_t n;
    unsigned char *raw = read_all(good, &n);
    unsigned char *buf = malloc(n);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int rejected = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(buf, raw, n);
        size_t len = n;
        int flips = 1 + it % 3;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(rng >> 33) % n;
            buf[at] = (unsigned char)(rng >> 20);
        }
        if (it % 5 == 0) len = (size_t)(rng >> 40) % n;
        write_bytes(p, buf, len);
        dt_safetensors st;
        dt_status s = dt_safetensors_load(p, &st);
        assert_true(s == DT_OK || s == DT_EFORMAT);
        if (s != DT_OK) {
            assert_non_null(strstr(dt_error_message(), p));
            rejected++;
            continue;
        }
        const unsigned char *lo = st.file_bytes, *hi = lo + st.file_size;
        for (int i = 0; i < st.n_tensors; i++) {
            const unsigned char *d = st.tensors[i].data;
            assert_true(d >= lo && d + st.tensors[i].nbytes <= hi);
        }
        dt_safetensors_free(&st);
    }
    assert_true(rejected > 500);
    free(buf);
    free(raw);
}

static void test_missing_file(void **state) {
    (void)state;
    dt_safetensors st;
    const char *p = path_in("does-not-exist.safetensors");
    assert_int_equal(dt_safetensors_load(p, &st), DT_EIO);
    assert_non_null(strstr(dt_error_message(), p));
}

/* ---- expect ---- */

static void test_expect(void **state) {
    (void)state;
    float w[12];
    fill_pattern(w, sizeof w, 3);
    dt_st_entry e = {"wte.weight", DT_F32, 2, {3, 4}, w};
    const char *p = path_in("checkpoint.safetensors");
    assert_int_equal(dt_safetensors_write(p, &e, 1, NULL, 0), DT_OK);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
    const dt_st_tensor *out = NULL;
    int64_t ok_shape[2] = {3, 4}, wrong[2] = {4, 3}, flat[1] = {12};
    assert_int_equal(dt_safetensors_expect(&st, "wte.weight", DT_F32, 2, ok_shape, &out), DT_OK);
    assert_ptr_equal(out, dt_safetensors_find(&st, "wte.weight"));
    assert_memory_equal(out->data, w, sizeof w);

    assert_int_equal(dt_safetensors_expect(&st, "wte.weight", DT_F32, 2, wrong, &out), DT_EFORMAT);
    assert_null(out);
    assert_non_null(strstr(dt_error_message(), p));
    assert_non_null(strstr(dt_error_message(), "tensor 'wte.weight' has shape [3, 4], expected [4, 3]"));
    assert_int_equal(dt_safetensors_expect(&st, "wte.weight", DT_F32, 1, flat, NULL), DT_EFORMAT);
    assert_non_null(strstr(dt_error_message(), "expected [12]"));
    assert_int_equal(dt_safetensors_expect(&st, "wte.weight", DT_BF16, 2, ok_shape, NULL), DT_EFORMAT);
    assert_non_null(strstr(dt_error_message(), "'wte.weight' has dtype F32, expected BF16"));
    assert_int_equal(dt_safetensors_expect(&st, "lm_head.weight", DT_F32, 2, ok_shape, NULL),
                     DT_EFORMAT);
    char want[512];
    snprintf(want, sizeof want, "%s: missing tensor 'lm_head.weight'", p);
    assert_string_equal(dt_error_message(), want);
    dt_safetensors_free(&st);
}

/* ---- writer validation ---- */

static void expect_write_rejected(const dt_st_entry *e, int n, const dt_st_meta *m, int nm,
                                  const char *must) {
    const char *p = path_in("rejected.safetensors");
    assert_int_equal(dt_safetensors_write(p, e, n, m, nm), DT_EINVAL);
    if (!strstr(dt_error_message(), must)) print_error("message: %s\n", dt_error_message());
    assert_non_null(strstr(dt_error_message(), must));
    assert_int_equal(access(p, F_OK), -1);
    dt_st_writer *w = (dt_st_writer *)&w;
    assert_int_equal(dt_st_writer_open(&w, p, e, n, m, nm), DT_EINVAL);
    assert_null(w);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(count_temp_files(), 0);
}

static void test_writer_rejects(void **state) {
    (void)state;
    float f[4] = {0};
    uint16_t h[4] = {0};
    dt_st_entry dup[] = {{"x", DT_F32, 1, {1}, f}, {"y", DT_F32, 1, {1}, f}, {"x", DT_F32, 1, {1}, f}};
    expect_write_rejected(dup, 3, NULL, 0, "duplicate tensor name 'x'");
    dt_st_entry empty[] = {{"", DT_F32, 1, {1}, f}};
    expect_write_rejected(empty, 1, NULL, 0, "empty name");
    dt_st_entry null_name[] = {{NULL, DT_F32, 1, {1}, f}};
    expect_write_rejected(null_name, 1, NULL, 0, "empty name");
    dt_st_entry reserved[] = {{"__metadata__", DT_F32, 1, {1}, f}};
    expect_write_rejected(reserved, 1, NULL, 0, "__metadata__");
    dt_st_entry rank5[] = {{"r5", DT_F32, 5, {1, 1, 1, 1}, f}};
    expect_write_rejected(rank5, 1, NULL, 0, "'r5'");
    dt_st_entry neg[] = {{"neg", DT_F32, 1, {-1}, f}};
    expect_write_rejected(neg, 1, NULL, 0, "'neg'");
    dt_st_entry misalign[] = {{"h", DT_BF16, 1, {1}, h}, {"f", DT_F32, 1, {1}, f}};
    expect_write_rejected(misalign, 2, NULL, 0, "'f'");
    dt_st_entry baddtype[] = {{"d", (dt_dtype)7, 1, {1}, f}};
    expect_write_rejected(baddtype, 1, NULL, 0, "'d'");
    dt_st_entry badutf8[] = {{"bad\xff", DT_F32, 1, {1}, f}};
    expect_write_rejected(badutf8, 1, NULL, 0, "UTF-8");
    dt_st_entry ok[] = {{"ok", DT_F32, 1, {1}, f}};
    dt_st_meta dupm[] = {{"k", "1"}, {"k", "2"}};
    expect_write_rejected(ok, 1, dupm, 2, "duplicate metadata key 'k'");
    dt_st_meta nullm[] = {{"k", NULL}};
    expect_write_rejected(ok, 1, nullm, 1, "metadata");
    /* NULL data is only an error for the whole-file writer. */
    dt_st_entry nodata[] = {{"nd", DT_F32, 1, {2}, NULL}};
    const char *p = path_in("nodata.safetensors");
    assert_int_equal(dt_safetensors_write(p, nodata, 1, NULL, 0), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "'nd'"));
    assert_int_equal(access(p, F_OK), -1);
    /* Control: the aligned order of the misaligned pair is accepted. */
    dt_st_entry aligned[] = {{"f", DT_F32, 1, {1}, f}, {"h", DT_BF16, 1, {1}, h}};
    assert_int_equal(dt_safetensors_write(p, aligned, 2, NULL, 0), DT_OK);
}

/* ---- streaming writer ---- */

static void test_stream_matches_write(void **state) {
    (void)state;
    float a[10];
    uint16_t b[7], c[1];
    fill_pattern(a, sizeof a, 7);
    fill_pattern(b, sizeof b, 8);
    fill_pattern(c, sizeof c, 9);
    dt_st_entry e[] = {{"a", DT_F32, 2, {2, 5}, a}, {"b", DT_BF16, 1, {7}, b},
                       {"c", DT_F16, 0, {0}, c}};
    dt_st_meta m[] = {{"kind", "consolidated"}};
    const char *p1 = path_in("whole.safetensors"), *p2 = path_in("stream.safetensors");
    assert_int_equal(dt_safetensors_write(p1, e, 3, m, 1), DT_OK);

    dt_st_entry decl[3];
    memcpy(decl, e, sizeof decl);
    for (int i = 0; i < 3; i++) decl[i].data = NULL;   /* declaration only */
    dt_st_writer *w = NULL;
    assert_int_equal(dt_st_writer_open(&w, p2, decl, 3, m, 1), DT_OK);
    assert_non_null(w);
    assert_int_equal(count_temp_files(), 1);   /* temp lives next to the target */
    assert_int_equal(access(p2, F_OK), -1);    /* nothing at the target yet */
    unsigned char all[sizeof a + sizeof b + sizeof c];
    memcpy(all, a, sizeof a);
    memcpy(all + sizeof a, b, sizeof b);
    memcpy(all + sizeof a + sizeof b, c, sizeof c);
    for (size_t off = 0; off < sizeof all; off += 3) {
        size_t n = sizeof all - off < 3 ? sizeof all - off : 3;
        assert_int_equal(dt_st_writer_append(w, all + off, n), DT_OK);
    }
    assert_int_equal(dt_st_writer_append(w, all, 0), DT_OK);
    assert_int_equal(dt_st_writer_commit(w), DT_OK);
    assert_int_equal(count_temp_files(), 0);

    size_t n1, n2;
    unsigned char *r1 = read_all(p1, &n1), *r2 = read_all(p2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(r1, r2, n1);
    free(r1);
    free(r2);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p2, &st), DT_OK);
    assert_memory_equal(dt_safetensors_find(&st, "b")->data, b, sizeof b);
    assert_string_equal(dt_safetensors_meta(&st, "kind"), "consolidated");
    dt_safetensors_free(&st);
}

static void assert_file_is(const char *p, const unsigned char *want, size_t n) {
    size_t got_n;
    unsigned char *got = read_all(p, &got_n);
    assert_non_null(got);
    assert_int_equal(got_n, n);
    assert_memory_equal(got, want, n);
    free(got);
}

static void test_stream_failures_keep_old(void **state) {
    (void)state;
    const char *p = path_in("keep.safetensors");
    float old_w[3] = {7, 8, 9};
    dt_st_entry old_e = {"old", DT_F32, 1, {3}, old_w};
    assert_int_equal(dt_safetensors_write(p, &old_e, 1, NULL, 0), DT_OK);
    size_t old_n;
    unsigned char *old = read_all(p, &old_n);

    float x[8] = {0};
    dt_st_entry decl[] = {{"x", DT_F32, 1, {4}, NULL}, {"y", DT_F32, 1, {4}, NULL}};
    dt_st_writer *w;

    /* Commit with too few bytes: error naming the incomplete tensor. */
    assert_int_equal(dt_st_writer_open(&w, p, decl, 2, NULL, 0), DT_OK);
    assert_int_equal(dt_st_writer_append(w, x, 20), DT_OK);
    assert_int_equal(dt_st_writer_commit(w), DT_ESTATE);
    assert_non_null(strstr(dt_error_message(), p));
    assert_non_null(strstr(dt_error_message(), "'y'"));
    assert_file_is(p, old, old_n);
    assert_int_equal(count_temp_files(), 0);

    /* Nothing appended at all. */
    assert_int_equal(dt_st_writer_open(&w, p, decl, 2, NULL, 0), DT_OK);
    assert_int_equal(dt_st_writer_commit(w), DT_ESTATE);
    assert_non_null(strstr(dt_error_message(), "'x'"));
    assert_file_is(p, old, old_n);
    assert_int_equal(count_temp_files(), 0);

    /* Too many bytes: the append fails, and so does the commit. */
    assert_int_equal(dt_st_writer_open(&w, p, decl, 2, NULL, 0), DT_OK);
    assert_int_equal(dt_st_writer_append(w, x, 16), DT_OK);
    assert_int_equal(dt_st_writer_append(w, x, 20), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "exceeds"));
    assert_int_equal(dt_st_writer_append(w, x, 16), DT_ESTATE);
    assert_int_equal(dt_st_writer_commit(w), DT_ESTATE);
    assert_file_is(p, old, old_n);
    assert_int_equal(count_temp_files(), 0);

    /* Abort. */
    assert_int_equal(dt_st_writer_open(&w, p, decl, 2, NULL, 0), DT_OK);
    assert_int_equal(dt_st_writer_append(w, x, 32), DT_OK);
    dt_st_writer_abort(w);
    dt_st_writer_abort(NULL);
    assert_file_is(p, old, old_n);
    assert_int_equal(count_temp_files(), 0);

    /* Control: a complete stream replaces the old file. */
    assert_int_equal(dt_st_writer_open(&w, p, decl, 2, NULL, 0), DT_OK);
    assert_int_equal(dt_st_writer_append(w, x, 32), DT_OK);
    assert_int_equal(dt_st_writer_commit(w), DT_OK);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
    assert_null(dt_safetensors_find(&st, "old"));
    assert_non_null(dt_safetensors_find(&st, "y"));
    dt_safetensors_free(&st);
    assert_int_equal(count_temp_files(), 0);
    free(old);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_dtypes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_metadata_roundtrip, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_empty_file, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_handwritten_file, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_corrupt_truncated, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_corrupt_header_length, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_corrupt_headers, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_corrupt_random, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_missing_file, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_expect, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_writer_rejects, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stream_matches_write, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stream_failures_keep_old, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
