#include <stdint.h>
#include <stdlib.h>
#include "arena.h"
#include "dtrain/tensor.h"

#define DT_ARENA_MIN_BLOCK ((size_t)4 << 20)

static int add_block(dt_arena *a, size_t cap) {
    if (a->n_blocks == a->cap_blocks) {
        int nc = a->cap_blocks ? 2 * a->cap_blocks : 4;
        dt_arena_block *nb = realloc(a->blocks, (size_t)nc * sizeof *nb);
        if (!nb) return -1;
        a->blocks = nb;
        a->cap_blocks = nc;
    }
    char *base = dt_alloc(cap);
    if (!base) return -1;
    a->blocks[a->n_blocks++] = (dt_arena_block){base, cap, 0};
    return 0;
}

void *dt_arena_alloc(dt_arena *a, size_t bytes) {
    if (bytes > SIZE_MAX - 63) return NULL;   /* rounding up to 64 would wrap to a tiny block */
    size_t need = (bytes + 63) & ~(size_t)63;
    if (need == 0) need = 64;
    dt_arena_block *b = a->n_blocks ? &a->blocks[a->cur] : NULL;
    while (b && b->cap - b->used < need && a->cur + 1 < a->n_blocks) b = &a->blocks[++a->cur];   /* rewound: reuse */
    if (!b || b->cap - b->used < need) {
        size_t cap = need > DT_ARENA_MIN_BLOCK ? need : DT_ARENA_MIN_BLOCK;
        if (b && cap < b->cap * 2) cap = b->cap * 2;   /* geometric growth */
        if (add_block(a, cap) != 0) return NULL;
        a->cur = a->n_blocks - 1;
        b = &a->blocks[a->cur];
    }
    void *p = b->base + b->used;
    b->used += need;
    a->in_use += need;
    if (a->in_use > a->high_water) a->high_water = a->in_use;
    return p;
}

void dt_arena_reset(dt_arena *a) {
    if (a->n_blocks > 1) {   /* merge: one block big enough for the whole step */
        size_t total = 0;
        for (int i = 0; i < a->n_blocks; i++) { total += a->blocks[i].cap; dt_free(a->blocks[i].base); }
        a->n_blocks = 0;
        if (add_block(a, total) != 0) a->n_blocks = 0;   /* retried lazily on next alloc */
    }
    dt_arena_rewind(a);
}

void dt_arena_rewind(dt_arena *a) {
    for (int i = 0; i < a->n_blocks; i++) a->blocks[i].used = 0;
    a->cur = 0;
    a->in_use = 0;
}

void dt_arena_set_used(dt_arena *a, int n, const size_t *used) {
    dt_arena_rewind(a);
    for (int i = 0; i < n && i < a->n_blocks; i++) {
        a->blocks[i].used = used[i];
        a->in_use += used[i];
    }
    a->cur = n > 0 ? n - 1 : 0;
    if (a->in_use > a->high_water) a->high_water = a->in_use;
}

void dt_arena_free(dt_arena *a) {
    for (int i = 0; i < a->n_blocks; i++) dt_free(a->blocks[i].base);
    free(a->blocks);
    *a = (dt_arena){0};
}

int dt_arena_owns(const dt_arena *a, const void *p) {
    uintptr_t c = (uintptr_t)p;   /* integers: comparing pointers into different objects is undefined */
    for (int i = 0; i < a->n_blocks; i++) {
        uintptr_t b = (uintptr_t)a->blocks[i].base;
        if (c >= b && c - b < a->blocks[i].cap) return 1;
    }
    return 0;
}
