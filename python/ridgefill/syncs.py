"""Count the operations that make the host wait for an accelerator, on any device (a CPU proxy).

On a GPU, an operation whose result the host must read (a scalar, a list, a data-dependent shape) waits
for every kernel queued before it: the device drains and the next launches start late. The same
operations run on the CPU without waiting, so a CPU run cannot time them, but it can count them.
:class:`HostSyncCounter` counts, while it is active:

- reads of a tensor's data on the host: ``item()``, ``int()``, ``float()``, ``bool()``, ``operator.index``
  of a tensor, ``is_nonzero``, ``tolist``, ``cpu`` (``numpy()`` only takes host tensors, so it is not
  counted: ``t.cpu().numpy()`` is one read);
- ATen operators whose output shape depends on data: ``nonzero``, ``masked_select``, ``unique`` (all
  forms), ``bincount``, ``equal``, ``repeat_interleave`` without ``output_size``, and indexing
  (``index``, ``index_put_``) with a boolean mask.

Tensors that never leave the host (host-side planning over ``int64`` row lists) are counted too when a
counted operation reads them, since a CPU run cannot tell host from device data: code that plans on the
host keeps such data as Python ints or NumPy arrays, which are not tensors.

``ridgefill.prefill`` is tested against a bound on this count (``tests/test_syncs.py``).
"""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter", "SYNC_OPS"]

#: ATen overload packets that read device data on the host (or have data-dependent output shapes).
SYNC_OPS = frozenset({
    "aten.nonzero", "aten.nonzero_static", "aten.masked_select",
    "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive", "aten.unique_dim_consecutive",
    "aten.bincount", "aten.equal",
})
_INDEX_OPS = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})
#: Tensor methods that read data on the host. Scalar reads are counted here, not as ATen's
#: ``_local_scalar_dense``, which inference mode does not show to a dispatch mode.
_HOST_METHODS = frozenset({"item", "__int__", "__float__", "__bool__", "__index__", "__complex__", "is_nonzero",
                           "tolist", "cpu"})


_HERE = str(Path(__file__).resolve())


def _site() -> str:
    """``file:line`` of the innermost frame outside this module and outside torch."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename != _HERE and "/torch/" not in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return "?"


class _Dispatch(TorchDispatchMode):
    def __init__(self, counts: Counter, sites: Counter | None):
        super().__init__()
        self.counts, self.sites = counts, sites

    def count(self, name: str) -> None:
        self.counts[name] += 1
        if self.sites is not None:
            self.sites[f"{_site()} {name}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if not name.startswith("aten."):
            name = "aten." + name
        if name in SYNC_OPS:
            self.count(name)
        elif name == "aten.repeat_interleave" and kwargs.get("output_size") is None:
            self.count(name)  # repeats given as a tensor (an int count decomposes without it)
        elif name in _INDEX_OPS and len(args) > 1:
            indices = args[1] if isinstance(args[1], (list, tuple)) else ()
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                self.count(name + " (bool mask)")
        return func(*args, **kwargs)


class _Function(TorchFunctionMode):
    def __init__(self, counts: Counter, sites: Counter | None):
        super().__init__()
        self.counts, self.sites = counts, sites

    count = _Dispatch.count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST_METHODS and args and isinstance(args[0], torch.Tensor):
            self.count(f"Tensor.{name}")
        return func(*args, **(kwargs or {}))


class HostSyncCounter:
    """Context manager counting host synchronisations (module docstring); ``counts`` by operation,
    ``total`` in all; with ``sites=True`` also ``sites``, by ``file:line`` of the calling code and operation.

    Example::

        with HostSyncCounter() as syncs:
            prefill(model, ids, maps)
        assert syncs.total <= 24, syncs.counts
    """

    def __init__(self, sites: bool = False):
        self.counts: Counter = Counter()
        self.sites: Counter | None = Counter() if sites else None
        self._modes = (_Function(self.counts, self.sites), _Dispatch(self.counts, self.sites))

    def __enter__(self) -> "HostSyncCounter":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    @property
    def total(self) -> int:
        """Host synchronisations counted so far."""
        return sum(self.counts.values())
