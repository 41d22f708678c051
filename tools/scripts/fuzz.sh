#!/bin/sh
# fuzz.sh: build the fuzz targets with libFuzzer + ASan + UBSan and run one.
#
#   sh tools/scripts/fuzz.sh TARGET [SECONDS] [JOBS]
#       TARGET   one of tests/fuzz/fz_TARGET.c: safetensors, index, bundle,
#                plan, manifest, sigbundle, policy_map, ep_manifest,
#                adapter_config
#       SECONDS  total run time (default 60)
#       JOBS     parallel fuzzing processes (default 1)
#   sh tools/scripts/fuzz.sh build         build every target, run nothing
#   sh tools/scripts/fuzz.sh minimize TARGET
#       merge the committed corpus into a minimal set (by coverage)
#
# libms is built into build-fuzz (FUZZ_BUILD=dir for another) with
# -fsanitize=fuzzer-no-link (coverage without libFuzzer's main), and each
# target links with -fsanitize=fuzzer. New inputs go to
# build-fuzz/corpus/TARGET first; at the end they are merged into
# tests/fuzz/corpus/TARGET (only those that add coverage), so the committed
# corpus stays small. Crashes are written to build-fuzz/crashes/TARGET/;
# every one found must become a fixture (tests/fixtures/bad) and stay in
# the corpus (as tests/fuzz/corpus/TARGET/regress-<what>) as a regression
# test. Targets that need the fixtures find them from the repository root
# (MS_FIXTURES overrides).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=${FUZZ_BUILD:-build-fuzz}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
export MS_FIXTURES="${MS_FIXTURES:-$ROOT/tests/fixtures}"

# Several runs (of different targets) may start at once: one builds at a
# time, the others then find everything up to date.
build() {
	mkdir -p $B/fz-obj
	exec 9>$B/build.lock
	flock 9
	cflags="-std=c11 -D_GNU_SOURCE -pthread -O1 -g -Wall -Wextra -Isrc -I$B/fz-obj $(pkg-config --cflags libcjson)"
	libs="$(pkg-config --libs sqlite3 libcrypto libcjson libarchive libzstd) -lpthread -lm"
	if make --no-print-directory BUILD=$B CC=clang OPT=-O1 \
	     EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $SAN" $B/libms.a >$B/make.log 2>&1; then
		lib=$B/libms.a
		# the Makefile adds the CUDA kernels whenever nvcc exists
		if ls $B/kernels/*.o >/dev/null 2>&1; then
			nvcc=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
			cuda=${nvcc%/bin/nvcc}
			libs="$libs -L$cuda/lib64 -L$cuda/targets/x86_64-linux/lib -lcudart_static -ldl -lrt -lstdc++"
		fi
	else
		# a half-finished module elsewhere in src/ must not stop a fuzzing
		# run: every module that compiles goes in, and a target that needs
		# one that does not fails alone (at link time)
		echo "fuzz: libms does not build (see $B/make.log); modules that compile only" >&2
		sh tools/scripts/embed_schema.sh $(ls schema/*.sql | sort) >$B/fz-obj/schema_sql.h
		objs=""
		for src in src/*.c; do
			o=$B/fz-obj/$(basename "$src" .c).o
			if clang $cflags -fsanitize=fuzzer-no-link $SAN -c -o "$o" "$src" 2>$o.log; then
				objs="$objs $o"
			else
				echo "fuzz: $src does not compile (see $o.log)" >&2
			fi
		done
		rm -f $B/fz-core.a
		ar rcs $B/fz-core.a $objs
		lib=$B/fz-core.a
	fi
	for src in tests/fuzz/fz_*.c; do
		n=$(basename "$src" .c)
		# skip an up-to-date target: it may be running in another run
		if [ "$B/$n" -nt "$src" ] && [ "$B/$n" -nt "$lib" ]; then
			continue
		fi
		clang $cflags -fsanitize=fuzzer $SAN -o "$B/$n.tmp" "$src" $lib $libs 2>$B/$n.log &&
			mv "$B/$n.tmp" "$B/$n" ||
			echo "fuzz: $n does not build (see $B/$n.log)" >&2
	done
	flock -u 9
}

# Tokens of the formats (libFuzzer dictionary syntax), so mutations speak
# JSON and safetensors.
dict() { # target
	cat <<'DICT'
"{"
"}"
"["
"]"
":"
","
"\""
"\\u0000"
"\\ud800"
"\\udc00"
"\\\""
"18446744073709551615"
"18446744073709551616"
"9007199254740993"
"1e3"
"1.0"
"-1"
"00"
"\x00\x00\x00\x00\x00\x00\x00\x00"
"\xff\xff\xff\xff\xff\xff\xff\xff"
"\xc0\x80"
"\xed\xa0\x80"
"\xf4\x90\x80\x80"
DICT
	case $1 in
	safetensors) words="__metadata__ dtype shape data_offsets BOOL F4 F6_E2M3 F6_E3M2 U8 I8
		F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ I16 U16 F16 BF16 I32 U32 F32
		C64 F64 I64 U64 format pt";;
	index) words="weight_map metadata total_size model-00001-of-00002.safetensors
		model-00002-of-00002.safetensors ../x.safetensors /x.safetensors a/b.safetensors
		.. . .safetensors model.layers.0.mlp.experts.0.up_proj.weight
		model.layers.0.mlp.experts.1.up_proj.weight outside nested";;
	plan) words="name ep_size placement budget_gib num_experts states role state path
		repr outputs contiguous round-robin as-is bf16 nvfp4-rowwise nvfp4-columnwise
		nvfp4-both nvfp4-ondemand base adapter sha256: 4096 65536 1048576 0.0001";;
	manifest) words="format msinv-manifest-v1 state kind label layout ep_size ep_rank
		files path size header_sha256 sha256 tensors name dtype shape offset bytes
		configs model.safetensors config.json sha256: BF16 F32 U8 F4 a/b ./x ../x /x";;
	sigbundle) words="mediaType application/vnd.dev.sigstore.bundle.v0.3+json
		verificationMaterial publicKey hint tlogEntries dsseEnvelope payload
		payloadType application/vnd.in-toto+json signatures sig keyid _type
		https://in-toto.io/Statement/v1 subject digest sha256 predicateType
		https://model_signing/signature/v1.0 predicate serialization method files
		hash_type allow_symlinks ignore_paths resources algorithm model config.json
		model.safetensors sub/notes.txt .git .git/HEAD sub ./ ../ true false null";;
	policy_map) words="tensors sha256: lm_head.weight model.embed_tokens.weight
		model.norm.weight base_model.model.model.layers.0.mlp.experts.lora_A.weight";;
	ep_manifest) words="ranks format msinv-ep-manifest version kind adapter checkpoint
		stem adapter_model model num_experts ep_size placement contiguous round-robin map
		packing fused per-expert grouped r source state_digest index files metadata
		configs adapter_config.json tensors dtype shape sha256 file param part expert
		replicated expert fused-lora-a fused-lora-b shards rank experts
		adapter_model-ep00000-of-00002.safetensors adapter_model-ep00001-of-00002.safetensors
		sha256:";;
	adapter_config) words="r rank_pattern alpha_pattern target_parameters target_modules
		lora_alpha mlp.experts.gate_up_proj mlp.experts.down_proj experts.gate_proj
		experts.up_proj num_experts num_local_experts n_routed_experts moe_num_experts
		quantization_config";;
	model_config) words="model_type qwen3_moe mixtral glm4_moe architectures hidden_act
		silu vocab_size hidden_size num_hidden_layers num_attention_heads
		num_key_value_heads head_dim rms_norm_eps rope_theta rope_parameters rope_type
		default yarn partial_rotary_factor rope_scaling num_experts num_local_experts
		n_routed_experts num_experts_per_tok moe_intermediate_size intermediate_size
		norm_topk_prob decoder_sparse_step mlp_only_layers n_shared_experts n_group
		topk_group routed_scaling_factor first_k_dense_replace use_qk_norm
		attention_bias tie_word_embeddings sliding_window use_sliding_window
		attention_dropout output_router_logits router_jitter_noise layer_types";;
	esac
	for k in $words; do printf '"\\"%s\\""\n' "$k"; done
}

# Merge the corpus into the inputs that add coverage. Files named
# regress-* are regression inputs (each a crash once found) and are always
# kept whatever their coverage. When the features libFuzzer counts (edges
# and hit-count buckets) need more than 300 files or 2 MB, the merge is
# redone on edges alone: big inputs (shard manifests) would not fit
# otherwise. The committed corpus is replaced only once a merge succeeded.
minimize() { # target
	c=tests/fuzz/corpus/$1
	tmp=$B/minimize-$1
	rm -rf "$tmp" "$tmp.in" "$tmp.keep"; mkdir -p "$tmp" "$tmp.in" "$tmp.keep" $B/corpus/$1
	for f in "$c"/*; do
		[ -f "$f" ] || continue
		case $(basename "$f") in
		regress-*) cp "$f" "$tmp.keep/";;
		*) cp "$f" "$tmp.in/";;
		esac
	done
	for counters in 1 0; do
		rm -rf "$tmp"; mkdir "$tmp"
		if ! $B/fz_$1 -set_cover_merge=1 -use_counters=$counters -rss_limit_mb=2048 \
		     "$tmp" "$tmp.in" $B/corpus/$1 2>$B/merge-$1.log; then
			echo "fuzz: $1: merge failed (see $B/merge-$1.log); corpus left as it was" >&2
			rm -rf "$tmp" "$tmp.in" "$tmp.keep"
			return 1
		fi
		mfiles=$(ls "$tmp" "$tmp.keep" | grep -vc -e '^$' -e ':$')
		mbytes=$(cat "$tmp"/* "$tmp.keep"/* 2>/dev/null | wc -c)
		[ "$mfiles" -lt 300 ] && [ "$mbytes" -lt 2000000 ] && break
	done
	rm -f "$c"/*
	# content-addressed names: the same input is never committed twice
	for f in "$tmp"/*; do
		[ -f "$f" ] || continue
		cp "$f" "$c/$(sha1sum "$f" | cut -c1-16)"
	done
	for f in "$tmp.keep"/*; do [ -f "$f" ] && mv "$f" "$c/"; done
	rm -rf "$tmp" "$tmp.in" "$tmp.keep"
	echo "fuzz: $1 corpus: $(ls "$c" | wc -l) files, $(cat "$c"/* | wc -c) bytes"
}

case "${1:-}" in
build)
	build; exit 0;;
minimize)
	[ $# -eq 2 ] || { echo "usage: fuzz.sh minimize TARGET" >&2; exit 2; }
	build; mkdir -p $B/corpus/$2; minimize "$2"; exit 0;;
''|-*)
	echo "usage: fuzz.sh TARGET [SECONDS] [JOBS] | build | minimize TARGET" >&2
	exit 2;;
*)
	[ -f tests/fuzz/fz_$1.c ] || { echo "fuzz.sh: no target tests/fuzz/fz_$1.c" >&2; exit 2; };;
esac

t=$1; secs=${2:-60}; jobs=${3:-1}
case "$secs$jobs" in *[!0-9]*) echo "fuzz.sh: SECONDS and JOBS are integers" >&2; exit 2;; esac
build
[ -x $B/fz_$t ] || exit 3
mkdir -p $B/corpus/$t $B/crashes/$t
opts="-max_total_time=$secs -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix=$B/crashes/$t/ -print_final_stats=1"
dict $t >$B/$t.dict
opts="$opts -dict=$B/$t.dict"
rc=0
if [ "$jobs" -gt 1 ]; then
	# -fork keeps going after a crash and restarts the workers
	$B/fz_$t $opts -fork="$jobs" -ignore_crashes=1 $B/corpus/$t tests/fuzz/corpus/$t \
	  2>$B/fuzz-$t.log || rc=$?
else
	$B/fz_$t $opts $B/corpus/$t tests/fuzz/corpus/$t 2>$B/fuzz-$t.log || rc=$?
fi
grep -E '^(stat::|#[0-9]+.*DONE)|SUMMARY|Done [0-9]+ runs' $B/fuzz-$t.log | tail -n 12 || true
n=$(ls $B/crashes/$t | wc -l)
echo "fuzz: $t: exit $rc, $n crash artifacts in $B/crashes/$t (log: $B/fuzz-$t.log)"
minimize "$t"
[ "$n" -eq 0 ] && [ $rc -eq 0 ]
