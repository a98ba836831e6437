#!/usr/bin/env bash
# The multi-machine launcher (cli/hosts.c, cli/launch.c) without machines:
# --print-launch shows the mpirun command --hosts / --hostfile / a Slurm
# allocation give (hosts, rank count, placement machine by machine, the
# environment passed to every rank), and bad input is refused before anything
# runs with one line naming the host or line at fault.
# (test_multihost.sh launches across simulated hosts for real.)
# usage: test_launch_hosts.sh DTRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
unset SLURM_JOB_ID SLURM_JOB_NODELIST SLURM_TASKS_PER_NODE SLURM_NTASKS SLURM_JOB_NUM_NODES

# has NAME PATTERN CMD...: CMD's output (stdout+stderr) matches PATTERN
has() {
    local name=$1 pat=$2; shift 2
    local out
    out=$("$@" 2>&1)
    if grep -qE -- "$pat" <<< "$out"; then echo "ok   $name"
    else echo "FAIL $name: /$pat/ not in:"; echo "$out" | head -5; fail=1; fi
}
# refuses NAME PATTERN CMD...: CMD exits 2 with one line matching PATTERN
refuses() {
    local name=$1 pat=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <<< "$out")" -eq 1 ] && grep -qE -- "$pat" <<< "$out"; then echo "ok   $name"
    else echo "FAIL $name (rc $rc): /$pat/ expected as the one line of:"; echo "$out" | head -5; fail=1; fi
}

has "hosts: host list, rank count = slots, machine by machine" \
    " -np 4 .*--host a:2,b:2 --map-by slot .* train --model mlp$" "$bin" train --hosts a:2,b:2 --print-launch --model mlp
has "hosts: --nproc below the slots" " -np 3 .*--host a:2,b:2" "$bin" train --hosts a:2,b:2 --nproc 3 --print-launch
has "hosts: a host without :N has one slot" " -np 3 .*--host a:1,b:2" "$bin" train --hosts a,b:2 --print-launch
has "hosts: the GEMM and kernel choices reach every rank" \
    "-x DTRAIN_GEMM .*-x OPENBLAS_CORETYPE|-x OPENBLAS_CORETYPE .*-x DTRAIN_GEMM" \
    env DTRAIN_GEMM=openblas OPENBLAS_CORETYPE=SkylakeX "$bin" train --hosts a:2,b:2 --print-launch
has "hosts: threads per rank reach every rank" "^OMP_NUM_THREADS=3 .*-x OMP_NUM_THREADS" \
    "$bin" train --hosts a:2,b:2 --threads 3 --print-launch
has "the environment printed as assignments a shell takes (NAME='a b', not 'NAME=a b')" "(^| )DTRAIN_FOO='a b' " \
    env DTRAIN_FOO='a b' "$bin" train --nproc 2 --print-launch
printf '# two machines\nn1 slots=2\nn2   slots=3  # more\n\n' > "$tmp/hosts"
has "hostfile: passed on, ranks = its slots" " -np 5 .*--hostfile $tmp/hosts --map-by slot" \
    "$bin" train --hostfile "$tmp/hosts" --print-launch
has "Slurm: the allocation's tasks, mpirun reads its nodes" " -np 6 --allow-run-as-root --map-by slot|-np 6 --map-by slot" \
    env SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[1-3]' SLURM_TASKS_PER_NODE='2(x3)' "$bin" train --print-launch
has "this machine: --nproc as before" " -np 2 .*--bind-to none" "$bin" train --nproc 2 --print-launch
# inside an allocation dtrain launches all its tasks without --nproc (it ran one process);
# ranks under mpirun: Open MPI's own leaks are not ours (see test_recompute_bitwise.sh)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
noleak="ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
has "Slurm: no --nproc, a real run on all the allocation's tasks" "ddp on 1 machine x 2 ranks" \
    env "$noleak" SLURM_JOB_ID=7 SLURM_JOB_NODELIST=localhost SLURM_TASKS_PER_NODE=2 timeout 120 "$bin" train --model mlp \
    --hidden 8 --threads 1 --steps 1 --batch 8
has "Slurm: in an srun step, one process as before" "mlp, [0-9]+ parameters, single x1" \
    env "$noleak" SLURM_JOB_ID=7 SLURM_JOB_NODELIST=localhost SLURM_TASKS_PER_NODE=2 SLURM_STEP_ID=0 timeout 120 "$bin" train \
    --model mlp --hidden 8 --threads 1 --steps 1 --batch 8
refuses "hosts: --nproc 0 is not a slot count problem" "^dtrain: --nproc must be >= 1 \(got 0\)$" \
    "$bin" train --hosts a:2,b:2 --nproc 0
refuses "a Slurm job id without a node list: this machine's cap" "--nproc 100: at most [0-9]+ ranks on this machine" \
    env SLURM_JOB_ID=7 "$bin" train --nproc 100

refuses "bad host name" "--hosts: host 'b!' has a '!'" "$bin" train --hosts 'a:2,b!:2'
refuses "zero slots" "--hosts: host 'a' with 0 slots" "$bin" train --hosts a:0
refuses "bad slot count" "--hosts a:x: after 'a:' a slot count" "$bin" train --hosts a:x
many=$(for i in $(seq 1 60); do printf 'node%03d:4,' "$i"; done)
refuses "60 hosts: the list cut in the middle, the last one named" \
    "--nproc 1000: 60 hosts \(node001:4, node002:4, .*, \.\.\., node060:4\) has 240 slots$" "$bin" train --hosts "${many%,}" --nproc 1000
refuses "host twice" "--hosts: host 'a' listed twice" "$bin" train --hosts a:1,a:2
refuses "host twice, in other case" "--hosts: host 'a' listed twice" "$bin" train --hosts A:1,a:2
refuses "a slot count with a space" "--hosts a: 2: after 'a:' a slot count" "$bin" train --hosts 'a: 2'
refuses "a slot count with a sign" "--hosts a:\+2: after 'a:' a slot count" "$bin" train --hosts 'a:+2'
refuses "a trailing comma" "an empty entry \(a leading, trailing or doubled comma\?\)" "$bin" train --hosts 'a:2,'
refuses "more ranks than slots" "--nproc 5: 2 hosts \(a:2, b:2\) has 4 slots" "$bin" train --hosts a:2,b:2 --nproc 5
refuses "hosts and hostfile" "--hosts and --hostfile: give one of them" "$bin" train --hosts a:2 --hostfile "$tmp/hosts"
printf 'n1 slot=2\n' > "$tmp/bad"
refuses "hostfile: bad line named" "--hostfile $tmp/bad line 1: 'slot=2'" "$bin" train --hostfile "$tmp/bad"
printf 'n1 slots=2 max_slots=4\nn2 max_slots=8 slots=3\nn3 max_slots=3\n' > "$tmp/maxs"
has "hostfile: Open MPI's max_slots= accepted, ranks = the slots (max_slots alone: as many)" " -np 8 .*--hostfile $tmp/maxs" \
    "$bin" train --hostfile "$tmp/maxs" --print-launch
printf 'n1 slots=4 max_slots=2\n' > "$tmp/bad"
refuses "hostfile: max_slots below slots" "--hostfile $tmp/bad line 1: max_slots=2 is below slots=4" "$bin" train --hostfile "$tmp/bad"
printf 'n1 max_slots=0\n' > "$tmp/bad"
refuses "hostfile: max_slots=0" "--hostfile $tmp/bad line 1: max_slots=0 \(at least 1\)" "$bin" train --hostfile "$tmp/bad"
printf 'n1 slots=2 max_slots=x\n' > "$tmp/bad"
refuses "hostfile: bad max_slots" "--hostfile $tmp/bad line 1: 'max_slots=x'" "$bin" train --hostfile "$tmp/bad"
printf 'a slots=2\r\nb\r\n' > "$tmp/crlf"   # (the first line's CR was taken as a space, the second's named raw)
refuses "hostfile: DOS line ends named" "--hostfile $tmp/crlf line 1 ends in a carriage return" "$bin" train --hostfile "$tmp/crlf"
refuses "hostfile: missing" "--hostfile $tmp/none: No such file" "$bin" train --hostfile "$tmp/none"
{ printf '#%.0s' $(seq 1 1100); printf ' node9\nn1 slots=2\n'; } > "$tmp/long"   # (its tail read as a line of its own: 3 slots)
refuses "hostfile: a line too long to read whole" "--hostfile $tmp/long line 1 is longer than 1022 characters" \
    "$bin" train --hostfile "$tmp/long"
for nt in 4abc 4294967297 2147483648 -1; do
    refuses "Slurm: SLURM_NTASKS=$nt refused, not read as a number" "cannot read its task count \(SLURM_NTASKS=$nt" \
        env SLURM_JOB_ID=7 SLURM_JOB_NODELIST=n1 SLURM_NTASKS=$nt "$bin" train --print-launch
done
: > "$tmp/empty"
refuses "hostfile: empty" "--hostfile $tmp/empty: no hosts in it" "$bin" train --hostfile "$tmp/empty"
refuses "unresolvable host named" "host 'nosuch\.invalid' \(--hosts\): cannot resolve its name" \
    "$bin" train --hosts nosuch.invalid:2
# one machine under two names: mpirun would take it for two (and its slots twice)
refuses "this machine twice (localhost, 127.0.0.1)" \
    "--hosts: hosts 'localhost' and '127\.0\.0\.1' are one machine \(this one\): list it once, with its slots \(localhost:3\)" \
    "$bin" train --hosts localhost:1,127.0.0.1:2
printf 'localhost slots=1\n%s slots=1\n' "$(hostname)" > "$tmp/twice"
refuses "this machine twice (localhost, its host name)" "--hostfile: hosts 'localhost' and '$(hostname)' are one machine" \
    "$bin" train --hostfile "$tmp/twice"
refuses "Slurm: more ranks than tasks" "--nproc 8: Slurm job 7: n\[1-3\] \(6 tasks\) has 6 slots" \
    env SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[1-3]' SLURM_TASKS_PER_NODE='2(x3)' "$bin" train --nproc 8
# a silent machine is noticed within ~20 s (TCP keepalives on mpirun's control connections), unless the user set them
has "hosts: keepalives on the daemons' connections" "--mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 5" \
    "$bin" train --hosts a:2,b:2 --print-launch
out=$(OMPI_MCA_oob_tcp_keepalive_time=60 "$bin" train --hosts a:2,b:2 --print-launch 2>&1)
if grep -q "keepalive_time 10" <<< "$out"; then echo "FAIL hosts: the user's OMPI_MCA_oob_tcp_keepalive_time is overridden"; fail=1
else echo "ok   hosts: the user's keepalive setting wins"; fi
out=$("$bin" train --nproc 2 --print-launch 2>&1)
if grep -q "keepalive" <<< "$out"; then echo "FAIL this machine: keepalives set without daemons"; fail=1
else echo "ok   this machine: no keepalive settings"; fi
# --min-nproc (elastic restarts): only where machines can be lost, and not above the job
refuses "min-nproc without restarts" "--min-nproc 2 needs --max-restarts K" \
    "$bin" train --hosts a:2,b:2 --min-nproc 2 --save "$tmp/ck"
refuses "min-nproc on one machine" "--min-nproc 1 needs a host list \(--hosts or --hostfile\)" \
    "$bin" train --nproc 2 --max-restarts 1 --min-nproc 1 --save "$tmp/ck"
refuses "min-nproc above the job" "--min-nproc 5 is more than the job's 4 ranks" \
    "$bin" train --hosts localhost:2,a:2 --max-restarts 1 --min-nproc 5 --save "$tmp/ck"
has "min-nproc is the launcher's, not the ranks'" " -np 4 .* train --model mlp --save [^ ]+$" \
    "$bin" train --hosts a:2,b:2 --print-launch --model mlp --max-restarts 1 --min-nproc 2 --save "$tmp/ck"
exit $fail
