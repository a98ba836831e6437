/* Bump allocator behind a dt_graph: one step's activations and tape nodes.
 * Allocation bumps block `cur`, moving on to the next block (or a new one)
 * when it is full. Reset rewinds without freeing; if a step overflowed into
 * extra blocks, the next reset merges them into one block of the high-water
 * size, so a steady training loop does one allocation total. Rewind empties
 * the arena but keeps every block where it is: memory handed out before it
 * may be written back at the same addresses (autograd/pack16.c). */
#ifndef DT_AUTOGRAD_ARENA_H
#define DT_AUTOGRAD_ARENA_H
#include <stddef.h>

typedef struct dt_arena_block { char *base; size_t cap, used; } dt_arena_block;
typedef struct dt_arena {
    dt_arena_block *blocks;
    int n_blocks, cap_blocks;
    int cur;                     /* the block allocations bump; blocks after it are empty */
    size_t in_use, high_water;   /* bytes handed out this step / max over steps */
} dt_arena;

void *dt_arena_alloc(dt_arena *a, size_t bytes);   /* 64-byte aligned; NULL on OOM */
void dt_arena_reset(dt_arena *a);
void dt_arena_rewind(dt_arena *a);                 /* empty; blocks kept in place */
/* After a rewind: blocks 0..n-1 hold used[0..n-1] bytes again, allocation
 * continues in block n-1 (n <= n_blocks; n = 0: stays empty). */
void dt_arena_set_used(dt_arena *a, int n, const size_t *used);
void dt_arena_free(dt_arena *a);
/* 1 if p points into memory the arena handed out since its last reset (or
 * into a block's unused tail): the graph uses it to tell a checkpoint
 * replay's own tensors from tensors created outside it. */
int dt_arena_owns(const dt_arena *a, const void *p);
#endif
