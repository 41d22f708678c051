#!/bin/sh
# fetch_cutlass.sh DIR: CUTLASS's C++ headers (include/ and
# tools/util/include/) into DIR, for kernels/xgemm.cu, from PyPI's
# nvidia-cutlass wheel (pinned version and SHA-256). Headers only: nothing
# of it is linked or installed. Without the network, or on any mismatch,
# it says so in one line and exits 0: the build then compiles xgemm.cu
# without CUTLASS and the trainer keeps one cuBLAS GEMM per expert.
set -u
DIR=$1
VER=4.2.0.0
SHA=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
WHL=nvidia_cutlass-$VER-py3-none-any.whl
[ -f "$DIR/include/cutlass/cutlass.h" ] && exit 0
no() {
	echo "fetch_cutlass: $1: kernels/xgemm.cu is built without CUTLASS (the per-expert cuBLAS loop stays)" >&2
	rm -rf "$DIR.tmp"
	exit 0
}
rm -rf "$DIR.tmp" && mkdir -p "$DIR.tmp" || no "cannot create $DIR.tmp"
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || no "no $PY to download it with"
timeout 300 "$PY" -m pip download --quiet --no-deps --no-cache-dir --only-binary :all: \
	-d "$DIR.tmp" "nvidia-cutlass==$VER" >/dev/null 2>&1 || no "nvidia-cutlass $VER not downloadable"
[ -f "$DIR.tmp/$WHL" ] || no "no $WHL after the download"
got=$(sha256sum "$DIR.tmp/$WHL" | cut -d' ' -f1)
[ "$got" = "$SHA" ] || no "$WHL has SHA-256 $got, not the pinned $SHA"
"$PY" - "$DIR.tmp/$WHL" "$DIR.tmp/x" <<'PYEOF' || no "cannot unpack $WHL"
import sys, zipfile, os
src, dst = sys.argv[1], sys.argv[2]
pre = {"cutlass_library/source/include/": "include/",
       "cutlass_library/source/tools/util/include/": "include/"}
with zipfile.ZipFile(src) as z:
    for n in z.namelist():
        for p, d in pre.items():
            if n.startswith(p) and not n.endswith("/"):
                out = os.path.join(dst, d, n[len(p):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with z.open(n) as f, open(out, "wb") as g:
                    g.write(f.read())
PYEOF
[ -f "$DIR.tmp/x/include/cutlass/cutlass.h" ] || no "no cutlass/cutlass.h in $WHL"
rm -rf "$DIR" && mkdir -p "$(dirname "$DIR")" && mv "$DIR.tmp/x" "$DIR" && rm -rf "$DIR.tmp" ||
	no "cannot move the headers to $DIR"
echo "fetch_cutlass: CUTLASS $VER headers in $DIR" >&2
