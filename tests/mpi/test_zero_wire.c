/* ZeRO's wire (zero.h, "16-bit wire" and "Node-shared memory"):
 *  (c) reference: with opts.wire = bf16 / fp16, two AdamW steps at stages
 *      1/2/3 equal one process that computes every rank's gradient on the
 *      parameters that rank holds, rounds each to 16 bits (our own rounding,
 *      not dtrain's converters), sums in rank order in float32, divides by N,
 *      rounds once and steps float32 masters; every rank's full parameters
 *      (stages 1/2 after a step; stage 3 from the first gather on) are its
 *      own shard exact and the other shards rounded;
 *  (a) bf16 and fp16 runs converge on the MLP and end near the float32 run;
 *  (b) the bytes each rank hands to its reduce-scatters and all-gathers halve
 *      (stages 1/2: exactly steps x layout x element size);
 *  (d) dt_reduce_scatter / dt_allgather on node-shared memory equal the MPI
 *      path bit for bit (F32, BF16, F16, odd sizes and offsets, in place,
 *      an output over a peer's input chunk), really run there (ranks passing
 *      different offsets fail as only the shared path can), and ZeRO with
 *      node-shared memory equals ZeRO with no_shm bit for bit;
 *  (e) param_dtype bf16 / fp16 (the 16-bit working copy): the parameter
 *      all-gathers carry half the bytes, plus the 1-D parameters (biases)
 *      at 32 bits, while a float32 gradient wire keeps its bytes; the owned
 *      shards stay float32 masters (not all of them 16-bit values), and at
 *      stages 1/2 every rank's whole flat copy, its own chunk included, is
 *      exactly round16(masters) but for the biases, which are the masters
 *      themselves -- the same on every rank. */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

/* ---- 16-bit rounding, independent of dtrain: nearest even ---- */
static float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;   /* NaN */
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float y;
    memcpy(&y, &u, sizeof y);
    return y;
}
static float round_f16(float x) { return (float)(_Float16)x; }   /* the compiler's conversion */
static float round16(float x, dt_dtype t) { return t == DT_BF16 ? round_bf16(x) : t == DT_F16 ? round_f16(x) : x; }
static const char *dname(dt_dtype t) { return t == DT_BF16 ? "bf16" : t == DT_F16 ? "fp16" : "f32"; }

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    T_CHECK(p != NULL);
    return p;
}

/* ================= (c) the hand-computed reference ================= */

/* Which rank owns layout element pos of z's layout. */
static int owner_of(dt_zero *z, size_t pos) {
    for (int i = 0; i < dt_zero_num_buckets(z); i++) {
        const dt_zero_bucket *b = dt_zero_bucket_at(z, i);
        if (pos >= b->begin && pos < b->begin + b->numel) return (int)((pos - b->begin) / b->shard);
    }
    T_CHECK(0);
    return -1;
}

/* What rank r holds (registration order) when the masters are `master`:
 * its own shard's elements exact, the other ranks' rounded. */
static void held_params(dt_zero *z, const dt_model *m, const float *master, int r, dt_dtype t, float *out) {
    size_t pos = 0;
    for (int i = 0; i < m->n_params; i++) {
        size_t k = (size_t)m->params[i]->value.numel;
        for (size_t e = 0; e < k; e++, pos++)
            out[pos] = owner_of(z, m->offsets[i] + e) == r ? master[pos] : round16(master[pos], t);
    }
}

static void set_params(dt_model *m, const float *reg) {
    size_t pos = 0;
    for (int i = 0; i < m->n_params; i++) {
        size_t k = (size_t)m->params[i]->value.numel;
        memcpy(m->params[i]->value.data, reg + pos, k * sizeof(float));
        pos += k;
    }
}

/* One step of the single-process reference: rank r's gradient from held[r]
 * and batch r, each rounded, rank-ordered float32 sum / N rounded once, and
 * the float32 masters stepped. */
static void ref_step(dtt_net *ref, float *const *held, const dtt_batch *b, int N, dt_dtype t, float lr) {
    dt_model *m = ref->m;
    size_t ng = m->grad_flat.numel;
    float *sum = xcalloc(ng, sizeof *sum), *master = dtz_params(m, NULL);
    for (int r = 0; r < N; r++) {
        set_params(m, held[r]);
        dt_model_zero_grad(m);
        dtt_fwd_bwd(ref, NULL, 1, &b[r].b, 1.0f, NULL);
        for (size_t i = 0; i < ng; i++) {
            float h = round16(m->grad_flat.data[i], t);
            sum[i] = r == 0 ? h : sum[i] + h;
        }
    }
    set_params(m, master);
    for (size_t i = 0; i < ng; i++) m->grad_flat.data[i] = round16(sum[i] / (float)N, t);
    ref->lr = lr;
    dtt_opt_step(ref);
    free(sum);
    free(master);
}

static void test_reference(void) {
    t_begin("16-bit wire == hand-computed rounded reference (stages 1/2/3, bf16/fp16, 2 steps)");
    int N = t_size(), me = t_rank();
    dt_model_cfg cfg = dtt_mlp_cfg(20, 16, 12, 5);
    dtz_spec s = dtz_mk_spec(cfg, 8, 2);
    const float lrs[2] = {1e-2f, 7e-3f};
    const dt_dtype wires[2] = {DT_BF16, DT_F16};
    float *f32_master = NULL;   /* the unrounded reference: the rounding must matter */
    for (int wi = -1; wi < 2; wi++)
        for (int stage = 1; stage <= 3; stage++) {
            dt_dtype t = wi < 0 ? DT_F32 : wires[wi];
            if (wi < 0 && stage > 1) continue;
            dt_zero_opts o = dtz_opts(&s, stage, stage == 2 ? DT_ZERO_OVERLAP_INTERLEAVED : DT_ZERO_OVERLAP_AFTER_BACKWARD);
            o.dp.wire = t;
            o.dp.first_bucket_bytes = o.dp.bucket_bytes = 1024;   /* several buckets */
            dtz_net n;
            dtz_net_init(&n, &s, 1 + (uint64_t)me, world, &o);
            T_CHECK(dt_zero_num_buckets(n.z) >= 2);
            dtt_net ref;
            dtt_net_init(&ref, &cfg, 1, &s.oc);   /* rank 0's initial parameters, which ZeRO broadcasts */
            size_t np = dtz_param_count(ref.m);
            /* stages 1/2 start from the broadcast float32 parameters; stage 3
             * gathers over the wire before every forward, the first included */
            float **held = xcalloc((size_t)N, sizeof *held), *init = dtz_params(ref.m, NULL);
            for (int r = 0; r < N; r++) {
                held[r] = dtz_params(ref.m, NULL);
                if (stage == 3) held_params(n.z, n.m, init, r, t, held[r]);
            }
            free(init);
            for (int st = 0; st < 2; st++) {
                dtt_batch *b = xcalloc((size_t)N, sizeof *b);
                for (int r = 0; r < N; r++) dtt_make_batch(&cfg, dtt_key(st, r, 0), s.B, &b[r]);
                dtz_step(&n, lrs[st], &b[me], 1, NULL);
                ref_step(&ref, held, b, N, t, lrs[st]);
                float *master = dtz_params(ref.m, NULL);
                for (int r = 0; r < N; r++) held_params(n.z, n.m, master, r, t, held[r]);
                T_OK(dt_zero_sync_params(n.z));
                char what[160];
                float *lay = dtz_gather_layout(n.z), *got = dtz_params(n.m, lay);
                snprintf(what, sizeof what, "stage %d, %s, step %d: owned master shards vs reference", stage, dname(t), st);
                dtz_expect_params(n.m, got, master, 0, what);
                if (stage < 3) {   /* what this rank holds */
                    float *full = dtz_params(n.m, NULL);
                    snprintf(what, sizeof what, "stage %d, %s, step %d: rank %d's full parameters (own shard exact, "
                             "others rounded)", stage, dname(t), st, me);
                    dtz_expect_params(n.m, full, held[me], 0, what);
                    free(full);
                }
                if (st == 1 && t == DT_F32) f32_master = t_copy(master, np);
                if (st == 1 && t != DT_F32) T_CHECK(t_differs(master, f32_master, np));   /* rounding visible */
                free(lay);
                free(got);
                free(master);
                for (int r = 0; r < N; r++) dtt_batch_free(&b[r]);
                free(b);
            }
            for (int r = 0; r < N; r++) free(held[r]);
            free(held);
            dtt_net_free(&ref);
            dtz_net_free(&n);
        }
    free(f32_master);
    t_end();
}

/* ================= (a) + (b) training with a 16-bit wire ================= */

typedef struct run_out {
    float first_loss, last_loss;   /* rank-mean loss of the first step, mean of the last 5 steps */
    float *master;                 /* owned shards, registration order */
    dt_zero_stats st;
    size_t layout;                 /* padded layout length */
} run_out;

/* working: a 16-bit param_dtype (DT_F32: none); stages 1/2 copy the flat
 * parameters each rank computes with into out->copy (registration order) */
static void train_pd(int stage, dt_dtype t, dt_dtype working, int no_shm, int steps, run_out *out, float **copy) {
    int me = t_rank(), N = t_size();
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 32, 16, 5), 16, steps);
    dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
    o.dp.wire = t;
    o.param_dtype = working;
    o.dp.shm = (no_shm) ? DT_DP_SHM_OFF : DT_DP_SHM_AUTO;
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 2048;
    dtz_net n;
    dtz_net_init(&n, &s, 1 + (uint64_t)me, world, &o);
    memset(out, 0, sizeof *out);
    float tail = 0;
    for (int st = 0; st < steps; st++) {
        dtt_batch b;
        dtt_make_batch(&s.cfg, dtt_key(st, me, 0), s.B, &b);
        double l = dtz_step(&n, dtz_lr(&s, st), &b, 1, NULL);
        MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        l /= N;
        if (st == 0) out->first_loss = (float)l;
        if (st >= steps - 5) tail += (float)l / 5.0f;
        dtt_batch_free(&b);
    }
    out->last_loss = tail;
    T_OK(dt_zero_sync_params(n.z));
    if (copy) *copy = stage < 3 ? dtz_params(n.m, n.m->param_flat.data) : NULL;
    float *lay = dtz_gather_layout(n.z);
    out->master = dtz_params(n.m, lay);
    free(lay);
    out->st = dt_zero_get_stats(n.z);
    out->layout = dtz_layout_len(n.z);
    dtz_net_free(&n);
}

static void train(int stage, dt_dtype t, int no_shm, int steps, run_out *out) {
    train_pd(stage, t, DT_F32, no_shm, steps, out, NULL);
}

static void test_param_dtype(void) {
    t_begin("param_dtype bf16/fp16: 16-bit gathers of a rounded working copy, float32 masters (stages 1/2/3)");
    const int steps = 12;
    dt_model *namer;
    dt_model_cfg cfg = dtt_mlp_cfg(20, 32, 16, 5);
    T_OK(dt_model_create(&cfg, 1, &namer));
    size_t np = dtz_param_count(namer), n_exact = 0;
    unsigned char *exact = xcalloc(np, 1);   /* registration order: 1-D parameters (the biases) */
    for (int i = 0, pos = 0; i < namer->n_params; pos += (int)namer->params[i]->value.numel, i++)
        if (namer->params[i]->value.ndim == 1) {
            memset(exact + pos, 1, (size_t)namer->params[i]->value.numel);
            n_exact += (size_t)namer->params[i]->value.numel;
        }
    T_CHECK(n_exact > 0 && n_exact < np / 4);
    const dt_dtype types[2] = {DT_BF16, DT_F16};
    const int N = t_size();
    for (int stage = 1; stage <= 3; stage++) {
        run_out f32;
        train_pd(stage, DT_F32, DT_F32, 1, steps, &f32, NULL);
        for (int ti = 0; ti < 2; ti++) {
            run_out h;
            float *copy = NULL;
            train_pd(stage, DT_F32, types[ti], 1, steps, &h, &copy);
            T_CHECK(h.st.bytes_reduced == f32.st.bytes_reduced);        /* gradients: the float32 wire */
            /* parameters: 16 bits, and the exact biases at 32 after each rank's chunk
             * (a bucket's chunks each carry the most any holds: between a 1/N share of
             * its biases and all of them). Stages 1/2 gather the whole layout G times;
             * stage 3 gathers buckets as modules need them: fewer bytes than float32 */
            T_CHECK(h.st.bytes_gathered > f32.st.bytes_gathered / 2 && h.st.bytes_gathered < f32.st.bytes_gathered);
            if (stage < 3) {
                size_t G = f32.st.bytes_gathered / (4 * f32.layout), extra = h.st.bytes_gathered - f32.st.bytes_gathered / 2;
                T_CHECK(G >= 1 && f32.st.bytes_gathered == G * 4 * f32.layout);
                T_CHECK(extra >= G * 4 * n_exact && extra <= G * 4 * n_exact * (size_t)N);
            }
            T_CHECK(fabsf(h.last_loss - f32.last_loss) <= 0.05f * f32.last_loss);   /* trains as float32 does */
            size_t rounded = 0;   /* masters that are already 16-bit values */
            size_t exact_unrounded = 0;   /* biases whose masters have more bits than the copy type */
            for (size_t i = 0; i < np; i++) {
                rounded += round16(h.master[i], types[ti]) == h.master[i];
                exact_unrounded += exact[i] && round16(h.master[i], types[ti]) != h.master[i];
            }
            T_CHECK(exact_unrounded > n_exact / 2);   /* so the copy's exact biases above are not rounded values */
            T_CHECK(rounded < np / 2);   /* float32 masters: most carry more bits */
            if (copy) {
                size_t bad = 0;
                for (size_t i = 0; i < np; i++)   /* the biases exact, the rest rounded */
                    bad += memcmp(&copy[i], &(float){exact[i] ? h.master[i] : round16(h.master[i], types[ti])}, 4) != 0;
                T_CHECK(bad == 0);
                /* every rank computes with the same copy */
                float *r0 = xcalloc(np, sizeof *r0);
                if (t_rank() == 0) memcpy(r0, copy, np * sizeof *r0);
                MPI_Bcast(r0, (int)np, MPI_FLOAT, 0, MPI_COMM_WORLD);
                T_CHECK(memcmp(r0, copy, np * sizeof *r0) == 0);
                free(r0);
            }
            if (t_rank() == 0)
                printf("  stage %d param_dtype %s: all-gather bytes per rank %zu (f32 %zu), reduce-scatter %zu; "
                       "%zu of %zu masters are %s values\n", stage, dname(types[ti]), h.st.bytes_gathered,
                       f32.st.bytes_gathered, h.st.bytes_reduced, rounded, np, dname(types[ti]));
            free(copy);
            free(h.master);
        }
        free(f32.master);
    }
    free(exact);
    dt_model_free(namer);
    t_end();
}

static void test_converge_and_bytes(void) {
    t_begin("16-bit wire: converges near float32 and halves the bytes per rank (stages 1/2/3)");
    const int steps = 40;
    dt_model *namer;
    dt_model_cfg cfg = dtt_mlp_cfg(20, 32, 16, 5);
    T_OK(dt_model_create(&cfg, 1, &namer));
    size_t np = dtz_param_count(namer);
    for (int stage = 1; stage <= 3; stage++) {
        run_out f32;
        train(stage, DT_F32, 0, steps, &f32);
        T_CHECK(f32.last_loss < 0.5f * f32.first_loss);
        if (stage < 3) {   /* one reduce-scatter and one all-gather per bucket and step */
            T_CHECK(f32.st.bytes_reduced == (size_t)steps * f32.layout * sizeof(float));
            T_CHECK(f32.st.bytes_gathered == (size_t)steps * f32.layout * sizeof(float));
        } else {           /* every bucket gathered at least once per step (forward) */
            T_CHECK(f32.st.bytes_reduced == (size_t)steps * f32.layout * sizeof(float));
            T_CHECK(f32.st.bytes_gathered >= (size_t)steps * f32.layout * sizeof(float));
        }
        const dt_dtype wires[2] = {DT_BF16, DT_F16};
        /* Tolerance on ||p16 - p32|| / ||p32|| (and per parameter) after 40
         * AdamW steps: the rounding itself is checked bitwise by
         * test_reference; here it only has to stay harmless. Measured (MLP
         * 20-[32,16]-5, lr 1e-2): bf16 1.5e-2 to 2.7e-2 (stage 3 at np 4; one
         * parameter 2.5e-2 at np 2); fp16 7e-4 at np 2, 1.3e-2 at np 4 (its
         * per-rank gradients are smaller: elements below fp16's normal range,
         * 6e-5, keep few bits, and AdamW's normalised update turns a relative
         * error of a tiny gradient into a full-size change). AdamW divides by
         * sqrt(v), so the difference grows like a random walk of steps of
         * ~lr, not like the rounding error itself: 5e-2 is ~2x the largest
         * measured; a broken wire (chunks misplaced, unscaled, garbage) is off
         * by O(1) or does not converge. The final losses also stay within 5%. */
        const double tol[2] = {5e-2, 5e-2};
        for (int wi = 0; wi < 2; wi++) {
            run_out h;
            train(stage, wires[wi], 0, steps, &h);
            char what[128];
            snprintf(what, sizeof what, "stage %d, %s: loss falls", stage, dname(wires[wi]));
            if (!(h.last_loss < 0.5f * h.first_loss)) t_fail(__FILE__, __LINE__, what);
            snprintf(what, sizeof what, "stage %d, %s: parameters near the float32 run", stage, dname(wires[wi]));
            dtz_expect_params(namer, h.master, f32.master, tol[wi], what);
            T_CHECK(t_differs(h.master, f32.master, np));   /* the wire really was 16-bit */
            T_CHECK(fabsf(h.last_loss - f32.last_loss) <= 0.05f * f32.last_loss);
            T_CHECK(h.st.bytes_reduced * 2 == f32.st.bytes_reduced);
            T_CHECK(h.st.bytes_gathered * 2 == f32.st.bytes_gathered);
            if (t_rank() == 0)
                printf("  stage %d %s: loss %.4f -> %.4f (f32 %.4f -> %.4f), param rel diff %.3g; bytes per rank "
                       "reduce-scatter %zu (f32 %zu), all-gather %zu (f32 %zu)\n", stage, dname(wires[wi]),
                       (double)h.first_loss, (double)h.last_loss, (double)f32.first_loss, (double)f32.last_loss,
                       t_rel_diff(h.master, f32.master, np), h.st.bytes_reduced, f32.st.bytes_reduced,
                       h.st.bytes_gathered, f32.st.bytes_gathered);
            free(h.master);
        }
        free(f32.master);
    }
    dt_model_free(namer);
    t_end();
}

/* ================= (d) node-shared memory == MPI ================= */

/* Order-sensitive values: 1e8 + 1 - 1e8 depends on the order of additions. */
static float val(int rank, int64_t i) {
    static const float v[6] = {1e4f, 1.0f, -1e4f, 3.14159f, -2.5e3f, 0.001f};
    return v[(i + 2 * rank + (i / 7) * rank) % 6] * (1.0f + (float)(i % 5) * 0.37f) + (float)rank * 0.5f;
}

static void fill(void *buf, dt_dtype t, int rank, int64_t n) {
    float *f = xcalloc((size_t)n, sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = val(rank, i);
    t_fill(buf, t, f, n);
    free(f);
}

static int same_bytes(const void *a, const void *b, int64_t n, dt_dtype t) {
    return memcmp(a, b, (size_t)n * dt_dtype_size(t)) == 0;
}

static void test_shm_collectives(void) {
    t_begin("reduce-scatter / all-gather on node-shared memory == MPI path (bitwise)");
    int me = t_rank(), N = t_size();
    const int64_t counts[5] = {1, 3, 17, 1001, 4099};
    const int64_t max_c = 4099, lead = 5;   /* odd element offset into the window */
    const dt_dtype types[3] = {DT_F32, DT_BF16, DT_F16};
    float *win = NULL;
    size_t win_floats = (size_t)(lead + N * max_c + 16);   /* floats: room for any dtype */
    T_OK(dt_pg_alloc_shared(world, win_floats, &win));
    T_CHECK(win != NULL);
    for (int ti = 0; ti < 3; ti++) {
        dt_dtype t = types[ti];
        size_t es = dt_dtype_size(t);
        for (int ci = 0; ci < 5; ci++)
            for (int avg = 0; avg < 2; avg++) {
                int64_t c = counts[ci], tot = c * N;
                int op = avg ? DT_RED_AVG : DT_RED_SUM;
                char *sin = (char *)win + (size_t)lead * es;   /* shared input */
                void *pin = t_alloc(tot, t), *want = t_alloc(c, t), *got = t_alloc(c, t);
                fill(pin, t, me, tot);
                /* MPI path (private input) */
                T_OK(dt_reduce_scatter(world, pin, want, c, t, op, NULL));
                if (t == DT_F32) {   /* F32: the rank-ordered sum by hand */
                    float *e = xcalloc((size_t)c, sizeof *e);
                    for (int64_t i = 0; i < c; i++) {
                        float a = val(0, (int64_t)me * c + i);
                        for (int r = 1; r < N; r++) a += val(r, (int64_t)me * c + i);
                        e[i] = avg ? a / (float)N : a;
                    }
                    T_BITWISE((float *)want, e, (size_t)c, "MPI reduce-scatter vs rank-ordered sum");
                    free(e);
                }
                /* shared input, private output */
                memcpy(sin, pin, (size_t)tot * es);
                T_OK(dt_reduce_scatter(world, sin, got, c, t, op, NULL));
                T_CHECK(same_bytes(got, want, c, t));
                /* in place: out = in + rank * count */
                memcpy(sin, pin, (size_t)tot * es);
                dt_work *w = NULL;
                T_OK(dt_reduce_scatter(world, sin, sin + (size_t)me * (size_t)c * es, c, t, op, &w));
                T_OK(dt_work_wait(w));
                T_CHECK(same_bytes(sin + (size_t)me * (size_t)c * es, want, c, t));
                /* output over chunk 0 of the input (a peer's chunk on ranks > 0) */
                memcpy(sin, pin, (size_t)tot * es);
                T_OK(dt_reduce_scatter(world, sin, sin, c, t, op, NULL));
                T_CHECK(same_bytes(sin, want, c, t));
                free(pin);
                free(want);
                free(got);

                /* all-gather: MPI (private output) vs shared output, and in place */
                void *mine = t_alloc(c, t), *pout = t_alloc(tot, t);
                fill(mine, t, me + 7, c);
                T_OK(dt_allgather(world, mine, pout, c, t, NULL));
                char *sout = (char *)win + (size_t)lead * es;
                memset(sout, 0xff, (size_t)tot * es);
                T_OK(dt_allgather(world, mine, sout, c, t, NULL));
                T_CHECK(same_bytes(sout, pout, tot, t));
                memset(sout, 0xff, (size_t)tot * es);
                memcpy(sout + (size_t)me * (size_t)c * es, mine, (size_t)c * es);
                T_OK(dt_allgather(world, sout + (size_t)me * (size_t)c * es, sout, c, t, &w));
                T_OK(dt_work_wait(w));
                T_CHECK(same_bytes(sout, pout, tot, t));
                free(mine);
                free(pout);
                T_OK(dt_barrier(world, NULL));   /* the window is reused by the next case */
            }
    }
    T_OK(dt_pg_free_shared(world, win));

    /* ranks passing different offsets: only the shared-memory path checks
     * (MPI's exchange would not notice); it breaks the group: private ones */
    for (int kind = 0; kind < 2; kind++) {
        dt_pg *g = NULL;
        T_OK(dt_pg_split(world, 0, 0, &g));
        float *x = NULL;
        T_OK(dt_pg_alloc_shared(g, (size_t)(64 * N + 64), &x));
        T_CHECK(x != NULL);
        float *at = x + (me == 0 ? 0 : 16), out[64] = {0};
        alarm(120);
        if (kind == 0) T_EXPECT(dt_reduce_scatter(g, at, out, 16, DT_F32, DT_RED_SUM, NULL), DT_ECOMM);
        else T_EXPECT(dt_allgather(g, out, at, 16, DT_F32, NULL), DT_ECOMM);
        alarm(0);
        T_CHECK(strstr(dt_error_message(), "ranks disagree") != NULL);
        T_CHECK(strstr(dt_error_message(), kind == 0 ? "reduce_scatter(shm)" : "allgather(shm)") != NULL);
        dt_pg_free(g);
    }
    t_end();
}

static void freeze_all(dt_model *m) {
    for (int i = 0; i < m->n_params; i++) m->params[i]->requires_grad = 0;
    T_OK(dt_model_refresh_grads(m));
}

/* Nothing trainable (what dtrain eval makes of a model): stages 1/2 make no
 * node-shared window (before: the gradients of stage 1 and the gather
 * window, 2 x the parameters per rank, RssShmem) and no gradient memory;
 * the parameters still load and gather. */
static void test_nothing_trains_no_windows(void) {
    t_begin("ZeRO-1/2 with every parameter frozen: no node-shared windows, no gradients");
    dt_model_cfg cfg = dtt_mlp_cfg(20, 32, 16, 5);
    for (int stage = 1; stage <= 2; stage++) {
        dtz_spec s = dtz_mk_spec(cfg, 1, 1);
        s.prepare = freeze_all;
        dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        o.dp.shm = DT_DP_SHM_AUTO;
        dtz_net n;
        dtz_net_init(&n, &s, 1 + (uint64_t)t_rank(), world, &o);
        dt_zero_memory mem = dt_zero_get_memory(n.z);
        T_CHECK(mem.shm_bytes == 0);
        T_CHECK(mem.grad_bytes <= 64 * sizeof(float));   /* (the layout's padding only: 1285 parameters) */
        T_CHECK(mem.optim_bytes == 0);
        T_CHECK(!n.m->grad_flat.borrowed);   /* (stage 1 lent it the gradient window) */
        T_OK(dt_zero_gather_params(n.z));
        dtz_net_free(&n);
    }
    t_end();
}

/* ZeRO through node-shared memory == ZeRO through MPI, bit for bit: masters
 * and every rank's full parameters. */
static void test_zero_shm_vs_mpi(void) {
    t_begin("ZeRO node-shared memory == no_shm (bitwise; stages 1/2/3, f32 and bf16)");
    const dt_dtype wires[2] = {DT_F32, DT_BF16};
    dt_model_cfg cfg = dtt_mlp_cfg(20, 32, 16, 5);
    dt_model *namer;
    T_OK(dt_model_create(&cfg, 1, &namer));
    for (int stage = 1; stage <= 3; stage++)
        for (int wi = 0; wi < 2; wi++) {
            float *full[2] = {0}, *master[2] = {0};
            size_t shm_bytes[2] = {0};
            for (int no_shm = 0; no_shm < 2; no_shm++) {
                dtz_spec s = dtz_mk_spec(cfg, 8, 3);
                dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
                o.dp.wire = wires[wi];
                o.dp.shm = (no_shm) ? DT_DP_SHM_OFF : DT_DP_SHM_AUTO;
                o.dp.first_bucket_bytes = o.dp.bucket_bytes = 1024;
                dtz_net n;
                dtz_net_init(&n, &s, 1 + (uint64_t)t_rank(), world, &o);
                shm_bytes[no_shm] = dt_zero_get_memory(n.z).shm_bytes;
                for (int st = 0; st < s.steps; st++) {
                    dtt_batch b;
                    dtt_make_batch(&cfg, dtt_key(st, t_rank(), 0), s.B, &b);
                    dtz_step(&n, dtz_lr(&s, st), &b, 1, NULL);
                    dtt_batch_free(&b);
                }
                T_OK(dt_zero_sync_params(n.z));
                float *lay = dtz_gather_layout(n.z);
                master[no_shm] = dtz_params(n.m, lay);
                free(lay);
                if (stage < 3) full[no_shm] = dtz_params(n.m, NULL);
                dtz_net_free(&n);
            }
            /* stages 1/2 really used node-shared buffers; stage 3 and no_shm none */
            T_CHECK(stage < 3 ? shm_bytes[0] > 0 : shm_bytes[0] == 0);
            T_CHECK(shm_bytes[1] == 0);
            char what[128];
            snprintf(what, sizeof what, "stage %d, %s: masters, shared memory vs MPI", stage, dname(wires[wi]));
            dtz_expect_params(namer, master[0], master[1], 0, what);
            if (stage < 3) {
                snprintf(what, sizeof what, "stage %d, %s: rank %d's full parameters, shared memory vs MPI", stage,
                         dname(wires[wi]), t_rank());
                dtz_expect_params(namer, full[0], full[1], 0, what);
            }
            for (int k = 0; k < 2; k++) { free(full[k]); free(master[k]); }
        }
    dt_model_free(namer);
    t_end();
}

/* (f) fp16 param_dtype: a master beyond 65504 gathers as inf. Every rank
 * receives the same payload, so every rank fails at once, naming the
 * parameter and the rank whose shard holds it -- none waits in a collective
 * another has left. With the value back in range (and the copy gathered
 * again: dt_zero_gather_params) the next step trains, the same loss on every
 * rank. A bias beyond 65504 travels exact (32 bits) and refuses nothing. */
static dt_status try_step(dtz_net *n, const dtt_batch *b) {
    dt_zero_set_lr(n->z, 1e-3f);
    dt_graph_reset(n->g);
    dt_status s = dt_zero_before_forward(n->z, n->g, 1);
    dt_tensor *loss = s == DT_OK ? dt_model_forward(n->m, n->g, &b->b, NULL) : NULL;
    if (s == DT_OK && !loss) s = dt_error_code();
    if (s == DT_OK) s = dt_graph_backward_scaled(n->g, loss, 1.0f);
    if (s == DT_OK) s = dt_zero_finish_backward(n->z);
    if (s == DT_OK) s = dt_zero_step(n->z, NULL);
    if (s == DT_OK) s = dt_zero_sync_params(n->z);   /* stages 1/2: the stepped shards gathered */
    else (void)dt_zero_sync_params(n->z);   /* drain what is in flight; s stays the first error */
    return s;
}

/* the last element of parameter `name`: the rank whose shard holds it, and its master there */
static int owner_of_param(dt_zero *z, dt_model *m, const char *name, float **master) {
    dt_param *p = dt_model_find_param(m, name);
    T_CHECK(p != NULL);
    size_t at = m->offsets[p->index] + (size_t)p->value.numel - 1;
    for (int i = 0; i < dt_zero_num_buckets(z); i++) {
        const dt_zero_bucket *b = dt_zero_bucket_at(z, i);
        if (at < b->begin || at >= b->begin + b->numel) continue;
        int q = (int)((at - b->begin) / b->shard);
        *master = q == t_rank() ? dt_zero_shard_params(z, i) + (at - b->own_begin) : NULL;
        return q;
    }
    T_CHECK(!"parameter in no bucket");
    return -1;
}

static void test_fp16_range(void) {
    t_begin("param_dtype fp16: a master beyond 65504 fails the step on every rank, naming it (stages 2/3)");
    dtz_spec sp = dtz_mk_spec(dtt_mlp_cfg(20, 32, 16, 5), 16, 4);
    for (int stage = 2; stage <= 3; stage++) {
        dt_zero_opts o = dtz_opts(&sp, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        o.param_dtype = DT_F16;
        o.dp.first_bucket_bytes = o.dp.bucket_bytes = 2048;
        dtz_net n;
        dtz_net_init(&n, &sp, 1 + (uint64_t)t_rank(), world, &o);
        dtt_batch b;   /* the same batch on every rank: the same loss on every rank */
        dtt_make_batch(&sp.cfg, dtt_key(0, 0, 0), sp.B, &b);
        T_OK(try_step(&n, &b));
        /* a bias: exact on the wire, no refusal */
        float *bias = NULL;
        owner_of_param(n.z, n.m, n.m->params[1]->name, &bias);
        T_CHECK(n.m->params[1]->value.ndim == 1);
        float keep_bias = bias ? *bias : 0;
        if (bias) *bias = 1e6f;
        T_OK(try_step(&n, &b));
        if (bias) *bias = keep_bias;
        /* a matrix */
        const char *name = n.m->params[n.m->n_params - 2]->name;   /* the last matrix */
        T_CHECK(n.m->params[n.m->n_params - 2]->value.ndim == 2);
        float *w = NULL;
        int q = owner_of_param(n.z, n.m, name, &w);
        float keep = w ? *w : 0;
        if (w) *w = 1e6f;
        dt_error_clear();
        dt_status st = try_step(&n, &b);
        char want[64], msg[512];
        snprintf(want, sizeof want, "in rank %d's master shard", q);
        snprintf(msg, sizeof msg, "%s", dt_error_message());
        T_CHECK(st == DT_EINVAL);
        T_CHECK(strstr(msg, name) != NULL);
        T_CHECK(strstr(msg, "beyond fp16's range") != NULL);
        T_CHECK(strstr(msg, want) != NULL);
        if (w) *w = keep;
        T_OK(dt_zero_gather_params(n.z));   /* stage 2's copy holds the inf: gathered again */
        dt_error_clear();
        T_OK(try_step(&n, &b));   /* trains on, every rank */
        dt_graph_reset(n.g);
        T_OK(dt_zero_before_forward(n.z, n.g, 1));
        dt_tensor *loss = dt_model_forward(n.m, n.g, &b.b, NULL);
        T_CHECK(loss != NULL);
        float l = dt_f32(loss)[0];
        T_OK(dt_zero_sync_params(n.z));
        T_CHECK(isfinite(l));
        T_SAME_ON_RANKS(&l, 1, "the loss after the refusal");
        if (t_rank() == 0) printf("  stage %d: every rank refused: %s\n", stage, msg);
        dtt_batch_free(&b);
        dtz_net_free(&n);
    }
    /* float32 masters on an fp16 gather wire (dp.wire, --compress fp16): the
     * wire overflows, not a working copy, and the message says so */
    dt_zero_opts o = dtz_opts(&sp, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD);
    o.dp.wire = DT_F16;
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 2048;
    dtz_net n;
    dtz_net_init(&n, &sp, 1 + (uint64_t)t_rank(), world, &o);
    dtt_batch b;
    dtt_make_batch(&sp.cfg, dtt_key(0, 0, 0), sp.B, &b);
    T_OK(try_step(&n, &b));
    const char *name = n.m->params[n.m->n_params - 2]->name;
    float *w = NULL;
    owner_of_param(n.z, n.m, name, &w);
    if (w) *w = 1e6f;
    dt_error_clear();
    T_CHECK(try_step(&n, &b) == DT_EINVAL);
    const char *msg = dt_error_message();
    T_CHECK(strstr(msg, name) != NULL && strstr(msg, "beyond fp16's range") != NULL);
    T_CHECK(strstr(msg, "dp.wire fp16") != NULL);
    T_CHECK(strstr(msg, "param_dtype") == NULL);   /* (the masters are float32: not the cause) */
    if (t_rank() == 0) printf("  fp16 wire: %s\n", msg);
    dtt_batch_free(&b);
    dtz_net_free(&n);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_shm_collectives();
    test_zero_shm_vs_mpi();
    test_nothing_trains_no_windows();
    test_reference();
    test_converge_and_bytes();
    test_param_dtype();
    test_fp16_range();
    T_OK(dt_dist_finalize());
    return 0;
}
