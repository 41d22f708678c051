#!/usr/bin/env python3
"""gen_bad_corpus.py: write the malformed-input corpus, tests/fixtures/bad/.

Every file breaks exactly one rule of the safetensors format (or of the
sharded-checkpoint index) and EXPECTED.tsv pairs it with a fragment of the
one-line error the reader must give. The bytes are built here by hand,
independently of the C reader, so the corpus tests the reader rather than
echoing it. Output is deterministic: running this again gives the same
bytes (tests/script/malformed.sh runs every case through `msinv inspect`).

    python3 tests/gen/gen_bad_corpus.py [OUTDIR]   (default tests/fixtures/bad)
"""
import json
import os
import shutil
import struct
import sys

CASES = []  # (relative path, expected fragment)


def st_bytes(header, data=b"", pad=True, raw_len=None):
    """A safetensors image: u64 length, header text (bytes or str), data."""
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header += b" " * (-len(header) % 8)
    n = len(header) if raw_len is None else raw_len
    return struct.pack("<Q", n) + header + data


def entry(dtype, shape, begin, end):
    return '{"dtype":"%s","shape":[%s],"data_offsets":[%s,%s]}' % (
        dtype, ",".join(str(d) for d in shape), begin, end)


def one(name, dtype, shape, nbytes, data=None):
    """A header with one tensor and its data (zeros unless given)."""
    h = '{"%s":%s}' % (name, entry(dtype, shape, 0, nbytes))
    return st_bytes(h, data if data is not None else bytes(nbytes))


def add(out, name, blob, fragment):
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    CASES.append((name, fragment))


def safetensors_cases(out):
    ok = entry("F32", [2], 0, 8)
    d8 = bytes(range(8))
    # -- the length field and the header bounds
    add(out, "empty_file.safetensors", b"", "shorter than the 8-byte header length")
    add(out, "truncated_length.safetensors", b"\x10\x00\x00\x00", "shorter than the 8-byte header length")
    add(out, "header_len_past_eof.safetensors",
        st_bytes('{"t":%s}' % ok, d8, raw_len=4096), "runs past the end of the file")
    add(out, "header_len_over_100mb.safetensors",
        st_bytes('{"t":%s}' % ok, d8, raw_len=100000001), "exceeds the limit of 100000000 bytes")
    add(out, "header_len_2pow64_minus1.safetensors",
        st_bytes("{}", raw_len=(1 << 64) - 1), "exceeds the limit of 100000000 bytes")
    add(out, "header_len_zero.safetensors", st_bytes(b"", raw_len=0), "too small for a JSON object")
    add(out, "header_truncated.safetensors",
        st_bytes(('{"t":%s}' % ok).encode()[:17], pad=False), "unterminated string")
    # -- UTF-8 and JSON syntax
    add(out, "utf8_invalid_byte.safetensors", st_bytes(b'{"t\xff":' + ok.encode() + b"}", d8),
        "header is not valid UTF-8")
    add(out, "utf8_overlong.safetensors", st_bytes(b'{"t\xc0\xae":' + ok.encode() + b"}", d8),
        "header is not valid UTF-8")
    add(out, "utf8_surrogate.safetensors", st_bytes(b'{"t\xed\xa0\x80":' + ok.encode() + b"}", d8),
        "header is not valid UTF-8")
    add(out, "utf8_above_10ffff.safetensors",
        st_bytes(b'{"t\xf4\x90\x80\x80":' + ok.encode() + b"}", d8), "header is not valid UTF-8")
    add(out, "utf8_truncated_sequence.safetensors",
        st_bytes(b'{"t":' + ok.encode() + b"}   \xe2\x82", d8, pad=False), "header is not valid UTF-8")
    add(out, "not_an_object.safetensors", st_bytes('[{"t":%s}]' % ok, d8), "header is not a JSON object")
    add(out, "trailing_json.safetensors", st_bytes('{"t":%s} {}' % ok, d8),
        "trailing bytes after the JSON object")
    add(out, "bad_escape.safetensors", st_bytes('{"t\\x41":%s}' % ok, d8), "invalid escape in string")
    add(out, "bad_unicode_escape.safetensors", st_bytes('{"t\\u12G4":%s}' % ok, d8), "invalid \\u escape")
    add(out, "unpaired_high_surrogate.safetensors", st_bytes('{"t\\ud800":%s}' % ok, d8),
        "unpaired surrogate")
    add(out, "unpaired_low_surrogate.safetensors", st_bytes('{"t\\udc00x":%s}' % ok, d8),
        "unpaired surrogate")
    add(out, "control_char_in_name.safetensors", st_bytes(b'{"t\x01":' + ok.encode() + b"}", d8),
        "control character in string")
    add(out, "nul_in_name.safetensors", st_bytes('{"t\\u0000x":%s}' % ok, d8), "NUL character in string")
    add(out, "deep_nesting.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s%s}}'
                 % ("[" * 40, "]" * 40), d8), "nesting too deep")
    add(out, "unknown_field_leading_zero.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":01}}', d8),
        "invalid JSON value")
    add(out, "unknown_field_bare_fraction.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":-.5}}', d8),
        "invalid JSON value")
    add(out, "nul_byte_in_header.safetensors",
        st_bytes(b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1\0}}', d8),
        "expected ',' or '}' in tensor entry")
    add(out, "invalid_literal.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":nope}}', d8),
        "invalid JSON value")
    # -- keys
    add(out, "duplicate_tensor.safetensors",
        st_bytes('{"t":%s,"t":%s}' % (entry("F32", [2], 0, 8), entry("F32", [2], 8, 16)), bytes(16)),
        "duplicate tensor name 't'")
    add(out, "duplicate_tensor_escaped.safetensors",
        st_bytes('{"ab":%s,"\\u0061b":%s}' % (entry("F32", [2], 0, 8), entry("F32", [2], 8, 16)),
                 bytes(16)), "duplicate tensor name 'ab'")
    add(out, "duplicate_metadata_key.safetensors",
        st_bytes('{"__metadata__":{"format":"pt","format":"np"},"t":%s}' % ok, d8),
        "duplicate __metadata__ key 'format'")
    add(out, "duplicate_metadata_block.safetensors",
        st_bytes('{"__metadata__":{"a":"1"},"t":%s,"__metadata__":{"b":"2"}}' % ok, d8),
        "duplicate key '__metadata__'")
    add(out, "duplicate_dtype_key.safetensors",
        st_bytes('{"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', d8),
        "duplicate key 'dtype'")
    add(out, "metadata_number_value.safetensors",
        st_bytes('{"__metadata__":{"step":5},"t":%s}' % ok, d8), "__metadata__ value is not a string")
    add(out, "metadata_nested_value.safetensors",
        st_bytes('{"__metadata__":{"cfg":{"a":"b"}},"t":%s}' % ok, d8),
        "__metadata__ value is not a string")
    add(out, "metadata_not_object.safetensors",
        st_bytes('{"__metadata__":["a"],"t":%s}' % ok, d8), "__metadata__ is not an object")
    # a name that decodes to a newline must not split the error line
    add(out, "duplicate_name_with_newline.safetensors",
        st_bytes('{"a\\nb":%s,"a\\nb":%s}' % (entry("F32", [2], 0, 8), entry("F32", [2], 8, 16)),
                 bytes(16)), "duplicate tensor name 'a\\x0ab'")
    # -- tensor entries
    add(out, "entry_not_object.safetensors", st_bytes('{"t":[1,2]}'), "tensor entry is not an object")
    add(out, "entry_empty.safetensors", st_bytes('{"t":{}}'), "tensor entry is empty")
    add(out, "missing_dtype.safetensors", st_bytes('{"t":{"shape":[2],"data_offsets":[0,8]}}', d8),
        "tensor entry without 'dtype'")
    add(out, "missing_shape.safetensors", st_bytes('{"t":{"dtype":"F32","data_offsets":[0,8]}}', d8),
        "tensor entry without 'shape'")
    add(out, "missing_offsets.safetensors", st_bytes('{"t":{"dtype":"F32","shape":[2]}}', d8),
        "tensor entry without 'data_offsets'")
    add(out, "unknown_dtype.safetensors", one("t", "F128", [2], 8), "unknown dtype 'F128'")
    add(out, "lowercase_dtype.safetensors", one("t", "f32", [2], 8), "unknown dtype 'f32'")
    add(out, "shape_not_array.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}', d8), "shape is not an array")
    add(out, "rank_9.safetensors", one("t", "U8", [1] * 9, 1), "rank exceeds the limit of 8")
    add(out, "empty_name.safetensors", one("", "F32", [2], 8), "empty tensor name")
    add(out, "name_too_long.safetensors", one("n" * 1025, "F32", [2], 8),
        "tensor name longer than 1024 bytes")
    add(out, "offsets_three_entries.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', d8),
        "data_offsets needs exactly two entries")
    # -- numbers
    add(out, "float_shape.safetensors", one("t", "F32", ["2.0"], 8), "shape entry is not an integer")
    add(out, "exponent_offset.safetensors",
        st_bytes('{"t":{"dtype":"U8","shape":[1000],"data_offsets":[0,1e3]}}', bytes(1000)),
        "offset is not an integer")
    add(out, "string_shape.safetensors", one("t", "F32", ['"2"'], 8), "shape entry is not an integer")
    add(out, "negative_shape.safetensors", one("t", "F32", [-2], 8), "negative shape entry")
    add(out, "negative_offset.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}', d8), "negative offset")
    add(out, "leading_zero.safetensors", one("t", "F32", ["02"], 8), "integer with leading zero")
    add(out, "shape_2pow64.safetensors", one("t", "U8", [1 << 64], 8), "shape entry overflows u64")
    add(out, "offset_2pow64.safetensors",
        st_bytes('{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,%d]}}' % (1 << 64), d8),
        "offset overflows u64")
    # above 2^53 a double would round 2^53+1 to 2^53 and accept the span
    big = (1 << 53) + 1
    add(out, "offset_above_2pow53.safetensors",
        st_bytes('{"t":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (1 << 53, big), d8),
        "data_offsets span 9007199254740993 bytes")
    add(out, "element_count_overflow.safetensors", one("t", "U8", [1 << 32, 1 << 32, 2], 8),
        "element count overflows u64")
    add(out, "byte_size_overflow.safetensors", one("t", "F64", [1 << 61], 8), "byte size overflows u64")
    add(out, "f4_odd_count.safetensors", one("t", "F4", [3], 2), "is not a whole number of bytes")
    add(out, "f6_partial_byte.safetensors", one("t", "F6_E2M3", [3], 3), "is not a whole number of bytes")
    # -- sizes and layout
    add(out, "wrong_size.safetensors", one("t", "F32", [3], 8, bytes(8)), "data_offsets span 8 bytes")
    add(out, "end_before_begin.safetensors",
        st_bytes('{"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', d8),
        "data_offsets end 0 before begin 8")
    add(out, "overlap.safetensors",
        st_bytes('{"a":%s,"b":%s}' % (entry("F32", [2], 0, 8), entry("F32", [2], 4, 12)), bytes(12)),
        "data overlaps the previous tensor")
    add(out, "same_offset.safetensors",
        st_bytes('{"a":%s,"b":%s}' % (entry("F32", [2], 0, 8), entry("F32", [2], 0, 8)), bytes(8)),
        "data overlaps the previous tensor")
    add(out, "hole.safetensors",
        st_bytes('{"a":%s,"b":%s}' % (entry("F32", [2], 0, 8), entry("F32", [2], 12, 20)), bytes(20)),
        "hole in the data buffer")
    add(out, "not_starting_at_zero.safetensors",
        st_bytes('{"a":%s}' % entry("F32", [2], 4, 12), bytes(12)), "hole in the data buffer")
    add(out, "trailing_bytes.safetensors", one("t", "F32", [2], 8, bytes(9)),
        "1 trailing bytes after the last tensor")
    # found by fuzzing: a header without tensors once reached qsort(NULL, 0)
    add(out, "no_tensors_trailing_bytes.safetensors", st_bytes("{" + "\n" * 10 + "}", b"junk"),
        "4 trailing bytes after the last tensor")
    add(out, "data_truncated.safetensors", one("t", "F32", [4], 16, bytes(12)),
        "tensor data extends 4 bytes past the end of the file")
    add(out, "data_missing_entirely.safetensors", one("t", "BF16", [64, 64], 8192, b""),
        "tensor data extends 8192 bytes past the end of the file")


def write_shard(path, tensors):
    """tensors: list of (name, dtype, shape, data bytes), written in order."""
    parts, off, data = [], 0, b""
    for name, dtype, shape, blob in tensors:
        parts.append('"%s":%s' % (name, entry(dtype, shape, off, off + len(blob))))
        off += len(blob)
        data += blob
    with open(path, "wb") as f:
        f.write(st_bytes("{" + ",".join(parts) + "}", data))


def index_cases(out):
    root = os.path.join(out, "index")
    A = "model.layers.0.mlp.experts.0.down_proj.weight"
    B = "model.layers.0.mlp.experts.1.down_proj.weight"
    S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    blob = bytes(range(16))

    def case(name, weight_map, fragment, shards=None, text=None):
        d = os.path.join(root, name)
        os.makedirs(d)
        if shards is None:
            shards = {S1: [(A, "BF16", [2, 4], blob)], S2: [(B, "BF16", [2, 4], blob)]}
        for fname, ts in shards.items():
            write_shard(os.path.join(d, fname), ts)
        if text is None:
            text = json.dumps({"metadata": {"total_size": 32}, "weight_map": weight_map}, indent=2)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write(text + "\n")
        CASES.append(("index/" + name, fragment))

    case("dotdot", {A: "../" + S1, B: S2}, "which is not a plain .safetensors file name")
    case("absolute", {A: "/" + S1, B: S2}, "which is not a plain .safetensors file name")
    case("subdir", {A: "a/" + S1, B: S2}, "which is not a plain .safetensors file name")
    case("dot", {A: ".", B: S2}, "which is not a plain .safetensors file name")
    case("not_safetensors", {A: "config.json", B: S2}, "which is not a plain .safetensors file name")
    case("missing_file", {A: S1, B: "model-00003-of-00002.safetensors"},
         "index lists 'model-00003-of-00002.safetensors', which does not exist")
    case("wrong_file", {A: S2, B: S1}, "is mapped to 'model-00002-of-00002.safetensors' but not found there")
    case("not_listed", {A: S1}, "tensor '%s' in '%s' is not listed there by the index" % (B, S1),
         shards={S1: [(A, "BF16", [2, 4], blob), (B, "BF16", [2, 4], blob)]})
    # the same tensor in both shards, the map naming one of them
    case("in_two_files", {A: S1, B: S2}, "tensor '%s' in '%s' is not listed there by the index" % (A, S2),
         shards={S1: [(A, "BF16", [2, 4], blob)], S2: [(A, "BF16", [2, 4], blob), (B, "BF16", [2, 4], blob)]})
    dup = '{"weight_map": {"%s": "%s", "%s": "%s", "%s": "%s"}}' % (A, S1, A, S1, B, S2)
    case("duplicate_entry", None, "weight_map lists tensor '%s' twice" % A, text=dup)
    # listed twice while another tensor goes unlisted: the counts agree
    dup2 = '{"weight_map": {"%s": "%s", "%s": "%s"}}' % (A, S1, A, S1)
    case("duplicate_hides_unlisted", None, "weight_map lists tensor '%s' twice" % A, text=dup2,
         shards={S1: [(A, "BF16", [2, 4], blob), (B, "BF16", [2, 4], blob)]})
    case("not_json", None, "index is not a JSON object", text='{"weight_map": {')
    case("array", None, "index is not a JSON object", text="[]")
    case("no_weight_map", None, "index has no \"weight_map\" object", text='{"metadata": {}}')
    case("value_not_string", None, "is not a file name", text='{"weight_map": {"%s": 1}}' % A)
    case("bad_shard", {A: S1, B: S2}, "%s': 1 trailing bytes after the last tensor" % S2,
         shards={S1: [(A, "BF16", [2, 4], blob)], S2: [(B, "BF16", [2, 4], blob)]})
    # make bad_shard's second shard one byte too long
    with open(os.path.join(root, "bad_shard", S2), "ab") as f:
        f.write(b"\0")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "bad")
    out = os.path.normpath(out)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    safetensors_cases(out)
    index_cases(out)
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names)), "duplicate case name"
    with open(os.path.join(out, "EXPECTED.tsv"), "w") as f:
        f.write("# file\texpected fragment of the one-line error (tests/script/malformed.sh)\n")
        for name, frag in CASES:
            assert "\t" not in frag and "\n" not in frag
            f.write("%s\t%s\n" % (name, frag))
    print("gen_bad_corpus: %d cases in %s" % (len(CASES), out))


if __name__ == "__main__":
    main()
