"""``ridgefill report``: the JSON of ``ridgefill eval ...`` as a markdown report with PNG plots.

Each input file's ``kind`` (``needle``, ``loss``, ``splice``, ``depth``) picks its section; tables give
ΔNLL vs exact in nats/token with 95 % bootstrap intervals (over documents) and needle scores in
percent with 95 % Wilson intervals. Plots are written beside ``report.md`` (matplotlib, Agg backend);
every file is written atomically.
"""

from __future__ import annotations

import io

import json
import lzma
import re
import shlex
from pathlib import Path
from typing import Sequence

from ..errors import InputError
from ..fileio import atomic_write

MODE_NAMES = {"ridge": "RidgeFill", "identity": "Identity", "none": "No fill", "exact": "Exact"}
SPLICE_NAMES = {"fill": "fill (no splice)", "k": "exact K", "v": "exact V", "kv": "exact K and V",
                "k_scale": "exact K scale (norm per row/head)", "k_direction": "exact K direction (fill's norm)",
                "state": "exact recurrent state"}


def load_reports(paths: Sequence[str | Path]) -> list[dict]:
    """Read eval JSON files (plain, or xz-compressed with a ``.xz`` suffix). Raises :class:`InputError`
    for a missing, unreadable or foreign file."""
    out = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise InputError(f"report input {p} does not exist")
        try:
            raw = lzma.decompress(p.read_bytes()) if p.suffix == ".xz" else p.read_bytes()
            data = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, lzma.LZMAError) as e:
            raise InputError(f"report input {p} is not readable JSON ({e})") from None
        if not isinstance(data, dict) or data.get("kind") not in ("needle", "loss", "splice", "depth"):
            raise InputError(f"report input {p} is not the output of `ridgefill eval` (no kind needle/loss/splice/depth)")
        data["_path"] = p.name
        out.append(data)
    return out


def fmt_delta(d: dict) -> str:
    """``+0.123 [+0.050, +0.200]`` from an estimate dict (nats/token)."""
    lo, hi = d["ci"]
    return f"{d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def fmt_score(row: dict) -> str:
    lo, hi = row["ci"]
    return f"{row['score']:.0f} [{lo:.0f}, {hi:.0f}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _savefig(fig, path: Path) -> None:
    buf = io.BytesIO()  # the image's bytes first: the write then knows the room it needs
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write(path, buf.getvalue())


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _system_name(system: str) -> str:
    if system == "exact":
        return "Exact"
    split, mode = system.split("/", 1)
    return f"{MODE_NAMES.get(mode, mode)} S={split}"


def _loss_row(summary: list[dict], set_: str, tokens: str, variant: str) -> dict | None:
    for r in summary:
        if r["set"] == set_ and r["tokens"] == tokens and r["variant"] == variant:
            return r
    return None


def _provenance(rep: dict) -> str:
    wall = rep.get("wall_seconds")
    return (f"Model {rep['model']} ({rep['num_layers']} layers); from `{rep['_path']}`; command "
            f"`ridgefill {rep.get('_command') or shlex.join(rep.get('argv', []))}`; wall time {wall / 60:.1f} min"
            + (f" (load average {rep['load_average_start'][0]:.1f} at start)" if rep.get("load_average_start") else "")
            + ".")


def _loss_context(rep: dict) -> str:
    kt = rep.get("key_tokens", {})
    parts = [f"{k}: {v['key_tokens']} key of {v['tokens']} tokens in {v['documents']} documents"
             for k, v in kt.items()]
    return (f"Documents of {rep['doc_tokens']} tokens, exact tail {rep['tail']} rows (the scored tokens). Key "
            f"tokens: exact NLL with the full prefix lower by ≥ τ = {rep['tau']} nats than with a local window "
            f"of {rep['local_context'][0]}-{rep['local_context'][1]} tokens ({'; '.join(parts)}). "
            "Novel set: evaluation books with every recurring proper name replaced by an invented one.")


def _needle_section(rep: dict, out: Path, stem: str) -> str:
    plt = _plt()
    lines = [f"### Needle retrieval by context length: {rep['model']}", "", _provenance(rep), "",
             f"Needle inside the filled rows (all {sum(t['needle_in_filled_rows'] for t in rep['trials'])} of "
             f"{len(rep['trials'])} trials checked), question in the exact tail of {rep['tail']} rows; "
             f"{'chat template' if rep.get('chat') else 'plain prompt'}; score = string match × 100, "
             f"{rep['trials_per_cell']} trials per cell, 95 % Wilson intervals.", ""]
    scores = rep["scores"]
    systems = list(dict.fromkeys(r["system"] for r in scores))
    variants = list(dict.fromkeys(r["variant"] for r in scores))
    fig, axes = plt.subplots(1, len(variants), figsize=(5 * len(variants), 3.6), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        lengths = sorted({r["length"] for r in scores if r["variant"] == variant})
        rows = []
        for n in lengths:
            cells = {r["system"]: r for r in scores if r["variant"] == variant and r["length"] == n}
            rows.append([str(n)] + [fmt_score(cells[s]) if s in cells else "" for s in systems])
        lines += [f"**{variant}**", "", _table(["tokens"] + [_system_name(s) for s in systems], rows), ""]
        for s in systems:
            pts = [(r["length"], r["score"]) for r in scores if r["variant"] == variant and r["system"] == s]
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=_system_name(s))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context tokens")
        ax.set_ylabel("score (%)")
        ax.set_ylim(-5, 105)
        ax.set_title(f"{rep['model']}: {variant}")
    axes[0][-1].legend(fontsize=8)
    _savefig(fig, out / f"{stem}.png")
    plt.close(fig)
    lines += [f"![needle scores]({stem}.png)", ""]
    return "\n".join(lines)


def variant_label(variant: str) -> str:
    """``"15/ridge+k_scale"`` -> ``"S=15 RidgeFill + exact K scale (norm per row/head)"``."""
    split, rest = variant.split("/", 1)
    lam = ""
    if "@lam×" in rest:
        rest, factor = rest.split("@lam×", 1)
        lam = f", λ × {factor}"
    mode, _, comp = rest.partition("+")
    label = f"S={split} {MODE_NAMES.get(mode, mode)}{lam}"
    if comp == "kscale":
        return label + " + fitted key-scale correction"
    if comp:
        return label + " + " + SPLICE_NAMES.get(comp, comp) if comp != "fill" else label
    return label


def _loss_section(rep: dict, title: str) -> str:
    summary = rep["summary"]
    variants = list(dict.fromkeys(r["variant"] for r in summary))
    lines = [f"### {title}: {rep['model']}", "", _provenance(rep), "", _loss_context(rep), "",
             "ΔNLL vs exact, nats/token, 95 % bootstrap CI over documents:", ""]
    cols = [("plain", "all"), ("plain", "key"), ("novel", "all"), ("novel", "key"), ("all", "key")]
    cols = [c for c in cols if any(r["set"] == c[0] and r["tokens"] == c[1] for r in summary)]
    rows = []
    for v in variants:
        label = variant_label(v)
        cells = []
        for s, t in cols:
            r = _loss_row(summary, s, t, v)
            cells.append(fmt_delta(r["delta_nll"]) if r else "")
        rows.append([label] + cells)
    lines += [_table(["variant"] + [f"{s} / {t} tokens" for s, t in cols], rows), ""]
    return "\n".join(lines)


def _depth_section(rep: dict, out: Path, stem: str) -> str:
    plt = _plt()
    loss, needles = rep["loss"], rep.get("needles")
    summary = loss["summary"]
    modes = [m for m in rep["modes"] if m != "exact"]
    fake = dict(rep, summary=summary, key_tokens=loss["key_tokens"])
    lines = [f"### Depth table: {rep['model']}", "", _provenance(rep), "", _loss_context(fake), ""]
    for set_, tokens, what in (("all", "key", "Key-token ΔNLL vs exact (all documents)"),
                               ("plain", "key", "Key-token ΔNLL, plain documents"),
                               ("novel", "key", "Key-token ΔNLL, novel-text documents"),
                               ("novel", "all", "Novel-text ΔNLL (all tokens of the novel documents)"),
                               ("plain", "all", "ΔNLL on all exact-row tokens, plain documents")):
        if not any(r["set"] == set_ and r["tokens"] == tokens for r in summary):
            continue
        rows = []
        for d, s in zip(rep["depths"], rep["splits"]):
            cells = []
            for m in modes:
                r = _loss_row(summary, set_, tokens, f"{s}/{m}")
                cells.append(fmt_delta(r["delta_nll"]) if r else "")
            rows.append([d, str(s)] + cells)
        lines += [f"**{what}** (nats/token, 95 % CI)", "",
                  _table(["depth", "S"] + [MODE_NAMES.get(m, m) for m in modes], rows), ""]
    fig, axes = plt.subplots(1, 2 if needles else 1, figsize=(10 if needles else 5, 3.6), squeeze=False)
    ax = axes[0][0]
    x = [eval_fraction(d) for d in rep["depths"]]
    for k, m in enumerate(modes):
        ys, lo, hi = [], [], []
        for s in rep["splits"]:
            r = _loss_row(summary, "all", "key", f"{s}/{m}") or _loss_row(summary, "plain", "key", f"{s}/{m}") \
                or _loss_row(summary, "novel", "key", f"{s}/{m}")
            d = r["delta_nll"] if r else {"mean": float("nan"), "ci": [float("nan")] * 2}
            ys.append(d["mean"])
            lo.append(d["mean"] - d["ci"][0])
            hi.append(d["ci"][1] - d["mean"])
        ax.errorbar([v + 0.006 * (k - 1) for v in x], ys, yerr=[lo, hi], marker="o", capsize=3,
                    label=MODE_NAMES.get(m, m))
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("split depth S/L")
    ax.set_ylabel("key-token ΔNLL vs exact (nats)")
    ax.set_title(f"{rep['model']}: key-token ΔNLL")
    ax.legend(fontsize=8)
    if needles:
        rows = []
        nscores = needles["scores"]
        for d, s in zip(rep["depths"], rep["splits"]):
            cells = []
            for m in modes:
                r = next((r for r in nscores if r["system"] == f"{s}/{m}"), None)
                cells.append(fmt_score(r) if r else "")
            rows.append([d, str(s)] + cells)
        ex = next((r for r in nscores if r["system"] == "exact"), None)
        ntr = needles["trials"]
        lines += [f"**Filled-region single-needle score** ({rep['needle_length']} tokens, tail {rep['needle_tail']}, "
                  f"{len(ntr)} trials per cell, needle depth {min(t['depth'] for t in ntr):.2f}-"
                  f"{max(t['depth'] for t in ntr):.2f} of the filled rows, all inside them: "
                  f"{all(t['needle_in_filled_rows'] for t in ntr)}; exact: {fmt_score(ex) if ex else 'n/a'}; "
                  "percent, 95 % Wilson CI)", "",
                  _table(["depth", "S"] + [MODE_NAMES.get(m, m) for m in modes], rows), ""]
        ax = axes[0][1]
        for m in modes:
            ys = [next((r["score"] for r in nscores if r["system"] == f"{s}/{m}"), float("nan")) for s in rep["splits"]]
            ax.plot(x, ys, marker="o", label=MODE_NAMES.get(m, m))
        if ex:
            ax.axhline(ex["score"], color="black", ls="--", lw=0.8, label="Exact")
        ax.set_ylim(-5, 105)
        ax.set_xlabel("split depth S/L")
        ax.set_ylabel("needle score (%)")
        ax.set_title(f"filled-region needle, {rep['needle_length']} tokens")
        ax.legend(fontsize=8)
    _savefig(fig, out / f"{stem}.png")
    plt.close(fig)
    lines += [f"![depth]({stem}.png)", ""]
    return "\n".join(lines)


def eval_fraction(text: str) -> float:
    from fractions import Fraction

    return float(Fraction(text))


def _splice_section(rep: dict, out: Path, stem: str) -> str:
    plt = _plt()
    text = _loss_section(rep, f"Splice tests (mode {rep['mode']})")
    summary = rep["summary"]
    set_ = "all" if any(r["set"] == "all" for r in summary) else summary[0]["set"]
    lines = [text, f"Share of the fill's ΔNLL removed by each splice ({set_} documents):", ""]
    rows = []
    others = [c for c in rep["components"] if c != "fill"]
    extra = list(dict.fromkeys(r["variant"].split("/", 1)[1] for r in summary
                               if "+" not in r["variant"] or r["variant"].endswith("+kscale")))
    for s in rep["splits"]:
        for tokens in ("all", "key"):
            base = _loss_row(summary, set_, tokens, f"{s}/{rep['mode']}+fill")
            if not base or abs(base["delta_nll"]["mean"]) < 1e-12:
                continue
            cells = []
            for name in [f"{rep['mode']}+{c}" for c in others] + extra:
                r = _loss_row(summary, set_, tokens, f"{s}/{name}")
                cells.append(f"{100 * (1 - r['delta_nll']['mean'] / base['delta_nll']['mean']):.0f} %" if r else "")
            rows.append([str(s), tokens] + cells)
    heads = [SPLICE_NAMES.get(c, c) for c in others] + [variant_label(f"0/{e}")[4:] for e in extra]
    lines += [_table(["S", "tokens"] + heads, rows), ""]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    width = 0.8 / max(1, len(rep["splits"]))
    for k, s in enumerate(rep["splits"]):
        ys, err = [], [[], []]
        for c in rep["components"]:
            r = _loss_row(summary, set_, "key", f"{s}/{rep['mode']}+{c}")
            d = r["delta_nll"] if r else {"mean": float("nan"), "ci": [float("nan")] * 2}
            ys.append(d["mean"])
            err[0].append(d["mean"] - d["ci"][0])
            err[1].append(d["ci"][1] - d["mean"])
        ax.bar([i + k * width for i in range(len(ys))], ys, width, yerr=err, capsize=2, label=f"S={s}")
    ax.set_xticks([i + width * (len(rep["splits"]) - 1) / 2 for i in range(len(rep["components"]))])
    ax.set_xticklabels(rep["components"], rotation=20)
    ax.set_ylabel("key-token ΔNLL vs exact (nats)")
    ax.set_title(f"{rep['model']}: splice tests")
    ax.legend(fontsize=8)
    _savefig(fig, out / f"{stem}.png")
    plt.close(fig)
    lines += [f"![splice]({stem}.png)", ""]
    lines += _state_error_lines(rep)
    return "\n".join(lines)


def _state_error_lines(rep: dict) -> list[str]:
    """The hybrid models' table: the filled recurrent state's relative error per late recurrent layer."""
    errs = rep.get("state_errors")
    if not errs:
        return []
    lines = ["Filled vs exact recurrent state in the late linear-attention layers (relative Frobenius error "
             "‖S_fill − S_exact‖ / ‖S_exact‖, mean over documents): after the filled rows (the state the exact "
             "rows start from) and at the end of the prompt (the state handed to decoding).", ""]
    rows = []
    keys = ("conv_after_filled", "recurrent_after_filled", "conv_prompt_end", "recurrent_prompt_end")
    for s, layers in errs.items():
        for layer, e in layers.items():
            rows.append([s, layer] + [f"{e[k]['mean']:.3g}" if k in e else "" for k in keys])
    heads = ["S", "layer", "conv, after filled", "delta-rule, after filled", "conv, prompt end",
             "delta-rule, prompt end"]
    return lines + [_table(heads, rows), ""]


def merge_needle_reports(reps: list[dict]) -> list[dict]:
    """Needle reports of the same model (e.g. short lengths with more trials, long ones with fewer)
    become one section when their lengths do not overlap: their trials are pooled and re-summarised
    per variant × length × system. Other reports pass through in order."""
    from .needles import summarise_needles

    out, first = [], {}
    for rep in reps:
        if rep["kind"] != "needle":
            out.append(rep)
            continue
        key = (rep["model"], bool(rep.get("chat")), rep.get("tail"))
        if key in first and set(rep.get("lengths", [])) & {t["length"] for t in first[key]["trials"]}:
            out.append(rep)  # the same lengths again (same seeded prompts): a section of its own
            continue
        if key not in first:
            first[key] = dict(rep, trials=list(rep["trials"]), _merged=[rep])
            out.append(first[key])
            continue
        m = first[key]
        m["trials"] += rep["trials"]
        m["_merged"].append(rep)
    for rep in first.values():
        parts = rep.pop("_merged")
        if len(parts) > 1:
            rep["scores"] = summarise_needles(rep["trials"])
            rep["_path"] = " + ".join(p["_path"] for p in parts)
            rep["_command"] = " ; ridgefill ".join(shlex.join(p.get("argv", [])) for p in parts)
            rep["wall_seconds"] = sum(p.get("wall_seconds", 0.0) for p in parts)
            counts = sorted({p["trials_per_cell"] for p in parts})
            rep["trials_per_cell"] = "/".join(map(str, counts))
    return out


def write_report(inputs: Sequence[str | Path], out: str | Path) -> Path:
    """Write ``<out>/report.md`` and its PNGs from eval JSON files; returns the markdown path.

    Raises:
        InputError: an input is missing or not eval JSON.
    """
    reps = load_reports(inputs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    parts = ["# RidgeFill evaluation report", "",
             "ΔNLL: mean of NLL(mode) − NLL(exact) in nats/token over the exact tail's tokens, 95 % percentile "
             "bootstrap interval over documents. Needle scores: percent, 95 % Wilson interval.", ""]
    reps = merge_needle_reports(reps)
    for i, rep in enumerate(reps):
        name = rep["_path"].split(" + ")[0].removesuffix(".xz").removesuffix(".json")
        stem = f"{i:02d}-{rep['kind']}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}"
        if rep["kind"] == "needle":
            parts.append(_needle_section(rep, out, stem))
        elif rep["kind"] == "loss":
            parts.append(_loss_section(rep, "Loss on context-dependent tokens"))
        elif rep["kind"] == "splice":
            parts.append(_splice_section(rep, out, stem))
        else:
            parts.append(_depth_section(rep, out, stem))
    text = "\n".join(parts) + "\n"
    path = out / "report.md"
    atomic_write(path, text.encode("utf-8"))
    return path
