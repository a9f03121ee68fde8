"""An lm-evaluation-harness model backed by RidgeFill (``pip install -e '.[eval]'``; lm-eval 0.4.13).

:class:`RidgeFillLM` is registered with lm-eval as ``ridgefill``. lm-eval 0.4.13 finds an external model
through its registry, so the registering module is imported before lm-eval's CLI runs::

    python -m ridgefill.evaluate.harness run --model ridgefill --device cpu \\
        --model_args model=smollm2,maps=maps.safetensors,tokenizer=$(ridgefill convert) \\
        --tasks niah_single_1 --metadata '{"max_seq_lengths": [4096]}' --limit 20

takes every option of ``lm-eval run``; from Python, ``import ridgefill.evaluate.harness`` and then
``lm_eval.simple_evaluate(model="ridgefill", model_args={...}, ...)``, or pass a :class:`RidgeFillLM`
instance as ``model``. RULER's tasks build their prompts with the tokenizer named by ``tokenizer`` (a local
folder: the model's own, which ``ridgefill convert [--model M]`` prints); the model refuses another.

Model args (each as in :func:`ridgefill.prefill`): ``model`` (a :func:`ridgefill.load_model` spec; default
the bundled SmolLM2), ``maps`` (a maps file; needed by modes ``ridge`` and ``centred``), ``split``, ``tail``,
``select`` (left out: :func:`ridgefill.prefill`'s default), ``mode`` (``ridge``, a baseline, or ``exact``),
``threads`` (torch CPU threads). Requests run one at a time (batch size 1).

- ``generate_until``: :func:`ridgefill.prefill`, then greedy :func:`ridgefill.generate_after` for
  ``max_gen_toks`` tokens, cut at the first end-of-sequence token and at the first ``until`` string.
- ``loglikelihood``: the continuation's rows must lie in the exact tail, where rows have logits
  (continuation tokens ``≤ tail``); a longer one is refused before any request runs.
- ``loglikelihood_rolling`` scores every token, and filled rows have no logits: refused.

A prompt is never truncated: one longer than the model's context (less the tokens to generate) is refused.
A prompt of at most ``tail`` tokens has every row in the tail, so it is prefilled exactly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from .. import defaults
from ..data.models import load_model, model_folder
from ..errors import InputError
from ..fill import MODES, generate_after, prefill, prefill_instrumented
from ..maps import RidgeMaps, load_maps

#: lm-eval's name for :class:`RidgeFillLM` (``--model ridgefill``).
NAME = "ridgefill"

_GREEDY_KEYS = {"until", "max_gen_toks", "do_sample", "temperature"}


def _as_int(value: Any, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).lstrip("-").isdigit():
        raise InputError(f"model arg {name}={value!r} must be an integer ≥ {lo}")
    if int(value) < lo:
        raise InputError(f"model arg {name}={value} must be ≥ {lo}")
    return int(value)


@register_model(NAME)
class RidgeFillLM(TemplateLM):
    """lm-eval's ``LM`` over :func:`ridgefill.prefill` and :func:`ridgefill.generate_after` (module docstring).

    Args:
        model: a :func:`ridgefill.load_model` spec (``"smollm2"``, ``"gemma3-270m"``, a Hugging Face folder or
            a ``.gguf`` file), or a loaded causal LM (then ``tokenizer`` is its tokenizer object).
        maps: a maps file or :class:`ridgefill.RidgeMaps`; required in modes ``ridge`` and ``centred``.
        split, tail, select, mode: as :func:`ridgefill.prefill`; ``select`` ``None`` keeps its default.
        tokenizer: the folder RULER's tasks tokenize with (must be the model's own folder), or the loaded
            model's tokenizer object.
        threads: torch CPU threads (``None``: torch's choice).
        max_length: the longest prompt plus generation (default: the model's ``max_position_embeddings``).
        batch_size: ``1`` only (requests run one at a time); device: ``cpu`` only.

    Raises:
        InputError: an unknown mode, a missing maps file, a bad integer, ``batch_size`` other than 1, or a
            ``tokenizer`` folder other than the model's; all checked before the model loads.
    """

    def __init__(self, model: str | torch.nn.Module = defaults.MODEL, maps: str | RidgeMaps | None = None, *,
                 split: int | str | None = None, tail: int | str = defaults.TAIL, select: str | None = None,
                 mode: str = "ridge", tokenizer: Any = None, threads: int | str | None = None,
                 batch_size: int | str = 1, max_length: int | str | None = None, device: str | None = None,
                 **unknown: Any) -> None:
        super().__init__()
        if unknown:
            raise InputError(f"unknown model args {sorted(unknown)}; RidgeFillLM takes model, maps, split, tail, "
                             "select, mode, tokenizer, threads, max_length, batch_size=1, device=cpu")
        if device not in (None, "cpu"):
            raise InputError(f"device={device!r}: RidgeFillLM runs the reference on the CPU; pass --device cpu "
                             "(lm-eval's command line defaults to cuda:0)")
        if mode not in MODES:
            raise InputError(f"model arg mode={mode!r} is not one of {', '.join(MODES)}")
        if str(batch_size) != "1":
            raise InputError(f"batch_size={batch_size}: RidgeFillLM runs one request at a time; use batch_size=1")
        self.mode = mode
        self.tail = _as_int(tail, "tail", 1)
        self.split = None if split is None else _as_int(split, "split", 0)
        self.select = None if select is None else str(select)
        if mode in ("ridge", "centred") and maps is None:
            raise InputError(f"mode={mode} needs maps: pass maps=<file> (`ridgefill calibrate --out FILE` "
                             "fits them), or mode=exact")
        if isinstance(maps, (str, os.PathLike)) and not Path(maps).is_file():
            raise InputError(f"maps file {str(maps)!r} does not exist; `ridgefill calibrate --out {maps}` fits it")
        if threads is not None:
            torch.set_num_threads(_as_int(threads, "threads", 1))
        if isinstance(model, torch.nn.Module):
            if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
                raise InputError("a loaded model needs its tokenizer object as tokenizer=")
            self.model, self.tokenizer, self.name = model, tokenizer, type(model).__name__
        else:
            folder = model_folder(model)
            if tokenizer is not None and Path(tokenizer).resolve() != Path(folder).resolve():
                raise InputError(f"tokenizer={tokenizer!r} is not the folder of model {model!r} ({folder}): "
                                 "RULER's prompts must be sized with the model's own tokenizer; pass "
                                 f"tokenizer=$(ridgefill convert --model {model})")
            self.model, self.tokenizer, self.name = load_model(model)
        self.maps = load_maps(maps) if isinstance(maps, (str, os.PathLike)) else maps
        config = self.model.config
        context = getattr(config, "max_position_embeddings", None)
        self.max_length = _as_int(max_length, "max_length", 2) if max_length is not None else context
        self.stats = {"requests": 0, "rows": 0, "exact_rows": 0, "selected_rows": 0}

    # --- lm-eval's interface -----------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return eos if eos is not None else self.model.config.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", self.name)).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids of ``string``; the tokenizer's own special tokens (Gemma's ``<bos>``) unless the string
        already starts with them (a chat template's output) or ``add_special_tokens`` says otherwise."""
        if add_special_tokens is None:
            bos = getattr(self.tokenizer, "bos_token", None)
            add_special_tokens = not (bos and string.startswith(bos))
        return self.tokenizer(string, add_special_tokens=add_special_tokens)["input_ids"]

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)

    def _prefill(self, ids: torch.Tensor, *, logits: str = "last"):
        """Prefill one ``[1, N]`` prompt with the configured settings (every row exact when ``N ≤ tail``)."""
        kwargs: dict[str, Any] = {"mode": self.mode, "split": self.split, "tail": min(self.tail, ids.shape[1])}
        if self.select is not None:
            kwargs["select"] = self.select
        if logits == "last":
            res = prefill(self.model, ids, self.maps, **kwargs)
        else:
            res = prefill_instrumented(self.model, ids, self.maps, logits=logits, **kwargs)
        self.stats["requests"] += 1
        self.stats["rows"] += ids.shape[1]
        self.stats["exact_rows"] += ids.shape[1] if self.mode == "exact" else res.exact_positions.numel()
        self.stats["selected_rows"] += 0 if res.selected is None else res.selected.numel()
        return res

    def _check_length(self, rows: int, new: int, what: str) -> None:
        if self.max_length is not None and rows + new > self.max_length:
            raise InputError(f"{what} has {rows} tokens and {new} to generate, more than the model's context of "
                             f"{self.max_length}; RidgeFillLM truncates nothing: use shorter prompts (RULER: lower "
                             "max_seq_lengths) or fewer max_gen_toks")

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy generation for each request's ``(context, gen_kwargs)``.

        Raises:
            InputError: sampling asked for (``do_sample`` true or ``temperature`` > 0), an unknown generation
                argument, or a prompt that does not fit the context (checked for every request first).
        """
        plans = []
        for req in requests:
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            unknown = set(gen_kwargs) - _GREEDY_KEYS
            if unknown:
                raise InputError(f"generation args {sorted(unknown)} are not supported: RidgeFillLM decodes greedily "
                                 "(until, max_gen_toks, do_sample=false, temperature=0)")
            if gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature") or 0) > 0:
                raise InputError("RidgeFillLM decodes greedily: set do_sample=false and temperature=0")
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            new = _as_int(gen_kwargs.get("max_gen_toks", 256), "max_gen_toks", 1)
            ids = self.tok_encode(context)
            if not ids:
                raise InputError("an empty prompt cannot be prefilled")
            self._check_length(len(ids), new, "a prompt")
            plans.append((ids, until, new))
        out = []
        stops = self._stop_ids()
        for ids, until, new in tqdm(plans, desc="ridgefill generate_until", disable=disable_tqdm):
            prompt = torch.tensor([ids], dtype=torch.long)
            tokens = generate_after(self.model, prompt, self._prefill(prompt), max_new_tokens=new)[0].tolist()
            end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
            text = self.tokenizer.decode(tokens[:end], skip_special_tokens=True)
            for s in until:
                if s and s in text:
                    text = text[:text.index(s)]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (self.tokenizer.decode(ids), {"until": until}), text)
        return out

    def _stop_ids(self) -> set[int]:
        ids = set()
        for source in (self.model.config, getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            ids.update([eos] if isinstance(eos, int) else list(eos or []))
        return ids

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``(Σ log p(continuation), greedy)`` for each request from the exact rows' logits.

        Raises:
            InputError: a continuation of more tokens than ``tail`` (its rows would be filled, without
                logits), or a context and continuation longer than the model's context; checked first.
        """
        for _, ctx, cont in requests:
            if self.mode != "exact" and len(cont) > self.tail:
                raise InputError(f"a continuation of {len(cont)} tokens is longer than tail={self.tail}: only the "
                                 "exact tail's rows have logits under the fill; raise tail to at least "
                                 f"{len(cont)} or use mode=exact")
            self._check_length(len(ctx) + len(cont) - 1, 0, "a context and continuation")
        out = []
        for _, ctx, cont in tqdm(requests, desc="ridgefill loglikelihood", disable=disable_tqdm):
            whole = (ctx + cont)[:-1]
            prompt = torch.tensor([whole], dtype=torch.long)
            if self.mode == "exact":  # exact prefill: the continuation's rows only, never the whole prompt's logits
                with torch.inference_mode():
                    rows = self.model(prompt, logits_to_keep=len(cont)).logits[0].float()
            else:  # the last exact rows are the tail's, in order
                rows = self._prefill(prompt, logits="exact").logits[0, -len(cont):].float()
            logp = torch.log_softmax(rows, dim=-1)
            target = torch.tensor(cont, dtype=torch.long)
            score = float(logp.gather(1, target[:, None]).sum())
            greedy = bool((rows.argmax(-1) == target).all())
            out.append((score, greedy))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Refused: a rolling log-likelihood scores every token, and filled rows have no logits.

        Raises:
            InputError: always.
        """
        raise InputError("loglikelihood_rolling (perplexity tasks) scores every token, and the fill's filled "
                         "rows have no logits; evaluate perplexity with lm-eval's hf model, or ridgefill's "
                         "own ΔNLL (`ridgefill eval loss`)")


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with ``ridgefill`` registered (``python -m ridgefill.evaluate.harness ...``)."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
