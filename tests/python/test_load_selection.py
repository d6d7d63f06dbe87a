"""Choosing what to load (issue 24 point 5): load_file / open_file with names=, pattern= and
exclude= open only the chosen tensors, read only their bytes (the transfer moves exactly theirs;
an unread corrupt member does not fail), match globs as fnmatch.fnmatchcase does, work with
device_dtype= and sharding=, and name what matched nothing."""

import fnmatch
import os
import zipfile

import numpy as np
import pytest

import ferry

SEED = int(os.environ.get("FERRY_TEST_SEED", "7177"))


@pytest.fixture
def checkpoint(tmp_path):
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED} (FERRY_TEST_SEED)")
    tensors = {
        "embed.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "layers.0.attn.weight": rng.standard_normal((8, 8)).astype(np.float32),
        "layers.0.attn.bias": rng.standard_normal(8).astype(np.float32),
        "layers.1.attn.weight": rng.standard_normal((8, 8)).astype(np.float64),
        "layers.1.attn.bias": rng.standard_normal(8).astype(np.float64),
        "position_ids": np.arange(16, dtype=np.int64),
    }
    path = tmp_path / "model.safetensors"
    ferry.save_file(tensors, path)
    return path, tensors


def test_names_pattern_and_exclude_choose_the_tensors_in_file_order(checkpoint):
    path, tensors = checkpoint
    got = ferry.load_file(path, names=["position_ids"], pattern="layers.*", exclude="*.bias")
    assert set(got) == {"position_ids", "layers.0.attn.weight", "layers.1.attn.weight"}
    assert list(got) == [n for n in ferry.open_file(path) if n in got]  # the file's order
    for name, array in got.items():
        np.testing.assert_array_equal(array, tensors[name])
    # One name as a plain string is that name, not its characters.
    assert list(ferry.load_file(path, names="embed.weight")) == ["embed.weight"]
    assert list(ferry.open_file(path, pattern=["*.bias", "embed.*"], exclude="layers.1.*")) == [
        n for n in ferry.open_file(path) if n in ("layers.0.attn.bias", "embed.weight")]


def test_only_the_chosen_tensors_bytes_are_transferred(checkpoint):
    path, tensors = checkpoint
    ferry.reset_metrics()
    got = ferry.load_file(path, "host:0", pattern="layers.0.*")
    assert set(got) == {"layers.0.attn.weight", "layers.0.attn.bias"}
    moved = ferry.metrics()["OutboundData.sum"]
    assert moved == sum(tensors[n].nbytes for n in got)
    assert moved < sum(t.nbytes for t in tensors.values())


def test_a_missing_name_or_a_pattern_matching_nothing_is_named(checkpoint):
    path, _ = checkpoint
    with pytest.raises(ferry.NotFoundError, match=r"no tensor named 'lm_head.weight' in file"):
        ferry.load_file(path, names=["embed.weight", "lm_head.weight"])
    with pytest.raises(ferry.NotFoundError, match=r"the pattern 'decoder\.\*' matches no tensor"):
        ferry.load_file(path, "host:0", pattern=["layers.*", "decoder.*"])
    with pytest.raises(ferry.InvalidArgumentError, match="leave no tensor to load"):
        ferry.load_file(path, pattern="*.bias", exclude="layers.*")
    # An exclusion that matches nothing is not an error: one list serves many checkpoints.
    assert len(ferry.load_file(path, exclude="no_such_*")) == 6
    with pytest.raises(TypeError, match="names= takes strings"):
        ferry.load_file(path, names=[3])
    # bytes: refused whole, as one name would be taken (not as a list of ints: "not int")
    for argument in ("names", "pattern", "exclude"):
        for given in (b"embed.weight", [b"embed.weight"]):
            with pytest.raises(TypeError, match=rf"{argument}= takes strings, not bytes "
                                                r"\(b'embed.weight'\): decode"):
                ferry.load_file(path, **{argument: given})


def test_device_dtype_applies_to_the_chosen_tensors(checkpoint):
    path, tensors = checkpoint
    got = ferry.load_file(path, "host:0", device_dtype="bfloat16", pattern=["layers.1.*", "pos*"])
    assert set(got) == {"layers.1.attn.weight", "layers.1.attn.bias", "position_ids"}
    assert got["layers.1.attn.weight"].device_dtype == "bfloat16"
    assert got["position_ids"].device_dtype == "int64"  # ids keep their kind's dtype
    np.testing.assert_array_equal(got["position_ids"].to_numpy(), tensors["position_ids"])


def test_sharding_loads_only_the_chosen_tensors(checkpoint):
    path, tensors = checkpoint
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("x",))
    ferry.reset_metrics()
    got = ferry.load_file(path, sharding=ferry.shard_along(mesh, 0), names=["embed.weight"],
                          pattern="*.bias")
    assert set(got) == {"embed.weight", "layers.0.attn.bias", "layers.1.attn.bias"}
    for name, array in got.items():
        assert array.sharding is not None
        np.testing.assert_array_equal(array.to_numpy(), tensors[name])
    assert ferry.metrics()["OutboundData.sum"] == sum(tensors[n].nbytes for n in got)
    with pytest.raises(ferry.NotFoundError, match="'nope'"):
        ferry.load_file(path, sharding=ferry.shard_along(mesh, 0), names="nope")


def test_an_unchosen_corrupt_compressed_member_is_never_read(tmp_path):
    path = tmp_path / "mixed.npz"
    np.savez_compressed(path, good=np.arange(5.0), bad=np.arange(1000.0))
    # Corrupt the deflated bytes of "bad.npy" (its CRC then fails when it is inflated).
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("bad.npy")
    raw = bytearray(path.read_bytes())
    data_start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(data_start + 8, data_start + 40):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(ferry.InvalidArgumentError, match="bad.npy"):
        ferry.load_file(path)
    got = ferry.load_file(path, "host:0", names="good")
    np.testing.assert_array_equal(got["good"].to_numpy(), np.arange(5.0))


def test_patterns_match_as_fnmatchcase_does(tmp_path):
    rng = np.random.default_rng(SEED + 1)
    print(f"seed {SEED + 1} (FERRY_TEST_SEED + 1)")
    alphabet = list("ab.-!]") + ["[", "*", "?", "é"]
    names = sorted({"".join(rng.choice(list("ab.-!]é["), size=rng.integers(1, 5)))
                    for _ in range(60)})
    path = tmp_path / "names.npz"
    np.savez(path, **{name: np.zeros(1, np.uint8) for name in names})
    for _ in range(300):
        pattern = "".join(rng.choice(alphabet, size=rng.integers(1, 6)))
        expected = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not expected:
            with pytest.raises(ferry.NotFoundError, match="matches no tensor"):
                ferry.open_file(path, pattern=pattern)
            continue
        got = sorted(ferry.open_file(path, pattern=pattern))
        assert got == expected, f"pattern {pattern!r}"
