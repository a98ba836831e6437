#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tmpdir.h"

int dt_test_tmpdir(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "/tmp/dt_test_%s_XXXXXX", tag);
    return mkdtemp(buf) ? 0 : -1;
}

void dt_test_rm_rf(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (!S_ISDIR(sb.st_mode)) { unlink(path); return; }
    chmod(path, 0700);   /* a test may have left it read-only */
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char sub[1024];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            dt_test_rm_rf(sub);
        }
        closedir(d);
    }
    rmdir(path);
}
