# Sourced by the training test scripts that compare runs of `dtrain train`
# (tests/scripts/test_*.sh): train under a tag, then compare two tags bit for
# bit or to rounding. The caller sets:
#   bin   the dtrain executable      cmp  tests/tools/ckpt_cmp
#   tmp   a scratch directory        args the name of an array with the flags every run shares
#   fail  0; set to 1 by any failed check
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
