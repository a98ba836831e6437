/* Per-tensor checksums: zlib's CRC-32 over a tensor's bytes, recorded as
 * metadata "crc32.<tensor>" so the file stays plain safetensors. */
#include <inttypes.h>
#include <zlib.h>
#include "st_internal.h"

uint32_t dt_st_crc_update(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = p;
    uLong c = crc;
    while (n > 0) {   /* zlib takes a uInt length */
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, b, k);
        b += k;
        n -= k;
    }
    return (uint32_t)c;
}

dt_status dt_st_crc_verify(const char *path, const char *name, uint32_t want, uint32_t got) {
    if (want == got) return DT_OK;
    return DT_ERR(DT_EFORMAT, "%s: tensor '%s': data checksum mismatch (CRC-32 of its bytes is %08" PRIx32
                  ", the header records %08" PRIx32 "): the file is corrupt", path, name, got, want);
}
