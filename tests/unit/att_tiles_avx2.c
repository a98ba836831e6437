/* att_tiles.h as a build without AVX-512 compiles it (att_tiles_variant.h) */
#if defined(__AVX512F__)
#error "att_tiles_avx2.c must be compiled without AVX-512 (cmake/tests.cmake)"
#endif
#define ATT_VARIANT(name) avx2_##name
#include "att_tiles_variant.h"
