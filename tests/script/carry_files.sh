#!/bin/sh
# Every non-weight file of a checkpoint directory (tokenizer files, chat
# template, generation_config.json, a binary tokenizer.model, a model card)
# travels with the state: recorded with its digest by add, copied by
# msshard split and merge, packed by export and unpacked by import, byte
# for byte; and an exported bundle carries the state's lineage (ancestors'
# records, labels, derivation edges with operation and parameters), so an
# import into a fresh inventory shows where the state came from in
# `msinv lineage` and `msinv show`. Hostile lineage in a bundle is refused
# before anything is extracted.
. "$(dirname "$0")/lib.sh"
tmp=$W

run() { # EXPECTED_RC NAME CMD...: stdout in $tmp/out, stderr in $tmp/err
	want=$1; name=$2; shift 2
	"$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" -eq "$want" ]; then ok; else bad "$name: exit $rc, want $want: $(cat "$tmp/err")"; fi
}
has() { # FILE NAME PATTERN: a fixed string in the file
	if grep -qF -- "$3" "$1"; then ok; else bad "$2: no '$3' in: $(cat "$1")"; fi
}
same() { # A B NAME
	if cmp -s "$1" "$2"; then ok; else bad "$3: $1 and $2 differ"; fi
}

if [ ! -x "$B/msinv" ] || [ ! -x "$B/msshard" ] || [ ! -x "$B/msconvert" ]; then
	echo "carry_files: tools not built"; echo "carry_files: 0 passed, 1 failed"; exit 1
fi
SIDE="tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json
special_tokens_map.json tokenizer.model README.md vocab.txt"

# a Qwen3-MoE base with what a published checkpoint has beside its weights
mkdir "$tmp/base"
cp "$FX/hf/qwen3moe/model.safetensors" "$FX/hf/qwen3moe/config.json" \
	"$FX/hf/qwen3moe/generation_config.json" "$tmp/base/"
printf '{"version":"1.0","model":{"type":"BPE","vocab":{"<s>":0,"a":1}}}\n' >"$tmp/base/tokenizer.json"
printf '{"bos_token":"<s>","model_max_length":4096}\n' >"$tmp/base/tokenizer_config.json"
printf '{%%- for m in messages %%}<|%%{{ m.role }}|>{{ m.content }}{%%- endfor %%}\n' \
	>"$tmp/base/chat_template.jinja"
printf '{"eos_token":"</s>"}\n' >"$tmp/base/special_tokens_map.json"
printf '\n\000\001\002sentencepiece\377' >"$tmp/base/tokenizer.model"
printf '# model card\n' >"$tmp/base/README.md"
# a vocabulary of 24 MiB: more than a configuration file may be
head -c 18874368 /dev/urandom | base64 >"$tmp/base/vocab.txt"
cp -r "$tmp/base" "$tmp/orig"
export MSINV_DB="$tmp/a.db"
run 0 init "$B/msinv" init
run 0 add "$B/msinv" add --label base "$tmp/base"
run 0 show "$B/msinv" show base
for f in $SIDE; do has "$tmp/out" "add records $f" "/base/$f"; done

# split -> merge: every file in the shard set and in the merged directory
run 0 split "$B/msshard" split "$tmp/base" -o "$tmp/ep2" --ep-size 2
run 0 merge "$B/msshard" merge "$tmp/ep2" -o "$tmp/merged"
for f in $SIDE config.json; do
	same "$tmp/orig/$f" "$tmp/ep2/$f" "split carries $f"
	same "$tmp/orig/$f" "$tmp/merged/$f" "merge carries $f"
done
# the merged directory is a second copy of the base state, its files too
run 0 "show after merge" "$B/msinv" show base
has "$tmp/out" "merged copy records tokenizer.json" "/merged/tokenizer.json"

# a quantized child, for lineage: its side files are copied too
run 0 quantize "$B/msconvert" quantize "$tmp/merged" -o "$tmp/q" --device cpu
for f in $SIDE; do same "$tmp/orig/$f" "$tmp/q/$f" "quantize carries $f"; done
q=$(sed -n 's/^quantized \(sha256:[0-9a-f]*\) .*/\1/p' "$tmp/out")
[ -n "$q" ] && ok || bad "quantize printed no digest: $(cat "$tmp/out")"

# export the base from its merged copy (the first copy is gone) and the
# quantized state; import both into a fresh inventory
rm -rf "$tmp/base"
run 0 "export base" "$B/msinv" export -o "$tmp/base.tar.zst" base
run 0 "export q" "$B/msinv" export -o "$tmp/q.tar.zst" "$q"
tar --zstd -tf "$tmp/base.tar.zst" >"$tmp/members" 2>/dev/null || zstd -dc "$tmp/base.tar.zst" | tar -tf - >"$tmp/members"
for f in $SIDE; do has "$tmp/members" "bundle member $f" "$f"; done
export MSINV_DB="$tmp/b.db"
run 0 "init b" "$B/msinv" init
run 0 "import q" "$B/msinv" import --label q-imported "$tmp/q.tar.zst" "$tmp/q-imp"
for f in $SIDE; do same "$tmp/orig/$f" "$tmp/q-imp/$f" "import carries $f"; done
run 0 lineage "$B/msinv" lineage q-imported
has "$tmp/out" "lineage names the ancestor by label" "(base) -> $(echo "$q" | cut -c1-23) (q-imported)  quantize"
has "$tmp/out" "lineage keeps the parameters" '"recipe":"modelopt"'
run 0 "show q" "$B/msinv" show q-imported
has "$tmp/out" "show names the parent" "parent    sha256:"
has "$tmp/out" "show names the parent's label" "(base)  quantize"
run 0 "show ancestor" "$B/msinv" show base
has "$tmp/out" "the ancestor has no copy here" "copies    none here"
has "$tmp/out" "the ancestor keeps its origin" "msinv add --label base"
run 0 "verify all" "$B/msverify" files
has "$tmp/out" "verify checks the imported state" "ok	q-imported"
# the base itself, imported later, becomes the copy of the recorded ancestor
run 0 "import base" "$B/msinv" import "$tmp/base.tar.zst" "$tmp/base-imp"
for f in $SIDE config.json; do same "$tmp/orig/$f" "$tmp/base-imp/$f" "import carries $f"; done
run 0 "ls" "$B/msinv" ls
if [ "$(wc -l <"$tmp/out")" -eq 2 ]; then ok; else bad "ls: want 2 states: $(cat "$tmp/out")"; fi
run 0 "verify all again" "$B/msverify" files
has "$tmp/out" "the ancestor now verifies" "ok	base"
run 0 "log check" "$B/msinv" log --check

# a tokenizer changed after add is a failed check of the state
echo '{}' >"$tmp/merged/tokenizer.json"
export MSINV_DB="$tmp/a.db"
run 1 "changed tokenizer" "$B/msverify" files base
cat "$tmp/out" "$tmp/err" >"$tmp/both"; has "$tmp/both" "changed tokenizer named" "tokenizer.json"

# hostile lineage: refused before anything is extracted, nothing
# registered. evil NAME PYTHON-EDIT FRAGMENT: the quantized bundle with
# its manifest edited
evil() {
	rm -rf "$tmp/evil" "$tmp/evil.tar.zst"
	mkdir "$tmp/evil"
	(cd "$tmp/evil" && zstd -dc "$tmp/q.tar.zst" | tar -xf - &&
		python3 -c "import json; m = json.load(open('MANIFEST.json')); l = m['bundle']['lineage']; $2; json.dump(m, open('MANIFEST.json', 'w'), indent=1)" &&
		tar --format=pax -cf - MANIFEST.json $(sed -n 's/.*"path": "\([^"]*\)".*/\1/p' MANIFEST.json | sort -u) |
		zstd -q -o "$tmp/evil.tar.zst")
	export MSINV_DB="$tmp/c.db"
	rm -f "$tmp/c.db"
	"$B/msinv" init >/dev/null
	run 2 "$1" "$B/msinv" import "$tmp/evil.tar.zst" "$tmp/evil-imp"
	has "$tmp/err" "$1 named" "$3"
	[ ! -e "$tmp/evil-imp" ] && ok || bad "$1: output extracted"
	run 0 "$1: ls" "$B/msinv" ls
	[ ! -s "$tmp/out" ] && ok || bad "$1: registered: $(cat "$tmp/out")"
}
if command -v python3 >/dev/null 2>&1; then
	evil "edge to an unlisted state" "l['edges'][0]['parent'] = 'sha256:' + 'ab' * 32" \
		"lineage: an edge to a state it does not list"
	evil "the state its own ancestor" "l['states'][0]['state'] = m['state']; l['edges'][0]['parent'] = m['state']" \
		"lineage: lists the state itself as its ancestor"
	evil "a state listed twice" "l['states'].append(l['states'][0])" "lineage: lists a state twice"
	evil "unknown kind" "l['states'][0]['kind'] = 'weights'" "lineage: a state of unknown kind"
	evil "shard without placement" "l['states'][0]['kind'] = 'adapter_shard'" \
		"lineage: an EP placement that does not fit its kind"
	evil "edge without params" "del l['edges'][0]['params']" "lineage: an edge without child, parent"
	evil "unknown operation" "l['edges'][0]['operation'] = 'invented'" \
		"lineage: an edge of unknown operation 'invented'"
	evil "label read as a digest" "l['states'][0]['label'] = 'abc'" "lineage: a label this inventory would refuse"
	evil "lineage not an object" "m['bundle']['lineage'] = [1]" "lineage: not an object"
fi

# a lineage that would close a cycle with the edges recorded here: this
# inventory says the quantized state is the base's parent; the bundle says
# the opposite. Refused, and the import leaves nothing behind
export MSINV_DB="$tmp/d.db"
run 0 "init d" "$B/msinv" init
run 0 "add q" "$B/msinv" add --label q "$tmp/q"
run 0 "add base as q's child" "$B/msinv" add --label base-here --parent q --op compose "$tmp/merged"
run 2 "cycle" "$B/msinv" import "$tmp/q.tar.zst" "$tmp/q-cycle"
has "$tmp/err" "cycle named" "would close a cycle"
[ ! -e "$tmp/q-cycle" ] && ok || bad "cycle: output left"
run 0 "cycle: show q" "$B/msinv" show q
if grep -q "q-cycle" "$tmp/out"; then bad "cycle: a copy registered"; else ok; fi
run 0 "cycle: log check" "$B/msinv" log --check

# a sharded checkpoint: export keeps the index and generation_config.json,
# so the extracted directory loads in transformers (issue: it left them out)
export MSINV_DB="$tmp/s.db"
run 0 "init s" "$B/msinv" init
run 0 "add sharded" "$B/msinv" add --label sh "$FX/hf/qwen3moe-sharded"
run 0 "export sharded" "$B/msinv" export sh -o "$tmp/sh.tar.zst"
export MSINV_DB="$tmp/s2.db"
run 0 "init s2" "$B/msinv" init
run 0 "import sharded" "$B/msinv" import "$tmp/sh.tar.zst" "$tmp/sh"
for f in $(cd "$FX/hf/qwen3moe-sharded" && ls); do
	same "$FX/hf/qwen3moe-sharded/$f" "$tmp/sh/$f" "sharded export: $f"
done

echo "carry_files: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
