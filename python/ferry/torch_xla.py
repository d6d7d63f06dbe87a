"""torch_xla without its contiguous copy (docs/jax.md, "torch_xla").

``tensor.to(xla_device)`` in torch_xla 2.9 first copies the tensor into a new contiguous CPU tensor
(its ``AtenSource``) and then has PJRT copy that into device memory: two full-size copies, the
first a strided gather, and a full-size temporary. ``ferry.torch_xla.to_xla`` gathers the tensor
once, through its real strides and converting on the way if asked, straight into memory that
torch_xla takes as it is (``torch_xla.utils.dlpack.from_dlpack`` of a ferry array on ``host:0``:
a view, no copy). The XLA tensor keeps ferry's array alive.

It needs torch_xla's device memory to be host memory: torch_xla's CPU platform (``PJRT_DEVICE=CPU``,
or ferry's plugin over the XLA CPU plugin). torch_xla's ``from_dlpack`` accepts host memory there
only; elsewhere (a GPU or TPU plugin) ``to_xla`` raises ``ferry.UnimplementedError``: use
``.to(device)``, or ferry's plugin, whose puts already read the real strides. So it does under
torch_xla's SPMD mode (``torch_xla.runtime.use_spmd()``), whose from_dlpack cannot place host
memory on a device: use ``.to(device)`` and ``mark_sharding``.
"""

from __future__ import annotations

from typing import Any

import ferry
from ferry._inputs import _flatten


def to_xla(tensor: Any, *, dtype: Any = None) -> Any:
    """A torch_xla tensor on torch_xla's default device holding `tensor`'s values (a torch tensor
    of any strides, or anything ferry.device_put takes), stored as `dtype` if given (ferry's
    conversion rules, docs/conversions.md), made without torch_xla's contiguous copy.

    A pytree (nested lists, tuples and dicts, as ferry.device_put takes them) is put in one
    batched call and comes back in the same structure, each leaf an XLA tensor; `dtype` is one
    dtype or a tree of them, as device_put's `device_dtype`.

    A source that requires grad (an nn.Parameter) gives an XLA tensor that requires grad too,
    where its stored dtype can (floating point or complex): a new leaf, a plain tensor (not a
    Parameter), whose gradient collects in its own `.grad`; none flows back to the source."""
    import torch_xla  # its runtime up before from_dlpack
    import torch_xla.runtime
    from torch_xla.utils import dlpack as xla_dlpack

    import torch_xla.core.xla_model as xm

    # The hardware of the default device, as its PJRT platform says ("CPU" for the built-in CPU
    # client and for any plugin over the CPU platform, ferry's included, however it was
    # registered: PJRT_DEVICE=CPU, LIBRARY or a plugin's own name).
    hardware = xm.xla_device_hw(torch_xla.device())
    if hardware != "CPU":
        raise ferry.UnimplementedError(
            f"to_xla: torch_xla's device memory on {hardware} is not host memory, which "
            "torch_xla's from_dlpack needs; use tensor.to(device)")
    if torch_xla.runtime.is_spmd():
        # Under SPMD from_dlpack looks for the tensor's device among SPMD's virtual devices and
        # fails after it has taken (and freed) the capsule: refused before anything is made.
        raise ferry.UnimplementedError(
            "to_xla: torch_xla's SPMD mode is on (torch_xla.runtime.use_spmd()), where its "
            "from_dlpack cannot place host memory on a device; use tensor.to(device) and "
            "xs.mark_sharding")
    sources: list[Any] = []
    _flatten(tensor, sources)  # device_put's result has the same leaves, in the same order
    arrays: list[Any] = []
    rebuild = _flatten(ferry.device_put(tensor, "host:0", device_dtype=dtype), arrays)
    return rebuild(iter([_viewed_by_xla(array, source, xla_dlpack.from_dlpack)
                         for array, source in zip(arrays, sources)]))


def _viewed_by_xla(array: Any, source: Any, from_dlpack: Any) -> Any:
    """The XLA tensor over ferry's `array` (put from `source`), requiring grad as `source` does
    where its dtype can."""
    try:
        viewed = from_dlpack(array)
    except (RuntimeError, ValueError) as error:
        stored = str(array.device_dtype)
        if stored.startswith("float8"):
            # torch_xla 2.9's DLPack import knows no float8 type code, on any platform.
            raise ferry.UnimplementedError(
                f"to_xla: torch_xla's from_dlpack takes no {stored} ({error}); store it as "
                "another dtype (dtype=...) or use tensor.to(device)") from error
        raise ferry.UnimplementedError(
            f"to_xla: torch_xla did not take ferry's host memory ({error}); its from_dlpack "
            "views host memory on the CPU platform only: use tensor.to(device)") from error
    if getattr(source, "requires_grad", False) and (viewed.is_floating_point()
                                                    or viewed.is_complex()):
        viewed.requires_grad_()  # a new leaf: its gradient collects in its own .grad
    return viewed
