"""Maps as GGUF, for the llama.cpp engine (``engines/llamacpp``): ``ridgefill export-gguf``.

:func:`export_gguf` writes the input maps of a maps file (:func:`ridgefill.maps.load_maps`) as float32 GGUF
tensors with the metadata the patched llama.cpp graph reads (docs/maps-format.md, "GGUF maps"):

- ``ridgefill.weight.<l>``, for each late layer ``l = S+1 .. L-1``: ``W_l`` stored transposed, GGUF shape
  ``[f, d]`` (``f`` = ``d``, or ``2d`` for context maps): the layout ggml's ``mul_mat`` reads, so that
  ``x̂_l = W_lᵀ`` applied to a column ``f`` of features equals :func:`ridgefill.maps.predict_inputs`;
- ``ridgefill.bias.<l>``: ``b_l`` ``[d]``;
- keys ``ridgefill.format_version`` (2), ``ridgefill.kind`` (``"inputs"``), ``ridgefill.split``,
  ``ridgefill.context`` (0 or 1), ``ridgefill.tail`` (the default tail), ``ridgefill.n_layer``,
  ``ridgefill.n_embd``, ``ridgefill.maps_sha256`` (:func:`maps_sha256`, the content checksum),
  ``ridgefill.model_fingerprint`` (:func:`model_fingerprint` of the GGUF model file the maps are for),
  ``ridgefill.model_file`` (that file's name, for messages), and the safetensors maps' provenance
  ``ridgefill.model_name``, ``ridgefill.model_hash`` and ``ridgefill.weight_fingerprint``.

The patched llama.cpp checks, once when it reads the maps, that every value is finite, that the tensors
hash to ``ridgefill.maps_sha256``, and that ``ridgefill.model_fingerprint`` equals the fingerprint of the
model file it loaded (computed the same way at model load), and stops with a ``ridgefill: ...`` error
otherwise.

Only input maps (``kind = "inputs"``) are exported: K/V maps predict keys and values, which the llama.cpp
graph does not take.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import struct
from pathlib import Path

from . import defaults
from .errors import InputError, MapsFormatError
from .fileio import atomic_write

#: The GGUF maps format this module writes and the llama.cpp patch reads.
GGUF_FORMAT_VERSION = 2
GGUF_ARCH = "ridgefill"
#: Largest tail the GGUF key (uint32) and llama.cpp's positions (int32) hold.
MAX_TAIL = 2**31 - 1
#: Bytes of each tensor's data that :func:`model_fingerprint` reads (all of a shorter tensor).
SAMPLE_BYTES = 4096


def check_tail(tail) -> int:
    """``tail`` as an int in ``1 .. MAX_TAIL``, or :class:`InputError` naming the range."""
    if isinstance(tail, bool) or not isinstance(tail, int) or not 1 <= tail <= MAX_TAIL:
        raise InputError(f"tail={tail!r} must be a whole number of tokens in 1..{MAX_TAIL} (the prompt's last token "
                         "is exact; llama.cpp holds positions as 32-bit integers)")
    return tail


def _open_gguf(path: str | os.PathLike, what: str):
    import gguf

    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {str(p)!r} does not exist")
    try:
        return gguf.GGUFReader(str(p))
    except (ValueError, OSError, struct.error) as e:
        raise InputError(f"{what} {str(p)!r} is not a GGUF file ({e})") from e


def model_fingerprint(path: str | os.PathLike) -> str:
    """SHA-256 (hex) identifying a GGUF model file, as the patched llama.cpp computes it when it loads the
    model: over the file's tensors sorted by name, of each tensor's name (UTF-8), a zero byte, its GGML type
    (uint32 little-endian), its 4 dimensions (``ne``, int64 little-endian each, unused ones 1) and the first
    :data:`SAMPLE_BYTES` bytes of its data as stored (all of it when shorter).

    Two files agree when their tensors have the same names, types and shapes and the same first 4 KiB of
    data each: another model, a fine-tune or another quantisation of the same architecture fails (their
    first bytes differ); a change beyond the first 4 KiB of every tensor would not be seen.

    Raises:
        InputError: the file is missing, not a GGUF file, or one part of a split model.
    """
    r = _open_gguf(path, "model file")
    split = r.fields.get("split.count")
    if split is not None and int(split.parts[split.data[0]][0]) > 1:
        raise InputError(f"model file {str(path)!r} is one part of a split GGUF model; merge it into one file "
                         "(llama-gguf-split --merge) and give that")
    h = hashlib.sha256()
    for t in sorted(r.tensors, key=lambda t: t.name.encode()):
        h.update(t.name.encode() + b"\0")
        ne = [int(x) for x in t.shape] + [1] * (4 - len(t.shape))
        h.update(struct.pack("<I4q", int(t.tensor_type), *ne))
        n = min(SAMPLE_BYTES, int(t.n_bytes))
        h.update(r.data[t.data_offset:t.data_offset + n].tobytes())
    return h.hexdigest()


def _model_shape(r) -> tuple[int, int]:
    """(layers, width) from a GGUF model's metadata: ``<arch>.block_count`` and ``<arch>.embedding_length``."""
    def value(key):
        f = r.fields.get(key)
        return None if f is None else f.parts[f.data[0]]

    arch = value("general.architecture")
    arch = bytes(arch).decode() if arch is not None else ""
    layers, width = value(f"{arch}.block_count"), value(f"{arch}.embedding_length")
    if layers is None or width is None:
        raise InputError(f"the model file has no {arch or '<architecture>'}.block_count or .embedding_length: "
                         "it is not a model GGUF that llama.cpp loads")
    return int(layers[0]), int(width[0])


def maps_sha256(weights, biases) -> str:
    """The content checksum of GGUF maps: SHA-256 (hex) of, for each late layer in order, ``W_l`` as stored
    (float32 ``[d, f]`` row-major, i.e. GGUF ``[f, d]``) then ``b_l`` (float32 ``[d]``). ``weights`` and
    ``biases`` are numpy arrays ``[layers, f, d]`` and ``[layers, d]`` (``W_l`` as in
    :func:`ridgefill.maps.predict_inputs`)."""
    import numpy as np

    h = hashlib.sha256()
    for w, b in zip(weights, biases):
        h.update(np.ascontiguousarray(w.T, dtype="<f4").tobytes())
        h.update(np.ascontiguousarray(b, dtype="<f4").tobytes())
    return h.hexdigest()


def export_gguf(maps, path: str | os.PathLike, *, model: str | os.PathLike, tail: int = defaults.TAIL) -> Path:
    """Write ``maps`` (:class:`ridgefill.maps.RidgeMaps`, input maps) as a GGUF maps file at ``path``,
    atomically, for the GGUF model file ``model`` (the one llama.cpp will load: its
    :func:`model_fingerprint` is stored); return the path.

    Raises:
        InputError: K/V maps, a ``tail`` outside ``1 .. MAX_TAIL``, maps whose shapes do not describe input
            maps, or a model file that is missing, not a GGUF model, or of another layer count or width.
        MapsFormatError: the maps hold a NaN or an infinity.
    """
    import gguf
    import numpy as np

    from .maps import RidgeMaps

    tail = check_tail(tail)
    if not isinstance(maps, RidgeMaps):
        raise InputError(f"maps must be a RidgeMaps (ridgefill.load_maps); got {type(maps).__name__}")
    if maps.kind != "inputs":
        raise InputError(f"the llama.cpp engine takes input maps; these are {maps.kind!r} maps: fit input maps "
                         "with `ridgefill calibrate` (the default)")
    w = maps.weights.detach().float().cpu().numpy()
    b = maps.biases.detach().float().cpu().numpy()
    layers, f, d = w.shape
    if f != d * (1 + maps.context) or b.shape != (layers, d):
        raise InputError(f"maps of weights {w.shape} and biases {b.shape} are not input maps with context "
                         f"{maps.context}: refit them with `ridgefill calibrate`")
    n_layer = maps.split + 1 + layers
    for name, a in (("weights", w), ("biases", b)):
        if not np.isfinite(a).all():
            i = int(np.flatnonzero(~np.isfinite(a).reshape(-1))[0])
            raise MapsFormatError(f"the maps' {name} hold a non-finite value ({a.reshape(-1)[i]} at flat index {i}): "
                                  "they are corrupted; fit them again with `ridgefill calibrate`")
    r = _open_gguf(model, "model file")
    m_layers, m_width = _model_shape(r)
    if (m_layers, m_width) != (n_layer, d):
        raise InputError(f"model file {str(model)!r} has {m_layers} layers of width {m_width}; these maps are for "
                         f"{n_layer} layers of width {d}: give the GGUF of the model the maps were fitted on")
    del r
    fingerprint = model_fingerprint(model)
    checksum = maps_sha256(w, b)

    def write(tmp: str) -> None:
        out = gguf.GGUFWriter(tmp, GGUF_ARCH)
        out.add_uint32("ridgefill.format_version", GGUF_FORMAT_VERSION)
        out.add_string("ridgefill.kind", "inputs")
        out.add_uint32("ridgefill.split", maps.split)
        out.add_uint32("ridgefill.context", maps.context)
        out.add_uint32("ridgefill.tail", tail)
        out.add_uint32("ridgefill.n_layer", n_layer)
        out.add_uint32("ridgefill.n_embd", d)
        out.add_string("ridgefill.maps_sha256", checksum)
        out.add_string("ridgefill.model_fingerprint", fingerprint)
        out.add_string("ridgefill.model_file", Path(model).name)
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
    """The metadata and tensors of a GGUF maps file, as ``{"format_version", "split", "context", "tail",
    "n_layer", "n_embd", "maps_sha256", "model_fingerprint", "model_file", "weights": {layer: W_l [f, d]},
    "biases": {layer: b_l [d]}}`` (numpy float32; ``W_l`` as in :func:`ridgefill.maps.predict_inputs`).
    Raises :class:`InputError` for a missing file or one without the keys :func:`export_gguf` writes;
    the tensors are returned as stored, not checked (:func:`maps_sha256` checks them)."""
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
    for key in ("maps_sha256", "model_fingerprint", "model_file"):
        field = r.fields.get(f"ridgefill.{key}")
        out[key] = None if field is None else bytes(field.parts[field.data[0]]).decode()
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
                       "ridgefill.weight.<l> and ridgefill.bias.<l>, with split, context, default tail, a content "
                       "checksum and the fingerprint of the GGUF model they are for) that the patched llama.cpp "
                       "reads through RIDGEFILL_MAPS (docs/llamacpp.md).")
    p.add_argument("maps", help="maps file (.safetensors) written by `ridgefill calibrate` or `ridgefill run`")
    p.add_argument("--model", required=True, metavar="GGUF",
                   help="the GGUF model file llama.cpp will run with these maps (the model they were fitted on); "
                        "llama.cpp refuses the maps with any other model file")
    p.add_argument("--out", required=True, metavar="FILE", help="GGUF maps file to write (.gguf), atomically")
    p.add_argument("--tail", type=int, default=defaults.TAIL,
                   help=f"default exact tokens at the end of a prompt, 1..{MAX_TAIL} (default {defaults.TAIL}); "
                        "RIDGEFILL_TAIL overrides it at run time")
    p.set_defaults(func=_cmd)


def _is_gguf(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def _cmd(a: argparse.Namespace) -> None:
    check_tail(a.tail)  # before anything slow
    if not str(a.out).endswith(".gguf"):
        raise InputError(f"--out {a.out!r} must name a .gguf file")
    if _is_gguf(a.maps):
        raise InputError(f"{a.maps!r} is a GGUF file; export-gguf reads the safetensors maps that `ridgefill "
                         "calibrate` (or `ridgefill run`) writes, e.g. maps.safetensors, and writes the GGUF maps")
    if not _is_gguf(a.model):
        raise InputError(f"--model {a.model!r} " + ("does not exist" if not Path(a.model).exists() else
                         "is not a GGUF file") + ": give the GGUF model file llama.cpp will load")

    from .maps import load_maps  # heavy: torch

    maps = load_maps(a.maps)
    path = export_gguf(maps, a.out, model=a.model, tail=a.tail)
    print(path)
