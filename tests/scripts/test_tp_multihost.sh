#!/usr/bin/env bash
# Tensor-parallel groups on simulated hosts (../shared/tools/netsim.sh: network
# namespaces joined by a 1 Gbit/s link; ranks on one host share memory):
#  - dp 2 x tp 2 on 2 hosts x 2 ranks trains bit-identically to the same run
#    on one machine (every tensor of the final checkpoint, every logged loss):
#    on both, each TP group sums a + b on one machine and each DP pair a + b;
#  - the bytes that left each host (its link's TX counter, ip -s link) stay
#    within a bound of the DP all-reduce's bytes, computed here from the
#    per-rank parameter count dtrain prints, and far below what the TP
#    all-reduces of [B, T, C] would add if a TP group spanned the hosts (the
#    check fails if the TP traffic crossed the link);
#  - the CLI's launcher (--hosts tpn0:2,tpn1:2, placing by slot) runs it too;
#  - layouts whose TP group spans hosts are refused before training, naming
#    the ranks, their hosts and how to place them: 1 rank per host with
#    --tp 2, 2 x 2 mapped round-robin (--map-by node), and the mesh --tp 2
#    --pp 2 on 3 + 1 ranks.
# Skipped (exit 77, ctest SKIP_RETURN_CODE) where namespaces cannot be made.
# usage: test_tp_multihost.sh DTRAIN CKPT_CMP NETSIM
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2 ns=$3
[ "$(id -u)" -eq 0 ] || { echo "SKIP: simulated hosts need root (network namespaces)"; exit 77; }
[ -x "$ns" ] || { echo "SKIP: $ns not found (the shared tools live beside the repository)"; exit 77; }
probe=tpn-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then echo "SKIP: network namespaces unavailable here (ip netns add failed)"; exit 77; fi
ip netns del "$probe"
tmp=$(mktemp -d)
export NETSIM_PREFIX=tpn NETSIM_SUBNET=10.217.0 NETSIM_STATE=$tmp/netsim OMP_NUM_THREADS=1
trap '"$ns" down --kill > /dev/null 2>&1; rm -rf "$tmp"' EXIT
if ! "$ns" up --hosts 2 --rate 1gbit > "$tmp/up.out" 2>&1; then echo "FAIL: netsim up:"; cat "$tmp/up.out"; exit 1; fi
fail=0
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
# B T C = 8 x 64 x 32: each TP all-reduce moves 64 KiB, against ~75 KiB of a rank's parameters
B=8 T=64 C=32 L=2 steps=4
gpt2=(train --model gpt2 --layers $L --embd $C --heads 2 --max-t $T --seq $T --data text --data-path "$tmp/corpus.txt"
      --eval-batches 1 --threads 1 --steps $steps --batch $B --tp 2)
tx() { ip netns exec "$1" cat /sys/class/net/nsim0/statistics/tx_bytes; }

# 1. the same run on one machine and on 2 hosts x 2 ranks: bitwise
if ! timeout -k 10 120 "$bin" "${gpt2[@]}" --nproc 4 --save "$tmp/ref.ck" --metrics "$tmp/ref.jsonl" \
        < /dev/null > "$tmp/ref.out" 2>&1; then
    echo "FAIL one machine:"; tail -5 "$tmp/ref.out"; exit 1
fi
tx0=$(tx tpn0) tx1=$(tx tpn1)
if ! timeout -k 10 180 "$ns" run -np 4 --host tpn0:2,tpn1:2 -- "$bin" "${gpt2[@]}" --save "$tmp/hosts.ck" \
        --metrics "$tmp/hosts.jsonl" < /dev/null > "$tmp/hosts.out" 2>&1; then
    echo "FAIL 2 hosts x 2 ranks:"; tail -5 "$tmp/hosts.out"; exit 1
fi
sent0=$(( $(tx tpn0) - tx0 )) sent1=$(( $(tx tpn1) - tx1 ))
if "$cmp" "$tmp/ref.ck" "$tmp/hosts.ck" step optim_step epoch cursor > "$tmp/cmp.out"; then
    echo "ok   dp 2 x tp 2 on 2 hosts x 2 ranks == one machine: $(tail -1 "$tmp/cmp.out")"
else
    echo "FAIL dp 2 x tp 2 on 2 hosts != one machine:"; cat "$tmp/cmp.out"; fail=1
fi
strip() { sed -E 's/"(time|elapsed|tok_per_s|ms|wall)[a-z_]*":[-0-9.e+]+,?//g' "$1" | grep -oE '"(step|loss|eval_loss|eval_accuracy)":[-0-9.e+]+' ; }
if [ -s "$tmp/ref.jsonl" ] && diff <(strip "$tmp/ref.jsonl") <(strip "$tmp/hosts.jsonl") > /dev/null; then
    echo "ok   every logged loss and evaluation equal ($(strip "$tmp/ref.jsonl" | grep -c loss) values)"
else
    echo "FAIL logged losses differ:"; diff <(strip "$tmp/ref.jsonl") <(strip "$tmp/hosts.jsonl") | head -5; fail=1
fi

# 2. bytes across the link. N = one rank's parameters (the start-up line's
# "(N on each tensor-parallel rank)");
# each data-parallel pair all-reduces N floats per step, plus DDP's start-up
# broadcast: a host's 2 ranks send 2 x 4N bytes per step (an all-reduce of 2
# ranks sends each rank's whole buffer once). A TP group across the hosts
# would add per rank and step (4 L + 2) all-reduces of B T C floats (2
# forward + 2 backward per layer, the embedding's and the lm-head's), the
# evaluation's forwards on top.
N=$(grep -m1 -oE '\(([0-9]+) on each tensor-parallel rank\)' "$tmp/hosts.out" | grep -oE '[0-9]+')
if [ -z "$N" ]; then echo "FAIL no parameter count in the output:"; head -5 "$tmp/hosts.out"; exit 1; fi
dp=$(( 2 * 4 * N * (steps + 1) ))
tp=$(( 2 * 4 * (4 * L + 2) * B * T * C * steps ))
bound=$(( dp * 3 / 2 + 256 * 1024 ))   # + TCP/IP headers, MPI's wire-up and mpirun's control traffic
echo "     bytes sent: tpn0 $sent0, tpn1 $sent1; DP all-reduce $dp (N = $N), bound $bound; TP would add $tp"
if [ "$tp" -gt $(( 3 * bound )) ] && [ "$sent0" -le "$bound" ] && [ "$sent1" -le "$bound" ] && [ "$sent0" -ge $(( dp / 2 )) ]; then
    echo "ok   each host sent at most the DP all-reduce's bound; the TP all-reduces stayed on the hosts"
else
    echo "FAIL bytes across the link: tpn0 $sent0, tpn1 $sent1 against the bound $bound (DP $dp, TP $tp)"; fail=1
fi

# the launcher: dtrain --hosts places by slot, so the same layout runs from the
# CLI (through netsim's ssh stand-in, as mpirun would through ssh)
if ip netns exec tpn0 env SHELL=/bin/sh OMPI_MCA_plm_rsh_agent="$NETSIM_STATE/agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
       OMPI_MCA_oob_tcp_if_include="$NETSIM_SUBNET.0/24" OMPI_MCA_btl_tcp_if_include="$NETSIM_SUBNET.0/24" \
       timeout -k 10 180 "$bin" "${gpt2[@]}" --hosts tpn0:2,tpn1:2 --save "$tmp/launch.ck" < /dev/null > "$tmp/launch.out" 2>&1 &&
   "$cmp" "$tmp/ref.ck" "$tmp/launch.ck" step optim_step epoch cursor > "$tmp/cmp.out"; then
    echo "ok   --hosts tpn0:2,tpn1:2 --tp 2 == one machine: $(tail -1 "$tmp/cmp.out")"
else
    echo "FAIL --hosts tpn0:2,tpn1:2 --tp 2:"; tail -5 "$tmp/launch.out"; cat "$tmp/cmp.out" 2>/dev/null; fail=1
fi

# 3. layouts that put a TP group across hosts: refused, naming ranks, hosts, the fix
refused() {
    local tag=$1 want=$2; shift 2
    if timeout -k 10 120 "$ns" run "$@" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: accepted"; fail=1
    elif grep -qE -- "$want" "$tmp/$tag.out" && ! grep -q '^step ' "$tmp/$tag.out"; then
        echo "ok   $tag refused: $(grep -m1 -oE -- "$want" "$tmp/$tag.out")"
    else
        echo "FAIL $tag: want /$want/, got:"; head -8 "$tmp/$tag.out"; fail=1
    fi
}
refused one_per_host "--tp 2: the tensor-parallel group of world ranks 0, 1 spans machines \(rank 0 on tpn0, rank 1 on tpn1\).*run a multiple of 2 ranks on every machine, placed by slot" \
    -np 2 --host tpn0:1,tpn1:1 -- "$bin" "${gpt2[@]}"
refused round_robin "group of world ranks 0, 1 spans machines \(rank 0 on tpn0, rank 1 on tpn1\)" \
    -np 4 --host tpn0:2,tpn1:2 --map-by node -- "$bin" "${gpt2[@]}"
refused mesh_31 "--tp 2: the tensor-parallel group of world ranks 2, 3 spans machines \(rank 2 on tpn0, rank 3 on tpn1\).*run a multiple of 2 ranks on every machine$" \
    -np 4 --host tpn0:3,tpn1:1 -- "$bin" "${gpt2[@]}" --pp 2 --batch 4
exit $fail
