"""Maps as GGUF, for the llama.cpp engine (``engines/llamacpp``): ``ridgefill export-gguf``.

:func:`export_gguf` writes the input maps of a maps file (:func:`ridgefill.maps.load_maps`) as float32 GGUF
tensors with the metadata the patched llama.cpp graph reads (docs/maps-format.md, "GGUF maps"):

- ``ridgefill.weight.<l>``, for each late layer ``l = S+1 .. L-1``: ``W_l`` stored transposed, GGUF shape
  ``[f, d]`` (``f`` = ``d``, or ``2d`` for context maps): the layout ggml's ``mul_mat`` reads, so that
  ``x̂_l = W_lᵀ`` applied to a column ``f`` of features equals :func:`ridgefill.maps.predict_inputs`;
- ``ridgefill.bias.<l>``: ``b_l`` ``[d]``;
- keys ``ridgefill.format_version`` (1), ``ridgefill.kind`` (``"inputs"``), ``ridgefill.split``,
  ``ridgefill.context`` (0 or 1), ``ridgefill.tail`` (the default tail), ``ridgefill.n_layer``,
  ``ridgefill.n_embd``, ``ridgefill.model_name``, ``ridgefill.model_hash`` and
  ``ridgefill.weight_fingerprint``.

Only input maps (``kind = "inputs"``) are exported: K/V maps predict keys and values, which the llama.cpp
graph does not take.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import defaults
from .errors import InputError
from .fileio import atomic_write

#: The GGUF maps format this module writes and the llama.cpp patch reads.
GGUF_FORMAT_VERSION = 1
GGUF_ARCH = "ridgefill"


def export_gguf(maps, path: str | os.PathLike, *, tail: int = defaults.TAIL) -> Path:
    """Write ``maps`` (:class:`ridgefill.maps.RidgeMaps`, input maps) as a GGUF maps file at ``path``,
    atomically; return the path.

    Raises:
        InputError: K/V maps, a ``tail`` below 1, or maps whose shapes do not describe input maps.
    """
    import gguf
    import numpy as np

    from .maps import RidgeMaps

    if not isinstance(maps, RidgeMaps):
        raise InputError(f"maps must be a RidgeMaps (ridgefill.load_maps); got {type(maps).__name__}")
    if maps.kind != "inputs":
        raise InputError(f"the llama.cpp engine takes input maps; these are {maps.kind!r} maps: fit input maps "
                         "with `ridgefill calibrate` (the default)")
    if isinstance(tail, bool) or not isinstance(tail, int) or tail < 1:
        raise InputError(f"tail={tail!r} must be an integer of at least 1 (the prompt's last token is exact)")
    w = maps.weights.detach().float().cpu().numpy()
    b = maps.biases.detach().float().cpu().numpy()
    layers, f, d = w.shape
    if f != d * (1 + maps.context) or b.shape != (layers, d):
        raise InputError(f"maps of weights {w.shape} and biases {b.shape} are not input maps with context "
                         f"{maps.context}: refit them with `ridgefill calibrate`")
    n_layer = maps.split + 1 + layers

    def write(tmp: str) -> None:
        out = gguf.GGUFWriter(tmp, GGUF_ARCH)
        out.add_uint32("ridgefill.format_version", GGUF_FORMAT_VERSION)
        out.add_string("ridgefill.kind", "inputs")
        out.add_uint32("ridgefill.split", maps.split)
        out.add_uint32("ridgefill.context", maps.context)
        out.add_uint32("ridgefill.tail", tail)
        out.add_uint32("ridgefill.n_layer", n_layer)
        out.add_uint32("ridgefill.n_embd", d)
        for key in ("model_name", "model_hash", "weight_fingerprint"):
            out.add_string(f"ridgefill.{key}", str(maps.meta.get(key, "")))
        for i in range(layers):
            layer = maps.split + 1 + i
            # numpy (d, f) is GGUF/ggml [f, d]: ggml_mul_mat(W, features) gives x̂ = h W
            out.add_tensor(f"ridgefill.weight.{layer}", np.ascontiguousarray(w[i].T, dtype=np.float32))
            out.add_tensor(f"ridgefill.bias.{layer}", np.ascontiguousarray(b[i], dtype=np.float32))
        out.write_header_to_file()
        out.write_kv_data_to_file()
        out.write_tensors_to_file()
        out.close()

    return atomic_write(Path(path), write)


def read_gguf_maps(path: str | os.PathLike) -> dict:
    """The metadata and tensors of a GGUF maps file, as ``{"split", "context", "tail", "n_layer", "n_embd",
    "weights": {layer: W_l [f, d]}, "biases": {layer: b_l [d]}}`` (numpy float32; ``W_l`` as in
    :func:`ridgefill.maps.predict_inputs`). Raises :class:`InputError` for a missing file or one without
    the keys :func:`export_gguf` writes."""
    import gguf
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise InputError(f"GGUF maps file {str(p)!r} does not exist; write it with `ridgefill export-gguf`")
    try:
        r = gguf.GGUFReader(str(p))
    except (ValueError, OSError) as e:
        raise InputError(f"{str(p)!r} is not a GGUF file ({e}); write it with `ridgefill export-gguf`") from e
    out: dict = {"weights": {}, "biases": {}}
    for key in ("format_version", "split", "context", "tail", "n_layer", "n_embd"):
        field = r.fields.get(f"ridgefill.{key}")
        if field is None:
            raise InputError(f"{str(p)!r} has no key ridgefill.{key}: it is not a GGUF maps file; write it with "
                             "`ridgefill export-gguf`")
        out[key] = int(field.parts[field.data[0]][0])
    for t in r.tensors:
        kind, _, layer = t.name.removeprefix("ridgefill.").partition(".")
        data = np.array(t.data, dtype=np.float32)
        if kind == "weight":
            out["weights"][int(layer)] = data.T  # stored [d, f] row-major
        elif kind == "bias":
            out["biases"][int(layer)] = data.reshape(-1)
    return out


def add_command(sub) -> None:
    """Register ``ridgefill export-gguf`` on the CLI's subparsers."""
    p = sub.add_parser("export-gguf", help="write maps as GGUF for the llama.cpp engine",
                       description="Write the input maps of a maps file as a GGUF file (float32 tensors "
                       "ridgefill.weight.<l> and ridgefill.bias.<l>, with split, context and default tail) "
                       "that the patched llama.cpp reads through RIDGEFILL_MAPS (docs/llamacpp.md).")
    p.add_argument("maps", help="maps file (.safetensors) written by `ridgefill calibrate` or `ridgefill run`")
    p.add_argument("--out", required=True, metavar="FILE", help="GGUF maps file to write (.gguf), atomically")
    p.add_argument("--tail", type=int, default=defaults.TAIL,
                   help=f"default exact tokens at the end of a prompt (default {defaults.TAIL}); "
                        "RIDGEFILL_TAIL overrides it at run time")
    p.set_defaults(func=_cmd)


def _cmd(a: argparse.Namespace) -> None:
    from .maps import load_maps  # heavy: torch

    if not str(a.out).endswith(".gguf"):
        raise InputError(f"--out {a.out!r} must name a .gguf file")
    maps = load_maps(a.maps)
    path = export_gguf(maps, a.out, tail=a.tail)
    print(path)
