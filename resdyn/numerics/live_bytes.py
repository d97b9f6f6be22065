"""Live tensor bytes per device, counted op by op: how much memory a code path holds at its peak.

:class:`LiveBytes` is a ``TorchDispatchMode``: every tensor an aten op returns is recorded by its
storage (views share one), and a weakref finalizer on the storage takes it off when the last
reference goes. The peak per device is the largest sum of live storages seen after any op. Run
on the meta device (tensors with shapes and dtypes but no data) it measures a paper-scale job on a
laptop: the arithmetic is skipped, the allocations are not. What it cannot see: the caching
allocator's rounding and fragmentation, cuBLAS/cuDNN workspaces, the CUDA context, and temporaries
inside one fused kernel (docs/cost.md, "Memory trace").

Data-dependent scalars (``bool(t)``, ``t.item()``, ``float(t)``) have no value on the meta device;
:class:`LiveBytes` answers them with the value of data that passes every check (``all``: True,
other booleans False, integers 0, floats 1.0), and a copy from the meta
device to the host returns host zeros of the same shape, so host-side bookkeeping runs on.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_SCALAR = torch.ops.aten._local_scalar_dense.default
_TO_COPY = torch.ops.aten._to_copy.default
#: reductions whose scalar reads as True: "all finite" checks pass, as on data that is fine
_ALL = (torch.ops.aten.all.default, torch.ops.aten.all.dim, torch.ops.aten.all.dims)


def _neutral_scalar(t: torch.Tensor) -> bool | int | float:
    """The value a meta tensor's scalar reads as: True for the result of ``all``, False for other
    booleans (``any``: no NaN found), 0 for integers, 1.0 for floats."""
    if t.dtype == torch.bool:
        return bool(getattr(t, "_all_reduction", False))
    return 1.0 if (t.is_floating_point() or t.is_complex()) else 0


class LiveBytes(TorchDispatchMode):
    """Count live tensor bytes per device while active (see the module docstring).

    ``current[device]``: bytes of the storages alive now; ``peak[device]``: the largest value
    ``current`` took after any op. ``track(tensors)`` counts tensors made before the mode was
    entered (a model's weights).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[str, int]] = {}
        self.current: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)

    def track(self, tensors: Iterable[Any]) -> None:
        """Count each tensor's storage once (others are ignored)."""
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self.live:
                continue
            device, size = str(t.device), int(storage.nbytes())
            self.live[key] = (device, size)
            self.current[device] += size
            weakref.finalize(storage, self._free, key)
            self.peak[device] = max(self.peak[device], self.current[device])

    def _free(self, key: int) -> None:
        device, size = self.live.pop(key)
        self.current[device] -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SCALAR and args[0].device.type == "meta":
            return _neutral_scalar(args[0])
        to_host = torch.device(kwargs.get("device", "meta")).type == "cpu"
        if func is _TO_COPY and args[0].device.type == "meta" and to_host:
            out = torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        else:
            out = func(*args, **kwargs)
            if func in _ALL:
                out._all_reduction = True
        self.track(tree_flatten(out)[0])
        return out
