#!/usr/bin/env bash
# Real simulated hosts (../shared/tools/netsim.sh: network namespaces, ranks on
# different hosts talk TCP over a veth link, ranks on one host shared memory):
#  - 2 hosts x 2 ranks and 3 + 1 ranks: DDP, ZeRO-1/2/3 and pp 2 x dp 2 with
#    --deterministic train bit-identically to the same run on one machine
#    (every tensor of the final checkpoint, tests/tools/ckpt_cmp);
#  - ZeRO with --node-params (one parameter copy per host) equals private
#    parameters on one machine, 2 x 2 and 3 + 1;
#  - the start-up line names the machines and the hierarchical path;
#  - a pipeline's 16-bit wire (--pp-wire bf16) saves the predicted bytes per
#    step on each host's link (interface counters);
#  - a SIGSTOPped rank on the other host is named, with its host, by the
#    stall warning of the ranks that wait for it;
#  - a stop signal to a --hosts launcher at once after it started mpirun
#    stops the job before its first step (exit 143, checkpoint saved), the
#    launcher on a machine with ranks (the launch directory, then the step
#    agreement) and on one without (mpirun's forwarding); before, it was
#    lost (the job trained to its end) or ended the job with status 0;
#  - the same stop while one host's ranks are still loading (held 4 s
#    before main() by SLOW_START, as on a slow machine): the launcher's
#    asks through mpirun reach them before they handle signals; as SIGUSR1
#    they killed them and failed the job, as SIGURG they pass; with the
#    user's OMPI_MCA_ess_base_forward_signals=none the stop ends the job
#    through mpirun's SIGTERM instead of being lost.
# Skipped (exit 77, ctest SKIP_RETURN_CODE) where namespaces cannot be made.
# usage: test_multihost.sh DTRAIN CKPT_CMP NETSIM SLOW_START
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2 ns=$3 slow=$4
[ "$(id -u)" -eq 0 ] || { echo "SKIP: simulated hosts need root (network namespaces)"; exit 77; }
[ -x "$ns" ] || { echo "SKIP: $ns not found (the shared tools live beside the repository)"; exit 77; }
probe=dtm-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then echo "SKIP: network namespaces unavailable here (ip netns add failed)"; exit 77; fi
ip netns del "$probe"
tmp=$(mktemp -d)
export NETSIM_PREFIX=dtm NETSIM_SUBNET=10.213.0 NETSIM_STATE=$tmp/netsim OMP_NUM_THREADS=1
trap '"$ns" down --kill > /dev/null 2>&1; rm -rf "$tmp"' EXIT
if ! "$ns" up --hosts 3 --rate 10gbit > "$tmp/up.out" 2>&1; then echo "FAIL: netsim up:"; cat "$tmp/up.out"; exit 1; fi
fail=0
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(train --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --steps 4 --batch 2 --deterministic)

# one TAG PLACEMENT ARGS...: the run on simulated hosts (PLACEMENT: mpirun --host
# list) and on this machine (--nproc 4, or REF_ARGS instead of ARGS when set);
# checkpoints bitwise equal
one() {
    local tag=$1 hosts=$2; shift 2
    local ref=(--nproc 4 "$@")
    [ -n "${REF_ARGS:-}" ] && read -r -a ref <<< "$REF_ARGS"
    if ! "$bin" "${gpt2[@]}" "${ref[@]}" --save "$tmp/$tag.ref" > "$tmp/$tag.ref.out" 2>&1; then
        echo "FAIL $tag: one machine:"; tail -5 "$tmp/$tag.ref.out"; fail=1; return
    fi
    if ! "$ns" run -np 4 --host "$hosts" -- "$bin" "${gpt2[@]}" "$@" --save "$tmp/$tag.ck" > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: simulated hosts:"; tail -5 "$tmp/$tag.out"; fail=1; return
    fi
    if "$cmp" "$tmp/$tag.ref" "$tmp/$tag.ck" step optim_step epoch cursor > "$tmp/cmp.out"; then
        echo "ok   $tag ($hosts) == one machine: $(tail -1 "$tmp/cmp.out")"
    else
        echo "FAIL $tag ($hosts) != one machine:"; cat "$tmp/cmp.out"; fail=1
    fi
}
# says TAG PATTERN: the run's output has PATTERN
says() {
    if grep -qE "$2" "$tmp/$1.out"; then echo "ok   $1 says: $(grep -m1 -oE "$2" "$tmp/$1.out")"
    else echo "FAIL $1 does not say /$2/:"; head -12 "$tmp/$1.out"; fail=1; fi
}

one ddp22 dtm0:2,dtm1:2
says ddp22 "ddp on 2 machines x 2 ranks: gradients reduced hierarchically"
says ddp22 "machine dtm1 \(2 ranks\): [0-9.]+ / [0-9.]+ / [0-9.]+ / [0-9.]+"
one zero1_22 dtm0:2,dtm1:2 --zero 1 --save-format consolidated
one zero2_22 dtm0:2,dtm1:2 --zero 2 --save-format consolidated
one zero3_22 dtm0:2,dtm1:2 --zero 3 --save-format consolidated
# pp 2 x dp 2 == DDP at 2 ranks on the same micro-batches (as test_pipeline_bitwise.sh)
REF_ARGS="--nproc 2 --batch 2 --accum 2" one pp2dp2 dtm0:2,dtm1:2 --pp 2 --microbatches 2 --batch 4
# node-shared parameters: one copy per real host, equal to private parameters on one machine
REF_ARGS="--nproc 4 --zero 3 --save-format consolidated" one zero3np_22 dtm0:2,dtm1:2 --zero 3 --node-params --save-format consolidated
says zero3np_22 "zero-3: parameters once per machine in shared memory"
REF_ARGS="--nproc 4 --zero 2 --save-format consolidated" one zero2np_31 dtm0:3,dtm1:1 --zero 2 --node-params --save-format consolidated
one ddp31 dtm0:3,dtm1:1
says ddp31 "ddp on 2 machines \(3\+1 ranks\): gradients reduced hierarchically \(inside each machine, then across machines in 3 lanes\)"
one zero2_31 dtm0:3,dtm1:1 --zero 2 --save-format consolidated

# --compress bf16 across machines: float32 inside each, bf16 between them
if "$ns" run -np 4 --host dtm0:2,dtm1:2 -- "$bin" train --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 \
       --data text --data-path "$tmp/corpus.txt" --eval-batches 2 --threads 1 --steps 4 --batch 2 --compress bf16 \
       > "$tmp/bf16.out" 2>&1; then
    says bf16 "ddp on 2 machines x 2 ranks: gradients reduced hierarchically \(inside each machine, then across machines in 2 lanes, as bf16\)"
else
    echo "FAIL --compress bf16 across machines:"; tail -5 "$tmp/bf16.out"; fail=1
fi

# --pp-wire bf16 across machines: stage 0 on dtm0, stage 1 on dtm1. A step
# sends --batch x --seq x --embd = 16 x 32 x 32 activations one way and as
# many gradients back, so the 16-bit wire must save 2 bytes of each, 32768
# bytes per step, on each host's link (tied rows, the loss and the clip norm
# stay float32: the saving is predicted, not the ratio). Measured from the
# interface counters: a 9-step run minus a 1-step run (set-up and the final
# evaluation cancel), per step, bf16 against float32.
tx() { ip netns exec "dtm$1" cat /sys/class/net/nsim0/statistics/tx_bytes; }
pptx() {   # pptx WIRE STEPS: "bytes sent by dtm0 dtm1" during the run
    local a0 a1
    a0=$(tx 0); a1=$(tx 1)
    "$ns" run -np 2 --host dtm0:1,dtm1:1 -- "$bin" train --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 \
        --data text --data-path "$tmp/corpus.txt" --eval-batches 1 --threads 1 --batch 16 --microbatches 4 --pp 2 \
        --pp-split 2,2 --steps "$2" --pp-wire "$1" > "$tmp/ppw.out" 2>&1 || { tail -3 "$tmp/ppw.out" >&2; return 1; }
    echo "$(( $(tx 0) - a0 )) $(( $(tx 1) - a1 ))"
}
if f9=$(pptx fp32 9) && f1=$(pptx fp32 1) && b9=$(pptx bf16 9) && b1=$(pptx bf16 1); then
    read -r -a F9 <<< "$f9"; read -r -a F1 <<< "$f1"; read -r -a B9 <<< "$b9"; read -r -a B1 <<< "$b1"
    for h in 0 1; do
        fs=$(( (F9[h] - F1[h]) / 8 )) bs=$(( (B9[h] - B1[h]) / 8 ))
        saved=$((fs - bs))
        # 32768 payload bytes, within 10% (packet headers; measured: within 1.5%)
        if [ "$saved" -ge 29500 ] && [ "$saved" -le 36000 ]; then
            echo "ok   --pp-wire bf16: dtm$h sends $bs bytes per step against $fs in float32 (saves $saved, payload 32768)"
        else
            echo "FAIL --pp-wire bf16: dtm$h sends $bs bytes per step against $fs in float32: saves $saved, want ~32768"; fail=1
        fi
    done
else
    echo "FAIL --pp-wire across machines: a run failed"; fail=1
fi

# the launcher: dtrain --hosts starts the ranks itself (through netsim's ssh
# stand-in, as mpirun would through ssh) and trains across both hosts
if ip netns exec dtm0 env SHELL=/bin/sh OMPI_MCA_plm_rsh_agent="$NETSIM_STATE/agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
       OMPI_MCA_oob_tcp_if_include="$NETSIM_SUBNET.0/24" OMPI_MCA_btl_tcp_if_include="$NETSIM_SUBNET.0/24" \
       "$bin" "${gpt2[@]}" --hosts dtm0:2,dtm1:2 --save "$tmp/hosts.ck" > "$tmp/hosts.out" 2>&1 &&
   "$cmp" "$tmp/ddp22.ck" "$tmp/hosts.ck" step optim_step epoch cursor > "$tmp/cmp.out"; then
    echo "ok   --hosts dtm0:2,dtm1:2 == the same run under netsim's mpirun: $(tail -1 "$tmp/cmp.out")"
    says hosts "ddp on 2 machines x 2 ranks"
else
    echo "FAIL --hosts dtm0:2,dtm1:2:"; tail -5 "$tmp/hosts.out"; cat "$tmp/cmp.out" 2>/dev/null; fail=1
fi

# the watchdog: rank 3 (on dtm1) stopped for 5 s; the ranks waiting for it name it and its host
"$ns" run -np 4 --host dtm0:2,dtm1:2 -- "$bin" train --model mlp --hidden 32 --batch 8 --steps 100000000 --threads 1 \
    --log-every 20 --stall-warn 2 > "$tmp/wd.out" 2> "$tmp/wd.err" < /dev/null &
job=$!
for _ in $(seq 300); do grep -q "^step " "$tmp/wd.out" 2>/dev/null && break; sleep 0.2; done
victim=""
for p in $(pgrep -f "dtrain.*--stall-warn 2"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -cx "OMPI_COMM_WORLD_RANK=3" > /dev/null && victim=$p
done
if [ -z "$victim" ]; then
    echo "FAIL watchdog: rank 3 not found"; fail=1
else
    sleep 1; kill -STOP "$victim"; sleep 5; kill -CONT "$victim"; sleep 1
fi
kill -TERM "$job" 2>/dev/null; wait "$job" 2>/dev/null
re="rank (0|1): warning: collective stalled: .* on world has waited [0-9.]+ s: .*3 on dtm1 \((its last operation #[0-9]+, )?idle [0-9.]+ s\)"
if grep -qE "$re" "$tmp/wd.err"; then echo "ok   watchdog across hosts: $(grep -m1 -oE "$re" "$tmp/wd.err")"
else echo "FAIL watchdog: no warning on dtm0 naming rank 3 on dtm1:"; head -6 "$tmp/wd.err"; fail=1; fi

# a stop at start-up: SIGTERM to the launcher as soon as it has started
# mpirun (+0 / +0.1 s); the launcher on dtm0 (with 2 of the ranks) and on
# dtm2 (none of them)
cat > "$tmp/env.sh" << EOF
export SHELL=/bin/sh OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm=rsh
export OMPI_MCA_plm_rsh_agent=\${DT_AGENT:-$NETSIM_STATE/agent} OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_oob_tcp_if_include=$NETSIM_SUBNET.0/24 OMPI_MCA_btl_tcp_if_include=$NETSIM_SUBNET.0/24
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
exec "\$@"
EOF
# (netsim's ssh stand-in, with dtm1's ranks held before main())
cat > "$tmp/slow_agent" << EOF
#!/bin/sh
for a; do [ "\$a" = dtm1 ] && export LD_PRELOAD="$slow" DT_TEST_HOLD_S=4; done
exec "$NETSIM_STATE/agent" "\$@"
EOF
chmod 755 "$tmp/slow_agent"
# stop_case AT DELAY [AGENT]: SIGTERM to a launcher on AT, DELAY s after it forked mpirun
stop_case() {
    local at=$1 d=$2 how=""
    [ -n "${3:-}" ] && how=", dtm1's ranks held 4 s before main()"
    local ck=$tmp/stop_$at.ck started="" job rc step want
    rm -rf "$ck"
    DT_AGENT=${3:-} "$ns" exec "$at" sh "$tmp/env.sh" "$bin" train --model mlp --hidden 32 --batch 8 --steps 100000 \
        --threads 1 --log-every 100000 --hosts dtm0:2,dtm1:2 --save "$ck" < /dev/null > "$tmp/stop.out" 2>&1 &
    job=$!
    for _ in $(seq 2000); do   # (netsim's exec becomes dtrain, which forks mpirun)
        [ "$(readlink "/proc/$job/exe")" = "$(readlink -f "$bin")" ] && [ -n "$(pgrep -P $job)" ] && started=1 && break
        sleep 0.005
    done
    [ -z "$started" ] && { echo "FAIL stop on $at: the launcher did not start mpirun within 10 s"; fail=1; }
    sleep "$d"; kill -TERM $job; wait $job; rc=$?
    step=$("$bin" inspect "$ck" 2>/dev/null | awk '$1 == "step" {print $2; exit}')
    # (from dtm2 the stop goes through mpirun 1 s after its start: on a fast
    # machine the ranks may have trained a few steps by then)
    want=0; [ $at = dtm2 ] && want=${step:-x}
    if [ $rc -eq 143 ] && grep -qE "^interrupted at step $want, saved to $ck" "$tmp/stop.out" && [ "$step" = "$want" ]; then
        echo "ok   stop $d s after the launcher on $at started mpirun$how: exit 143, $(grep -m1 '^interrupted' "$tmp/stop.out")"
    else
        echo "FAIL stop $d s after the launcher on $at started mpirun$how: exit $rc, checkpoint step '${step:-}':"
        tail -3 "$tmp/stop.out"; fail=1
    fi
}
for at in dtm0 dtm2; do
    for d in 0 0.1; do stop_case $at $d; done
done
# (the held ranks survive the asks sent while they load; the stop reaches
# them through dtm0's ranks and the step agreement, or a later ask)
stop_case dtm2 0 "$tmp/slow_agent"
# the user turned mpirun's forwarding off (OMPI_MCA_ess_base_forward_signals=none):
# from dtm2 the stop ends the job through mpirun's SIGTERM, and says so,
# instead of being lost (the job trained to its end)
OMPI_MCA_ess_base_forward_signals=none "$ns" exec dtm2 sh "$tmp/env.sh" "$bin" train --model mlp --hidden 32 --batch 8 \
    --steps 100000000 --threads 1 --log-every 100000000 --hosts dtm0:2,dtm1:2 < /dev/null > "$tmp/none.out" 2>&1 &
job=$! started=""
for _ in $(seq 2000); do   # (as in stop_case: dtrain itself, with mpirun started)
    [ "$(readlink "/proc/$job/exe")" = "$(readlink -f "$bin")" ] && [ -n "$(pgrep -P $job)" ] && started=1 && break
    sleep 0.005
done
sleep 2; kill -TERM $job
for _ in $(seq 300); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
if [ -z "$started" ]; then
    echo "FAIL forward list 'none': the launcher did not start mpirun within 10 s"; kill -KILL $job; wait $job; fail=1
elif kill -0 $job 2> /dev/null; then
    echo "FAIL forward list 'none': the job still runs 30 s after the stop"; kill -KILL $job; wait $job; fail=1
elif wait $job; [ $? -eq 143 ] && grep -q "ess_base_forward_signals=none: mpirun passes no signal on" "$tmp/none.out"; then
    echo "ok   forward list 'none': the stop ends the job through mpirun (exit 143), said on stderr"
else
    echo "FAIL forward list 'none':"; tail -3 "$tmp/none.out"; fail=1
fi

exit $fail
