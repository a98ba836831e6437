/* att_tiles.h as a build without AVX-512 compiles it (att_tiles_variant.h) */
#define ATT_VARIANT(name) avx2_##name
#include "att_tiles_variant.h"
