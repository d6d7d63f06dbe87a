#!/usr/bin/env bash
# End-to-end test of the `ferry` command line: sample -> put --verify (single device, converted,
# sharded), JSON output, and the exit codes (0 ok, 1 bad input, 2 usage).
# Usage: cli_test.sh /path/to/ferry
set -uo pipefail
ferry=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
passes=0
check() {  # check DESCRIPTION EXPECTED_RC COMMAND...
  local description=$1 expected=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [[ $rc -ne $expected ]]; then
    echo "FAIL: $description: exit $rc, expected $expected"; cat "$work/out" "$work/err"
    failures=$((failures + 1))
  else
    echo "ok: $description"; passes=$((passes + 1))
  fi
}
expect_no_output() {  # expect_no_output DESCRIPTION PATTERN FILE
  if grep -q -- "$2" "$3"; then echo "FAIL: $1: '$2' in $3"; cat "$3"; failures=$((failures + 1))
  else echo "ok: $1"; passes=$((passes + 1)); fi
}
expect_output() {  # expect_output DESCRIPTION PATTERN FILE
  if grep -q -- "$2" "$3"; then echo "ok: $1"; passes=$((passes + 1)); else
    echo "FAIL: $1: '$2' not in $3"; cat "$3"; failures=$((failures + 1)); fi
}

check "help exits 0" 0 "$ferry" --help
check "put --help exits 0" 0 "$ferry" put --help
check "no subcommand is a usage error" 2 "$ferry"
check "put without files is a usage error" 2 "$ferry" put
check "an unknown option is a usage error" 2 "$ferry" put --no-such-flag x
# A ferry without ferry-bench beside it (a pip install) says so, in its help and for `ferry bench`.
mkdir "$work/alone" && cp "$ferry" "$work/alone/ferry"
check "bench where there is no ferry-bench is bad input" 1 "$work/alone/ferry" bench --list
expect_output "bench says how to get the benchmark" "this install has no benchmark" "$work/err"
check "help where there is no ferry-bench" 0 "$work/alone/ferry" --help
expect_output "help says there is no benchmark" "no benchmark" "$work/out"
check "--shard-dim without --mesh is a usage error" 2 "$ferry" put x.safetensors --shard-dim 1
check "a negative --shard-dim is a usage error" 2 "$ferry" put x.safetensors --mesh host:0 \
  --shard-dim -1
expect_output "the range is short" "not in range 0 to 2147483647" "$work/err"
check "a host device beyond the count" 1 "$ferry" put x.safetensors --device host:3
expect_output "says how the host device count is set" "host has 1 device(s); .*FERRY_HOST_DEVICES" \
  "$work/err"
check "devices lists host:0" 0 "$ferry" devices
expect_output "devices table" "host:0" "$work/out"
expect_output "devices says how fresh host pages are faulted in" "fresh pages" "$work/out"
check "devices with FERRY_HOST_PREFAULT=off" 0 env FERRY_HOST_PREFAULT=off "$ferry" devices
expect_output "devices says prefaulting is off and why" "(FERRY_HOST_PREFAULT=off)" "$work/out"
check "a bad FERRY_HOST_PREFAULT is bad input" 1 env FERRY_HOST_PREFAULT=maybe "$ferry" devices

for format in safetensors npz npy; do
  check "sample $format" 0 "$ferry" sample "$work/s.$format" --size 3MiB
  check "put --verify $format" 0 "$ferry" put "$work/s.$format" --verify --json "$work/$format.json"
  expect_output "verified $format" "verified: every tensor matches the file" "$work/out"
  expect_output "json $format" '"verified": true' "$work/$format.json"
done
# Errors before work: a --json path that cannot be written stops the put before it starts.
check "--json into a missing folder is bad input" 1 "$ferry" put "$work/s.safetensors" \
  --json "$work/no/such/dir/x.json"
expect_output "the missing folder is named" "the folder '$work/no/such/dir' does not exist" "$work/err"
if grep -q "total:" "$work/out"; then
  echo "FAIL: the put ran before the --json path was refused"; cat "$work/out"
  failures=$((failures + 1))
else
  echo "ok: nothing was put"; passes=$((passes + 1))
fi
check "--json onto a directory is bad input" 1 "$ferry" put "$work/s.safetensors" --json "$work"
# A --device-dtype that applies to no tensor says so (exit 0), or fails with --strict.
check "a float8 request on a bf16 checkpoint is a note" 0 "$ferry" put "$work/s.safetensors" \
  --device-dtype float8_e4m3fn
expect_output "the note says nothing converts" "applies to no tensor here.*nothing is converted" \
  "$work/err"
check "...and an error with --strict" 1 "$ferry" put "$work/s.safetensors" \
  --device-dtype float8_e4m3fn --strict
# An explicitly requested PJRT plugin that cannot load is an error, not a table row.
check "devices with a missing --pjrt-plugin is bad input" 1 "$ferry" --pjrt-plugin \
  "$work/no_such_plugin.so" devices
expect_output "the plugin is named" "pjrt-plugin $work/no_such_plugin.so" "$work/err"
check "put converted" 0 "$ferry" put "$work/s.safetensors" --device-dtype float32 --verify \
  --json "$work/converted.json"
expect_output "converted path in table" "bfloat16 -> float32" "$work/out"
expect_output "converted path in the JSON" '"path": "converted"' "$work/converted.json"
# A requested device dtype applies to the tensors of its kind; --verify compares with the file.
check "sample float32" 0 "$ferry" sample "$work/f32.safetensors" --size 3MiB --dtype float32
check "put bfloat16 --verify" 0 "$ferry" put "$work/f32.safetensors" --device-dtype bfloat16 \
  --verify --json "$work/lossy.json"
expect_output "integer ids keep their dtype (no arrow)" "position_ids .*\] *int64  *[0-9]" "$work/out"
expect_output "weights converted" "lm_head.weight .*float32 -> bfloat16" "$work/out"
expect_output "lossy conversion named with its error" \
  "lossy conversion: lm_head.weight (float32 -> bfloat16): [0-9]* of 65536 elements" \
  "$work/out"
expect_output "ids match exactly" "verified: 1 of 11 tensors match the file exactly" "$work/out"
if grep -q "every tensor matches the file" "$work/out"; then
  echo "FAIL: a lossy conversion reported as a match"; failures=$((failures + 1))
else echo "ok: a lossy conversion is not reported as a match"; passes=$((passes + 1)); fi
expect_output "json says not exact" '"verified_exact": false' "$work/lossy.json"
check "put --device-dtype-all" 0 "$ferry" put "$work/f32.safetensors" --device-dtype bfloat16 \
  --device-dtype-all --verify
expect_output "ids converted when asked" "position_ids .*int64 -> bfloat16" "$work/out"
expect_output "ids' loss reported" "lossy conversion: model.position_ids (int64 -> bfloat16)" \
  "$work/out"
# int64 beyond 2^53 stored as float64 loses its low bits: a lossy conversion, compared as integers
# (not through a double, which would round the file's value the same way and call it a match).
python3 - "$work/big_i64.npy" <<'PY'
import struct, sys
header = b"{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"
header += b" " * (64 - 10 - len(header) - 1) + b"\n"
with open(sys.argv[1], "wb") as out:
    out.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
    out.write(struct.pack("<3q", 2**53 + 1, 2**60 + 1, 3))
PY
check "put int64 as float64 --verify" 0 "$ferry" put "$work/big_i64.npy" --device-dtype float64 \
  --device-dtype-all --verify --json "$work/big_i64.json"
expect_output "integers past 2^53 reported lossy" \
  "lossy conversion: big_i64 (int64 -> float64): 2 of 3 elements differ" "$work/out"
expect_output "json says not exact (integers)" '"verified_exact": false' "$work/big_i64.json"
# --json never writes over a tensor file: a typo that took a checkpoint's name as its value, or
# an input under another name.
cp "$work/big_i64.npy" "$work/keep.npy"
check "--json naming a tensor file is bad input" 1 "$ferry" put --json "$work/keep.npy" \
  "$work/big_i64.npy"
expect_output "the refusal says why" "is named like a tensor file" "$work/err"
ln -s "$work/keep.npy" "$work/keep_link"
check "--json naming an input is bad input" 1 "$ferry" put --json "$work/keep_link" \
  "$work/keep.npy"
expect_output "the refusal names the input" "is the input file" "$work/err"
if cmp -s "$work/keep.npy" "$work/big_i64.npy"; then echo "ok: the inputs are untouched"
  passes=$((passes + 1)); else echo "FAIL: --json overwrote an input"; failures=$((failures + 1)); fi
# A size beyond int64 bytes is the parser's error, not an overflowed negative size.
check "sample --size beyond 2^63 bytes is bad input" 1 "$ferry" sample "$work/huge.safetensors" \
  --size 99999999999GiB
expect_output "the size error says so" "is larger than 2^63 bytes" "$work/err"
# .npz has no bfloat16: asked for it explicitly, sample refuses instead of writing float16.
check "sample .npz --dtype bfloat16 is bad input" 1 "$ferry" sample "$work/bf16.npz" --size 1MiB \
  --dtype bfloat16
expect_output "sample says numpy has no bfloat16" "no dtype for bfloat16" "$work/err"
check "sample --dtype int8 is bad input" 1 "$ferry" sample "$work/i8.safetensors" --size 1MiB \
  --dtype int8
expect_output "sample says int8 is not floating-point" "not a floating-point dtype" "$work/err"
# A report that cannot be written (stdout closed, a full disk) is a failure, not exit 0.
if "$ferry" devices >&- 2>"$work/err"; then
  echo "FAIL: devices with stdout closed exited 0"; failures=$((failures + 1))
else echo "ok: devices with stdout closed fails"; passes=$((passes + 1)); fi
expect_output "...saying why" "could not be written to stdout" "$work/err"
if [[ -w /dev/full ]]; then
  check "put into /dev/full is bad input" 1 sh -c '"$1" put "$2" >/dev/full' sh "$ferry" \
    "$work/s.safetensors"
  expect_output "...saying why" "No space left on device" "$work/err"
fi
# An FP8 checkpoint: float8 converts to nothing else, so a float request leaves it as it is.
f8_header='{"w8":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]},"w32":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
printf "$(printf '\\x%02x' $(( ${#f8_header} )) 0 0 0 0 0 0 0)" >"$work/f8.safetensors"
printf '%s' "$f8_header" >>"$work/f8.safetensors"
printf '\x38\x40\xb8\x00\x00\x00\x80\x3f\x00\x00\x00\x40' >>"$work/f8.safetensors"
check "put an FP8 file with --device-dtype bfloat16" 0 "$ferry" put "$work/f8.safetensors" \
  --device-dtype bfloat16 --verify
expect_output "float8 stays float8 (no arrow)" "w8 .*float8_e4m3fn  *[0-9]" "$work/out"
expect_output "float32 converted beside it" "w32 .*float32 -> bfloat16" "$work/out"
check "--device-dtype-all still asks float8 to convert" 1 "$ferry" put "$work/f8.safetensors" \
  --device-dtype bfloat16 --device-dtype-all
expect_output "the refusal says why" "float8 types are storage-only" "$work/err"
# On host:0 the large tensors stored as they are kept go from the file into device memory with
# pread ("read"); the small ones (the norms) and conversions are put from the mapping.
if python3 - "$work/safetensors.json" <<'PY'
import json, sys
tensors = json.load(open(sys.argv[1]))["tensors"]
read = [t for t in tensors if t["path"] == "read"]
assert read and all(t["bytes"] >= 65536 and t["device_dtype"] == t["file_dtype"] for t in read)
assert all(t["path"] == "direct" for t in tensors if t["bytes"] < 65536)
PY
then echo "ok: large tensors read in place"; passes=$((passes + 1))
else echo "FAIL: read in place"; cat "$work/safetensors.json"; failures=$((failures + 1)); fi
check "put lossless conversion" 0 "$ferry" put "$work/f32.safetensors" --device-dtype float64 --verify
expect_output "lossless conversion verified" "verified: every tensor matches the file" "$work/out"
# A file truncated while `put` reads it: exit 1 naming the file (a truncated-while-mapped error,
# or a malformed-file error when the truncation wins the race to open), never SIGBUS (rc 135).
check "sample to truncate" 0 "$ferry" sample "$work/cut.safetensors" --size 256MiB
"$ferry" put "$work/cut.safetensors" --semantics copy >"$work/out" 2>"$work/err" &
sleep 0.01; truncate -s 4096 "$work/cut.safetensors"; wait $!; rc=$?
if [[ $rc -eq 1 || $rc -eq 0 ]] && { [[ $rc -eq 0 ]] || grep -q "cut.safetensors" "$work/err"; }; then
  echo "ok: a file truncated during put: exit $rc"; passes=$((passes + 1))
else echo "FAIL: a file truncated during put: exit $rc"; cat "$work/err"; failures=$((failures + 1)); fi
# A .npy file's data starts 64-byte aligned in the mapping, as the host device needs to alias it.
check "put zero_copy aliases" 0 "$ferry" put "$work/s.npy" --semantics zero_copy --verify
expect_output "aliased label" "aliased" "$work/out"
check "put sharded" 0 env FERRY_HOST_DEVICES=4 "$ferry" put "$work/s.safetensors" \
  --mesh host:0,host:1,host:2,host:3 --shard-dim 0 --verify --json "$work/sharded.json"
expect_output "sharded placement" "^lm_head.weight .* sharded " "$work/out"
expect_output "sharded placement in the JSON" '"placement": "sharded"' "$work/sharded.json"
expect_no_output "no tensor is replicated along dim 0" " replicated  *[0-9]" "$work/out"
# --shard-dim 1: the rank-1 tensors (norms) are replicated, and the table says so (issue 28: they
# were labelled sharded/direct).
check "put --shard-dim 1" 0 env FERRY_HOST_DEVICES=2 "$ferry" put "$work/s.safetensors" \
  --mesh host:0,host:1 --shard-dim 1 --verify --json "$work/dim1.json"
expect_output "a norm is replicated" "^model.norm.weight .* replicated " "$work/out"
expect_output "a matrix is sharded" "^lm_head.weight .* sharded " "$work/out"
if python3 - "$work/dim1.json" <<'PY'
import json, sys
tensors = json.load(open(sys.argv[1]))["tensors"]
for t in tensors:
    want = "sharded" if len(t["shape"]) > 1 else "replicated"
    assert t["placement"] == want, t
    assert ("shard_dim" in t) == (want == "sharded"), t
    assert t["path"] in ("direct", "aliased", "converted", "byte-swapped"), t
assert {t["placement"] for t in tensors} == {"sharded", "replicated"}
PY
then echo "ok: JSON placement matches each tensor's rank"; passes=$((passes + 1))
else echo "FAIL: JSON placement"; cat "$work/dim1.json"; failures=$((failures + 1)); fi

check "a missing file is bad input" 1 "$ferry" put "$work/missing.safetensors"
expect_output "missing file named" "missing.safetensors" "$work/err"
printf 'garbage that is not a tensor file' >"$work/bad.safetensors"
check "a malformed file is bad input" 1 "$ferry" put "$work/bad.safetensors"
expect_output "malformed file named" "bad.safetensors" "$work/err"
check "an unknown device is bad input" 1 "$ferry" put "$work/s.safetensors" --device host:9
check "an unknown dtype is bad input" 1 "$ferry" put "$work/s.safetensors" --device-dtype float128
check "a bad size is bad input" 1 "$ferry" sample "$work/x.safetensors" --size lots
# A bad setting in the environment is named (docs/settings.md), before any command runs.
check "a bad setting is bad input" 1 env FERRY_HOST_MEMORY_CACHE_BYTES=abc "$ferry" devices
expect_output "the bad setting is named" \
  'ferry: FERRY_HOST_MEMORY_CACHE_BYTES="abc": not a byte count (an integer >= 0)' "$work/err"


# --version, and a mistyped command named with the ones that exist.
check "--version exits 0" 0 "$ferry" --version
expect_output "--version prints the version" "^ferry [0-9]*\.[0-9]*\.[0-9]*$" "$work/out"
check "an unknown command is a usage error" 2 "$ferry" pt "$work/s.safetensors"
expect_output "the unknown command is named" "unknown command 'pt' (commands: devices, put" \
  "$work/err"

# --json - writes the JSON alone to stdout (the table goes to stderr).
check "put --json -" 0 "$ferry" put "$work/s.safetensors" --json -
if python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["tensors"]' \
  "$work/out" 2>/dev/null; then echo "ok: stdout is the JSON alone"; passes=$((passes + 1))
else echo "FAIL: stdout is not the JSON alone"; cat "$work/out"; failures=$((failures + 1)); fi
expect_output "the table went to stderr" "total: " "$work/err"
# The memcpy yardstick runs only when asked for (--vs-memcpy): a plain put does its job alone.
if python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert d["vs_memcpy"] is None and d["memcpy_seconds"] is None' "$work/out" 2>/dev/null; then
  echo "ok: no memcpy yardstick by default"; passes=$((passes + 1))
else echo "FAIL: a plain put timed a memcpy"; cat "$work/out"; failures=$((failures + 1)); fi
expect_no_output "no vs_memcpy in the plain table" "vs_memcpy" "$work/err"
check "put --vs-memcpy" 0 "$ferry" put "$work/s.safetensors" --vs-memcpy --json -
if python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert d["memcpy_seconds"] > 0 and d["vs_memcpy"] > 0' "$work/out" 2>/dev/null; then
  echo "ok: --vs-memcpy times the yardstick"; passes=$((passes + 1))
else echo "FAIL: --vs-memcpy gave no ratio"; cat "$work/out"; failures=$((failures + 1)); fi
expect_output "--vs-memcpy prints the ratio" "; vs_memcpy [0-9]" "$work/err"

# A system error is reported once.
check "a missing file (system error)" 1 "$ferry" put "$work/missing.safetensors"
if [[ $(grep -o "No such file or directory" "$work/err" | wc -l) -eq 1 ]]; then
  echo "ok: the system error is not repeated"; passes=$((passes + 1))
else echo "FAIL: the system error is repeated"; cat "$work/err"; failures=$((failures + 1)); fi

# A 0-byte .npy is a bad .npy, not a bad safetensors file.
: >"$work/empty.npy"
check "a 0-byte .npy is bad input" 1 "$ferry" put "$work/empty.npy"
expect_output "the empty .npy is named" "empty.npy" "$work/err"
expect_no_output "the empty .npy is not called safetensors" "safetensors" "$work/err"

# --mesh: spaces after commas are fine; an empty list or an empty name is refused.
check "put --mesh with spaces" 0 env FERRY_HOST_DEVICES=2 "$ferry" put "$work/s.safetensors" \
  --mesh "host:0, host:1" --verify
expect_output "mesh with spaces verified" "verified: every tensor matches the file" "$work/out"
check "put --mesh ''" 1 "$ferry" put "$work/s.safetensors" --mesh ""
check "put --mesh 'host:0,'" 1 "$ferry" put "$work/s.safetensors" --mesh "host:0,"
expect_output "the empty mesh name is explained" "empty device name" "$work/err"

# A mesh mixing backends: each shard's device picks its own device dtype, as device_put does
# (the OpenCL device here may lack float16, which the host device holds).
if "$ferry" devices 2>/dev/null | grep -q "^opencl:0 "; then
  if "$ferry" devices | grep "^opencl:0 " | grep -qw float16; then
    echo "skip: mixed-backend mesh: opencl:0 holds float16 here, so both shards agree"
  else
    check "put on a host+opencl mesh" 0 "$ferry" put "$work/s.npz" --mesh host:0,opencl:0 \
      --shard-dim 0 --verify --json "$work/mixed.json"
    expect_output "shards report their own device dtypes" "float16 -> float16/float32" "$work/out"
    expect_output "json lists each shard's dtype" '"float16",' "$work/mixed.json"
  fi
else
  echo "skip: mixed-backend mesh: no opencl:0 here (no OpenCL runtime)"
fi

# sample --size writes the size asked for, within one tensor (the largest is 1/6 of 3 MiB here).
for size in 3MiB 5MiB; do
  bytes=$(( ${size%MiB} * 1048576 ))
  check "sample --size $size" 0 "$ferry" sample "$work/size.safetensors" --size "$size"
  actual=$(stat -c %s "$work/size.safetensors")
  if (( actual <= bytes + 65536 && actual >= bytes - 524288 )); then
    echo "ok: sample --size $size wrote $actual bytes"; passes=$((passes + 1))
  else echo "FAIL: sample --size $size wrote $actual bytes"; failures=$((failures + 1)); fi
done
# Small sizes get a narrower model, never a file larger than asked (plus its header); a size
# below the smallest model, or a hidden size too wide for it, is bad input naming what is needed.
for size in 200KiB 1MiB; do
  if [[ $size == *KiB ]]; then bytes=$(( ${size%KiB} * 1024 )); else bytes=$(( ${size%MiB} * 1048576 )); fi
  check "sample --size $size --dtype float64" 0 "$ferry" sample "$work/small.safetensors" \
    --size "$size" --dtype float64
  actual=$(stat -c %s "$work/small.safetensors")
  if (( actual <= bytes + 65536 )); then
    echo "ok: sample --size $size wrote $actual bytes"; passes=$((passes + 1))
  else echo "FAIL: sample --size $size wrote $actual bytes"; failures=$((failures + 1)); fi
done
check "sample --size 1KiB is too small" 1 "$ferry" sample "$work/tiny.safetensors" --size 1KiB
expect_output "the size needed is named" "ask for at least" "$work/err"
check "sample --hidden too wide" 1 "$ferry" sample "$work/wide.safetensors" --size 10KiB \
  --hidden 100000
expect_output "a smaller hidden size suggested" "smaller hidden size" "$work/err"
check "sample npy --size 1KiB" 0 "$ferry" sample "$work/tiny.npy" --size 1KiB
actual=$(stat -c %s "$work/tiny.npy")
if (( actual <= 1024 + 128 )); then echo "ok: npy of 1KiB is $actual bytes"; passes=$((passes + 1))
else echo "FAIL: npy of 1KiB is $actual bytes"; failures=$((failures + 1)); fi

# `ferry bench` runs the ferry-bench program installed beside ferry.
if [[ -x "$(dirname "$ferry")/ferry-bench" ]]; then
  check "ferry bench --list runs ferry-bench" 0 "$ferry" bench --list
  expect_output "the bench's cases listed" "h2d_contiguous" "$work/out"
else
  echo "skip: ferry bench: no ferry-bench beside $ferry (built without FERRY_BUILD_BENCH)"
fi

# Without a terminal, lines are laid out for 80 columns ($COLUMNS when set).
check "put --verify piped" 0 "$ferry" put "$work/f32.safetensors" --device-dtype bfloat16 --verify
widest=$(awk '{ if (length($0) > w) w = length($0) } END { print w + 0 }' "$work/out")
if (( widest <= 80 )); then echo "ok: piped output fits 80 columns"; passes=$((passes + 1))
else echo "FAIL: piped output is $widest columns wide"; cat "$work/out"; failures=$((failures + 1)); fi

# --only / --exclude: glob patterns (fnmatch's), repeatable, before or after the files. The JSON
# lists only the tensors put, and the bytes moved are theirs alone.
check "put everything for reference" 0 "$ferry" put "$work/s.safetensors" --json "$work/all.json"
check "put --only --exclude" 0 "$ferry" put --only 'model.layers.0.*' --only 'lm_head.*' \
  "$work/s.safetensors" --exclude '*norm*' --json "$work/only.json"
if python3 - "$work/all.json" "$work/only.json" <<'PY'
import fnmatch, json, sys
every, chosen = (json.load(open(p)) for p in sys.argv[1:3])
def wanted(n):
    return (fnmatch.fnmatchcase(n, "model.layers.0.*") or fnmatch.fnmatchcase(n, "lm_head.*")) \
        and not fnmatch.fnmatchcase(n, "*norm*")
expected = [t for t in every["tensors"] if wanted(t["name"])]
assert 0 < len(expected) < len(every["tensors"]), expected
assert [t["name"] for t in chosen["tensors"]] == [t["name"] for t in expected], chosen["tensors"]
assert chosen["total_bytes"] == sum(t["bytes"] for t in expected) < every["total_bytes"]
PY
then echo "ok: --only/--exclude put exactly the matching tensors and their bytes"; passes=$((passes + 1))
else echo "FAIL: --only/--exclude selection"; cat "$work/only.json"; failures=$((failures + 1)); fi
expect_no_output "the table lists only the tensors put" "norm" "$work/out"
check "put --only a pattern that matches nothing" 1 "$ferry" put "$work/s.safetensors" \
  --only 'lm_head.*' --only 'no_such_*'
expect_output "the pattern is named" "the pattern 'no_such_\*' matches no tensor in file" "$work/err"
check "put --exclude of every tensor" 1 "$ferry" put "$work/s.safetensors" --exclude '*'
expect_output "an empty selection is explained" "leave no tensor to load" "$work/err"
check "put --only over two files (matching in one)" 0 "$ferry" put "$work/s.safetensors" \
  "$work/f8.safetensors" --only w8 --verify
expect_output "the one tensor put (singular)" "total: 1 tensor," "$work/out"
check "put --only --mesh all" 0 "$ferry" put "$work/f8.safetensors" --mesh all --only 'w3?'
expect_output "mesh all puts the selection (singular)" "total: 1 tensor," "$work/out"

# Tensor names are the file's bytes: a name holding terminal controls (an OSC title, a colour and
# a newline) is escaped in the table, the lossy-conversion lines, the JSON and error messages;
# no control byte but the line ends ferry writes itself reaches stdout or stderr.
python3 - "$work" <<'PY'
import json, struct, sys, zipfile
work = sys.argv[1]
names = ["\x1b[31mred\nline", "plain"]
header = json.dumps({names[0]: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     names[1]: {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}).encode()
with open(f"{work}/hostile.safetensors", "wb") as out:
    out.write(struct.pack("<Q", len(header)) + header + struct.pack("<3f", 1.1, -2.3, 0.7))
npy_dict = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
npy_dict += b" " * (64 - 10 - len(npy_dict) - 1) + b"\n"
npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(npy_dict)) + npy_dict + struct.pack("<2f", 1.1, 2.2)
with zipfile.ZipFile(f"{work}/hostile.npz", "w") as archive:
    archive.writestr("\x1b]0;title\x07.npy", npy)
    archive.writestr("\x7f\x1b[2J.npy", npy)
PY
no_raw_controls() {  # no_raw_controls DESCRIPTION: checks $work/out and $work/err
  if python3 - "$work/out" "$work/err" <<'PY'
import sys
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    bad = sorted({b for b in data if (b < 0x20 and b != 0x0A) or b == 0x7F})
    assert not bad, f"{path}: raw control bytes {bad}"
    c1 = sorted({hex(ord(c)) for c in data.decode("utf-8", "replace") if 0x80 <= ord(c) <= 0x9F})
    assert not c1, f"{path}: raw C1 control characters {c1}"
PY
  then echo "ok: $1"; passes=$((passes + 1))
  else echo "FAIL: $1"; cat -v "$work/out" "$work/err"; failures=$((failures + 1)); fi
}
for file in hostile.safetensors hostile.npz; do
  check "put $file" 0 "$ferry" put "$work/$file" --device-dtype bfloat16 --verify
  no_raw_controls "put $file: table and lossy lines escaped"
  check "put $file --json -" 0 "$ferry" put "$work/$file" --json -
  no_raw_controls "put $file --json -: JSON and table escaped"
  if python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$work/out"; then
    echo "ok: $file JSON is valid"; passes=$((passes + 1))
  else echo "FAIL: $file JSON is not valid"; failures=$((failures + 1)); fi
done
expect_output "the OSC name escaped in the table" '\\x1b\]0;title\\x07' "$work/err"
if python3 -c '
import json, sys
names = [t["name"] for t in json.load(open(sys.argv[1]))["tensors"]]
assert names == ["\x1b]0;title\x07", "\x7f\x1b[2J"], names' "$work/out"; then
  echo "ok: the JSON keeps the real names (escaped as JSON)"; passes=$((passes + 1))
else echo "FAIL: the JSON names"; cat "$work/out"; failures=$((failures + 1)); fi
check "put hostile.safetensors --verify" 0 "$ferry" put "$work/hostile.safetensors" \
  --device-dtype bfloat16 --verify
expect_output "the colour and newline escaped in the lossy line" \
  'lossy conversion: \\x1b\[31mred\\nline' "$work/out"
check "a hostile name in an error" 1 "$ferry" put "$work/hostile.safetensors" --only '*red*' \
  --device-dtype float8_e4m3fn --device-dtype-all
expect_output "the error names the tensor escaped" 'hostile.safetensors:\\x1b\[31mred\\nline' \
  "$work/err"
no_raw_controls "the error message escaped"

echo "cli: $passes passed, $failures failed"
exit $((failures > 0))
