#!/usr/bin/env bash
# When dtrain re-executes itself to fix OpenBLAS's kernel family (issue 27),
# its process keeps the program's name: /proc/PID/comm (top, pgrep) is
# "dtrain", `pgrep -x dtrain` finds it, and the command line's argv[0] is the
# one it was started with -- also when started through a symbolic link of
# another name (comm is then the link's name, as without a re-exec). The
# re-exec is forced on any CPU with AVX or better: DTRAIN_TEST_BLAS_CORE
# makes dtrain believe OpenBLAS chose Prescott (SSE) kernels. Exit 77 (skip)
# on a CPU without AVX (/proc/cpuinfo), where no re-exec can happen.
# usage: test_process_name.sh DTRAIN_BINARY
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2> /dev/null; rm -rf "$tmp"' EXIT
export DTRAIN_GEMM=openblas DTRAIN_TEST_BLAS_CORE=Prescott OMP_NUM_THREADS=1
unset OPENBLAS_CORETYPE DTRAIN_BLAS_REEXEC
fail=0
ok()  { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

# Whether a re-exec must happen is the CPU's (cpuid's avx flag, read here
# independently of dtrain), not what dtrain says: a broken re-exec fails.
grep -m1 '^flags' /proc/cpuinfo | grep -qw avx || { echo "skip: this CPU has no AVX, so no re-exec can happen"; exit 77; }
# the start-up line says that dtrain re-executed (and which family it set)
out=$(timeout 60 "$bin" train --model mlp --steps 1 --batch 8 --threads 1 2>&1)
line=$(grep -m1 'GEMM:' <<< "$out")
if grep -q 'set by dtrain' <<< "$line"; then ok "forced re-exec: $line"
else bad "an AVX CPU told OpenBLAS chose Prescott, and no re-exec: $(tail -3 <<< "$out")"; fi

# start(EXE, ARGV0): a long run in the background, its pid once it re-executed
start() {
    (exec -a "$2" "$1" train --model mlp --steps 1000000 --batch 8 --threads 1 --quiet > /dev/null 2>&1) &
    pid=$!
    for _ in $(seq 1 1000); do   # up to 10 s; normally a few ms
        tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -c '^DTRAIN_BLAS_REEXEC=' > /dev/null && return 0
        sleep 0.01
    done
    return 1
}
stop() { kill -9 "$pid" 2> /dev/null; wait "$pid" 2> /dev/null; pid=; }
# comm_of WANT: the process's comm once it is WANT, else what it is after 5 s (the
# new image names itself in main(), a moment after the exec: longer under ASan)
comm_of() {
    local c
    for _ in $(seq 1 500); do
        c=$(cat "/proc/$pid/comm" 2> /dev/null)
        [ "$c" = "$1" ] && break
        sleep 0.01
    done
    echo "$c"
}

# (1) started as dtrain by its path
if start "$bin" "$bin"; then
    comm=$(comm_of dtrain)
    argv0=$(tr '\0' '\n' < "/proc/$pid/cmdline" | head -1)
    [ "$comm" = dtrain ] && ok "comm after the re-exec: $comm" || bad "comm after the re-exec: '$comm' (want dtrain)"
    pgrep -x dtrain | grep -cx "$pid" > /dev/null && ok "pgrep -x dtrain finds pid $pid" || bad "pgrep -x dtrain: $(pgrep -x dtrain | tr '\n' ' ')"
    [ "$argv0" = "$bin" ] && ok "argv[0] kept: $argv0" || bad "argv[0]: '$argv0' (want $bin)"
else
    bad "dtrain never re-executed (no DTRAIN_BLAS_REEXEC in its environment)"
fi
stop

# (2) started through a link of another name: the name it was started as
ln -s "$bin" "$tmp/dtlink"
if start "$tmp/dtlink" "$tmp/dtlink"; then
    comm=$(comm_of dtlink)
    [ "$comm" = dtlink ] && ok "through a link: comm $comm" || bad "through a link: comm '$comm' (want dtlink)"
else
    bad "dtrain (through a link) never re-executed"
fi
stop
exit $fail
