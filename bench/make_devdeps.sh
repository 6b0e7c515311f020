#!/usr/bin/env bash
# Builds .devdeps/: what the GPU image lacks, taken from Debian's packages on this machine, carried
# to the device machine with each call (`carry: [".devdeps"]`, 8 MB):
#   - dlpack and nlohmann-json headers with their CMake configs;
#   - Boost 1.74's program_options library and CMake configs, and the 1.74 headers that
#     program_options and Boost.DLL include (their closure, ~700 files, not all of Boost: the image
#     has Boost 1.83 headers, and program_options must be compiled against the headers of the
#     library it links).
# Configure there with -DCMAKE_PREFIX_PATH=$PWD/.devdeps/usr -DDLPACK_INCLUDE_DIR=$PWD/.devdeps/usr/include
# and run the CLI with .devdeps/usr/lib/x86_64-linux-gnu on LD_LIBRARY_PATH (bench/device_all.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$PWD/.devdeps
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download libdlpack-dev nlohmann-json3-dev libboost-program-options1.74-dev \
  libboost-program-options1.74.0 libboost1.74-dev >/dev/null)
mkdir -p "$tmp/x"
for d in "$tmp"/*.deb; do dpkg -x "$d" "$tmp/x"; done
rm -rf "$dest"
mkdir -p "$dest/usr/include" "$dest/usr/lib/x86_64-linux-gnu" "$dest/usr/share"
printf '#include <boost/dll/runtime_symbol_info.hpp>\n#include <boost/dll/shared_library.hpp>\n#include <boost/dll/import.hpp>\n#include <boost/program_options.hpp>\n' > "$tmp/t.cpp"
(cd "$tmp/x" && g++ -std=c++20 -M -I usr/include "$tmp/t.cpp" | tr ' \\' '\n\n' |
  grep '^usr/include/boost/' | sort -u | xargs cp --parents -t "$dest")
cp -a "$tmp"/x/usr/include/dlpack "$tmp"/x/usr/include/nlohmann "$dest/usr/include/"
cp -a "$tmp"/x/usr/lib/x86_64-linux-gnu/libboost_program_options* "$tmp"/x/usr/lib/x86_64-linux-gnu/cmake \
  "$dest/usr/lib/x86_64-linux-gnu/"
cp -a "$tmp"/x/usr/share/cmake "$dest/usr/share/"
echo "$dest: $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1)"
