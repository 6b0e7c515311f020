#!/usr/bin/env bash
# The SDK path as a third party walks it (one ctest, sdk.install_build_conform_run):
#   1. the "Build, load, conform, run" block of docs/plugin-authoring.md, extracted and run
#      verbatim: install this build tree into a fresh prefix, build docs/examples/h2o out of tree
#      with find_package(Sieve), list it with the installed `sieve plugins`, `sieve conform` it,
#      run it in a chain with `sieve eval`;
#   2. checks on what those commands printed (installed plugins found, conformance passed, the
#      chain held fewer KV bytes than dense);
#   3. a host: hosts/c_host built out of tree against the installed Sieve::runtime and run with the
#      example in its chain; and the same C files built with pkg-config only, finding the installed
#      plugins next to the installed runtime library, run in engine-pool mode; and the Python ctypes host on the install;
#   4. every code block of the guide compiled (doc_units.py); its C++ plugin conformed and run.
# usage: run_sdk_test.sh SOURCE_DIR BUILD_DIR WORK_DIR CMAKE_COMMAND [GENERATOR]
set -euo pipefail
SRC=$1
export SIEVE_BUILD=$2
ROOT=$3
export PATH="$(dirname "$4"):$PATH"  # the cmake that configured this tree
if [ -n "${5:-}" ] && [ -z "${CMAKE_GENERATOR:-}" ]; then
  export CMAKE_GENERATOR="$5"  # nested builds use this tree's generator (Ninja needs no make)
fi
unset SIEVE_PLUGIN_PATH
if [ ! -x "$SIEVE_BUILD/bin/sieve" ]; then
  echo "sdk test: $SIEVE_BUILD/bin/sieve was not built (no Boost.program_options): skipped"
  exit 77
fi
rm -rf "$ROOT"
mkdir -p "$ROOT/work"
export PREFIX="$ROOT/prefix" WORK="$ROOT/work"

fail() { echo "sdk test: FAIL: $*" >&2; exit 1; }

# 1. The guide's commands, verbatim.
awk '/<!-- sdk-test:begin -->/{on=1; next} /<!-- sdk-test:end -->/{on=0} on' \
  "$SRC/docs/plugin-authoring.md" | sed '/^```/d' > "$ROOT/guide.sh"
grep -q 'cmake --install' "$ROOT/guide.sh" || fail "no sdk-test block in docs/plugin-authoring.md"
echo "== docs/plugin-authoring.md, as written:"
cat "$ROOT/guide.sh"
echo "== running it"
if ! (cd "$WORK" && bash -e -x "$ROOT/guide.sh") > "$ROOT/guide.log" 2>&1; then
  cat "$ROOT/guide.log"
  fail "a command of the guide failed (output above)"
fi
cat "$ROOT/guide.log"

# 2. What the commands printed.
grep -Eq '^h2o\b|^  *h2o\b|\bh2o ' "$ROOT/guide.log" || fail "sieve plugins did not list h2o"
for p in dense streaming; do
  grep -q "$PREFIX/lib.*/sieve/plugins/libsieve_$p.so" "$ROOT/guide.log" ||
    fail "the installed sieve did not find the installed plugin $p under $PREFIX"
done
grep -Eq '^PASS: [0-9]+ passed, 0 failed' "$ROOT/guide.log" || fail "sieve conform did not pass"
kv=$(grep -E 'KV bytes after the last step: dense [0-9]+, chain [0-9]+' "$ROOT/guide.log" | tail -1)
[ -n "$kv" ] || fail "sieve eval printed no KV bytes"
dense=$(echo "$kv" | sed -E 's/.*dense ([0-9]+), chain ([0-9]+).*/\1/')
chain=$(echo "$kv" | sed -E 's/.*dense ([0-9]+), chain ([0-9]+).*/\2/')
[ "$chain" -lt "$dense" ] || fail "h2o evicted nothing: KV bytes dense $dense, chain $chain"
echo "== h2o in a chain: KV bytes dense $dense, chain $chain"
"$PREFIX/bin/sieve-conform" "$WORK/h2o/build/libsieve_h2o.so" --json > "$ROOT/conform.json" ||
  fail "sieve-conform --json failed: $(cat "$ROOT/conform.json")"
grep -q '"schema": "sieve.conform/1"' "$ROOT/conform.json" || fail "sieve-conform --json: no schema"

# 3. A host in C against the installed package: CMake, then pkg-config alone.
cmake -S "$SRC/hosts/c_host" -B "$WORK/c_host" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release > "$ROOT/c_host.log" 2>&1 &&
  cmake --build "$WORK/c_host" >> "$ROOT/c_host.log" 2>&1 || { cat "$ROOT/c_host.log"; fail "c_host did not build against the install"; }
"$WORK/c_host/sieve_c_host" --plugin-dir "$WORK/h2o/build" --chain 'decode:*=h2o(budget_pages=3, recent_pages=1)' ||
  fail "c_host with h2o in its chain failed"
if command -v pkg-config > /dev/null && command -v cc > /dev/null; then
  export PKG_CONFIG_PATH="$(dirname "$(find "$PREFIX" -name sieve-runtime.pc | head -1)")"
  cc -std=c11 -O1 "$SRC/hosts/c_host/c_host.c" "$SRC/hosts/c_host/engine_pages.c" $(pkg-config --cflags --libs sieve-runtime) -lm -o "$WORK/c_host_pc" ||
    fail "c_host did not build with pkg-config sieve-runtime"
  # No --plugin-dir: the default chain's streaming plugin is found next to the installed library;
  # and the installed runtime's engine_pool store over the host's own pages.
  (cd / && "$WORK/c_host_pc" --engine-pool) || fail "c_host (pkg-config build, --engine-pool) failed"
else
  echo "sdk test: no pkg-config or cc: the pkg-config build of c_host skipped (Debian: pkg-config, in docs/debian-packages.txt)"
fi
# Python: the installed `sieve` package (it finds the installed library, which finds its plugins),
# with numpy tensors; no compiler involved.
PY=""
for p in python3 /usr/bin/python3; do
  if [ -z "$PY" ] && "$p" -c "import numpy" 2> /dev/null; then PY=$p; fi
done
if [ -n "$PY" ]; then
  (cd / && PYTHONPATH="$(dirname "$(find "$PREFIX" -path '*/python/sieve/__init__.py' | head -1)")/.." \
    "$PY" "$PREFIX/share/doc/Sieve/examples/python/sieve_host.py") || fail "the Python host (installed sieve package) failed"
else
  echo "sdk: no python3 with numpy: the Python host example is not run"
fi

# 4. Every code block of the guide (tests/sdk/doc_units.py pulls them out of the markdown): the C
#    outline of h2o.c against the installed headers, §1's CMake project around h2o.c, §11's C++
#    plugin on the installed Sieve::plugin_support (built, conformed, run in a chain), §10's chains.
command -v python3 > /dev/null || fail "python3 is needed to read the guide's code blocks"
UNITS="$WORK/guide"
python3 "$SRC/tests/sdk/doc_units.py" "$SRC/docs/plugin-authoring.md" "$UNITS" ||
  fail "docs/plugin-authoring.md has code the test would not compile (above)"
for u in guide.c h2o/CMakeLists.txt recent/CMakeLists.txt recent/recent.cpp chains.txt; do
  [ -f "$UNITS/$u" ] || fail "docs/plugin-authoring.md has no block for unit $u"
done
mkdir -p "$UNITS/outline"
cat > "$UNITS/outline/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(guide_outline LANGUAGES C)
find_package(Sieve 0.1 REQUIRED)
add_library(outline OBJECT ../guide.c)
set_target_properties(outline PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON)
target_compile_options(outline PRIVATE -Wall -Werror)
target_link_libraries(outline PRIVATE Sieve::api)
CMAKE
build_unit() {  # DIR WHAT: configure and build DIR against the install, or fail saying WHAT
  { cmake -S "$1" -B "$1/build" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$1/build"; } > "$1/build.log" 2>&1 || { cat "$1/build.log"; fail "$2"; }
}
build_unit "$UNITS/outline" "the guide's C blocks (unit guide.c) do not compile"
cp "$SRC/docs/examples/h2o/h2o.c" "$UNITS/h2o/"
build_unit "$UNITS/h2o" "the guide's §1 CMakeLists.txt does not build h2o.c"
[ -f "$UNITS/h2o/build/libsieve_h2o.so" ] || fail "the guide's §1 project built no libsieve_h2o.so"
build_unit "$UNITS/recent" "the guide's C++ plugin does not build against the installed Sieve::plugin_support"
"$PREFIX/bin/sieve" conform "$UNITS/recent/build/libsieve_recent.so" > "$ROOT/recent.log" 2>&1 ||
  { cat "$ROOT/recent.log"; fail "the guide's C++ plugin does not conform"; }
grep -Eq '^PASS: [0-9]+ passed, 0 failed' "$ROOT/recent.log" || fail "recent: sieve conform did not pass"
"$PREFIX/bin/sieve" eval --plugin-dir "$UNITS/recent/build" --chain 'decode:*=recent(pages=4)' \
  --steps 48 > "$ROOT/recent_eval.log" 2>&1 ||
  { cat "$ROOT/recent_eval.log"; fail "the guide's C++ plugin did not run in a chain"; }
[ "$("$PREFIX/bin/sieve" tool --plugin-dir "$UNITS/recent/build" recent pages-for 100 16)" = "pages=7" ] ||
  fail "the guide's C++ plugin's tool (sieve tool recent pages-for 100 16) did not print pages=7"
echo "== the guide's C++ plugin: built on Sieve::plugin_support, conformed, ran in a chain, ran its tool"
# A bundled plugin's tool from the install: the plugin loads its tool module from
# <libdir>/sieve/tools, and the module finds libsieve_cli through its RPATH.
"$PREFIX/bin/sieve" calibrate delta --steps 8 --select 2 > "$ROOT/delta_tool.log" 2>&1 ||
  { cat "$ROOT/delta_tool.log"; fail "the installed delta plugin's calibrate tool (its tool module) did not run"; }
grep -q 'decode:\*=delta' "$ROOT/delta_tool.log" || fail "sieve calibrate delta printed no suggested chain"
echo "== a bundled plugin's tool module ran from the install"
while IFS= read -r line; do
  chain=${line%%  *}  # the chain, before the two-space gap and its comment
  [ -n "$chain" ] || continue
  "$PREFIX/bin/sieve" eval --plugin-dir "$WORK/h2o/build" --chain "$chain" --steps 8 \
    > "$ROOT/chain.log" 2>&1 || { cat "$ROOT/chain.log"; fail "the guide's chain '$chain' does not run"; }
done < "$UNITS/chains.txt"
echo "== every code block of docs/plugin-authoring.md compiled; its chains ran"
echo "sdk test: PASS"
