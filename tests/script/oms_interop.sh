#!/bin/sh
# oms_interop.sh: msverify and the reference OpenSSF Model Signing tool
# (model_signing, from the test virtual environment) accept each other's
# signatures, for P-256 and P-384 keys made by openssl, with the signature
# outside and inside the model; and a tampered file, a tampered signature
# and the wrong key fail with both tools.
MS_BUILD=${MS_BUILD:-build}
MS_FIXTURES=${MS_FIXTURES:-tests/fixtures}
MS_ROOT=${MS_ROOT:-.}
MSV=$MS_BUILD/msverify
PY=$MS_ROOT/.venv/bin/python
REF=$MS_ROOT/.venv/bin/model_signing
. "$(dirname "$0")/lib.sh"
tmp=$W

if [ ! -x "$REF" ] || [ ! -x "$PY" ]; then
	echo "oms_interop: skipped: no model_signing in .venv (run 'make venv')"
	echo "oms_interop: 0 passed, 0 failed"
	exit 0
fi
if ! "$REF" --help >/dev/null 2>&1; then
	echo "oms_interop: skipped: model_signing in .venv does not start:"
	"$REF" --help 2>&1 | tail -n 1
	echo "oms_interop: 0 passed, 0 failed"
	exit 0
fi
if [ ! -x "$MSV" ]; then
	echo "oms_interop: missing $MSV"
	echo "oms_interop: 0 passed, 1 failed"
	exit 1
fi
MSV=$(cd "$(dirname "$MSV")" && pwd)/msverify
REF=$(cd "$(dirname "$REF")" && pwd)/model_signing
PY=$(cd "$(dirname "$PY")" && pwd)/python



# expect CODE WHAT CMD...: run CMD, want exit CODE ("nz" = any failure)
expect() {
	want=$1; what=$2; shift 2
	"$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$want" = nz ] && [ $rc -ne 0 ]; then ok; return 0; fi
	if [ "$want" = "$rc" ]; then ok; return 0; fi
	bad "$what: exit $rc (want $want): $(head -c 300 "$tmp/err") $(head -c 300 "$tmp/out")"
	return 1
}

# stderr of the last command names the file
names() {
	if grep -qF -- "$1" "$tmp/err"; then ok; else bad "$2: error does not name '$1': $(head -c 300 "$tmp/err")"; fi
}

# A model directory: the fixture checkpoint and a nested file.
mkmodel() {
	rm -rf "$1"
	mkdir -p "$1/tokenizer/extra"
	cp "$MS_FIXTURES"/hf/qwen3moe/* "$1/"
	printf '{"vocab": {"a": 0}}\n' >"$1/tokenizer/extra/vocab.json"
	printf 'x' >"$1/a.b"
	mkdir -p "$1/a"; printf 'y' >"$1/a/b"
}

# The payload of a bundle with one resource digest changed, re-encoded.
tamper_payload() {
	"$PY" - "$1" "$2" <<'EOF'
import base64, json, sys
b = json.load(open(sys.argv[1]))
p = json.loads(base64.b64decode(b["dsseEnvelope"]["payload"]))
r = p["predicate"]["resources"][0]
r["digest"] = ("0" if r["digest"][0] != "0" else "1") + r["digest"][1:]
b["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(p).encode()).decode()
open(sys.argv[2], "w").write(json.dumps(b))
EOF
}

# The DER signature with one bit flipped, re-encoded.
tamper_sig() {
	"$PY" - "$1" "$2" <<'EOF'
import base64, json, sys
b = json.load(open(sys.argv[1]))
s = bytearray(base64.b64decode(b["dsseEnvelope"]["signatures"][0]["sig"]))
s[-2] ^= 1
b["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(s)).decode()
open(sys.argv[2], "w").write(json.dumps(b))
EOF
}

for curve in prime256v1 secp384r1; do
	k=$tmp/$curve
	openssl ecparam -name $curve -genkey -noout -out "$k.pem" 2>/dev/null &&
		openssl pkey -in "$k.pem" -pubout -out "$k.pub" 2>/dev/null ||
		{ bad "$curve: openssl could not make a key"; continue; }
	openssl ecparam -name $curve -genkey -noout -out "$k.other.pem" 2>/dev/null &&
		openssl pkey -in "$k.other.pem" -pubout -out "$k.other.pub" 2>/dev/null
	m=$tmp/model-$curve
	mkmodel "$m"

	# ours -> reference
	expect 0 "$curve: msverify sign" "$MSV" sign --key "$k.pem" -o "$tmp/ours.sig" "$m"
	expect 0 "$curve: model_signing verify of msverify's signature" \
		"$REF" verify key "$m" --signature "$tmp/ours.sig" --public_key "$k.pub"
	expect 0 "$curve: msverify verify of its own signature" \
		"$MSV" verify --sig "$tmp/ours.sig" --pub "$k.pub" "$m"
	expect 2 "$curve: msverify sign refuses to overwrite" \
		"$MSV" sign --key "$k.pem" -o "$tmp/ours.sig" "$m"

	# reference -> ours
	expect 0 "$curve: model_signing sign" \
		"$REF" sign key "$m" --private_key "$k.pem" --signature "$tmp/ref.sig"
	expect 0 "$curve: msverify verify of model_signing's signature" \
		"$MSV" verify --sig "$tmp/ref.sig" --pub "$k.pub" "$m"

	# the two statements cover the same files with the same root digest
	"$MSV" verify --json --sig "$tmp/ours.sig" --pub "$k.pub" "$m" >"$tmp/j1" 2>&1
	"$MSV" verify --json --sig "$tmp/ref.sig" --pub "$k.pub" "$m" >"$tmp/j2" 2>&1
	r1=$(grep root_digest "$tmp/j1"); r2=$(grep root_digest "$tmp/j2")
	if [ -n "$r1" ] && [ "$r1" = "$r2" ]; then ok; else bad "$curve: root digests differ: '$r1' '$r2'"; fi

	# signatures inside the model, default name model.sig in the current
	# directory: each tool leaves the signature file out
	(cd "$m" && "$MSV" sign --key "$k.pem" .) >"$tmp/out" 2>&1 &&
		(cd "$m" && "$REF" verify key . --signature model.sig --public_key "$k.pub") >"$tmp/out" 2>&1
	if [ $? -eq 0 ]; then ok; else bad "$curve: signature inside the model, ours -> reference: $(cat "$tmp/out")"; fi
	rm -f "$m/model.sig"
	(cd "$m" && "$REF" sign key . --private_key "$k.pem") >"$tmp/out" 2>&1 &&
		"$MSV" verify --sig "$m/model.sig" --pub "$k.pub" "$m" >"$tmp/out" 2>&1
	if [ $? -eq 0 ]; then ok; else bad "$curve: signature inside the model, reference -> ours: $(cat "$tmp/out")"; fi
	rm -f "$m/model.sig"

	# paths the signer chose to leave out (recorded in ignore_paths) are
	# left out when verifying too
	printf 'notes\n' >"$m/README.md"
	expect 0 "$curve: model_signing sign --ignore-paths" \
		"$REF" sign key "$m" --private_key "$k.pem" --signature "$tmp/ign.sig" \
		--ignore-paths "$m/README.md"
	printf 'edited\n' >>"$m/README.md"
	expect 0 "$curve: msverify verify, signed ignore_paths honoured" \
		"$MSV" verify --sig "$tmp/ign.sig" --pub "$k.pub" "$m"
	expect 1 "$curve: msverify verify, README.md not covered" \
		"$MSV" verify --sig "$tmp/ours.sig" --pub "$k.pub" "$m" &&
		names "README.md" "$curve: msverify, extra README.md"
	rm -f "$m/README.md" "$tmp/ign.sig"

	# the wrong key
	expect 1 "$curve: msverify, wrong key" \
		"$MSV" verify --sig "$tmp/ref.sig" --pub "$k.other.pub" "$m"
	expect nz "$curve: model_signing, wrong key" \
		"$REF" verify key "$m" --signature "$tmp/ours.sig" --public_key "$k.other.pub"

	# a tampered signature: the signed payload, then the signature bytes
	for how in payload sig; do
		for who in ours ref; do
			tamper_$how "$tmp/$who.sig" "$tmp/bad.sig" || { bad "tamper_$how failed"; continue; }
			expect 1 "$curve: msverify, $who signature with tampered $how" \
				"$MSV" verify --sig "$tmp/bad.sig" --pub "$k.pub" "$m"
			expect nz "$curve: model_signing, $who signature with tampered $how" \
				"$REF" verify key "$m" --signature "$tmp/bad.sig" --public_key "$k.pub"
		done
	done

	# a tampered file, deep in the tree; then an extra file
	printf 'X' >"$m/tokenizer/extra/vocab.json"
	for who in ours ref; do
		expect 1 "$curve: msverify, tampered file, $who signature" \
			"$MSV" verify --sig "$tmp/$who.sig" --pub "$k.pub" "$m" &&
			names "tokenizer/extra/vocab.json" "$curve: msverify, tampered file"
		expect nz "$curve: model_signing, tampered file, $who signature" \
			"$REF" verify key "$m" --signature "$tmp/$who.sig" --public_key "$k.pub"
	done
	mkmodel "$m"
	printf 'new' >"$m/tokenizer/added.txt"
	for who in ours ref; do
		expect 1 "$curve: msverify, extra file, $who signature" \
			"$MSV" verify --sig "$tmp/$who.sig" --pub "$k.pub" "$m" &&
			names "tokenizer/added.txt" "$curve: msverify, extra file"
		expect nz "$curve: model_signing, extra file, $who signature" \
			"$REF" verify key "$m" --signature "$tmp/$who.sig" --public_key "$k.pub"
	done
	rm -f "$tmp/ours.sig" "$tmp/ref.sig"
done

echo "oms_interop: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
