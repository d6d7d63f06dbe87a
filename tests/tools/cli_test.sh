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
expect_output() {  # expect_output DESCRIPTION PATTERN FILE
  if grep -q -- "$2" "$3"; then echo "ok: $1"; passes=$((passes + 1)); else
    echo "FAIL: $1: '$2' not in $3"; cat "$3"; failures=$((failures + 1)); fi
}

check "help exits 0" 0 "$ferry" --help
check "put --help exits 0" 0 "$ferry" put --help
check "no subcommand is a usage error" 2 "$ferry"
check "put without files is a usage error" 2 "$ferry" put
check "an unknown option is a usage error" 2 "$ferry" put --no-such-flag x
check "devices lists host:0" 0 "$ferry" devices
expect_output "devices table" "host:0" "$work/out"

for format in safetensors npz npy; do
  check "sample $format" 0 "$ferry" sample "$work/s.$format" --size 3MiB
  check "put --verify $format" 0 "$ferry" put "$work/s.$format" --verify --json "$work/$format.json"
  expect_output "verified $format" "verified: every tensor matches the file" "$work/out"
  expect_output "json $format" '"verified": true' "$work/$format.json"
done
check "put converted" 0 "$ferry" put "$work/s.safetensors" --device-dtype float32 --verify
expect_output "converted path in table" "bfloat16 -> float32" "$work/out"
expect_output "converted label" "converted" "$work/out"
# A requested device dtype applies to the tensors of its kind; --verify compares with the file.
check "sample float32" 0 "$ferry" sample "$work/f32.safetensors" --size 3MiB --dtype float32
check "put bfloat16 --verify" 0 "$ferry" put "$work/f32.safetensors" --device-dtype bfloat16 \
  --verify --json "$work/lossy.json"
expect_output "integer ids keep their dtype" "position_ids .*int64 -> int64 " "$work/out"
expect_output "weights converted" "lm_head.weight .*float32 -> bfloat16" "$work/out"
expect_output "lossy conversion named with its error" \
  "lossy conversion: lm_head.weight (float32 -> bfloat16): [0-9]* of 65536 elements differ, max error" \
  "$work/out"
expect_output "ids match exactly" "verified: 1 of 14 tensors match the file exactly" "$work/out"
if grep -q "every tensor matches the file" "$work/out"; then
  echo "FAIL: a lossy conversion reported as a match"; failures=$((failures + 1))
else echo "ok: a lossy conversion is not reported as a match"; passes=$((passes + 1)); fi
expect_output "json says not exact" '"verified_exact": false' "$work/lossy.json"
check "put --device-dtype-all" 0 "$ferry" put "$work/f32.safetensors" --device-dtype bfloat16 \
  --device-dtype-all --verify
expect_output "ids converted when asked" "position_ids .*int64 -> bfloat16" "$work/out"
expect_output "ids' loss reported" "lossy conversion: model.position_ids (int64 -> bfloat16)" \
  "$work/out"
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
check "put zero_copy aliases" 0 "$ferry" put "$work/s.safetensors" --semantics zero_copy --verify
expect_output "aliased label" "aliased" "$work/out"
check "put sharded" 0 env FERRY_HOST_DEVICES=4 "$ferry" put "$work/s.safetensors" \
  --mesh host:0,host:1,host:2,host:3 --shard-dim 0 --verify
expect_output "sharded label" "sharded/direct" "$work/out"

check "a missing file is bad input" 1 "$ferry" put "$work/missing.safetensors"
expect_output "missing file named" "missing.safetensors" "$work/err"
printf 'garbage that is not a tensor file' >"$work/bad.safetensors"
check "a malformed file is bad input" 1 "$ferry" put "$work/bad.safetensors"
expect_output "malformed file named" "bad.safetensors" "$work/err"
check "an unknown device is bad input" 1 "$ferry" put "$work/s.safetensors" --device host:9
check "an unknown dtype is bad input" 1 "$ferry" put "$work/s.safetensors" --device-dtype float128
check "a bad size is bad input" 1 "$ferry" sample "$work/x.safetensors" --size lots

echo "cli: $passes passed, $failures failed"
exit $((failures > 0))
