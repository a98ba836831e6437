#!/usr/bin/env bash
# dtrain plot end to end (issue 27 item 5): two tiny GPT-2 runs with --metrics
# and a 2-rank run with --trace, drawn into one SVG. The SVG is read back as
# XML (xmllint, package libxml2-utils): well-formed; for every run and key
# (loss, eval_loss, lr, ms) a series whose point count is the number of the
# file's lines with that key and whose first and last points are those lines'
# (step, value); per rank, the compute and communication times are the sums
# of the trace's own events. Bad input is one error line naming the file (and
# line), an output that is not .svg is refused, a failed plot leaves an
# existing picture alone. Values closer than a tick step can resolve still
# plot; runs with one file name are told apart in the legend, and runs past
# its room are counted there.
# usage: test_plot_cli.sh DTRAIN_BINARY
set -uo pipefail
bin=$1
command -v xmllint > /dev/null || { echo "FAIL xmllint not found: install libxml2-utils (scripts/deps.sh)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
for i in $(seq 1 300); do printf 'abcdefghij'; done > rep.txt
model=(--model gpt2 --layers 1 --embd 16 --heads 2 --max-t 16 --seq 16 --batch 4 --data text --data-path rep.txt
       --threads 1 --quiet)
fail=0
ok()  { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

"$bin" train "${model[@]}" --steps 12 --lr 1e-2 --metrics a.jsonl > train.out 2>&1 || { cat train.out; exit 1; }
"$bin" train "${model[@]}" --steps 9 --lr 3e-3 --warmup 3 --min-lr 1e-4 --metrics "b&c's.jsonl" > train.out 2>&1 ||
    { cat train.out; exit 1; }
# ranks under mpirun: Open MPI's own leaks are not ours (see test_recompute_bitwise.sh); dtrain plot
# itself runs with the leak check
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    "$bin" train --nproc 2 "${model[@]}" --steps 6 --trace tr.json > train.out 2>&1 || { cat train.out; exit 1; }

out=$("$bin" plot a.jsonl "b&c's.jsonl" tr.json -o curves.svg 2>&1); rc=$?
[ $rc -eq 0 ] && [ -s curves.svg ] && ok "plotted: $out" || { echo "FAIL plot: exit $rc: $out"; exit 1; }
xmllint --noout curves.svg 2> xml.err && ok "well-formed XML" || bad "not well-formed: $(head -3 xml.err)"
ls -a | grep -q '\.tmp' && bad "a temp file is left: $(ls -a)"

xp() { xmllint --xpath "$1" curves.svg 2> /dev/null; }
# the JSONL's own numbers: lines with the key, first and last (step, value)
jsonl() {   # FILE KEY -> "count first_step first_value last_step last_value"
    grep "\"$2\":" "$1" | sed -E "s/.*\"step\":([^,}]*).*\"$2\":([^,}]*).*/\1 \2/" |
        awk 'NR==1 {fs=$1; fv=$2} {ls=$1; lv=$2} END {print NR, fs, fv, ls, lv}'
}
for run in a.jsonl "b&c's.jsonl"; do
    for key in loss eval_loss lr ms; do
        read -r want fs fv ls lv <<< "$(jsonl "$run" "$key")"
        [ "$want" -gt 0 ] || { bad "$run has no $key lines (the trainer's keys changed?)"; continue; }
        # the run's name as an XPath string: it holds a quote, so concat() it
        sel="//*[local-name()='g'][@data-series='$key'][@data-run=concat('${run%%\'*}', \"'\", '${run#*\'}')]"
        [ "$run" = a.jsonl ] && sel="//*[local-name()='g'][@data-series='$key'][@data-run='$run']"
        n=$(xp "string($sel/@data-n)")
        pts=$(xp "string($sel/@data-points)")
        got=$(wc -w <<< "$pts")
        first=${pts%% *}; last=${pts##* }
        if [ "$n" = "$want" ] && [ "$got" -eq "$want" ] &&
           awk -v a="$first" -v b="$last" -v fs="$fs" -v fv="$fv" -v ls="$ls" -v lv="$lv" 'BEGIN {
               split(a, p, ","); split(b, q, ",");
               exit !(p[1] == fs + 0 && p[2] == fv + 0 && q[1] == ls + 0 && q[2] == lv + 0) }'; then
            ok "$run $key: $want points, first ($fs, $fv), last ($ls, $lv)"
        else
            bad "$run $key: want $want points ($fs,$fv ... $ls,$lv), got data-n '$n', $got points: ${first:-} ... ${last:-}"
        fi
    done
done
legend=$(xp "count(//*[local-name()='text'][contains(., \"b&c's.jsonl\")])")
[ "${legend:-0}" -ge 1 ] && ok "the legend names the runs' files" || bad "no legend entry for b&c's.jsonl"

# per rank: compute = the forward, backward, optimizer and evaluation events, communication
# = the compute thread's "comm" events (trainer and DDP record them one after another).
# The final evaluation's batches are compute events too, so its time is not drawn as idle
# (before, only its collectives were traced).
for r in 0 1; do
    ne=$(grep -o '"name":"evaluate","cat":"compute"' "tr.json.rank$r" | wc -l)
    [ "$ne" -ge 1 ] && ok "rank $r: $ne evaluation batches traced as compute" || bad "rank $r: no evaluation in the trace"
    read -r comp comm <<< "$(awk -v r="$r" '/"ph":"X"/ && /"tid":0[,}]/ {
            d = $0; sub(/.*"dur":/, "", d); d += 0
            if (/"name":"(forward|backward|optimizer|evaluate)"/) c += d; else if (/"cat":"comm"/) m += d }
        END {printf "%.3f %.3f\n", c, m}' "tr.json.rank$r")"
    sel="//*[local-name()='g'][@class='rank'][@data-rank='$r']"
    gc=$(xp "string($sel/@data-compute-us)"); gm=$(xp "string($sel/@data-comm-us)")
    gi=$(xp "string($sel/@data-idle-us)"); gs=$(xp "string($sel/@data-span-us)")
    if [ -n "$gc" ] && awk -v c="$comp" -v m="$comm" -v gc="$gc" -v gm="$gm" -v gi="$gi" -v gs="$gs" 'BEGIN {
            d1 = c - gc; d2 = m - gm; d3 = gc + gm + gi - gs
            exit !(c > 0 && d1 < 0.05 && d1 > -0.05 && d2 < 0.05 && d2 > -0.05 && d3 < 0.05 && d3 > -0.05 && gi >= 0) }'
    then ok "rank $r: compute $gc us, communication $gm us, idle $gi us (trace: $comp, $comm; span $gs)"
    else bad "rank $r: bar compute '$gc' comm '$gm' idle '$gi' span '$gs'; trace sums $comp, $comm"; fi
done

# values a tick step cannot tell apart (0.3 and 0.1 * 3): a picture, not a
# loop that never ends (it ran until killed)
printf '{"step":1,"loss":2.5,"lr":0.3}\n{"step":2,"loss":2.4,"lr":0.30000000000000004}\n' > ulp.jsonl
out=$(timeout 20 "$bin" plot ulp.jsonl -o ulp.svg 2>&1); rc=$?
ticks=$(grep -o '<text' ulp.svg 2> /dev/null | wc -l)
[ $rc -eq 0 ] && xmllint --noout ulp.svg 2> /dev/null && [ "$ticks" -lt 200 ] && ok "values 1 ulp apart: $ticks labels" ||
    bad "values 1 ulp apart: exit $rc (124: hung), $ticks labels: $out"

# runs with the same file name are told apart by their paths; more runs than
# the legend has room for: the last line counts the rest
mkdir -p runA runB
cp a.jsonl runA/metrics.jsonl; cp a.jsonl runB/metrics.jsonl
"$bin" plot runA/metrics.jsonl runB/metrics.jsonl -o same.svg > /dev/null 2>&1 &&
    grep -q '>runA/metrics.jsonl training<' same.svg && grep -q '>runB/metrics.jsonl training<' same.svg &&
    ok "same file names: the legend shows the paths" || bad "same file names: $(grep -o '>[^<]*training<' same.svg | head -4 | tr '\n' ' ')"
many=(); for i in $(seq 1 14); do cp a.jsonl "r$i.jsonl"; many+=("r$i.jsonl"); done
"$bin" plot "${many[@]}" -o many.svg > /dev/null 2>&1 && xmllint --noout many.svg 2> /dev/null &&
    grep -q '>+[0-9]* more not listed<' many.svg && ok "14 runs: $(grep -o '+[0-9]* more not listed' many.svg | head -1)" ||
    bad "14 runs: no '+N more' line in the legend"

# --log-loss: the loss panel says so; still well-formed
"$bin" plot a.jsonl -o log.svg --log-loss > /dev/null 2>&1 && xmllint --noout log.svg 2> /dev/null &&
    grep -q 'log scale' log.svg && ok "--log-loss" || bad "--log-loss"

# refusals: one line naming the file (and line); an existing picture is kept
echo "kept" > old.svg
printf '{"step":1,"loss":2.5}\n{"step":2,"loss":\n' > broken.jsonl
printf '{"step":1,"tokens":5}\n' > nothing.jsonl
head -c 120 tr.json.rank0 > cut.json   # a trace cut short (a killed run)
printf '{"traceEvents":[{"ph":"X","pid":1e300,"tid":0,"ts":1,"dur":2,"name":"forward"}]}' > pid.json
while IFS='|' read -r what want_rc want args; do
    # shellcheck disable=SC2086
    out=$("$bin" plot $args 2>&1); rc=$?
    if [ $rc -eq "$want_rc" ] && grep -q -- "$want" <<< "$out" && [ "$(wc -l <<< "$out")" -eq 1 ] &&
       [ "$(cat old.svg)" = kept ]; then ok "$what: $out"
    else bad "$what: exit $rc (want $want_rc, '$want'): $out"; fi
done <<CASES
missing file|1|missing.jsonl: cannot open|a.jsonl missing.jsonl -o old.svg
a line that is not JSON|1|broken.jsonl:2: not a JSON object|a.jsonl broken.jsonl -o old.svg
nothing to plot|1|no plottable series|nothing.jsonl -o old.svg
a trace cut short|1|cut.json: not valid JSON at byte|cut.json -o old.svg
a pid that is no rank|1|pid.json: a complete event ("ph":"X") whose pid is not a rank|pid.json -o old.svg
not .svg|2|only SVG|a.jsonl -o curves.png
no output|2|needs -o|a.jsonl
no input|2|needs a metrics or trace file|-o old.svg
unknown option|2|unknown option '--png'|a.jsonl --png -o old.svg
CASES
[ ! -e curves.png ] || bad "curves.png was written"
"$bin" plot --help | grep -c -- "--log-loss" > /dev/null && "$bin" --help | grep -c "plot" > /dev/null && ok "--help" || bad "--help"
exit $fail
