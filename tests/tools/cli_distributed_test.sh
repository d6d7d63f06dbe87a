#!/usr/bin/env bash
# `ferry put FILE --mesh all --shard-dim D --verify` under `mpiexec -n 2` and `-n 4` (loopback):
# one table from rank 0, per-rank numbers, the global checksum per tensor, and the failures
# (a rank that cannot open the file, arguments that differ between ranks): the same clear error on
# every rank and a non-zero exit. Usage: cli_distributed_test.sh /path/to/ferry /path/to/mpiexec
set -uo pipefail
ferry=$1
mpiexec=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
passes=0
check() {  # check DESCRIPTION EXPECTED_RC COMMAND...   (expected "nonzero" for any failure)
  local description=$1 expected=$2
  shift 2
  timeout 120 "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [[ $expected == nonzero && $rc -ne 0 && $rc -ne 124 ]] || [[ $rc == "$expected" ]]; then
    echo "ok: $description"; passes=$((passes + 1))
  else
    echo "FAIL: $description: exit $rc, expected $expected"; cat "$work/out" "$work/err"
    failures=$((failures + 1))
  fi
}
expect_output() {  # expect_output DESCRIPTION PATTERN FILE [COUNT]
  local count
  count=$(grep -c -- "$2" "$3")
  if [[ $count -ge 1 && ( -z ${4:-} || $count -eq ${4:-} ) ]]; then
    echo "ok: $1"; passes=$((passes + 1))
  else
    echo "FAIL: $1: '$2' found $count times in $3 (expected ${4:-at least 1})"; cat "$3"
    failures=$((failures + 1))
  fi
}

fits() {  # fits DESCRIPTION COLUMNS FILE: no line of FILE is wider than COLUMNS
  local widest
  widest=$(awk '{ if (length($0) > w) w = length($0) } END { print w + 0 }' "$3")
  if [[ $widest -le $2 ]]; then
    echo "ok: $1 (widest line $widest)"; passes=$((passes + 1))
  else
    echo "FAIL: $1: a line of $widest columns"; awk -v c="$2" 'length($0) > c' "$3"
    failures=$((failures + 1))
  fi
}

export FERRY_HOST_DEVICES=2
# The report is laid out like the one-process put's (tools/ferry/text_layout.h): without a
# terminal, $COLUMNS columns, 80 when it is unset.
unset COLUMNS
check "sample" 0 "$ferry" sample "$work/s.safetensors" --size 3MiB
for n in 2 4; do
  for dim in 0 1; do
    check "-n $n --shard-dim $dim --verify" 0 "$mpiexec" -n $n "$ferry" put "$work/s.safetensors" \
      --mesh all --shard-dim $dim --verify --json "$work/$n.json"
    expect_output "-n $n dim $dim: one table (rank 0)" "^total: " "$work/out" 1
    expect_output "-n $n dim $dim: verified" "every tensor's global checksum matches the file" "$work/out"
    expect_output "-n $n dim $dim: $((2 * n)) devices of $n processes" "on $((2 * n)) devices of $n process" "$work/out"
    expect_output "-n $n dim $dim: a row per rank" "^ *$((n - 1)) *2 " "$work/out" 1
    fits "-n $n dim $dim: the report fits 80 columns" 80 "$work/out"
  done
  expect_output "-n $n: json per rank" "\"rank\": $((n - 1))" "$work/$n.json"
  # Issue 28: every process names its devices from 0; in the job a device carries its process.
  expect_output "-n $n: devices named with their process" "^devices: p0/host:0, p0/host:1, p1/host:0" "$work/out" 1
  expect_output "-n $n: json names the devices" "\"p$((n - 1))/host:1\"" "$work/$n.json"
  expect_output "-n $n: json gives each tensor's placement" '"placement": "replicated"' "$work/$n.json"
done
# The benchmark's measurement (bench/distributed_put.py), tiny: a cold page cache, per-rank reads.
check "--drop-page-cache --json" 0 "$mpiexec" -n 2 "$ferry" put "$work/s.safetensors" --mesh all \
  --drop-page-cache --json "$work/cold.json"
expect_output "json has per-rank storage reads" '"storage_read_bytes"' "$work/cold.json"
expect_output "json has the aggregate" '"aggregate_gbps"' "$work/cold.json"
# The second, measuring pass opens the files with the same --only/--exclude as the put (it read
# every tensor of the file into a list sized for the chosen ones, and crashed).
check "--only with --drop-page-cache" 0 "$mpiexec" -n 2 "$ferry" put "$work/s.safetensors" \
  --mesh all --only 'lm_head*' --drop-page-cache --json "$work/cold_only.json"
expect_output "--only with --drop-page-cache: per-rank storage reads" '"storage_read_bytes"' \
  "$work/cold_only.json"
# A converted put: the checksums differ by the requested conversion, which is not a failure.
check "converted --verify" 0 "$mpiexec" -n 2 "$ferry" put "$work/s.safetensors" --mesh all \
  --device-dtype bfloat16 --verify
expect_output "float32 stored as bfloat16" "lm_head.weight .*float32 -> bfloat16" "$work/out"
expect_output "a lossy tensor on its own line" "^differs (lossy conversion): lm_head.weight (float32 -> bfloat16)$" "$work/out" 1
expect_output "the verdict counts them" "^verified: .* tensors' global checksums match the file; .* differ by the" "$work/out" 1
fits "converted --verify: the report fits 80 columns" 80 "$work/out"
# --json -: the JSON alone on stdout, the table on stderr (as a one-process put); a lossy
# conversion makes verified_exact false, as there.
check "converted --verify --json -" 0 "$mpiexec" -n 2 "$ferry" put "$work/s.safetensors" \
  --mesh all --device-dtype bfloat16 --verify --json -
if python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["verified_exact"] is False' \
  "$work/out"; then echo "ok: --json - is JSON alone, verified_exact false"; passes=$((passes + 1))
else echo "FAIL: --json - with --mesh all"; head -5 "$work/out"; failures=$((failures + 1)); fi
expect_output "--json -: the table on stderr" "^total: " "$work/err" 1
# --device-dtype leaves float8 tensors as they are (storage-only), and one that applies to no
# tensor is a note, or with --strict an error, as in a one-process put.
python3 - "$work/f8.safetensors" <<'PY'
import json, struct, sys
header = json.dumps({"q": {"dtype": "F8_E4M3", "shape": [8, 8], "data_offsets": [0, 64]},
                     "w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [64, 128]}}).encode()
header += b" " * (-len(header) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + bytes(range(64)) + struct.pack("<16f", *range(16)))
PY
check "float8 stays float8 under --device-dtype" 0 "$mpiexec" -n 2 "$ferry" put "$work/f8.safetensors" \
  --mesh all --device-dtype bfloat16 --verify
check "a float8 request on float32 tensors is a note" 0 "$mpiexec" -n 2 "$ferry" put \
  "$work/s.safetensors" --mesh all --device-dtype float8_e5m2 --only 'lm_head*'
expect_output "the note, once" "applies to no tensor here" "$work/err" 1
check "--strict makes it an error" nonzero "$mpiexec" -n 2 "$ferry" put "$work/s.safetensors" \
  --mesh all --device-dtype float8_e5m2 --only 'lm_head*' --strict
expect_output "the error on every rank" "applies to no tensor here" "$work/err" 2
check "--vs-memcpy with --mesh all is refused" 1 "$ferry" put "$work/s.safetensors" --mesh all \
  --vs-memcpy
check "--drop-page-cache needs --mesh all" 1 "$ferry" put "$work/s.safetensors" --drop-page-cache
# A timeout beyond what the clock counts (1e10 s) waits, not fails at once.
check "FERRY_DISTRIBUTED_TIMEOUT_S=1e10" 0 env FERRY_DISTRIBUTED_TIMEOUT_S=1e10 "$mpiexec" -n 2 \
  "$ferry" put "$work/s.safetensors" --mesh all --only 'lm_head*'
# A wider COLUMNS is used: long tensor names whole (shortened in the middle at 80 columns).
check "COLUMNS=160" 0 env COLUMNS=160 "$mpiexec" -n 2 "$ferry" put "$work/s.safetensors" \
  --mesh all --shard-dim 1 --verify
fits "COLUMNS=160: the report fits 160 columns" 160 "$work/out"
expect_output "COLUMNS=160: a long name whole" "^model.layers.0.post_attention_layernorm.weight " "$work/out" 1

# Every backend that starts here (OpenCL on PoCL, the XLA CPU PJRT plugin): one client per process.
for backend in opencl pjrt; do
  if "$ferry" devices 2>/dev/null | grep -q "^$backend:0 "; then
    check "-n 2 --mesh all:$backend --verify" 0 "$mpiexec" -n 2 "$ferry" put "$work/s.safetensors" \
      --mesh all:$backend --shard-dim 1 --verify
    expect_output "$backend: verified" "every tensor's global checksum matches the file" "$work/out"
  else
    echo "skip: no $backend device on this machine"
  fi
done

# Rank 1 runs in a folder without the file: every rank fails with the same error naming rank 1.
mkdir -p "$work/r0" "$work/r1"
cp "$work/s.safetensors" "$work/r0/"
check "a rank cannot open the file" nonzero "$mpiexec" -n 2 sh -c \
  "cd $work/r\$PMI_RANK && exec $ferry put s.safetensors --mesh all --verify"
expect_output "every rank says rank 1 failed" "rank 1 of 2 failed during opening the files" "$work/err" 2
# Arguments that differ between ranks (the mesh a rank would build): refused on every rank.
check "--shard-dim differs between ranks" nonzero "$mpiexec" -n 2 sh -c \
  "exec $ferry put $work/s.safetensors --mesh all --shard-dim \$PMI_RANK"
expect_output "every rank names the difference" "the command line differs between ranks 0 and 1" "$work/err" 2
# Issue 28: the field that differs is named and both values shown, on lines of 80 columns at most.
expect_output "every rank names the field" "^first in --shard-dim:$" "$work/err" 2
expect_output "rank 1's value shown" "^  rank 1: 1$" "$work/err" 2
fits "the error fits 80 columns" 80 "$work/err"
# --drop-page-cache on one rank only: named as a difference (before, the ranks' collectives went
# out of step and rank 0 aborted on an empty result).
check "--drop-page-cache differs between ranks" nonzero env FERRY_DISTRIBUTED_TIMEOUT_S=20 \
  "$mpiexec" -n 1 "$ferry" put "$work/s.safetensors" --mesh all : \
  -n 1 "$ferry" put "$work/s.safetensors" --mesh all --drop-page-cache
expect_output "every rank names that field" "^first in --drop-page-cache:$" "$work/err" 2
# Tensors that differ between the ranks' files: the first tensor that differs is named.
python3 - "$work" <<'PY'
import json, struct, sys
for rank, shape in ((0, [2, 2]), (1, [4, 1])):
    header = json.dumps({"a.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b.weight": {"dtype": "F32", "shape": shape, "data_offsets": [8, 24]}})
    header = header.encode() + b" " * (-len(header) % 8)
    with open(f"{sys.argv[1]}/r{rank}/t.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<6f", *range(6)))
PY
check "the files' tensors differ between ranks" nonzero "$mpiexec" -n 2 sh -c \
  "cd $work/r\$PMI_RANK && exec $ferry put t.safetensors --mesh all"
expect_output "every rank names the tensor" "^first in b.weight:$" "$work/err" 2
expect_output "with both shapes" "^  rank 1: float32 \[4,1\]$" "$work/err" 2
fits "that error fits 80 columns" 80 "$work/err"

# A rank that never starts MPI (it exits at once, or runs `ferry devices`, which needs no MPI):
# MPI_Init_thread waits for it forever, so start-up has the collective deadline too. Every rank
# that runs `put` fails with the deadline's error instead of hanging (check's `timeout 120` tells a
# hang, exit 124, from that failure). -disable-auto-cleanup: by default mpiexec kills the other
# ranks as soon as the first one exits non-zero, before they can print.
for other in true "$ferry devices"; do
  check "a rank that never starts MPI ($other)" nonzero env FERRY_DISTRIBUTED_TIMEOUT_S=5 \
    "$mpiexec" -disable-auto-cleanup -n 2 "$ferry" put "$work/s.safetensors" --mesh all : -n 1 $other
  expect_output "every put rank reports the start-up deadline ($other)" \
    "MPI start-up (MPI_Init_thread) did not finish within 5 s" "$work/err" 2
done

echo "$passes passed, $failures failed"
[[ $failures -eq 0 ]]
