#!/usr/bin/env bash
# Elastic restarts (issue 28, --min-nproc) on real simulated hosts
# (../shared/tools/netsim.sh: network namespaces; dtrain's own launcher runs on
# the first host and reaches the others through netsim's rsh agent).
# A machine is lost mid-run: its processes are killed with SIGKILL and its
# link goes down, so it no longer answers.
#  - DDP 2 hosts x 2 ranks, --min-nproc 2: the launcher probes the hosts,
#    restarts on the 2 ranks left with --accum 2 (the global batch kept) and
#    finishes; every loss after the restart equals (1e-6 relative) a run that
#    resumed the same checkpoint at 2 ranks --accum 2 by hand.
#  - ZeRO-2 (its sharded set resharded from 4 ranks to 2) and a pipeline,
#    pp 2 x dp 2 -> pp 2 x dp 1 with twice the micro-batches, compared the
#    same way. The final evaluations are compared too: a pipeline's restart
#    keeps the evaluated sequences (--eval-batches rescaled with --batch).
#  - spare hosts: --hosts with 3 machines for 4 ranks, one lost: the job
#    continues at 4 ranks on the two left, its losses those of the
#    uninterrupted run.
#  - no machine enough: without --min-nproc a lost machine ends the job —
#    here one that goes silent (link down first: no connection reset), which
#    mpirun notices by TCP keepalives the launcher sets (about 20 s).
# The probe timeout is 5 s (a live simulated host answers in ~0.1 s: a wide
# margin for a loaded machine; only the lost host waits it out).
# Skipped (exit 77) where namespaces cannot be made.
# usage: test_elastic.sh DTRAIN NETSIM [SEED]
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 ns=$2
[ "$(id -u)" -eq 0 ] || { echo "SKIP: simulated hosts need root (network namespaces)"; exit 77; }
[ -x "$ns" ] || { echo "SKIP: $ns not found (the shared tools live beside the repository)"; exit 77; }
probe=dte-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then echo "SKIP: network namespaces unavailable here (ip netns add failed)"; exit 77; fi
ip netns del "$probe"
seed=${3:-$$}
RANDOM=$seed
echo "seed $seed (test_elastic.sh ... $seed repeats this run)"
tmp=$(mktemp -d)
export NETSIM_PREFIX=dte NETSIM_SUBNET=10.214.0 NETSIM_STATE=$tmp/netsim OMP_NUM_THREADS=1
trap '"$ns" down --kill > /dev/null 2>&1; rm -rf "$tmp"' EXIT
if ! "$ns" up --hosts 3 --rate 10gbit > "$tmp/up.out" 2>&1; then echo "FAIL: netsim up:"; cat "$tmp/up.out"; exit 1; fi
fail=0
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
steps=400
base=(train --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --steps $steps --deterministic --log-every 1000 --save-every 2)
# what netsim's 'run' gives mpirun, for dtrain's launcher on host dte0
probe_s=5
cat > "$tmp/env.sh" << EOF
export SHELL=/bin/sh OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm=rsh
export OMPI_MCA_plm_rsh_agent=$tmp/netsim/agent OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_oob_tcp_if_include=10.214.0.0/24 OMPI_MCA_btl_tcp_if_include=10.214.0.0/24
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp DTRAIN_HOST_PROBE_TIMEOUT=$probe_s
exec "\$@"
EOF

last_step() { tail -n 1 "$1" 2>/dev/null | grep -oE '"step":[0-9]+' | cut -d: -f2; }
# lose HOST: the machine crashes (its processes die, its link goes down);
# SILENT=1: the link goes first, so no connection is reset (a power loss):
# only TCP keepalives tell mpirun its daemon there is gone
lose() {
    local p
    [ -n "${SILENT:-}" ] && ip -n "$1" link set nsim0 down && sleep 0.2
    for p in $(ip netns pids "$1"); do kill -9 "$p" 2>/dev/null; done
    sleep 0.3
    ip -n "$1" link set nsim0 down
}
# same_losses A.jsonl B.jsonl FROM: steps > FROM of A equal B's (1e-6 relative), B has them all
same_losses() {
    awk -v from="$3" -F'[:,}]' '
        function val(k,   i) { for (i = 1; i < NF; i++) if ($i ~ "\"" k "\"$") return $(i + 1); return "" }
        FNR == 1 { f++ }
        { s = val("step") + 0; l = val("loss"); if (s <= from || l == "") next
          if (f == 1) a[s] = l; else { b[s] = l; n++ } }
        END { if (!n) { print "no steps after " from; exit 1 }
              for (s in b) { if (!(s in a)) { print "step " s " missing"; exit 1 }
                  d = a[s] - b[s]; if (d < 0) d = -d; m = b[s] < 0 ? -b[s] : b[s]
                  if (d > 1e-6 * m) { print "step " s ": " a[s] " vs " b[s]; exit 1 } }
              print n " losses after step " from " equal" }' "$1" "$2"
}

# elastic TAG HOSTS VICTIM MIN WANT_NP REF_ARGS -- ARGS: the job on HOSTS, VICTIM lost
# mid-run; it must restart on WANT_NP ranks; then the resumed checkpoint is
# made on this machine (--nproc 4 ARGS, --stop-after the step) and resumed by
# hand with REF_ARGS; losses compared
elastic() {
    local tag=$1 hosts=$2 victim=$3 min=$4 want=$5; shift 5
    local ref=() args=()
    while [ "$1" != -- ]; do ref+=("$1"); shift; done
    shift; args=("$@")
    local mins=(); [ "$min" != - ] && mins=(--min-nproc "$min")
    "$ns" exec dte0 sh "$tmp/env.sh" "$bin" "${base[@]}" "${args[@]}" --nproc 4 --hosts "$hosts" --max-restarts 2 "${mins[@]}" \
        --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2> "$tmp/$tag.err" &
    local job=$! target=$((20 + RANDOM % 40)) s=""
    while kill -0 $job 2>/dev/null; do
        s=$(last_step "$tmp/$tag.jsonl"); [ -n "$s" ] && [ "$s" -ge "$target" ] && break
        sleep 0.02
    done
    local t0=$SECONDS
    lose "$victim"
    # a job still running 120 s after the loss hangs: killed, and a failure
    ( for _ in $(seq 1200); do kill -0 $job 2>/dev/null || exit 0; sleep 0.1; done
      echo "FAIL $tag: still running 120 s after losing $victim"; pkill -9 -f -- "--save $tmp/$tag.ck" ) &
    local guard=$!
    wait $job; local rc=$? t_lost=$((SECONDS - t0))
    wait $guard
    ip -n "$victim" link set nsim0 up
    if [ "$want" = 0 ]; then   # not enough left: the job ends, saying why
        if [ $rc -ne 0 ] && grep -q "$victim did not answer within $probe_s s: 2 slots left, fewer than the job's ranks" "$tmp/$tag.err"; then
            echo "ok   $tag: machine lost${SILENT:+ silently}, no --min-nproc: ends (exit $rc, ${t_lost}s after the loss): $(grep -m1 -o 'did not answer.*' "$tmp/$tag.err")"
        else
            echo "FAIL $tag: exit $rc:"; tail -5 "$tmp/$tag.err"; fail=1
        fi
        return
    fi
    local line from
    line=$(grep -m1 -E "restart 1 of 2 from $tmp/$tag.ck \(step [0-9]+\) on $want ranks" "$tmp/$tag.err")
    from=$(grep -oE '\(step [0-9]+\)' <<< "$line" | grep -oE '[0-9]+')
    if [ $rc -ne 0 ] || [ -z "$line" ] || ! grep -q "$victim did not answer" <<< "$line"; then
        echo "FAIL $tag: exit $rc, no restart on $want ranks naming $victim:"; tail -6 "$tmp/$tag.err"; fail=1; return
    fi
    echo "ok   $tag: ${line#dtrain: }"
    [ -n "${DTE_DEBUG:-}" ] && cat "$tmp/$tag.err"
    if ! grep -qE "^dtrain: 1 restart \(resumed at step $from" "$tmp/$tag.err"; then
        echo "FAIL $tag: no summary:"; tail -3 "$tmp/$tag.err"; fail=1
    fi
    # the checkpoint it resumed, made again on one machine (bitwise the same: test_multihost)
    if ! "$bin" "${base[@]}" "${args[@]}" --nproc 4 --stop-after "$from" --save "$tmp/$tag.at" \
            > "$tmp/$tag.at.out" 2>&1; then
        echo "FAIL $tag: step $from checkpoint:"; tail -3 "$tmp/$tag.at.out"; fail=1; return
    fi
    if ! "$bin" "${base[@]}" "${ref[@]}" --resume "$tmp/$tag.at" --save "$tmp/$tag.ref" --metrics "$tmp/$tag.ref.jsonl" \
            > "$tmp/$tag.ref.out" 2>&1; then
        echo "FAIL $tag: resumed by hand:"; tail -3 "$tmp/$tag.ref.out"; fail=1; return
    fi
    local r
    if r=$(same_losses "$tmp/$tag.jsonl" "$tmp/$tag.ref.jsonl" "$from"); then echo "ok   $tag: $r (resumed by hand: ${ref[*]})"
    else echo "FAIL $tag vs resumed by hand: $r"; fail=1; fi
    # and the final evaluation, on the same sequences (a pipeline's restart
    # rescales --eval-batches with --batch)
    local ea eb
    ea=$(grep -oE '"eval_loss":[0-9.e+-]+' "$tmp/$tag.jsonl" | tail -1 | cut -d: -f2)
    eb=$(grep -oE '"eval_loss":[0-9.e+-]+' "$tmp/$tag.ref.jsonl" | tail -1 | cut -d: -f2)
    if [ -n "$ea" ] && [ -n "$eb" ] && awk -v a="$ea" -v b="$eb" 'BEGIN { d = a - b; exit !(d * d <= 1e-12 * b * b) }'; then
        echo "ok   $tag: final evaluation $ea, resumed by hand $eb"
    else
        echo "FAIL $tag: final evaluation '$ea', resumed by hand '$eb'"; fail=1
    fi
}

elastic ddp dte0:2,dte1:2 dte1 2 2 --nproc 2 --batch 2 --accum 2 -- --batch 2
elastic zero2 dte0:2,dte1:2 dte1 2 2 --nproc 2 --batch 2 --accum 2 --zero 2 -- --batch 2 --zero 2
# (pp: --eval-batches 2 of --batch 4 are the 8 sequences of 1 batch of 8)
elastic pp dte0:2,dte1:2 dte1 2 2 --nproc 2 --pp 2 --batch 8 --microbatches 4 --eval-batches 1 -- --pp 2 --batch 4 --microbatches 2
grep -q "restart 1 of 2 .*--microbatches 4 keeps the global batch and --eval-batches 1 the evaluation$" "$tmp/pp.err" ||
    { echo "FAIL pp: the restart does not say it keeps the evaluation:"; grep restart "$tmp/pp.err"; fail=1; }
# spares: 4 ranks continue on the two machines left, as if nothing happened
elastic spare dte0:2,dte1:2,dte2:2 dte1 - 4 --nproc 4 --batch 2 -- --batch 2
SILENT=1 elastic short dte0:2,dte1:2 dte1 - 0 -- --batch 2
exit $fail
