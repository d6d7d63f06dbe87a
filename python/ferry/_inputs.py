"""What a put reads: the checks and preparation of each input (numpy arrays, buffers, DLPack
producers, scalars, ferry.Arrays), and pytrees of them."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from ._ferry import Array
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._dtypes import _dtype_name, _NUMPY_DTYPES


def _resolve_lazy_views(x: Any) -> Any:
    """A torch view with the conjugate or negative bit set, made real (a copy).

    Such a view shares its storage with the tensor it was made from and records the conjugation
    or negation in a bit that DLPack cannot carry: read through DLPack it would arrive as the raw
    storage, unconjugated or unnegated.
    """
    for flag, resolve in (("is_conj", "resolve_conj"), ("is_neg", "resolve_neg")):
        check = getattr(x, flag, None)
        if callable(check) and check():
            x = getattr(x, resolve)()
    return x


def _has_buffer(x: Any) -> bool:
    try:
        memoryview(x)
    except TypeError:
        return False
    return True


def _is_torch_tensor(x: Any) -> bool:
    """Whether `x` is a torch.Tensor, subclasses (nn.Parameter) included; never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _check_movable(x: Any, where: str) -> None:
    """An error naming the real cause for inputs that cannot be moved (instead of the DLPack or
    buffer error they would raise further down)."""
    is_deleted = getattr(x, "is_deleted", None)
    if type(x).__module__.startswith("jax") and callable(is_deleted) and is_deleted():
        raise FailedPreconditionError(
            f"{where}: the jax array has been deleted (donated or .delete())")
    if _is_torch_tensor(x):
        _check_torch_tensor(x, where)


def _check_torch_tensor(x: Any, where: str) -> None:
    """_check_movable for a torch tensor: one whose memory is not one strided block of host
    memory is refused naming what it is, before DLPack or the import says something vaguer."""
    if getattr(x, "is_meta", False):
        raise InvalidArgumentError(f"{where}: a meta torch tensor has no data to move")
    if x.is_nested:  # either layout: torch.jagged, or torch.strided with no strides of its own
        raise InvalidArgumentError(
            f"{where}: a nested torch tensor cannot be moved: pad it into one dense tensor "
            "first (torch.nested.to_padded_tensor), or put its components (.unbind())")
    layout = str(getattr(x, "layout", "torch.strided"))
    if layout != "torch.strided":
        raise InvalidArgumentError(
            f"{where}: a torch tensor with layout {layout} cannot be moved: make it dense "
            "first (.to_dense())")
    # Asked of torch, not of __dlpack_device__, which raises for torch_xla's tensors.
    if x.device.type != "cpu":
        raise InvalidArgumentError(
            f"{where}: a torch tensor in {x.device} memory: ferry imports tensors in host (CPU) "
            "memory only; copy it to the host first (.cpu())")
    if x.numel() and _has_no_storage(x):
        raise InvalidArgumentError(
            f"{where}: a torch tensor with no storage (a FakeTensor, torch's efficient zero "
            "tensor) has no data to move")


def _has_no_storage(x: Any) -> bool:
    """Whether a non-empty torch tensor has no memory behind it: a FakeTensor (asked by type: its
    data_ptr() warns, and is to raise), or a tensor whose data pointer is null (an efficient zero
    tensor; an empty tensor's may be null too, and is fine)."""
    fake_tensor = sys.modules.get("torch._subclasses.fake_tensor")
    if fake_tensor is not None and isinstance(x, fake_tensor.FakeTensor):
        return True
    try:
        return x.data_ptr() == 0
    except RuntimeError:  # "Cannot access data pointer of Tensor that doesn't have storage"
        return True


# DLPack's device types (DLDeviceType), for errors.
_DLPACK_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                        9: "VPI", 10: "ROCM", 11: "ROCMHost", 13: "CUDAManaged", 14: "OneAPI"}


def _check_foreign_dtype(x: Any, where: str) -> None:
    """An error naming the dtype for a framework's array (JAX, torch) of a dtype ferry lacks
    (int4, float8_e4m3fnuz...), as numpy arrays get, instead of the DLPack error further down."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or isinstance(x, np.ndarray):
        return
    module = type(x).__module__.split(".")[0]
    framework = {"jaxlib": "jax"}.get(module, module)
    if type(dtype).__module__ == "torch":
        try:
            _dtype_name(dtype)
        except InvalidArgumentError:
            raise InvalidArgumentError(
                f"{where}: torch dtype {str(dtype).removeprefix('torch.')} has no ferry dtype "
                f"(ferry has {', '.join(_NUMPY_DTYPES)})") from None
        return
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError:
        return  # not a dtype numpy knows: let the buffer or DLPack path say what it can
    if not _NUMPY_DTYPES.has(numpy_dtype):
        raise InvalidArgumentError(
            f"{where}: {framework} dtype {numpy_dtype} has no ferry dtype (ferry has "
            f"{', '.join(_NUMPY_DTYPES)})")


def _check_dlpack_device(x: Any, where: str) -> None:
    """An error naming the device of a DLPack producer whose memory is not host memory (a CUDA
    torch tensor): ferry imports host (CPU) DLPack tensors only."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return
    get_device = getattr(x, "__dlpack_device__", None)
    if not callable(get_device):
        return
    try:
        device_type, device_id = get_device()
    except Exception:  # noqa: BLE001 - a producer that cannot say: the import will
        return
    if int(device_type) != _DLPACK_CPU:
        name = _DLPACK_DEVICE_NAMES.get(int(device_type), f"device type {int(device_type)}")
        raise InvalidArgumentError(
            f"{where}: a {type(x).__name__} in {name}:{device_id} memory: ferry imports DLPack "
            "tensors in host (CPU) memory only; copy it to the host first (torch: .cpu())")


def _prepare(x: Any, where: str = "the array") -> tuple[Any, str | None]:
    """The object ferry reads, and a dtype override when numpy cannot describe the dtype itself.
    `where` names the input in errors ("item 3")."""
    if type(x) is not np.ndarray:  # numpy arrays (a file's tensors) skip the other inputs' checks
        x = _prepare_other(x, where)
        if _is_torch_tensor(x):
            return _carried_torch_tensor(x)
    viewed = _NUMPY_DTYPES.viewed_as_uint(x.dtype) if isinstance(x, np.ndarray) else None
    if viewed is not None:
        return x.view(viewed[1]), viewed[0]
    if isinstance(x, np.ndarray) and not _NUMPY_DTYPES.has(x.dtype):
        raise InvalidArgumentError(
            f"{where}: numpy dtype {x.dtype} has no ferry dtype (ferry has "
            f"{', '.join(_NUMPY_DTYPES)})")
    return x, None


# torch dtypes that DLPack does not carry in every torch version ("float8 types are not supported
# by dlpack" in torch 2.9): they travel as ml_dtypes' arrays do, as unsigned ints of their size
# with the dtype's name as an override.
_TORCH_CARRIED_DTYPES = ("float8_e4m3fn", "float8_e5m2")


def _carried_torch_tensor(x: Any) -> tuple[Any, str | None]:
    """_prepare's answer for a (checked) torch tensor: float8 as the uint8 tensor over the same
    memory, with its dtype's name; any other as it is."""
    name = str(x.dtype).removeprefix("torch.")
    if name in _TORCH_CARRIED_DTYPES:
        return x.view(sys.modules["torch"].uint8), name
    return x, None


def _single_device_jax_array(x: Any, where: str) -> Any:
    """A jax.Array over several devices as one that DLPack can pack (one device's data): the data
    of its first shard here when every device holds all of it (fully replicated); else an error
    saying what to pass (JAX's own BufferError said nothing of the kind by the time it reached
    the user)."""
    if not type(x).__module__.startswith("jax"):
        return x
    device_set = getattr(getattr(x, "sharding", None), "device_set", None)
    if device_set is None or len(device_set) <= 1:
        return x
    shards = x.addressable_shards
    if getattr(x, "is_fully_replicated", False) and shards:
        return shards[0].data
    raise InvalidArgumentError(
        f"{where}: a jax.Array sharded over {len(device_set)} devices, which DLPack cannot pack "
        "(it carries one device's data): put its shards (x.addressable_shards, e.g. through "
        "ferry.make_array_from_shards), or np.asarray(x) for the whole array")


def _prepare_other(x: Any, where: str) -> Any:
    """_prepare for what is not a plain numpy array: scalars, framework arrays, ferry.Arrays,
    objects numpy alone can read; checked, and made readable where it must be."""
    if isinstance(x, (np.generic, bool, int, float, complex)):  # a scalar: a 0-d array
        x = np.asarray(x)
    _check_movable(x, where)
    if _is_torch_tensor(x):
        if x.requires_grad:
            # The same memory without autograd's claim on it: DLPack refuses to export a tensor
            # that requires grad (every nn.Parameter of a model), and ferry only reads it.
            x = x.detach()
        if type(x).__module__ != "torch":
            # A subclass (nn.Parameter, a tensor subclass) as the plain tensor over its memory,
            # which the DLPack import recognises as torch's.
            x = x.as_subclass(sys.modules["torch"].Tensor)
    x = _resolve_lazy_views(x)
    x = _single_device_jax_array(x, where)
    if isinstance(x, Array):
        if x.is_deleted():
            raise FailedPreconditionError(f"{where}: a ferry.Array that has been deleted")
        x = x.to_numpy()  # through the host (device_put copies device to device where it can)
    _check_foreign_dtype(x, where)
    _check_dlpack_device(x, where)
    if (not isinstance(x, np.ndarray) and not hasattr(x, "__dlpack__") and not _has_buffer(x)
            and (hasattr(x, "__array__") or hasattr(x, "__array_interface__"))):
        x = np.asarray(x)  # an object that numpy alone can read
    return x


def _dict_maker(tree: dict) -> Callable[[Iterator[tuple[Any, Any]]], dict]:
    """How a dict node of a pytree is rebuilt from (key, value) pairs: dict, OrderedDict and
    defaultdict (with its default factory), as JAX's pytree nodes. Any other dict subclass
    raises before anything is transferred: its constructor need not take pairs (a Counter counts
    them)."""
    kind = type(tree)
    if kind is dict or kind is collections.OrderedDict:
        return kind
    if kind is collections.defaultdict:
        return lambda pairs: collections.defaultdict(tree.default_factory, pairs)
    raise InvalidArgumentError(
        f"a {kind.__module__}.{kind.__qualname__} in the input: ferry's pytrees hold dict, "
        "OrderedDict and defaultdict; pass dict(...) of it")


def _flatten(tree: Any, leaves: list[Any]) -> Callable[[Iterator[Any]], Any]:
    """Appends the leaves of a pytree (nested lists, tuples, named tuples and dicts; anything else
    is a leaf; None is an empty subtree, as in JAX: no leaf, rebuilt as None) to `leaves`, in
    order; returns the function that rebuilds the same structure from an iterator over new
    leaves."""
    if tree is None:
        return lambda it: None
    if isinstance(tree, dict):
        make = _dict_maker(tree)
        keys = list(tree)
        builders = [_flatten(tree[key], leaves) for key in keys]
        return lambda it: make(zip(keys, [build(it) for build in builders]))
    if isinstance(tree, (list, tuple)):
        builders = [_flatten(item, leaves) for item in tree]
        if hasattr(tree, "_fields"):  # a named tuple
            return lambda it: type(tree)(*[build(it) for build in builders])
        return lambda it: type(tree)([build(it) for build in builders])
    leaves.append(tree)
    return lambda it: next(it)


def _leaf_device_dtypes(tree: Any, dtypes: Any, out: list[Any], path: str) -> None:
    """Appends to `out` the device dtype of each leaf of `tree`, in _flatten's order: `dtypes` is
    one dtype (or None) for the whole subtree, or a pytree of the same structure, its dicts
    matched by key (as JAX matches a prefix tree), never by position."""
    where = f" at {path}" if path else ""
    if tree is None:
        return  # an empty subtree: no leaf to give a dtype
    if not isinstance(dtypes, (list, tuple, dict)):
        leaves: list[Any] = []
        _flatten(tree, leaves)
        out.extend([dtypes] * len(leaves))
        return
    if isinstance(tree, dict):
        if not isinstance(dtypes, dict):
            raise InvalidArgumentError(
                f"device_dtype{where} is a {type(dtypes).__name__} where the input has a dict: "
                "give one dtype, or a dict with the same keys")
        if set(dtypes) != set(tree):
            missing = [k for k in tree if k not in dtypes]
            extra = [k for k in dtypes if k not in tree]
            raise InvalidArgumentError(
                f"device_dtype{where} has other keys than the input: missing {missing}, "
                f"unknown {extra}")
        for key in tree:
            _leaf_device_dtypes(tree[key], dtypes[key], out, f"{path}[{key!r}]")
        return
    if isinstance(tree, (list, tuple)):
        if not isinstance(dtypes, (list, tuple)):
            raise InvalidArgumentError(
                f"device_dtype{where} is a dict where the input has a {type(tree).__name__}: "
                "give one dtype, or a sequence of the same length")
        if len(dtypes) != len(tree):
            raise InvalidArgumentError(
                f"device_dtype{where} has {len(dtypes)} {'entry' if len(dtypes) == 1 else 'entries'} "
                f"for {len(tree)} arrays: give one dtype, or one per array in the same structure")
        for index, (item, item_dtypes) in enumerate(zip(tree, dtypes)):
            _leaf_device_dtypes(item, item_dtypes, out, f"{path}[{index}]")
        return
    raise InvalidArgumentError(
        f"device_dtype{where} is a {type(dtypes).__name__} for one array: give one dtype")


_DLPACK_CPU = 1  # DLPack's kDLCPU
