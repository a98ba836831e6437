/* The library's own version (dtrain/version.h). */
#include "dtrain/version.h"

const char *dt_version(void) { return DTRAIN_VERSION; }
