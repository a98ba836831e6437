/* Per-graph parameter records, keyed by the dt_param pointer (linear probing). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

static unsigned slot_of(const dt_param *p, int n_slots) {
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;   /* murmur3 finaliser: spreads aligned pointers */
    h ^= h >> 33;
    return (unsigned)h & (unsigned)(n_slots - 1);
}

int dt_ptab_find(const dt_param_table *t, const dt_param *p) {
    if (!t->n_slots) return -1;
    for (unsigned s = slot_of(p, t->n_slots);; s = (s + 1) & (unsigned)(t->n_slots - 1)) {
        int v = t->slots[s];
        if (v == 0) return -1;
        if (t->recs[v - 1].p == p) return v - 1;
    }
}

static void insert_slot(dt_param_table *t, int idx) {
    unsigned s = slot_of(t->recs[idx].p, t->n_slots);
    while (t->slots[s]) s = (s + 1) & (unsigned)(t->n_slots - 1);
    t->slots[s] = idx + 1;
}

static int grow(dt_param_table *t) {
    if (t->n == t->cap) {
        int nc = t->cap ? 2 * t->cap : 64;
        dt_param_rec *r = realloc(t->recs, (size_t)nc * sizeof *r);
        if (!r) return -1;
        t->recs = r;
        t->cap = nc;
    }
    if (2 * (t->n + 1) > t->n_slots) {
        int ns = t->n_slots ? 2 * t->n_slots : 128;
        int *sl = calloc((size_t)ns, sizeof *sl);
        if (!sl) return -1;
        free(t->slots);
        t->slots = sl;
        t->n_slots = ns;
        for (int i = 0; i < t->n; i++) insert_slot(t, i);
    }
    return 0;
}

int dt_ptab_get(dt_param_table *t, dt_param *p) {
    int i = dt_ptab_find(t, p);
    if (i >= 0) return i;
    if (grow(t) != 0) return -1;
    t->recs[t->n] = (dt_param_rec){p, 0, 0};
    insert_slot(t, t->n);
    return t->n++;
}

void dt_ptab_clear(dt_param_table *t) {
    if (t->n) memset(t->slots, 0, (size_t)t->n_slots * sizeof *t->slots);
    t->n = 0;
}

void dt_ptab_free(dt_param_table *t) {
    free(t->recs);
    free(t->slots);
    memset(t, 0, sizeof *t);
}
