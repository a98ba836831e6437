/* att_tiles.h as a build without AVX compiles it (att_tiles_variant.h) */
#define ATT_VARIANT(name) scalar_##name
#include "att_tiles_variant.h"
