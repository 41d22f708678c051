#!/bin/sh
# Regenerate the producers' golden checkpoints (tests/fixtures/golden/)
# with the real libraries, on the CPU:
#   golden/ct/<fixture>   llm-compressor 0.14 (oneshot, NVFP4A16,
#                         save_compressed) with the compressed-tensors it pins
#   golden/mo/<fixture>   nvidia-modelopt 0.47 (mtq.quantize W4A16_NVFP4,
#                         export_hf_checkpoint)
# Each producer gets its own venv (they pin different torch/transformers),
# made here when missing: .venv-interop-ct/ and .venv-interop-mo/ at the
# top of the tree (ignored by git), or MS_INTEROP_CT / MS_INTEROP_MO. This
# downloads several GB. MS_INTEROP_FIXTURES=1 also rewrites the fixtures
# that tests/interop/make_fixtures.py makes (deepseekv3, qwen3moe-fused).
# tests/fixtures/golden/VERSIONS records the package versions and the date.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CT=${MS_INTEROP_CT:-$ROOT/.venv-interop-ct}
MO=${MS_INTEROP_MO:-$ROOT/.venv-interop-mo}
PY=${PYTHON:-python3}
HF=$ROOT/tests/fixtures/hf
GOLD=$ROOT/tests/fixtures/golden
FIXTURES="qwen3moe mixtral deepseekv3 qwen3moe-fused"

venv() { # DIR PACKAGES...
	d=$1
	shift
	if [ ! -x "$d/bin/python" ] || ! "$d/bin/python" -c 'import torch, transformers' 2>/dev/null; then
		"$PY" -m venv "$d"
		"$d/bin/pip" install -q --disable-pip-version-check "$@"
	fi
}
venv "$CT" llmcompressor==0.14.0 compressed-tensors==0.19.0 torch==2.14.0 transformers==5.17.0
venv "$MO" nvidia-modelopt==0.47.0 torch==2.15.0 transformers==5.14.1 accelerate requests datasets

if [ "${MS_INTEROP_FIXTURES:-0}" = 1 ] || [ ! -d "$HF/deepseekv3" ] || [ ! -d "$HF/qwen3moe-fused" ]; then
	"$CT/bin/python" "$ROOT/tests/interop/make_fixtures.py" "$HF"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ms-golden.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for f in $FIXTURES; do
	for p in ct mo; do
		if [ $p = ct ]; then v=$CT; else v=$MO; fi
		echo "gen_goldens: $p $f"
		"$v/bin/python" "$ROOT/tests/interop/gen_goldens.py" $p "$HF/$f" "$tmp/$p-$f" \
			> "$tmp/$p-$f.log" 2>&1 || { cat "$tmp/$p-$f.log" >&2; exit 1; }
		rm -rf "${GOLD:?}/$p/$f"
		mkdir -p "$GOLD/$p"
		mv "$tmp/$p-$f" "$GOLD/$p/$f"
	done
done
{
	echo "# tests/fixtures/golden: made by tests/interop/gen_goldens.sh on $(date -u +%Y-%m-%d), CPU only"
	echo "[ct]"
	"$CT/bin/pip" list --disable-pip-version-check 2>/dev/null |
		grep -iE '^(llmcompressor|compressed-tensors|torch|transformers|safetensors|accelerate) '
	echo "[mo]"
	"$MO/bin/pip" list --disable-pip-version-check 2>/dev/null |
		grep -iE '^(nvidia-modelopt|torch|transformers|safetensors|accelerate) '
} > "$GOLD/VERSIONS"
echo "gen_goldens: done ($GOLD)"
