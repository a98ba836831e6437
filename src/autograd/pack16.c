/* Activations kept in 16 bits until backward (dt_graph_pack16).
 *
 * Forward: fn runs as usual -- nodes recorded, parameter uses counted,
 * module hooks fired -- but allocates in the scratch arena. The output is
 * copied into the main arena for the ops after it. Then the whole scratch
 * (tensors, nodes, their saved state, the activations) is written into one
 * image in the main arena: bytes verbatim, except the data of every float32
 * node output (and buffers an op declared with dt_graph_saved_may_round),
 * rounded to bf16 / fp16 (half the bytes). The scratch is
 * rewound, the nodes leave the tape, and one pack16 node stands for them.
 *
 * Backward, that node: the scratch is rewound (it holds nothing outside a
 * region) and the image written back at the same addresses -- every pointer
 * inside it is valid again, so the nodes are the ones recorded -- the node
 * outputs widened to float32, fn's output overwritten with the exact copy,
 * and the nodes back-propagated in reverse with the main loop's body, as a
 * checkpoint's replay is (mode REPLAY: nothing deferred to a W pass -- a
 * split backward computes the region's weight gradients in B, since the
 * image is gone by W -- the gradients of the region's own tensors live in
 * the scratch, x's in the main arena). Then the scratch is rewound again.
 *
 * What changes numerically: an op's backward reads its inputs (another op's
 * output) rounded to 16 bits, and the saved buffers an op declared
 * (dt_graph_saved_may_round); the rest of an op's saved state (LayerNorm's
 * statistics, dropout's keys, parameters) stays exact.
 * Under --precision bf16 a linear layer's weight gradient reads the input
 * its forward product rounded to bf16 anyway.
 *
 * Invariants: the scratch's blocks never move between a region's forward and
 * its backward (only dt_graph_reset merges them; every other user rewinds),
 * and the scratch is empty outside a region, a checkpoint and a replay, so
 * an image always restores into the blocks it was taken from, from 0. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

/* A node output's data in scratch block b, bytes [off, off + bytes): stored
 * in 16 bits, or (skip: fn's output) not stored, restored from the copy. */
typedef struct pk_range { int block, skip; size_t off, bytes; } pk_range;

typedef struct dt_pack {
    dt_dtype dtype;          /* DT_BF16 or DT_F16 */
    int restore_y;           /* y's data is the region's own (in the scratch): written back from out */
    dt_tensor *y, *out;      /* fn's output (in the image), its exact copy (main arena) */
    int n_nodes;  dt_node **nodes;     /* the region's tape, in record order */
    int n_ev;     dt_region_event *ev; /* parameter uses and module markers, back to front on skip */
    int out_rec;                       /* y a trainable parameter's value: that use's record (last in ev), else -1 */
    int n_blocks; size_t *used;        /* scratch blocks 0..n_blocks-1 and their fill */
    int n_ranges; pk_range *ranges;    /* sorted by (block, off), disjoint */
    unsigned char *image;
} dt_pack;

static int scratch_block(const dt_arena *a, const void *p) {
    uintptr_t c = (uintptr_t)p;
    for (int i = 0; i <= a->cur && i < a->n_blocks; i++) {
        uintptr_t b = (uintptr_t)a->blocks[i].base;
        if (c >= b && c - b < a->blocks[i].used) return i;
    }
    return -1;
}

static int by_place(const void *pa, const void *pb) {
    const pk_range *a = pa, *b = pb;
    if (a->block != b->block) return a->block < b->block ? -1 : 1;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* 1 if range r overlaps a buffer an op declared with dt_graph_saved_keep_exact. */
static int must_stay_exact(const dt_graph *g, const pk_range *r) {
    uintptr_t lo = (uintptr_t)g->scratch.blocks[r->block].base + r->off, hi = lo + r->bytes;
    for (int k = 0; k < g->n_saved_decl; k++) {
        if (!g->saved_decl[k].keep) continue;
        uintptr_t a = (uintptr_t)g->saved_decl[k].data, b = a + (uintptr_t)g->saved_decl[k].n * sizeof(float);
        if (a < hi && lo < b) return 1;
    }
    return 0;
}

/* The float32 node outputs in the scratch (fn's output to skip: restored
 * exactly from its copy) and the buffers ops said may be rounded, sorted; a range overlapping an earlier one (a view
 * of another output) is dropped, its bytes packed with that one or verbatim. */
static int collect_ranges(dt_graph *g, dt_pack *pk, int mark) {
    pk_range *r = dt_arena_alloc(&g->arena, (size_t)(g->n_nodes - mark + g->n_saved_decl + 1) * sizeof *r);
    if (!r) return -1;
    int n = 0;
    for (int k = 0; k < g->n_saved_decl; k++) {   /* ops' saved buffers (dt_graph_saved_may_round) */
        if (g->saved_decl[k].keep) continue;
        int b = scratch_block(&g->scratch, g->saved_decl[k].data);
        if (b < 0) continue;
        size_t off = (size_t)((char *)g->saved_decl[k].data - g->scratch.blocks[b].base);
        size_t bytes = (size_t)g->saved_decl[k].n * sizeof(float);
        if (off + bytes <= g->scratch.blocks[b].used) r[n++] = (pk_range){b, 0, off, bytes};
    }
    for (int k = mark; k < g->n_nodes; k++) {
        const dt_tensor *t = g->nodes[k]->out;
        if (g->nodes[k]->marker || !t || t->dtype != DT_F32 || t->numel < 16 || !t->data) continue;
        int b = scratch_block(&g->scratch, t->data);
        if (b < 0) continue;   /* not the region's own (a view of x, a parameter, the caller's data) */
        size_t off = (size_t)((char *)t->data - g->scratch.blocks[b].base);
        size_t bytes = (size_t)t->numel * sizeof(float);
        if (off + bytes > g->scratch.blocks[b].used) continue;
        r[n++] = (pk_range){b, t->data == pk->y->data && t->numel == pk->y->numel, off, bytes};
    }
    qsort(r, (size_t)n, sizeof *r, by_place);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (kept && r[kept - 1].block == r[i].block && r[i].off < r[kept - 1].off + r[kept - 1].bytes) continue;
        if (!r[i].skip && must_stay_exact(g, &r[i])) continue;   /* stored verbatim */
        r[kept++] = r[i];
    }
    pk->ranges = r;
    pk->n_ranges = kept;
    return 0;
}

/* Image size: the blocks' fill, packed ranges at half their bytes, skipped ones at none. */
static size_t image_bytes(const dt_pack *pk) {
    size_t total = 0;
    for (int b = 0; b < pk->n_blocks; b++) total += pk->used[b];
    for (int i = 0; i < pk->n_ranges; i++) total -= pk->ranges[i].skip ? pk->ranges[i].bytes : pk->ranges[i].bytes / 2;
    return total;
}

/* dir 1: scratch -> image (rounding), 0: image -> scratch (widening). */
static void transfer(dt_graph *g, const dt_pack *pk, int dir) {
    unsigned char *img = pk->image;
    int i = 0;
    for (int b = 0; b < pk->n_blocks; b++) {
        char *base = g->scratch.blocks[b].base;
        size_t at = 0;
        for (; i < pk->n_ranges && pk->ranges[i].block == b; i++) {
            const pk_range *r = &pk->ranges[i];
            size_t gap = r->off - at, n = r->bytes / sizeof(float);
            if (dir) memcpy(img, base + at, gap); else memcpy(base + at, img, gap);
            img += gap;
            at = r->off + r->bytes;
            if (r->skip) continue;
            float *f = (float *)(void *)(base + r->off);
            uint16_t *h = (uint16_t *)(void *)img;
            if (dir) dt_convert(h, pk->dtype, f, DT_F32, n);   /* nearest even; F16C / vectorised */
            else dt_convert(f, DT_F32, h, pk->dtype, n);
            img += n * sizeof(uint16_t);
        }
        size_t tail = pk->used[b] - at;
        if (dir) memcpy(img, base + at, tail); else memcpy(base + at, img, tail);
        img += tail;
    }
}

/* The region's parameter uses and module markers, in the order the backward
 * loop would take them when read back to front: nodes last to first, each
 * node's inputs in order (the nodes themselves are in the image, which the
 * skip path does not restore). */
static int collect_events(dt_graph *g, dt_pack *pk, int mark) {
    int n = pk->out_rec >= 0;
    for (int k = mark; k < g->n_nodes; k++) {
        n += g->nodes[k]->marker != 0;
        for (int i = 0; i < g->nodes[k]->n_in; i++) n += g->nodes[k]->param_rec[i] >= 0;
    }
    pk->ev = dt_arena_alloc(&g->arena, (size_t)(n ? n : 1) * sizeof *pk->ev);
    if (!pk->ev) return -1;
    pk->n_ev = 0;
    for (int k = mark; k < g->n_nodes; k++) {
        const dt_node *nd = g->nodes[k];
        if (nd->marker) pk->ev[pk->n_ev++] = (dt_region_event){nd->module, nd->marker, -1};
        for (int i = nd->n_in - 1; i >= 0; i--)
            if (nd->param_rec[i] >= 0) pk->ev[pk->n_ev++] = (dt_region_event){NULL, 0, nd->param_rec[i]};
    }
    if (pk->out_rec >= 0) pk->ev[pk->n_ev++] = (dt_region_event){NULL, 0, pk->out_rec};   /* counted after fn: released first */
    return 0;
}

/* Moves the region [mark, n_nodes) of the tape and the scratch into pk. */
static dt_status pack(dt_graph *g, dt_pack *pk, int mark) {
    pk->n_nodes = g->n_nodes - mark;
    pk->nodes = dt_arena_alloc(&g->arena, (size_t)pk->n_nodes * sizeof(dt_node *));
    pk->n_blocks = g->scratch.n_blocks ? g->scratch.cur + 1 : 0;
    pk->used = dt_arena_alloc(&g->arena, (size_t)(pk->n_blocks ? pk->n_blocks : 1) * sizeof(size_t));
    if (!pk->nodes || !pk->used || collect_events(g, pk, mark) || collect_ranges(g, pk, mark))
        return DT_ERR(DT_ENOMEM, "pack16: out of memory for the region's record");
    memcpy(pk->nodes, g->nodes + mark, (size_t)pk->n_nodes * sizeof(dt_node *));
    for (int b = 0; b < pk->n_blocks; b++) pk->used[b] = g->scratch.blocks[b].used;
    pk->image = dt_arena_alloc(&g->arena, image_bytes(pk));
    if (!pk->image)
        return DT_ERR(DT_ENOMEM, "pack16: out of memory for a %zu-byte activation image", image_bytes(pk));
    transfer(g, pk, 1);
    return DT_OK;
}

static dt_tensor *fail(dt_graph *g, int mark) {   /* forward failed: the region leaves no trace on the tape */
    g->n_nodes = mark;
    g->packing = 0;
    g->alloc = &g->arena;
    dt_arena_rewind(&g->scratch);
    if (g->sticky == DT_OK) g->sticky = dt_error_code() != DT_OK ? dt_error_code() : DT_ESTATE;
    return NULL;
}

dt_tensor *dt_graph_pack16(dt_graph *g, dt_checkpoint_fn fn, dt_tensor *x, void *ctx, dt_dtype dtype) {
    if (!g || !fn) { DT_ERR(DT_EINVAL, "pack16: %s is NULL", g ? "fn" : "graph"); return NULL; }
    if (dtype != DT_BF16 && dtype != DT_F16 && dtype != DT_F32) {
        DT_ERR(DT_EINVAL, "pack16: activations are kept as bf16 or fp16 (or f32: no packing), not dtype %d", (int)dtype);
        return NULL;
    }
    if (g->mode != DT_GRAPH_RECORD || g->alloc == &g->scratch) {
        DT_ERR(DT_ESTATE, "pack16: called inside a checkpoint or another pack16 region (nesting is not supported)");
        return NULL;
    }
    if (!g->grad_enabled || dtype == DT_F32) return fn(g, x, ctx);   /* nothing to keep */
    int mark = g->n_nodes;
    dt_arena_rewind(&g->scratch);
    g->alloc = &g->scratch;
    g->packing = 1;
    g->n_saved_decl = 0;
    dt_tensor *y = fn(g, x, ctx);
    g->packing = 0;
    g->alloc = &g->arena;
    if (!y) {
        if (dt_error_code() == DT_OK) DT_ERR(DT_EINVAL, "pack16: the function returned NULL without an error");
        return fail(g, mark);
    }
    if (g->sticky != DT_OK) return fail(g, mark);   /* (the message is set) */
    if (g->n_nodes == mark && y->requires_grad && !dt_arena_owns(&g->scratch, y) &&
        (y->numel == 0 || !dt_arena_owns(&g->scratch, y->data))) {
        /* Nothing recorded, yet y needs a gradient: it comes from outside the
         * region (x, a parameter's value, a ctx tensor) and outlives it, so
         * it is handed back itself and the ops after it carry its gradient,
         * as without pack16 (a copy would cut the chain). */
        dt_arena_rewind(&g->scratch);
        return y;
    }
    dt_tensor *out = dt_graph_copy_out(g, y, "pack16");
    if (!out) return fail(g, mark);
    if (g->n_nodes == mark) {   /* nothing recorded (frozen or constant): nothing to keep */
        dt_arena_rewind(&g->scratch);
        return out;
    }
    dt_pack *pk = dt_arena_alloc(&g->arena, sizeof *pk);
    if (!pk) { DT_ERR(DT_ENOMEM, "pack16: out of memory"); return fail(g, mark); }
    *pk = (dt_pack){.dtype = dtype, .y = y, .out = out, .restore_y = y->numel > 0 && scratch_block(&g->scratch, y->data) >= 0};
    pk->out_rec = dt_graph_output_use(g, y);   /* y a parameter's value: the use its copy no longer counts */
    if (g->sticky != DT_OK || pack(g, pk, mark) != DT_OK) return fail(g, mark);
    g->n_nodes = mark;
    dt_arena_rewind(&g->scratch);
    return dt_graph_region_node(g, "pack16", dt_pack16_backward, x, out, pk, y->requires_grad) ? out : NULL;
}

void dt_pack16_backward(dt_graph *g, dt_node *n) {
    dt_pack *pk = n->saved;
    dt_tensor *x = n->n_in ? n->in[0] : NULL;
    if (x && x->requires_grad) {   /* main arena, before the scratch fills (NULL without error: frozen) */
        dt_grad_of(g, x);
        if (dt_error_code() != DT_OK) return;
    }
    dt_arena_set_used(&g->scratch, pk->n_blocks, pk->used);
    transfer(g, pk, 0);
    if (pk->restore_y) memcpy(pk->y->data, pk->out->data, (size_t)pk->out->numel * sizeof(float));
    int mark = g->n_nodes;
    dt_status s = dt_graph_reserve_nodes(g, pk->n_nodes);
    g->mode = DT_GRAPH_REPLAY;
    g->alloc = &g->scratch;
    if (s == DT_OK) {
        memcpy(g->nodes + mark, pk->nodes, (size_t)pk->n_nodes * sizeof(dt_node *));
        g->n_nodes += pk->n_nodes;
        s = dt_graph_seed_region_out(g, pk->y, dt_f32(n->out->grad));
    }
    if (s == DT_OK && pk->out_rec >= 0) s = dt_graph_release_use(g, pk->out_rec);   /* last counted, first released */
    for (int k = g->n_nodes - 1; s == DT_OK && k >= mark; k--) s = dt_graph_run_node(g, g->nodes[k], pk->y);
    if (s != DT_OK && dt_error_code() == DT_OK) DT_ERR(s, "pack16 backward: a hook failed without a message");
    g->n_nodes = mark;
    g->mode = DT_GRAPH_RECORD;
    g->alloc = &g->arena;
    dt_arena_rewind(&g->scratch);
}

static void declare(dt_graph *g, const float *data, int64_t n, int keep) {
    if (!g || !g->packing || g->mode != DT_GRAPH_RECORD || !data || n <= 0) return;
    if (g->n_saved_decl == g->cap_saved_decl) {
        int nc = g->cap_saved_decl ? 2 * g->cap_saved_decl : 16;
        void *a = realloc(g->saved_decl, (size_t)nc * sizeof *g->saved_decl);
        if (!a) {   /* a buffer to round stays exact (nothing lost); one to keep must not be rounded: the region fails */
            if (keep) g->sticky = DT_ERR(DT_ENOMEM, "pack16: out of memory listing a buffer to keep exact");
            return;
        }
        g->saved_decl = a;
        g->cap_saved_decl = nc;
    }
    g->saved_decl[g->n_saved_decl].data = data;
    g->saved_decl[g->n_saved_decl].n = n;
    g->saved_decl[g->n_saved_decl++].keep = keep;
}

void dt_graph_saved_may_round(dt_graph *g, float *data, int64_t n) { declare(g, data, n, 0); }
void dt_graph_saved_keep_exact(dt_graph *g, const float *data, int64_t n) { declare(g, data, n, 1); }

dt_status dt_pack16_skip(dt_graph *g, dt_node *n) {
    const dt_pack *pk = n->saved;
    return dt_graph_skip_region(g, pk->ev, pk->n_ev);
}
