# Sourced by the training test scripts that compare runs of `dtrain train`
# (tests/scripts/test_*.sh): train under a tag, then compare two tags bit for
# bit or to rounding. The caller sets:
#   bin   the dtrain executable      cmp  tests/tools/ckpt_cmp
#   tmp   a scratch directory        args the name of an array with the flags every run shares
#   fail  0; set to 1 by any failed check
# (t_near_metrics needs only tmp and fail.)
# Runs read no stdin and keep TAG.ck (the final checkpoint), TAG.jsonl (the
# metrics), TAG.out (what it printed) and TAG.loss ("step loss" per training step).

t_run() {   # t_run TAG ARGS...: train with "${args[@]}" ARGS
    local tag=$1; shift
    local -n shared=$args
    if ! "$bin" train "${shared[@]}" "$@" --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $*"; cat "$tmp/$tag.out"; fail=1; return 1
    fi
    grep '"loss"' "$tmp/$tag.jsonl" | grep -v eval | sed 's/.*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1 \2/' > "$tmp/$tag.loss"
}

t_same() {   # t_same REF TAG: final checkpoints and training losses bit for bit
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step > "$tmp/cmp.out" && cmp -s "$tmp/$1.loss" "$tmp/$2.loss"; then
        echo "ok   $2 == $1 bit for bit"
    else
        echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; diff "$tmp/$1.loss" "$tmp/$2.loss"; fail=1
    fi
}

t_close() {   # t_close REF TAG: the same steps, training losses within 1e-6 relative
    if join "$tmp/$1.loss" "$tmp/$2.loss" |
        awk -v n="$(wc -l < "$tmp/$1.loss")" '{ d = $2 - $3; if (d < 0) d = -d; if (d > 1e-6 * $2) bad = 1; k++ }
                                              END { exit bad || k != n || n == 0 }'; then
        echo "ok   $2 == $1 to 1e-6"
    else
        echo "FAIL $2 losses differ from $1:"; join "$tmp/$1.loss" "$tmp/$2.loss"; fail=1
    fi
}

# t_near_metrics REF TAG [acc] [train]: every line of TAG.jsonl (a training
# step's loss or an evaluation's) has REF's line of the same step and kind,
# within 1e-6 relative; with acc the evaluation's token accuracy is REF's
# exactly; with train only training lines count. TAG ends at REF's last step
# (a resumed run logs only the steps after its checkpoint).
t_near_metrics() {
    local ref=$1 tag=$2 acc=0 train="" why o; shift 2
    for o in "$@"; do case $o in acc) acc=1 ;; train) train=1 ;; esac; done
    if why=$(awk -v tol=1e-6 -v acc="$acc" -v train="$train" '
        function val(line, key) { return match(line, "\"" key "\":[-0-9.e+]+") ? substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3) : "" }
        function id(line) { return val(line, "step") (val(line, "eval_loss") != "" ? " eval" : "") }
        function loss(line) { return val(line, "eval_loss") != "" ? val(line, "eval_loss") : val(line, "loss") }
        train != "" && val($0, "eval_loss") != "" { next }
        FNR == NR { ref[id($0)] = loss($0); ac[id($0)] = val($0, "eval_accuracy"); last = id($0); next }
        { k = id($0); b = loss($0); n++; if (k ~ / eval$/) ne++
          if (!(k in ref) || b == "") { printf "step %s: not in the reference", k; bad = 1; exit 1 }
          a = ref[k] + 0; d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a
          if (d > tol * s) { printf "step %s: loss %s vs %s", k, ref[k], b; bad = 1; exit 1 }
          if (acc && val($0, "eval_accuracy") != ac[k]) { printf "step %s: accuracy %s vs %s", k, ac[k], val($0, "eval_accuracy"); bad = 1; exit 1 }
          end = k }
        END { if (bad) exit 1; if (!n || end != last) { printf "ends at step \"%s\", the reference at \"%s\"", end, last; exit 1 }
              printf "%d lines, %d evaluations", n, ne }' "$tmp/$ref.jsonl" "$tmp/$tag.jsonl"); then
        echo "ok   $tag ~ $ref (1e-6): $why"
    else
        echo "FAIL $tag vs $ref: $why"; fail=1
    fi
}
