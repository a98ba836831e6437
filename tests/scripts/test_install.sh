#!/usr/bin/env bash
# The library can be adopted: cmake --install into a temporary prefix, then
# examples/resmlp.c built out of tree against the installed files twice --
# with pkg-config (shared, and --static) and with find_package(dtrain) -- and
# the find_package build trains at 2 ranks; the installed CLI runs; the
# version macro and dt_version() agree with the installed library's SONAME.
# usage: test_install.sh BUILD_DIR SOURCE_DIR MPIEXEC [MPIEXEC ARGS...]
set -uo pipefail
build=$1 src=$2
shift 2
mpi=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
pfx=$tmp/prefix
if ! cmake --install "$build" --prefix "$pfx" > "$tmp/install.out" 2>&1; then
    echo "FAIL: cmake --install:"; tail -5 "$tmp/install.out"; exit 1
fi
so=$(cd "$pfx/lib" && ls libdtrain.so.*.*.* 2>/dev/null | head -1)
soname=$(objdump -p "$pfx/lib/$so" 2>/dev/null | awk '/SONAME/ {print $2}')
if [ -n "$so" ] && [ -f "$pfx/lib/libdtrain.a" ] && [ -x "$pfx/bin/dtrain" ] && [ -f "$pfx/include/dtrain/dtrain.h" ] &&
   [[ "$soname" =~ ^libdtrain\.so\.[0-9]+\.[0-9]+$ ]]; then
    echo "ok   installed: $so (SONAME $soname), libdtrain.a, bin/dtrain, include/dtrain/"
else
    echo "FAIL: installed tree incomplete (so=$so soname=$soname):"; find "$pfx" -maxdepth 3 | head -30; fail=1
fi

# 1. pkg-config, shared (README's line as it is: the .pc carries the rpath
# to the prefix, so the program starts without LD_LIBRARY_PATH) and static
export PKG_CONFIG_PATH=$pfx/lib/pkgconfig
if cc -std=c11 "$src/examples/resmlp.c" -o "$tmp/resmlp_pc" $(pkg-config --cflags --libs dtrain) 2> "$tmp/pc.err" &&
   cc -std=c11 $(pkg-config --cflags dtrain) "$src/examples/resmlp.c" -o "$tmp/resmlp_static" "$pfx/lib/libdtrain.a" \
      $(pkg-config --static --libs dtrain | sed 's/-ldtrain\b//') 2>> "$tmp/pc.err"; then
    got=$(ldd "$tmp/resmlp_pc" | awk '/libdtrain\.so/ {print $3}')   # (the rpath holds pkgconfig/../..)
    [ -n "$got" ] && [ "$(readlink -f "$got")" = "$(readlink -f "$pfx/lib/$soname")" ] &&
        ! ldd "$tmp/resmlp_static" | grep -c libdtrain.so > /dev/null \
        && echo "ok   pkg-config: built against the installed shared and static library" \
        || { echo "FAIL: pkg-config builds link the wrong library:"; ldd "$tmp/resmlp_pc" | grep dtrain; fail=1; }
else
    echo "FAIL: pkg-config build:"; head -20 "$tmp/pc.err"; fail=1
fi

# 2. find_package(dtrain): an out-of-tree CMake project
mkdir -p "$tmp/proj"
cp "$src/examples/resmlp.c" "$tmp/proj/"
cat > "$tmp/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(uses_dtrain C)
find_package(dtrain 0.13 REQUIRED)
add_executable(resmlp resmlp.c)
target_link_libraries(resmlp PRIVATE dtrain::dtrain)
CM
if cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$pfx" -DCMAKE_BUILD_TYPE=Release > "$tmp/fp.out" 2>&1 &&
   cmake --build "$tmp/proj/build" >> "$tmp/fp.out" 2>&1; then
    echo "ok   find_package(dtrain): built dtrain::dtrain's consumer"
    # trains at 2 ranks, against the installed library (its rpath)
    if "$src/tests/scripts/test_example_resmlp.sh" ddp 40 "${mpi[@]}" -n 2 "$tmp/proj/build/resmlp" --steps 40 > "$tmp/run.out" 2>&1 &&
       ldd "$tmp/proj/build/resmlp" | grep -c "$pfx/lib/libdtrain.so" > /dev/null; then
        echo "ok   the find_package build trains at 2 ranks: $(tail -1 "$tmp/run.out")"
    else
        echo "FAIL: the installed example at 2 ranks:"; tail -5 "$tmp/run.out"; fail=1
    fi
else
    echo "FAIL: find_package build:"; tail -20 "$tmp/fp.out"; fail=1
fi

# 3. version: the header's macro == dt_version() == the SONAME's numbers
cat > "$tmp/v.c" <<'C'
#include <stdio.h>
#include <string.h>
#include "dtrain/dtrain.h"
int main(void) { printf("%s %s\n", DTRAIN_VERSION, dt_version()); return strcmp(DTRAIN_VERSION, dt_version()) != 0; }
C
if cc -std=c11 $(pkg-config --cflags dtrain) "$tmp/v.c" -o "$tmp/v" $(pkg-config --libs dtrain) -Wl,-rpath,"$pfx/lib" &&
   v=$("$tmp/v") && [[ "$soname" == "libdtrain.so.$(cut -d' ' -f1 <<< "$v" | cut -d. -f1-2)" ]] &&
   [ "$(pkg-config --modversion dtrain)" = "$(cut -d' ' -f1 <<< "$v")" ]; then
    echo "ok   version $v (header, library, pkg-config, SONAME agree)"
else
    echo "FAIL: versions disagree: '${v:-}' vs $soname / $(pkg-config --modversion dtrain)"; fail=1
fi
if "$pfx/bin/dtrain" train --help 2>&1 | grep -c -- "--hosts" > /dev/null; then echo "ok   installed CLI runs"
else echo "FAIL: installed bin/dtrain"; fail=1; fi
exit $fail
