#!/usr/bin/env bash
# dtrain plot on hand-made input (no training run, a few seconds): whatever a
# file's name or numbers hold, the picture is well-formed XML with finite
# coordinates, or the input is refused in one line.
#  - file names with bytes that are not UTF-8 XML can hold (stray and
#    overlong leads, surrogates, code points past U+10FFFF, U+FFFE / U+FFFF,
#    C0 controls): each such byte is '?' in data-run / data-trace and in the
#    legend; valid characters are kept as they are.
#  - numbers at the ends of a double: a step that is not finite (1e999)
#    skips its line with a warning, a trace event ending past the largest
#    double is skipped, events too far apart to measure are refused; steps
#    and values from -1.8e308 to 1.8e308 or a few subnormals apart give axes
#    and coordinates that are all finite numbers.
#  - traces whose rank numbers repeat (two runs): every bar's label is its
#    own, naming its file (the path where file names repeat too).
#  - what --help says of inputs with nothing to plot is what happens: an
#    empty metrics file beside a good one is a warning (exit 0), alone it
#    is exit 1, as is a trace without complete events beside a good file.
#  - a pipe (`dtrain plot <(cat m.jsonl)`, a FIFO) is read once: all of its
#    lines are plotted, a trace through a pipe is still a trace.
# Every SVG is read back by xmllint (libxml2-utils) and, when there is one,
# python3's xml.dom.minidom (expat).
# usage: test_plot_input.sh DTRAIN_BINARY
set -uo pipefail
bin=$1
command -v xmllint > /dev/null || { echo "FAIL xmllint not found: install libxml2-utils (scripts/deps.sh)"; exit 1; }
py=""
command -v python3 > /dev/null && python3 -c 'import xml.dom.minidom' 2> /dev/null && py=python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fail=0
ok()  { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
# well-formed by both parsers; prints the first parser complaint when not
wellformed() {
    xmllint --noout "$1" 2> xml.err || { head -2 xml.err; return 1; }
    [ -z "$py" ] || "$py" -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' "$1" 2> py.err ||
        { tail -1 py.err; return 1; }
}
show() { printf '%q' "$1"; }   # a name with odd bytes, printable
# the loss series' data-points ("step,value ...")
pts() { xmllint --xpath "string(//*[local-name()='g'][@data-series='loss']/@data-points)" "$1" 2> /dev/null; }

# ---- file names: what XML cannot hold is '?' ----
metrics='{"step":1,"loss":2.5,"lr":0.1}\n{"step":2,"loss":2.0,"lr":0.1}\n'
trace='{"traceEvents":[{"name":"forward","ph":"X","ts":0,"dur":5,"pid":0,"tid":0}]}\n'
# name | the name as the SVG must show it
while IFS='|' read -r name want; do
    name=$(printf '%b' "$name"); want=$(printf '%b' "$want")
    for kind in metrics trace; do
        f="$name.$kind"
        if [ $kind = metrics ]; then printf %b "$metrics" > "$f"; else printf %b "$trace" > "$f"; fi
        out=$("$bin" plot "$f" -o names.svg 2>&1); rc=$?
        if [ $rc -ne 0 ]; then bad "$kind $(show "$f"): exit $rc: $out"; continue; fi
        why=$(wellformed names.svg) || { bad "$kind $(show "$f"): not well-formed XML: $why"; continue; }
        attr=data-run; [ $kind = trace ] && attr=data-trace
        if grep -qF "$attr=\"$want.$kind\"" names.svg; then ok "$kind $(show "$f"): shown as $(show "$want.$kind")"
        else bad "$kind $(show "$f"): want $attr=\"$(show "$want.$kind")\": $(grep -o "$attr=\"[^\"]*\"" names.svg | head -1)"; fi
    done
done <<'NAMES'
lead-f5-\xf5\x80\x80-|lead-f5-???-
lead-ff-\xff-|lead-ff-?-
surrogate-\xed\xa0\x80-|surrogate-???-
low-surrogate-\xed\xbf\xbf-|low-surrogate-???-
overlong3-\xe0\x80\xaf-|overlong3-???-
overlong3b-\xe0\x9f\xbf-|overlong3b-???-
overlong4-\xf0\x80\x80\xaf-|overlong4-????-
overlong4b-\xf0\x8f\xbf\xbf-|overlong4b-????-
overlong2-\xc0\xaf-\xc1\xbf-|overlong2-??-??-
past-10ffff-\xf4\x90\x80\x80-|past-10ffff-????-
fffe-\xef\xbf\xbe-|fffe-???-
ffff-\xef\xbf\xbf-|ffff-???-
cut-\xe2\x82-|cut-??-
lone-continuation-\x80-|lone-continuation-?-
controls-\x01\x1b[31m\x7f-|controls-??[31m?-
tab-\t-newline-\n-|tab-?-newline-?-
kept-\xc3\xa9\xe2\x82\xac\xef\xbf\xbd\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf-|kept-\xc3\xa9\xe2\x82\xac\xef\xbf\xbd\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf-
NAMES

# ---- numbers at the ends of a double ----
# no "nan" / "inf" anywhere in the picture (the file names here hold neither)
finite_svg() { ! grep -Eiq '(^|[^a-z])-?(nan|inf)([^a-z]|$)' "$1"; }
# name | lines (printf) | extra flag | what the picture must hold (grep -F)
while IFS='|' read -r name lines flag want; do
    printf %b "$lines" > "$name"
    # shellcheck disable=SC2086
    out=$(timeout 20 "$bin" plot "$name" -o num.svg $flag 2>&1); rc=$?
    why=""
    [ $rc -eq 0 ] || why="exit $rc (124: hung)"
    [ -z "$why" ] && { why=$(wellformed num.svg) || why="not well-formed: $why"; }
    [ -z "$why" ] && ! finite_svg num.svg && why="not finite: $(grep -Eio '[a-z0-9-]*="[^"]*(nan|inf)[^"]*"|>[^<]*(nan|inf)[^<]*<' num.svg | head -3 | tr '\n' ' ')"
    [ -z "$why" ] && ! grep -qF -- "$want" num.svg && why="no '$want' in the picture"
    [ -z "$why" ] && ok "$name $flag: finite, '$want'" || bad "$name $flag: $why: $out"
done <<'NUMS'
steps-huge.jsonl|{"step":-1e308,"loss":1}\n{"step":1e308,"loss":2}\n|| data-points="-1e+308,1 1e+308,2"
steps-max.jsonl|{"step":-1.7976931348623157e308,"loss":1}\n{"step":1.7976931348623157e308,"loss":2}\n||data-points="-1.7976931348623157e+308,1 1.7976931348623157e+308,2"
values-max.jsonl|{"step":1,"loss":-1.7976931348623157e308}\n{"step":2,"loss":1.7976931348623157e308}\n||data-n="2"
one-value-max.jsonl|{"step":1,"loss":1.7976931348623157e308}\n{"step":2,"loss":1.7976931348623157e308}\n||data-n="2"
steps-subnormal.jsonl|{"step":5e-324,"loss":1}\n{"step":1e-323,"loss":2}\n||data-n="2"
values-subnormal.jsonl|{"step":1,"loss":5e-324,"lr":1e-320}\n{"step":2,"loss":1e-323,"lr":1e-320}\n||data-n="2"
values-subnormal-log.jsonl|{"step":1,"loss":5e-324}\n{"step":2,"loss":1}\n|--log-loss|log scale
big-ms.jsonl|{"step":1,"ms":1e300}\n{"step":2,"ms":1e-300}\n||data-n="2"
NUMS

# a step that is no finite number: its line is skipped, with a warning naming the first
printf '{"step":1e999,"loss":1}\n{"step":2,"loss":2}\n{"step":-1e999,"loss":3}\n{"step":4,"loss":4}\n' > step-overflow.jsonl
out=$("$bin" plot step-overflow.jsonl -o num.svg 2>&1); rc=$?
if [ $rc -eq 0 ] && finite_svg num.svg && wellformed num.svg > /dev/null && [ "$(pts num.svg)" = "2,2 4,4" ] &&
   grep -q 'warning: step-overflow.jsonl:1: .*2 lines skipped' <<< "$out"; then ok "steps 1e999, -1e999: skipped: $(grep warning <<< "$out")"
else bad "steps 1e999, -1e999: exit $rc, points '$(pts num.svg)' (want '2,2 4,4'): $out"; fi

# traces: an event whose end is past the largest double is skipped (the rest is drawn);
# events too far apart for their distance to be a double: refused in one line
printf '{"traceEvents":[{"name":"forward","ph":"X","ts":1e308,"dur":1e308,"pid":0,"tid":0},{"name":"forward","ph":"X","ts":10,"dur":5,"pid":0,"tid":0}]}' > end-overflow.json
out=$("$bin" plot end-overflow.json -o num.svg 2>&1); rc=$?
got=$(xmllint --xpath "string(//*[local-name()='g'][@class='rank']/@data-span-us)" num.svg 2> /dev/null)
[ $rc -eq 0 ] && finite_svg num.svg && [ "$got" = 5.000 ] && ok "trace event ending past 1.8e308: skipped, span $got us" ||
    bad "trace event ending past 1.8e308: exit $rc, span '$got' (want 5.000): $out"
printf '{"traceEvents":[{"name":"forward","ph":"X","ts":0,"dur":1e308,"pid":0,"tid":0}]}' > long.json
out=$("$bin" plot long.json -o num.svg 2>&1); rc=$?
[ $rc -eq 0 ] && finite_svg num.svg && wellformed num.svg > /dev/null && ok "a trace event of 1e308 us: finite picture" ||
    bad "a trace event of 1e308 us: exit $rc: $out"
printf '{"traceEvents":[{"name":"forward","ph":"X","ts":-1e308,"dur":1,"pid":0,"tid":0},{"name":"forward","ph":"X","ts":1e308,"dur":1,"pid":0,"tid":0}]}' > apart.json
echo kept > kept.svg
out=$("$bin" plot apart.json -o kept.svg 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$(cat kept.svg)" = kept ] && grep -q "apart.json: rank 0's events .*too far apart" <<< "$out" &&
    [ "$(wc -l <<< "$out")" -eq 1 ] && ok "trace events 2e308 us apart: $out" || bad "trace events 2e308 us apart: exit $rc: $out"

# ---- rank labels: one per bar ----
ev() { printf '{"name":"forward","ph":"X","ts":0,"dur":5,"pid":%d,"tid":0}' "$1"; }
printf '{"traceEvents":[%s,%s]}' "$(ev 0)" "$(ev 1)" > A.json
printf '{"traceEvents":[%s]}' "$(ev 1)" > B.json
mkdir -p runA runB
printf '{"traceEvents":[%s]}' "$(ev 0)" > runA/t.json
printf '{"traceEvents":[%s]}' "$(ev 0)" > runB/t.json
labels() { xmllint --xpath "//*[local-name()='g'][@class='rank']/*[local-name()='text'][1]/text()" "$1" 2> /dev/null |
               sed 's/rank/\nrank/g' | sed '/^$/d'; }
while IFS='|' read -r files want; do
    # shellcheck disable=SC2086
    out=$("$bin" plot $files -o ranks.svg 2>&1); rc=$?
    got=$(labels ranks.svg | paste -sd '|')
    [ $rc -eq 0 ] && [ "$got" = "$want" ] && ok "bars of $files: $got" || bad "bars of $files: exit $rc, '$got', want '$want': $out"
done <<'RANKS'
A.json B.json|rank 0 (A.json)|rank 1 (A.json)|rank 1 (B.json)
B.json A.json|rank 1 (B.json)|rank 0 (A.json)|rank 1 (A.json)
runA/t.json runB/t.json|rank 0 (runA/t.json)|rank 0 (runB/t.json)
A.json|rank 0|rank 1
RANKS

# ---- nothing to plot: as --help says ----
help=$("$bin" plot --help | tr '\n' ' ')
: > empty.jsonl
printf %b "$metrics" > good.jsonl
printf '{"traceEvents":[{"name":"x","ph":"M","pid":0,"tid":0}]}' > no-events.json
out=$("$bin" plot empty.jsonl good.jsonl -o help.svg 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "warning: empty.jsonl holds none of the keys" <<< "$out" &&
    grep -q "(an empty one, say) is left out with a warning when another input has something to draw" <<< "$help" &&
    grep -q "Exit status: 0 written (also when a warning left something out)" <<< "$help" &&
    ok "an empty metrics file beside a good one: exit 0, a warning; --help says so" ||
    bad "an empty metrics file beside a good one: exit $rc: $out; --help: $help"
out=$("$bin" plot empty.jsonl -o help.svg 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "or no input has anything to plot" <<< "$help" && ok "an empty metrics file alone: exit 1; --help says so" ||
    bad "an empty metrics file alone: exit $rc: $out; --help: $help"
out=$("$bin" plot no-events.json good.jsonl -o help.svg 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "1 an input could not be read or is not valid (a line that is not JSON, a trace without complete events)" <<< "$help" &&
    ok "a trace without complete events beside a good file: exit 1; --help says so" ||
    bad "a trace without complete events beside a good file: exit $rc: $out; --help: $help"

# ---- pipes: each input is read once ----
# the metrics' points as data-points writes them (step,value), from the input's own text
printf '{"step":1,"loss":2.5,"lr":0.1}\n{"step":2,"loss":2.25,"lr":0.1}\n{"step":3,"loss":2.125,"lr":0.05}\n' > m.jsonl
want_pts="1,2.5 2,2.25 3,2.125"
out=$("$bin" plot <(cat m.jsonl) -o pipe.svg 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(pts pipe.svg)" = "$want_pts" ] && ok "metrics through a pipe: $want_pts" ||
    bad "metrics through a pipe: exit $rc: $out; points '$(pts pipe.svg 2> /dev/null)', want '$want_pts'"
printf %b "$trace" > one.json
out=$("$bin" plot <(cat one.json) -o pipe.svg 2>&1); rc=$?
got=$(xmllint --xpath "string(//*[local-name()='g'][@class='rank']/@data-compute-us)" pipe.svg 2> /dev/null)
[ $rc -eq 0 ] && [ "$got" = 5.000 ] && ok "a trace through a pipe: compute $got us" ||
    bad "a trace through a pipe: exit $rc: $out; compute '$got', want 5.000"
mkfifo fifo
timeout 10 sh -c "cat m.jsonl > fifo" &   # (a writer that gives up: no hang)
out=$(timeout 10 "$bin" plot fifo -o fifo.svg 2>&1); rc=$?
wait
[ $rc -eq 0 ] && [ "$(pts fifo.svg)" = "$want_pts" ] && ok "metrics from a FIFO: $want_pts" ||
    bad "metrics from a FIFO: exit $rc: $out; points '$(pts fifo.svg 2> /dev/null)', want '$want_pts'"

exit $fail
