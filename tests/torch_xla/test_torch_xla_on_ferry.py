"""torch_xla 2.9 (PJRT C API 0.75) computing on ferry's plugin wrapping the XLA CPU plugin (0.81).

Run with the torch_xla environment (scripts/xla_env.sh) by scripts/test.sh:
    FERRY_PJRT_PLUGIN_LIBRARY=.../ferry_pjrt_plugin.so <xla venv>/bin/python -m pytest tests/torch_xla

ferry's plugin bridges the minor versions (src/plugin/version_bridge.h: torch_xla's 80-byte
PJRT_ExecuteOptions, zero-extended to the plugin's 112), takes uploads
(PJRT_Client_BufferFromHostBuffer) and reads (PJRT_Buffer_ToHostBuffer with torch_xla's row-major
host_layout, results of computations included) itself; its counters
(FerryPjrtPluginCounters) prove which path each call took. Every result is compared with the same
computation on torch's CPU device.
"""

import ctypes
import os

import pytest

PLUGIN = os.environ.get("FERRY_PJRT_PLUGIN_LIBRARY")
if not PLUGIN or not os.path.exists(PLUGIN):
    reason = f"FERRY_PJRT_PLUGIN_LIBRARY names no plugin ({PLUGIN!r}): scripts/test.sh sets it"
    required = os.environ.get("FERRY_REQUIRE_ALL_BACKENDS", "")
    if (os.environ.get("CI") == "true" and required != "0") or required not in ("", "0"):
        pytest.fail(reason + " [every backend is required here]", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

# Before torch_xla starts its runtime: ferry's plugin, wrapping the XLA CPU plugin of this venv.
import xla_plugins  # noqa: E402  (the xla-cpu-pjrt package)

WRAPPED = os.path.join(list(xla_plugins.__path__)[0], "xla_cpu_pjrt", "xla_cpu_pjrt.so")
os.environ["PJRT_DEVICE"] = "LIBRARY"
os.environ["PJRT_LIBRARY_PATH"] = PLUGIN
os.environ["FERRY_PJRT_WRAPPED_PLUGIN"] = WRAPPED

import torch  # noqa: E402
import torch_xla  # noqa: E402

_LIBRARY = ctypes.CDLL(PLUGIN)
_NAMES = ("puts_by_ferry", "puts_by_plugin", "reads_by_ferry", "reads_by_plugin", "refused",
          "puts_after_the_call", "bytes_in_use")


def counters() -> dict[str, int]:
    values = (ctypes.c_int64 * len(_NAMES))()
    _LIBRARY.FerryPjrtPluginCounters(values, len(_NAMES))
    return dict(zip(_NAMES, values))


def delta(before: dict[str, int]) -> dict[str, int]:
    now = counters()
    return {name: now[name] - before[name] for name in _NAMES}


@pytest.fixture(scope="module")
def xla():
    return torch_xla.device()


def bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


def sample(dtype: torch.dtype, shape=(6, 10)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=generator)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype,
                         generator=generator)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trips_are_bit_exact_through_ferry(xla, dtype):
    source = sample(dtype)
    before = counters()
    back = source.to(xla).cpu()
    assert back.dtype == source.dtype
    assert bits(back) == bits(source)
    moved = delta(before)
    assert moved["puts_by_ferry"] >= 1 and moved["puts_by_plugin"] == 0, moved
    assert moved["reads_by_ferry"] >= 1 and moved["reads_by_plugin"] == 0, moved


@pytest.mark.parametrize("view", ["transpose", "every_other", "column_slice"])
def test_strided_views_round_trip(xla, view):
    base = torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12)
    source = {"transpose": base.t(), "every_other": base[::2, ::2],
              "column_slice": base[:, 3:7]}[view]
    assert not source.is_contiguous()
    assert torch.equal(source.to(xla).cpu(), source)


def test_elementwise_operations_equal_cpu(xla):
    x, y = sample(torch.float32), sample(torch.float32, (6, 10)).flip(0)
    expected = ((x + 1) * 2 - y).relu() / 3
    before = counters()
    got = ((x.to(xla) + 1) * 2 - y.to(xla)).relu() / 3
    result = got.cpu()
    assert torch.equal(result, expected)
    moved = delta(before)
    # The result was still being computed when torch_xla asked for it: ferry waited and read it.
    assert moved["reads_by_ferry"] >= 1 and moved["reads_by_plugin"] == 0, moved


@pytest.mark.parametrize("view", ["contiguous", "transpose", "every_other"])
def test_large_puts_return_before_ferry_writes_them_and_compute_equal_to_cpu(xla, view):
    # Past ferry's inline size (256 KiB): the put returns a pending buffer that ferry fulfils once
    # its workers have written the source; torch_xla computes on it and reads the result at once.
    base = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(11))
    source = {"contiguous": base, "transpose": base.t(), "every_other": base[::2, ::2]}[view]
    before = counters()
    on_device = source.to(xla)
    got = ((on_device + 1) * 2).cpu()
    assert torch.equal(got, (source + 1) * 2)
    assert torch.equal(on_device.cpu(), source)
    moved = delta(before)
    assert moved["puts_after_the_call"] >= 1 and moved["puts_by_plugin"] == 0, moved
    assert moved["reads_by_ferry"] >= 2 and moved["reads_by_plugin"] == 0, moved


def test_matmul_equals_cpu(xla):
    a = torch.randn(64, 96, generator=torch.Generator().manual_seed(1))
    b = torch.randn(96, 32, generator=torch.Generator().manual_seed(2))
    got = (a.to(xla) @ b.to(xla)).cpu()
    torch.testing.assert_close(got, a @ b, rtol=1e-5, atol=1e-5)


def test_a_training_step_equals_the_same_step_on_cpu(xla):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    inputs = torch.randn(8, 16)
    targets = torch.randn(8, 4)

    def step(device):
        replica = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                      torch.nn.Linear(32, 4)).to(device)
        replica.load_state_dict(model.state_dict())
        optimizer = torch.optim.SGD(replica.parameters(), lr=0.1)
        loss = torch.nn.functional.mse_loss(replica(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        if device != "cpu":
            torch_xla.sync()
        return loss.detach().cpu(), {k: v.detach().cpu() for k, v in replica.state_dict().items()}

    cpu_loss, cpu_params = step("cpu")
    xla_loss, xla_params = step(xla)
    torch.testing.assert_close(xla_loss, cpu_loss, rtol=1e-5, atol=1e-6)
    for name, value in cpu_params.items():
        torch.testing.assert_close(xla_params[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("view", ["contiguous", "transpose", "every_other", "column_slice"])
def test_to_xla_puts_strided_tensors_without_torch_xlas_contiguous_copy(xla, view):
    """ferry.torch_xla.to_xla: ferry gathers the strided tensor once into host memory that
    torch_xla views (from_dlpack): the XLA tensor computes like any other and equals the source."""
    ferry_torch_xla = pytest.importorskip("ferry.torch_xla",
                                          reason="ferry is not installed in torch_xla's venv")
    base = torch.arange(16 * 24, dtype=torch.float32).reshape(16, 24) / 5
    source = {"contiguous": base, "transpose": base.t(), "every_other": base[::2, ::2],
              "column_slice": base[:, 3:17]}[view]
    on_xla = ferry_torch_xla.to_xla(source)
    assert on_xla.device.type == "xla"
    assert torch.equal(on_xla.cpu(), source)
    assert torch.equal((on_xla * 2 + 1).cpu(), source * 2 + 1)


def test_to_xla_converts_on_the_way(xla):
    ferry_torch_xla = pytest.importorskip("ferry.torch_xla",
                                          reason="ferry is not installed in torch_xla's venv")
    source = torch.randn(32, 48, dtype=torch.float64).t()
    on_xla = ferry_torch_xla.to_xla(source, dtype="float32")
    assert on_xla.dtype == torch.float32
    assert torch.equal(on_xla.cpu(), source.to(torch.float32))


def test_to_xla_maps_over_a_pytree(xla):
    """A list or dict (anything ferry.device_put takes) comes back in its structure, each leaf an
    XLA tensor. Before: the whole put ran, then an UnimplementedError blamed the platform."""
    ferry_torch_xla = pytest.importorskip("ferry.torch_xla",
                                          reason="ferry is not installed in torch_xla's venv")
    first, second = sample(torch.float32), sample(torch.int32, (3, 5)).t()
    pair = ferry_torch_xla.to_xla([first, second])
    assert type(pair) is list and len(pair) == 2
    tree = ferry_torch_xla.to_xla({"w": first.t(), "rest": (second, None)},
                                  dtype={"w": "bfloat16", "rest": None})
    assert sorted(tree) == ["rest", "w"] and type(tree["rest"]) is tuple and tree["rest"][1] is None
    for got, expected in [(pair[0], first), (pair[1], second), (tree["w"], first.t().bfloat16()),
                          (tree["rest"][0], second)]:
        assert got.device.type == "xla" and got.dtype == expected.dtype
        assert torch.equal(got.cpu(), expected)


def test_to_xla_keeps_requires_grad_as_a_new_leaf(xla):
    """An nn.Parameter gives an XLA leaf that requires grad (before: requires_grad=False,
    silently); a plain tensor, or a dtype that cannot hold gradients, gives one that does not."""
    ferry_torch_xla = pytest.importorskip("ferry.torch_xla",
                                          reason="ferry is not installed in torch_xla's venv")
    weight = torch.nn.Parameter(sample(torch.float32, (3, 4)))
    tree = ferry_torch_xla.to_xla({"weight": weight, "plain": weight.detach(),
                                   "ids": torch.arange(4)})
    on_xla = tree["weight"]
    assert on_xla.requires_grad and on_xla.is_leaf and type(on_xla) is torch.Tensor
    assert not tree["plain"].requires_grad and not tree["ids"].requires_grad
    (on_xla * 3).sum().backward()
    assert torch.equal(on_xla.grad.cpu(), torch.full((3, 4), 3.0))
    assert weight.grad is None  # nothing flows back to the source
    assert not ferry_torch_xla.to_xla(weight, dtype="int32").requires_grad


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_float8_tensors_are_put_although_torch_29s_dlpack_refuses_them(dtype):
    """torch 2.9's DLPack raises "float8 types are not supported by dlpack": ferry reads a float8
    tensor as the uint8 tensor over its memory, as it reads ml_dtypes' float8 numpy arrays."""
    ferry = pytest.importorskip("ferry", reason="ferry is not installed in torch_xla's venv")
    source = sample(torch.float32).to(dtype).t()  # strided too
    array = ferry.device_put(source)
    assert array.device_dtype == str(dtype).removeprefix("torch.")
    stored, reason = array._numpy_view(stored=True)  # this venv has no ml_dtypes: the bytes
    assert stored is not None, reason
    assert stored.tobytes() == bits(source)


def test_to_xla_of_float8_says_torch_xla_takes_no_float8(xla):
    """ferry puts float8, but torch_xla 2.9's from_dlpack has no float8 type code: the error says
    so (not that the platform is the problem) and what to do instead."""
    ferry = pytest.importorskip("ferry", reason="ferry is not installed in torch_xla's venv")
    ferry_torch_xla = pytest.importorskip("ferry.torch_xla")
    with pytest.raises(ferry.UnimplementedError, match=r"takes no float8_e4m3fn .*dtype="):
        ferry_torch_xla.to_xla(sample(torch.float32).to(torch.float8_e4m3fn))


def test_a_tensor_on_torch_xlas_device_is_refused_naming_the_device(xla):
    """torch's __dlpack_device__ raises for an XLA tensor; ferry asks torch for the device."""
    ferry = pytest.importorskip("ferry", reason="ferry is not installed in torch_xla's venv")
    on_xla = torch.ones(3).to(xla)
    with pytest.raises(ferry.InvalidArgumentError,
                       match=r"a torch tensor in xla:0 memory: .*\.cpu\(\)"):
        ferry.device_put(on_xla)


def _run_fresh(code: str, timeout: int = 240):
    """`code` in a fresh interpreter of this venv (torch_xla reads its runtime settings once per
    process): its completed process."""
    import subprocess
    import sys
    import textwrap

    env = dict(os.environ, FERRY_PJRT_WRAPPED_PLUGIN=WRAPPED)
    for name in ("PJRT_DEVICE", "PJRT_LIBRARY_PATH"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


_REGISTER_AS_FERRY = f"""
import os
import torch, torch_xla
from torch_xla.experimental import plugins
class FerryPlugin(plugins.DevicePlugin):
    def library_path(self):
        return {PLUGIN!r}
    def client_create_options(self):
        return {{"cpu_device_count": 4}}
plugins.register_plugin("FERRY", FerryPlugin())
os.environ["PJRT_DEVICE"] = "FERRY"
"""


def test_spmd_reads_of_sharded_tensors_equal_cpu():
    """torch_xla's SPMD `.cpu()` of a sharded tensor reads a temporary replicated copy and destroys
    it before waiting for the read (which PJRT allows): ferry's plugin defers that Destroy until
    its read is over. Before, the read went on with the destroyed handle: a segfault."""
    result = _run_fresh(_REGISTER_AS_FERRY + """
import numpy as np
import torch_xla.runtime as xr, torch_xla.distributed.spmd as xs
xr.use_spmd()
mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
for n in (128, 1024):
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(n))
    for step in range(4):
        x = a.to("xla")
        xs.mark_sharding(x, mesh, ("x", "y"))
        y = x * 2
        torch_xla.sync()
        assert torch.equal(y.cpu(), a * 2), (n, step)
print("spmd ok")
""")
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "spmd ok" in result.stdout


def test_to_xla_on_ferrys_plugin_registered_under_its_own_name():
    """to_xla asks the device's hardware (CPU for any plugin over the CPU platform), not torch_xla's
    device-type name: a plugin registered as "FERRY" is host memory too."""
    pytest.importorskip("ferry.torch_xla", reason="ferry is not installed in torch_xla's venv")
    result = _run_fresh(_REGISTER_AS_FERRY + """
import ferry.torch_xla
source = torch.arange(12.0).reshape(3, 4).t()
on_xla = ferry.torch_xla.to_xla(source)
assert torch.equal((on_xla * 2).cpu(), source * 2)
print("to_xla ok")
""")
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "to_xla ok" in result.stdout


def test_to_xla_refuses_spmd_before_torch_xla_takes_the_capsule():
    """Under SPMD torch_xla's from_dlpack fails after it has freed the capsule, and the process
    then aborted with a double free: to_xla refuses SPMD before it puts anything."""
    pytest.importorskip("ferry.torch_xla", reason="ferry is not installed in torch_xla's venv")
    result = _run_fresh("""
import os
os.environ.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")
import torch, torch_xla.runtime as xr
import ferry, ferry.torch_xla
xr.use_spmd()
try:
    ferry.torch_xla.to_xla(torch.arange(8.0))
except ferry.UnimplementedError as error:
    print("refused:", error)
""")
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "refused: to_xla: torch_xla's SPMD mode is on" in result.stdout, result.stdout
    assert "tensor.to(device)" in result.stdout
