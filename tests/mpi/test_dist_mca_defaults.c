/* dt_dist_init's tuned Open MPI defaults: applied where the user set nothing
 * (TCP flags without emulated put, ring Iallreduce, 4 MiB TCP eager limit),
 * a value the user chose is kept, and Open MPI itself sees the result (the
 * eager limit read back through the MPI tool interface; ctest starts every
 * multi-rank test with the TCP component among the BTLs). */
#include <stdlib.h>
#include <string.h>
#include "mpi_check.h"

/* Open MPI's current value of an MCA variable of type size_t/int as a long
 * long, or -1 when the variable is not registered in this process. */
static long long cvar_value(const char *name) {
    int idx = -1;
    if (MPI_T_cvar_get_index(name, &idx) != MPI_SUCCESS) return -1;
    MPI_T_cvar_handle h;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &count) != MPI_SUCCESS) return -1;
    char name_buf[128], desc[1024];
    int nlen = sizeof name_buf, dlen = sizeof desc, verb, bind, scope;
    MPI_Datatype dt;
    MPI_T_enum en;
    long long v = -1;
    if (MPI_T_cvar_get_info(idx, name_buf, &nlen, &verb, &dt, &en, desc, &dlen, &bind, &scope) == MPI_SUCCESS) {
        if (dt == MPI_INT) { int x; if (MPI_T_cvar_read(h, &x) == MPI_SUCCESS) v = x; }
        else if (dt == MPI_UNSIGNED_LONG || dt == MPI_UNSIGNED_LONG_LONG || dt == MPI_LONG_LONG || dt == MPI_LONG) {
            unsigned long long x = 0;
            if (MPI_T_cvar_read(h, &x) == MPI_SUCCESS) v = (long long)x;
        }
    }
    MPI_T_cvar_handle_free(&h);
    return v;
}

int main(int argc, char **argv) {
    unsetenv("OMPI_MCA_btl_tcp_flags");
    unsetenv("OMPI_MCA_btl_tcp_eager_limit");
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "2", 1);   /* the user's choice */
    t_init(&argc, &argv);
    t_begin("tuned MCA defaults where unset, the user's value kept");
    const char *flags = getenv("OMPI_MCA_btl_tcp_flags"), *eager = getenv("OMPI_MCA_btl_tcp_eager_limit"),
               *algo = getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm");
    T_CHECK(flags && !strcmp(flags, "send,inplace,need-ack,need-csum"));
    T_CHECK(eager && atoll(eager) == 4 << 20);
    T_CHECK(algo && !strcmp(algo, "2"));
    int provided = 0;
    T_CHECK(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS);
    long long seen = cvar_value("btl_tcp_eager_limit");
    if (t_rank() == 0) printf("  Open MPI btl_tcp_eager_limit: %lld\n", seen);
    T_CHECK(seen == 4 << 20);
    MPI_T_finalize();
    t_end();
    T_OK(dt_dist_finalize());
    return 0;
}
