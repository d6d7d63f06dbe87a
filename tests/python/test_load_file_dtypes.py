"""load_file's device_dtype applies to the tensors of its kind, like `ferry put --device-dtype`."""

import numpy as np

import ferry


def test_a_requested_device_dtype_leaves_other_kinds_alone(tmp_path):
    rng = np.random.default_rng(11)
    print("seed 11")
    tensors = {
        "weight": rng.standard_normal((64, 32)).astype(np.float32),
        "position_ids": np.arange(2048, dtype=np.int64).reshape(1, 2048),
        "mask": rng.random(100) < 0.5,
        "scale": rng.standard_normal(8).astype(np.float64),
    }
    path = tmp_path / "m.safetensors"
    ferry.save_file(tensors, path)
    arrays = ferry.load_file(path, "host:0", device_dtype="bfloat16")
    assert {name: a.device_dtype for name, a in arrays.items()} == {
        "weight": "bfloat16", "position_ids": "int64", "mask": "bool", "scale": "bfloat16"}
    assert list(arrays) == list(ferry.open_file(path))  # the file's order is kept
    np.testing.assert_array_equal(ferry.device_get(arrays["position_ids"]), tensors["position_ids"])
    np.testing.assert_array_equal(ferry.device_get(arrays["mask"]), tensors["mask"])
    weight = ferry.device_get(arrays["weight"])
    assert not np.array_equal(weight, tensors["weight"])  # bfloat16 really was applied
    np.testing.assert_allclose(weight, tensors["weight"], rtol=1 / 128)

    everything = ferry.load_file(path, "host:0", device_dtype="bfloat16", device_dtype_all=True)
    assert everything["position_ids"].device_dtype == "bfloat16"
    ids = ferry.device_get(everything["position_ids"])
    assert not np.array_equal(ids, tensors["position_ids"])  # 2048 ids do not fit 8 bits of mantissa

    ints = ferry.load_file(path, "host:0", device_dtype="int32")
    assert ints["position_ids"].device_dtype == "int32"
    assert ints["weight"].device_dtype == "float32"


def test_a_float_request_leaves_float8_tensors_of_an_fp8_checkpoint_as_they_are(tmp_path):
    ml_dtypes = __import__("ml_dtypes")
    tensors = {
        "w8": np.array([1.0, -2.0, 0.5, 448.0], dtype=ml_dtypes.float8_e4m3fn),
        "w32": np.array([1.5, -3.25], dtype=np.float32),
    }
    path = tmp_path / "fp8.safetensors"
    ferry.save_file(tensors, path)
    arrays = ferry.load_file(path, "host:0", device_dtype="bfloat16")
    assert {name: a.device_dtype for name, a in arrays.items()} == {
        "w8": "float8_e4m3fn", "w32": "bfloat16"}
    np.testing.assert_array_equal(ferry.device_get(arrays["w8"]).view(np.uint8),
                                  tensors["w8"].view(np.uint8))
    np.testing.assert_array_equal(ferry.device_get(arrays["w32"]), tensors["w32"])
    # Asked for every tensor, float8 still cannot convert: the refusal says why.
    try:
        ferry.load_file(path, "host:0", device_dtype="bfloat16", device_dtype_all=True)
    except ferry.Error as error:
        assert "storage-only" in str(error), error
        # named by the file and the tensor's name in it, not by its position
        assert f"'{path}:w8'" in str(error), error
    else:
        raise AssertionError("float8 -> bfloat16 was accepted")


def test_a_sharded_load_names_the_file_and_tensor_that_failed(tmp_path):
    # Before: the sharded put's own name for its input, "tensor 'array[shard 0]'".
    ml_dtypes = __import__("ml_dtypes")
    path = tmp_path / "fp8.safetensors"
    ferry.save_file({"w32": np.array([1.5, -3.25], dtype=np.float32),
                     "layers.0.scale": np.array([1.0, -2.0], dtype=ml_dtypes.float8_e4m3fn)}, path)
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("x",))
    try:
        ferry.load_file(path, sharding=ferry.Sharding(mesh, ("x",)), device_dtype="bfloat16",
                        device_dtype_all=True)
    except ferry.UnimplementedError as error:
        assert "storage-only" in str(error), error
        assert f"tensor '{path}:layers.0.scale[shard 0]'" in str(error), error
        assert "'array" not in str(error), error
    else:
        raise AssertionError("float8 -> bfloat16 was accepted")


def test_a_device_and_a_sharding_together_are_refused(tmp_path):
    path = tmp_path / "one.safetensors"
    ferry.save_file({"w": np.ones((4, 2), np.float32)}, path)
    mesh = ferry.Mesh(ferry.devices("host")[:1], (1,), ("x",))
    try:
        ferry.load_file(path, "host:0", sharding=ferry.shard_along(mesh, 0))
    except ferry.InvalidArgumentError as error:
        assert "not both" in str(error), error
    else:
        raise AssertionError("a device beside a sharding was silently ignored")
