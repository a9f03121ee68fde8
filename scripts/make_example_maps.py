"""The example maps files of the format specification (docs/maps-format.md), written by ``ridgefill``'s writer.

Three tiny files (under 2 KB each) that the readers of both environments are tested against
(``tests/test_maps_format.py`` with ``ridgefill.maps``, ``tests_vllm/test_maps_format.py`` with the vLLM
plugin's ``load_fill_maps``): every value follows a formula the tests restate, in dyadic fractions that
float32 holds exactly.

- ``inputs.safetensors``: input maps without context, ``S = 1`` of ``L = 4`` layers, ``d = 4``: ``weights``
  ``[2, 4, 4]``, ``biases`` ``[2, 4]``; no calibration means.
- ``context.safetensors``: context maps (``context = 1``, ``context_penalty = 0.5``), ``S = 0`` of
  ``L = 3``, ``d = 4``: ``weights`` ``[2, 8, 4]``, ``biases`` ``[2, 4]``, ``mean_h`` ``[4]``, ``mean_x``
  ``[2, 4]``, ``cov_h`` ``[4, 4]``, ``induction`` ``[3, 2]`` (3 layers of 2 heads), and the selection setting
  ``select = "one-pass"``.
- ``kv.safetensors``: K/V maps (``kind = "kv"``), ``S = 1`` of ``L = 3``, ``d = 4``, ``kv_dim = 1``:
  ``weights`` ``[1, 4, 2]``, ``biases`` ``[1, 2]`` (``ridgefill`` reads them; the vLLM plugin refuses them).

``w[i, r, c] = (i + 1)/2 + r/4 − c/8``, ``b[i, c] = i − c/2``; ``mean_h[r] = r/4``,
``mean_x[i, c] = i + c/8``, ``cov_h = I + 1/16`` (every entry ``1/16``, the diagonal ``17/16``),
``induction[l, h] = l/4 + h/8``.

The files are of format version 2. ``tests/data/maps/v1/`` holds the same three maps as format version 1
wrote them (no induction scores, no selection setting), which the readers still read.

Usage: ``python scripts/make_example_maps.py [OUT_DIR]`` (default ``tests/data/maps``). The tests rerun it
into a temporary folder and compare the bytes, so the committed files are what this script writes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import tempfile
from pathlib import Path

import torch

from ridgefill.maps import RidgeMaps

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "maps"
NAMES = ("inputs.safetensors", "context.safetensors", "kv.safetensors")


def weights(n: int, f: int, k: int) -> torch.Tensor:
    """``w[i, r, c] = (i + 1)/2 + r/4 − c/8``, float32 ``[n, f, k]``."""
    i, r, c = torch.meshgrid(torch.arange(n), torch.arange(f), torch.arange(k), indexing="ij")
    return ((i + 1) / 2 + r / 4 - c / 8).to(torch.float32)


def biases(n: int, k: int) -> torch.Tensor:
    """``b[i, c] = i − c/2``, float32 ``[n, k]``."""
    i, c = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    return (i - c / 2).to(torch.float32)


def induction(layers: int, heads: int) -> torch.Tensor:
    """``induction[l, h] = l/4 + h/8``, float32 ``[layers, heads]``."""
    l, h = torch.meshgrid(torch.arange(layers), torch.arange(heads), indexing="ij")
    return (l / 4 + h / 8).to(torch.float32)


def example_maps() -> dict[str, RidgeMaps]:
    """The three example maps, by file name."""
    d = 4
    provenance = {"model_name": "example (format specification)", "weight_sample": [0.5, -0.25, 1.0, 0.0]}
    inputs = RidgeMaps(1, weights(2, d, d), biases(2, d), [0.5, 2.0], dict(provenance, kind="inputs", context=0))
    i, c = torch.meshgrid(torch.arange(2), torch.arange(d), indexing="ij")
    context = RidgeMaps(0, weights(2, 2 * d, d), biases(2, d), [1.0, 0.25],
                        dict(provenance, kind="inputs", context=1, context_penalty=0.5, select="one-pass"),
                        mean_h=(torch.arange(d) / 4).to(torch.float32), mean_x=(i + c / 8).to(torch.float32),
                        cov_h=torch.eye(d) + 1 / 16, induction=induction(3, 2))
    kv = RidgeMaps(1, weights(1, d, 2), biases(1, 2), [0.125], dict(provenance, kind="kv", context=0))
    return dict(zip(NAMES, (inputs, context, kv)))


def write(out: Path) -> list[Path]:
    """Write the example files into ``out`` (created if needed); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    with tempfile.TemporaryDirectory() as tmp:  # the writer's lock file stays out of ``out``
        for name, maps in example_maps().items():
            shutil.copyfile(maps.save(Path(tmp) / name), out / name)
            paths.append(out / name)
    return paths


def _header(data: bytes) -> tuple[int, dict]:
    """A safetensors file's header: its byte length and its JSON (tensor entries and ``__metadata__``)."""
    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8:8 + n])


def flip_tensor_byte(src: Path, dst: Path, tensor: str) -> None:
    """Copy ``src`` to ``dst`` with one bit of ``tensor``'s first data byte flipped (a corrupted tensor)."""
    data = bytearray(src.read_bytes())
    n, header = _header(data)
    data[8 + n + header[tensor]["data_offsets"][0]] ^= 0x40
    dst.write_bytes(bytes(data))


def edit_metadata(src: Path, dst: Path, **fields) -> None:
    """Copy ``src`` to ``dst`` with ``fields`` set in its ``ridgefill`` metadata, the content hashes kept
    (an edited header)."""
    data = src.read_bytes()
    n, header = _header(data)
    meta = json.loads(header["__metadata__"]["ridgefill"])
    meta.update(fields)
    header["__metadata__"]["ridgefill"] = json.dumps(meta, sort_keys=True)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes
    dst.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])


def corrupted_copies(data: Path, tmp: Path) -> list[tuple[Path, str | None]]:
    """Damaged copies of the example files in ``data``, written under ``tmp``, each with the regular
    expression of the error a reader must raise (``None``: the copy must load, its ``model_name`` being
    ``"renamed"``: provenance is not hashed). Both environments' tests read these cases."""
    cases: list[tuple[Path, str | None]] = []
    for tensor in ("weights", "biases", "cov_h"):
        flip_tensor_byte(data / "context.safetensors", tmp / f"flipped-{tensor}.safetensors", tensor)
        cases.append((tmp / f"flipped-{tensor}.safetensors", f"is corrupted: tensor {tensor} differs"))
    edit_metadata(data / "inputs.safetensors", tmp / "edited.safetensors", split=2)
    cases.append((tmp / "edited.safetensors", r"is corrupted: its header fields \(context, context_penalty"))
    edit_metadata(data / "inputs.safetensors", tmp / "named.safetensors", model_name="renamed")
    cases.append((tmp / "named.safetensors", None))
    raw = (data / "inputs.safetensors").read_bytes()
    (tmp / "cut.safetensors").write_bytes(raw[:len(raw) - 10])
    cases.append((tmp / "cut.safetensors", "truncated or corrupted"))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default=str(DEFAULT_OUT), help="folder to write (default: tests/data/maps)")
    for p in write(Path(ap.parse_args().out)):
        print(f"wrote {p} ({p.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
