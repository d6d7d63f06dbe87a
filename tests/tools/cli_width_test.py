#!/usr/bin/env python3
"""The `ferry` command in a pseudo-terminal: every line fits 80 columns (progress bars, the put
table with long tensor names, the devices list, help), and a wider terminal is used in full.

Usage: cli_width_test.py /path/to/ferry. Needs only the standard library (pty, termios)."""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
import unicodedata

FERRY = sys.argv[1]
ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LONG_NAME = "model.encoder.layers.17.attention.self_attention_block.query_key_value_projection.weight"


def run_in_terminal(args, columns, env=None, program=None):
    """Runs FERRY (or `program`) args with stdin/stdout/stderr on a pty of `columns`; returns
    (rc, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    child_env = dict(os.environ)
    child_env.pop("COLUMNS", None)
    child_env.update(env or {})
    process = subprocess.Popen([program or FERRY] + args, stdin=slave, stdout=slave, stderr=slave,
                               env=child_env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    rc = process.wait(timeout=120)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def screen_lines(output):
    """What the terminal shows as separate lines: split at newlines and carriage returns (the
    progress bar redraws its line after a \\r), escape sequences removed."""
    return [ESCAPES.sub("", piece) for piece in re.split(r"\r\n|\n|\r", output)]


def write_safetensors(path, names):
    """A safetensors file of 4-element float32 tensors with these names (stdlib only)."""
    header, offset = {}, 0
    for name in names:
        header[name] = {"dtype": "F32", "shape": [2, 2], "data_offsets": [offset, offset + 16]}
        offset += 16
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + struct.pack("<4f", 1, 2, 3, 4) * len(names))


failures = []


def display_columns(text):
    """The terminal columns of `text`: 2 for wide East Asian characters, 0 for combining marks."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


def table_rows(lines):
    """The put table's header and the first word of each row (the tensor names as shown): the rows
    run from the header ("tensor ...") to the first line that is not a row."""
    start = next((i for i, line in enumerate(lines) if line.startswith("tensor ")), None)
    if start is None:
        return "", []
    names = []
    for line in lines[start + 1:]:
        if not line or line.startswith(("tensor names ", "file ", "total: ")):
            break
        names.append(line.split()[0])
    return lines[start], names


def check(description, condition, detail=""):
    print(("ok: " if condition else "FAIL: ") + description)
    if not condition:
        failures.append(description)
        if detail:
            print(detail)


def check_fits(description, output, columns):
    lines = screen_lines(output)
    widest = max((len(line) for line in lines), default=0)
    too_wide = [line for line in lines if len(line) > columns]
    check(f"{description}: every line fits {columns} columns (widest {widest})", not too_wide,
          "\n".join(repr(line) for line in too_wide))
    return lines


with tempfile.TemporaryDirectory() as work:
    sample = os.path.join(work, "sample.safetensors")
    named = os.path.join(work, "named.safetensors")
    write_safetensors(named, [LONG_NAME, "short"])

    rc, out = run_in_terminal(["sample", sample, "--size", "48MiB"], 80)
    check("sample exits 0", rc == 0, out)
    check_fits("sample (progress bar)", out, 80)
    check("sample drew its progress bar", "sample [" in out, out)

    rc, out = run_in_terminal(["put", sample, named, "--verify"], 80)
    check("put exits 0", rc == 0, out)
    lines = check_fits("put --verify (progress bars, table, totals)", out, 80)
    check("put drew its progress bar", "put [" in out, out)
    check("the long name is shortened at 80 columns, keeping its layer number and its end",
          any(re.match(r"^\S*\.17\.\S*weight ", line) and not line.startswith(LONG_NAME)
              for line in lines), out)

    # Issue 28: the put table of the sample at 80 columns, on one device and on meshes (with and
    # without a conversion: the widest dtype column), of one file and of two: every name distinct,
    # each keeping the numbers of the whole name, the placement truthful, a file column for two.
    json_path = os.path.join(work, "put.json")
    cases = [
        ("one device", [sample], {}),
        ("two files", [sample, named], {}),
        ("mesh --shard-dim 1", [sample, "--mesh", "host:0,host:1", "--shard-dim", "1"],
         {"FERRY_HOST_DEVICES": "2"}),
        ("mesh converted", [sample, "--mesh", "host:0,host:1", "--shard-dim", "1",
                            "--device-dtype", "float32"], {"FERRY_HOST_DEVICES": "2"}),
        ("mesh of two files converted", [sample, named, "--mesh", "host:0,host:1,host:2",
                                         "--device-dtype", "float64"], {"FERRY_HOST_DEVICES": "3"}),
    ]
    for description, args, env in cases:
        rc, out = run_in_terminal(["put"] + args + ["--json", json_path], 80, env)
        check(f"put ({description}) exits 0", rc == 0, out)
        lines = check_fits(f"put ({description})", out, 80)
        with open(json_path) as f:
            tensors = json.load(f)["tensors"]
        header, names = table_rows(lines)
        check(f"put ({description}): one row per tensor", len(names) == len(tensors),
              f"{len(names)} rows, {len(tensors)} tensors\n" + out)
        if len(names) != len(tensors):
            continue
        pairs = {(t["file"], shown) for t, shown in zip(tensors, names)}
        check(f"put ({description}): tensor names distinct", len(pairs) == len(tensors), out)
        check(f"put ({description}): each name keeps its numbers",
              all(re.findall(r"\d+", t["name"]) == re.findall(r"\d+", shown)
                  for t, shown in zip(tensors, names)), out)
        several = len([a for a in args if a.endswith(".safetensors")]) > 1
        check(f"put ({description}): a file column exactly when there are several files",
              (" file " in header) == several, header)
        if several:
            check(f"put ({description}): the files listed by number",
                  any(line == f"file 2: {named}" for line in lines), out)
        if "--mesh" in args:
            dim = int(args[args.index("--shard-dim") + 1]) if "--shard-dim" in args else 0
            rows = [line for line in lines if line and line.split()[0] in names]
            check(f"put ({description}): placement sharded exactly where the tensor has dim {dim}",
                  all((" sharded " in row) == (len(t["shape"]) > dim) and
                      (" replicated " in row) == (len(t["shape"]) <= dim) and
                      t["placement"] == ("sharded" if len(t["shape"]) > dim else "replicated")
                      for t, row in zip(tensors, rows)), out)

    # Names that no shortening keeps apart (they differ only inside one long word): each whole name
    # on a line of its own (wrapped at 80 columns), its row below it.
    alike = ["block.0." + "q" * 70 + "left.weight", "block.0." + "q" * 70 + "right.weight"]
    alike_file = os.path.join(work, "alike.safetensors")
    write_safetensors(alike_file, alike)
    rc, out = run_in_terminal(["put", alike_file], 80)
    check("put of names alike exits 0", rc == 0, out)
    lines = check_fits("put of names alike", out, 80)
    joined = "".join(lines)
    check("names alike: each shown whole (on lines of their own)",
          all(name in joined for name in alike) and lines.count("tensor") == 1, out)

    # Names of wide (East Asian) and accented characters: the table counts terminal columns, not
    # bytes, so its columns line up and its lines fit.
    wide = ["权重.ü.weight", "ü" * 61 + ".bias", "层.0.注意力.查询.weight", "plain.weight"]
    wide_file = os.path.join(work, "wide.safetensors")
    write_safetensors(wide_file, wide)
    rc, out = run_in_terminal(["put", wide_file], 80)
    check("put of wide names exits 0", rc == 0, out)
    lines = screen_lines(out)
    too_wide = [line for line in lines if display_columns(line) > 80]
    check("wide names: every line fits 80 terminal columns", not too_wide, out)
    shape_columns = {display_columns(line[:line.index("[2,2]")]) for line in lines if "[2,2]" in line}
    check("wide names: the shape column starts at one terminal column in every row",
          len(shape_columns) == 1 and sum("[2,2]" in line for line in lines) == len(wide), out)

    # --wide: whole names, however long the lines.
    rc, out = run_in_terminal(["put", sample, named, "--wide"], 80)
    check("put --wide exits 0", rc == 0, out)
    check("put --wide shows the long name whole",
          any(line.startswith(LONG_NAME + " ") for line in screen_lines(out)), out)

    rc, out = run_in_terminal(["put", sample, named, "--device-dtype", "bfloat16", "--verify"], 80)
    check("put converted exits 0", rc == 0, out)
    check_fits("put with lossy conversions", out, 80)

    # The note on a --device-dtype that applies to no tensor wraps as errors do.
    rc, out = run_in_terminal(["put", sample, "--device-dtype", "complex64"], 80)
    check("put with an unused --device-dtype exits 0", rc == 0, out)
    check("the unused --device-dtype note is shown", "applies to no tensor" in out, out)
    check_fits("put with an unused --device-dtype (its note)", out, 80)

    rc, out = run_in_terminal(["put", named, "--mesh", "host:0, host:1,host:2"], 80,
                              {"FERRY_HOST_DEVICES": "3"})
    check("put on a mesh exits 0", rc == 0, out)
    check_fits("put on a mesh", out, 80)

    rc, out = run_in_terminal(["devices"], 80, {"FERRY_HOST_DEVICES": "2"})
    check("devices exits 0", rc == 0, out)
    check_fits("devices", out, 80)

    for args in (["--help"], ["put", "--help"], ["sample", "--help"], ["devices", "--help"]):
        rc, out = run_in_terminal(args, 80)
        check(f"{' '.join(args)} exits 0", rc == 0, out)
        check_fits(" ".join(args), out, 80)

    # The benchmark (`ferry bench` runs ferry-bench beside ferry): its help, its list of cases and
    # a sample of its table (tiny sizes: only the layout is checked, never a time).
    bench = os.path.join(os.path.dirname(FERRY), "ferry-bench")
    if os.access(bench, os.X_OK):
        for args in (["bench", "--help"], ["bench", "--list"]):
            rc, out = run_in_terminal(args, 80)
            check(f"{' '.join(args)} exits 0", rc == 0, out)
            check_fits(" ".join(args), out, 80)
        rc, out = run_in_terminal(["--help"], 80, program=bench)
        check("ferry-bench --help exits 0", rc == 0, out)
        check_fits("ferry-bench --help", out, 80)
        cases = "h2d_contiguous,h2d_convert_f32_bf16,raw_clwrite"
        rc, out = run_in_terminal(
            ["bench", "--case", cases, "--size", "0.01", "--repeats", "5"], 80)
        check("bench (a sample) exits 0", rc == 0, out)
        lines = check_fits("bench table", out, 80)
        check("bench printed its rows",
              any(line.startswith("h2d_convert_f32_bf16 ") for line in lines) and
              any(line.startswith("  peak extra ") for line in lines), out)
    else:
        print(f"skip: ferry bench: no ferry-bench beside {FERRY}")

    rc, out = run_in_terminal(["put", os.path.join(work, "missing" * 12 + ".safetensors")], 80)
    check("a missing file exits 1", rc == 1, out)
    check_fits("an error about a long path", out, 80)

    # A wider terminal is used: the long name whole, the bar longer than at 80 columns.
    rc, out = run_in_terminal(["put", sample, named], 160)
    check("put at 160 columns exits 0", rc == 0, out)
    lines = check_fits("put at 160 columns", out, 160)
    check("the long name is whole at 160 columns", any(LONG_NAME in line for line in lines), out)
    check("some line uses more than 80 columns", any(len(line) > 80 for line in lines), out)

print(f"cli width: {len(failures)} failed")
sys.exit(1 if failures else 0)
