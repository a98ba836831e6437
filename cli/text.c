/* Text from files (tensor names, metadata, file names) as the CLI shows it:
 * UTF-8 checked strictly, and escaped for a terminal (text.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "text.h"

int dt_cli_utf8_len(const unsigned char *s) {
    int n;
    unsigned cp;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) { n = 2; cp = s[0] & 0x1fu; }
    else if (s[0] >= 0xe0 && s[0] <= 0xef) { n = 3; cp = s[0] & 0x0fu; }
    else if (s[0] >= 0xf0 && s[0] <= 0xf4) { n = 4; cp = s[0] & 0x07u; }
    else return 0;
    for (int i = 1; i < n; i++) {   /* (a NUL stops here: it is no continuation byte) */
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;   /* overlong, too large */
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff) return 0;
    return n;
}

char *dt_cli_escape(const char *s) {
    size_t n = strlen(s);
    char *out = malloc(4 * n + 1), *o = out;   /* (at most \xNN per byte) */
    if (!out) return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int u = *p >= 0x80 ? dt_cli_utf8_len(p) : 0;
        if (*p == '\\') {
            *o++ = '\\';
            *o++ = '\\';
            p++;
        } else if (*p >= 0x20 && *p < 0x7f) {
            *o++ = (char)*p++;
        } else if (u > 0 && !(u == 2 && p[0] == 0xc2 && p[1] < 0xa0)) {   /* (U+0080..009F: C1 controls) */
            memcpy(o, p, (size_t)u);
            o += u;
            p += u;
        } else if (u == 2) {   /* a C1 control: its code point */
            o += sprintf(o, "\\u%04x", (unsigned)p[1]);
            p += 2;
        } else {
            o += sprintf(o, "\\x%02x", (unsigned)*p++);
        }
    }
    *o = 0;
    return out;
}
