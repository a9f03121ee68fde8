"""A model folder that vLLM serves with the fill: ``ridgefill export-vllm``.

:func:`export_vllm` writes a Hugging Face model folder that ``vllm serve FOLDER`` (with the ``ridgefill-vllm``
plugin installed) serves with the fill, with no ``--hf-overrides``: the model's files, the maps file in a subfolder
(``ridgefill/maps.safetensors``: vLLM loads every ``*.safetensors`` file of the folder itself as weights), and a ``config.json`` whose ``architectures`` names the plugin's RidgeFill class
(``RidgeFill<Arch>``, :data:`VLLM_ARCHITECTURES`; for a config that names none, the architecture serving its
``model_type``) and whose ``ridgefill`` entry holds the settings the plugin reads:
``maps`` (the file's name: the plugin looks for a relative path in the model folder), ``tail`` and ``select``
(docs/vllm.md). Weight files are hard links to the model's when the two folders share a file system, copies
otherwise. The folder is built beside ``out`` and renamed onto it when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from . import defaults
from .errors import InputError
from .fileio import atomic_write

#: The vLLM architectures (``config.json`` ``architectures``) the plugin has a RidgeFill class for, each with the
#: checkpoints' ``model_type`` values it serves; the class's register name is ``"RidgeFill" + architecture`` (the
#: plugin's ``ridgefill_vllm.SERVED`` and its families' ``model_types`` are built from this).
VLLM_ARCHITECTURES = {"LlamaForCausalLM": ("llama",), "MistralForCausalLM": ("mistral",), "Phi3ForCausalLM": ("phi3",),
                      "Qwen2ForCausalLM": ("qwen2",), "Qwen3ForCausalLM": ("qwen3",),
                      "Qwen3MoeForCausalLM": ("qwen3_moe",), "Gemma3ForCausalLM": ("gemma3_text",),
                      "Qwen3NextForCausalLM": ("qwen3_next",)}
#: The maps file's path in the exported folder: in a subfolder, since vLLM loads every ``*.safetensors`` file of a
#: model folder without a weight index as weights.
MAPS_NAME = "ridgefill/maps.safetensors"
#: Files at least this large are hard-linked rather than copied where the file system allows.
_LINK_BYTES = 1 << 20


def vllm_class(architecture: str) -> str:
    """The plugin's register name for vLLM's ``architecture`` (``RidgeFill<Arch>``).

    Raises:
        InputError: the plugin has no class for it (naming the served ones).
    """
    if architecture not in VLLM_ARCHITECTURES:
        raise InputError(f"the model's architecture {architecture!r} has no RidgeFill class in vLLM (served: "
                         f"{', '.join(VLLM_ARCHITECTURES)}; docs/vllm.md, support table): serve it with the "
                         "reference (ridgefill.prefill), or without the maps")
    return "RidgeFill" + architecture


def export_vllm(model_dir: str | os.PathLike, maps_path: str | os.PathLike, out: str | os.PathLike, *,
                tail: int = defaults.TAIL, select: str = defaults.SELECT) -> Path:
    """Write the folder ``out`` (module docstring) for the Hugging Face model folder ``model_dir`` and the maps file
    ``maps_path``; returns ``out``.

    Raises:
        InputError: ``out`` exists, ``tail`` is not a whole number ≥ 1, ``select`` is not a setting
            (:func:`ridgefill.select.resolve_auto`: ``"auto"``, the maps' recorded setting, or a spec) or has a
            query-agnostic part (the plugin refuses it), ``model_dir`` has no ``config.json`` or an architecture the
            plugin does not serve (or none, and a ``model_type`` none serves), or the maps do not fit the model (hidden size, layer count).
        MapsFormatError: a bad maps file (:func:`ridgefill.maps.load_maps`).
        WriteError: the folder cannot be written.
    """
    out, model_dir = Path(out), Path(model_dir)
    if out.exists():
        raise InputError(f"--out {str(out)!r} exists: give a new folder (the export writes config.json, the maps and "
                         "the model's files there)")
    if isinstance(tail, bool) or not isinstance(tail, int) or tail < 1:
        raise InputError(f"--tail {tail!r} must be a whole number of tokens ≥ 1")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise InputError(f"{str(model_dir)!r} has no config.json: give a Hugging Face model folder (`ridgefill "
                         "convert --model MODEL` prints the one a bundled model or a GGUF file loads from)")
    config = json.loads(config_path.read_text())
    archs = config.get("architectures") or [a for a, types in VLLM_ARCHITECTURES.items()
                                            if config.get("model_type") in types]
    if len(archs) != 1:
        raise InputError(f"{str(config_path)!r} names {len(archs)} architectures ({archs}) and model_type "
                         f"{config.get('model_type')!r}: the export needs one architecture (served: "
                         f"{', '.join(VLLM_ARCHITECTURES)})")
    config["architectures"] = [vllm_class(archs[0])]

    from .maps import load_maps  # heavy: torch
    from .select import as_selection, resolve_auto

    maps = load_maps(maps_path)
    chosen = resolve_auto(select, maps.select)  # refuses a bad spec, naming what it takes; "auto": the maps' setting
    if chosen is not None and any(p.by == "leverage" for p in as_selection(chosen).parts):
        via = f" (select 'auto' follows the maps' recorded setting {maps.select!r})" if isinstance(select, str) and select.strip() == "auto" else ""
        raise InputError(f"--select {select!r}{via} has a query-agnostic part (by=leverage, 'prompt'), which the vLLM "
                         "plugin does not serve: use 'on', 'two-pass', 'one-pass', 'off' or a spec of lexical and "
                         "attention parts")
    text = config.get("text_config") or config
    layers, hidden = text.get("num_hidden_layers"), text.get("hidden_size")
    if maps.split >= (layers or 0) - 1 or maps.weights.shape[-1] != hidden:
        raise InputError(f"the maps {str(maps_path)!r} (split S={maps.split}, hidden size {maps.weights.shape[-1]}) do "
                         f"not fit the model in {str(model_dir)!r} ({layers} layers, hidden size {hidden}): give the "
                         "maps fitted on this model")
    config["ridgefill"] = {"maps": MAPS_NAME, "tail": tail, "select": select}

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for f in sorted(model_dir.iterdir()):
            if f.name == "config.json" or not f.is_file():
                continue
            _link_or_copy(f, tmp / f.name)
        (tmp / MAPS_NAME).parent.mkdir()
        _link_or_copy(Path(maps_path), tmp / MAPS_NAME)
        atomic_write(tmp / "config.json", (json.dumps(config, indent=2) + "\n").encode())
        if json.loads((tmp / "config.json").read_text())["ridgefill"] != config["ridgefill"]:
            raise InputError(f"config.json in {str(tmp)!r} did not read back as written")
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    if src.stat().st_size >= _LINK_BYTES:
        try:
            os.link(src, dst)
            return
        except OSError:  # another file system, or links not allowed: copy
            pass
    shutil.copy2(src, dst)


def add_command(sub) -> None:
    """Register ``ridgefill export-vllm`` on the CLI's subparsers."""
    p = sub.add_parser("export-vllm", help="write a model folder that `vllm serve` serves with the fill",
                       description="Write a Hugging Face model folder for vLLM with the ridgefill-vllm plugin: the "
                       "model's files, the maps, and a config.json naming the plugin's RidgeFill class with the maps, "
                       "tail and row selection, so that `vllm serve FOLDER` serves the fill without --hf-overrides "
                       "(docs/vllm.md).")
    p.add_argument("--model", default=None, help="a Hugging Face model folder, a .gguf file or a bundled model "
                   "(default: the bundled SmolLM2-135M-Instruct; a GGUF is served from its float32 copy)")
    p.add_argument("--maps", required=True, metavar="FILE",
                   help="maps file from `ridgefill calibrate` or `ridgefill run`, fitted on this model")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (must not exist)")
    p.add_argument("--tail", type=int, default=defaults.TAIL,
                   help=f"exact tokens at the end of each prompt (default {defaults.TAIL})")
    p.add_argument("--select", default=defaults.SELECT, metavar="SETTING",
                   help=f"row selection: auto (the maps' recorded setting, else on), on, two-pass, one-pass, off, "
                   f"or a spec (default {defaults.SELECT!r})")
    p.set_defaults(func=_cmd)


def _cmd(a: argparse.Namespace) -> None:
    if Path(a.out).exists():  # before the model folder is made
        raise InputError(f"--out {a.out!r} exists: give a new folder")
    if not Path(a.maps).is_file():
        raise InputError(f"--maps {a.maps!r} does not exist: give the maps file `ridgefill calibrate` wrote")
    from .data.models import model_folder  # heavy

    print(export_vllm(model_folder(a.model), a.maps, a.out, tail=a.tail, select=a.select))
