#!/bin/sh
# fetch_headers.sh PACKAGE DIR: the C++ headers of a header-only library
# the kernels build against, into DIR/include, from its PyPI wheel (pinned
# version and SHA-256). Headers only: nothing of it is linked or
# installed. Without the network, or on any mismatch, it says so in one
# line and exits 0: the build then compiles the file that uses it without
# it, and the trainer keeps its other path.
#
#   cutlass         nvidia-cutlass: kernels/xgemm.cu (the experts' grouped
#                   GEMM; without it, the per-expert cuBLAS loop)
#   cudnn-frontend  nvidia-cudnn-frontend: kernels/sdpa.cpp (cuDNN's fused
#                   attention; without it, the flash kernels). The wheel
#                   carries a CPython extension too, so one platform's is
#                   pinned; only its headers are taken.
set -u
PKG=$1
DIR=$2
case $PKG in
cutlass)
	DIST=nvidia-cutlass VER=4.2.0.0
	SHA=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
	WHL=nvidia_cutlass-$VER-py3-none-any.whl
	PLAT=""
	CHECK=cutlass/cutlass.h
	PREFIXES="cutlass_library/source/include/ cutlass_library/source/tools/util/include/"
	WITHOUT="kernels/xgemm.cu is built without CUTLASS (the per-expert cuBLAS loop stays)"
	;;
cudnn-frontend)
	DIST=nvidia-cudnn-frontend VER=1.32.0
	SHA=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
	WHL=nvidia_cudnn_frontend-$VER-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
	PLAT="--python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64"
	CHECK=cudnn_frontend.h
	PREFIXES="include/"
	WITHOUT="kernels/sdpa.cpp is built without cuDNN's attention (the flash kernels stay)"
	;;
*)
	echo "fetch_headers: '$PKG' is not cutlass or cudnn-frontend" >&2
	exit 2
	;;
esac
[ -f "$DIR/include/$CHECK" ] && exit 0
no() {
	echo "fetch_headers: $1: $WITHOUT" >&2
	rm -rf "$DIR.tmp"
	exit 0
}
rm -rf "$DIR.tmp" && mkdir -p "$DIR.tmp" || no "cannot create $DIR.tmp"
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || no "no $PY to download it with"
# shellcheck disable=SC2086 # PLAT is a list of options
timeout 300 "$PY" -m pip download --quiet --no-deps --no-cache-dir --only-binary :all: $PLAT \
	-d "$DIR.tmp" "$DIST==$VER" >/dev/null 2>&1 || no "$DIST $VER not downloadable"
[ -f "$DIR.tmp/$WHL" ] || no "no $WHL after the download"
got=$(sha256sum "$DIR.tmp/$WHL" | cut -d' ' -f1)
[ "$got" = "$SHA" ] || no "$WHL has SHA-256 $got, not the pinned $SHA"
# shellcheck disable=SC2086 # PREFIXES is a list
"$PY" - "$DIR.tmp/$WHL" "$DIR.tmp/x" $PREFIXES <<'PYEOF' || no "cannot unpack $WHL"
import sys, zipfile, os
src, dst, pres = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(src) as z:
    for n in z.namelist():
        for p in pres:
            if n.startswith(p) and not n.endswith("/"):
                out = os.path.join(dst, "include", n[len(p):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with z.open(n) as f, open(out, "wb") as g:
                    g.write(f.read())
PYEOF
[ -f "$DIR.tmp/x/include/$CHECK" ] || no "no $CHECK in $WHL"
rm -rf "$DIR" && mkdir -p "$(dirname "$DIR")" && mv "$DIR.tmp/x" "$DIR" && rm -rf "$DIR.tmp" ||
	no "cannot move the headers to $DIR"
echo "fetch_headers: $DIST $VER headers in $DIR" >&2
