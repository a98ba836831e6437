/* dtrain CLI entry point (subcommands land in cli/cmd_*.c). */
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) { printf("usage: dtrain <train|eval> [options]\n"); return argc < 2; }
    fprintf(stderr, "dtrain: unknown command '%s'\n", argv[1]);
    return 2;
}
