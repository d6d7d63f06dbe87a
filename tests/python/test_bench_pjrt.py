"""ferry-bench --device pjrt:0 at a tiny size: the plugin's own path is timed next to ferry's
(the raw_pjrt_put row, and vs_raw_pjrt on every case the plugin has an own path for) and the
sharded case runs over 4 pjrt devices. Needs FERRY_BENCH (a built ferry-bench; scripts/test.sh
sets it) and a PJRT plugin; skips with the reason when the pjrt backend is Unavailable."""

import json
import os
import pathlib
import site
import subprocess
import sys

import pytest

from conftest import skip_or_fail_unavailable

SIZE = "0.002"
REPEATS = 5
# The cases with a plugin path, and what that path must be.
PLUGIN_METHODS = {
    "h2d_contiguous": "BufferFromHostBuffer",
    "h2d_transposed": "byte strides",
    "h2d_convert_f32_bf16": "astype",
    "h2d_sharded_4": "each shard",
    "d2h_contiguous": "ToHostBuffer",
    "d2h_upcast_bf16_f32": "astype",
}

pytestmark = pytest.mark.skipif(
    "FERRY_BENCH" not in os.environ,
    reason="FERRY_BENCH does not name a built ferry-bench (scripts/test.sh sets it)")


def run_bench(tmp_path, device, cases):
    result_file = tmp_path / "bench.json"
    env = dict(os.environ)
    # Where the plugin wheel (xla-cpu-pjrt) is installed for this interpreter.
    env.setdefault("FERRY_PJRT_SEARCH_PATH", ":".join(site.getsitepackages()))
    run = subprocess.run(
        [os.environ["FERRY_BENCH"], "--device", device, "--size", SIZE, "--repeats",
         str(REPEATS), "--case", ",".join(cases), "--json", str(result_file)],
        capture_output=True, text=True, timeout=300, env=env)
    return run, result_file


def test_ferry_bench_on_pjrt_times_the_plugins_own_path(tmp_path):
    cases = ["raw_pjrt_put", *PLUGIN_METHODS, "d2h_sharded_4_assemble"]
    run, result_file = run_bench(tmp_path, "pjrt:0", cases)
    if run.returncode != 0 and "cannot start backend 'pjrt'" in run.stderr:
        assert "UNAVAILABLE" in run.stderr, run.stderr  # any other failure to start is a bug
        skip_or_fail_unavailable(f"the pjrt backend is unavailable: {run.stderr.strip()}")
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {row["case"]: row for row in json.loads(result_file.read_text())["results"]}

    raw = rows["raw_pjrt_put"]
    assert "skipped" not in raw and "error" not in raw, raw
    assert raw["seconds_median"] > 0 and raw["device"] == "pjrt:0"
    assert raw["vs_staged"] is None  # the plugin's put is the yardstick itself
    assert "vs_raw_pjrt" not in raw

    for case, method in PLUGIN_METHODS.items():
        row = rows[case]
        assert "error" not in row and "skipped" not in row, row
        assert method in row["raw_pjrt_method"], (case, row["raw_pjrt_method"])
        assert len(row["raw_pjrt_seconds_all"]) == REPEATS
        assert row["vs_raw_pjrt"] == pytest.approx(
            row["raw_pjrt_seconds_median"] / row["seconds_median"])
        assert "vs raw pjrt" in run.stdout
    assert rows["h2d_sharded_4"]["mesh_devices"] == ["pjrt:0", "pjrt:1", "pjrt:2", "pjrt:3"]
    # The plugin cannot write a shard into its place in a whole (a strided host layout is refused).
    assert "vs_raw_pjrt" not in rows["d2h_sharded_4_assemble"]


def test_ferry_bench_on_host_has_no_plugin_path(tmp_path):
    run, result_file = run_bench(tmp_path, "host:0", ["raw_pjrt_put", "h2d_contiguous"])
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {row["case"]: row for row in json.loads(result_file.read_text())["results"]}
    assert "pjrt" in rows["raw_pjrt_put"]["skipped"]
    assert "vs_raw_pjrt" not in rows["h2d_contiguous"]
