/* att_tiles.h as a build without AVX compiles it (att_tiles_variant.h) */
#if defined(__AVX__)
#error "att_tiles_scalar.c must be compiled without AVX (cmake/tests.cmake)"
#endif
#define ATT_VARIANT(name) scalar_##name
#include "att_tiles_variant.h"
