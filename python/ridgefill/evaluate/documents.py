"""The evaluation documents (paper, "Evaluation"): every measurement that scores held-out text takes its
documents from here.

- :func:`evaluation_plan` / :func:`evaluation_documents`: documents of ``doc_tokens + 1`` tokens cut evenly
  from the given texts (the bundled held-out novels or the user's ``--text``), round-robin across texts;
  :func:`document_room` says how many fit.
- :func:`novel_documents`: the **novel** set, documents the model cannot have memorised
  (:func:`renamed_texts`): every recurring proper name of each book replaced, consistently within the
  book, by an invented name, each book rotated to start near its middle so the passages differ from the
  plain set's.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Mapping

import numpy as np
import torch
from torch import Tensor

from ..calibration import special_prefix
from ..errors import InputError

#: Capitalised words that are titles, headings or calendar words, never renamed.
_KEEP = frozenset({
    "mr", "mrs", "miss", "sir", "lady", "lord", "dr", "captain", "colonel", "admiral", "chapter", "volume",
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "january", "february",
    "march", "april", "may", "june", "july", "august", "september", "october", "november", "december",
    "christmas", "michaelmas", "easter", "god", "heaven", "english", "the", "end"})
_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "pr", "r", "s", "st",
           "t", "tr", "v", "z", "th", "sk")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "x", "v")


def evaluation_documents(tokenizer, texts: dict[str, str], docs: int, doc_tokens: int) -> list[torch.Tensor]:
    """``docs`` documents of ``doc_tokens + 1`` tokens: the tokenizer's special prefix
    (:func:`ridgefill.calibration.special_prefix`, Gemma's ``<bos>``; none for SmolLM2), then consecutive
    text tokens, evenly spaced over the given texts (round-robin across texts). Raises
    :class:`InputError` if a text is too short for its share (nothing is truncated). See
    :func:`evaluation_plan` for where each document comes from."""
    return evaluation_plan(tokenizer, texts, docs, doc_tokens)[0]


def evaluation_plan(tokenizer, texts: dict[str, str], docs: int, doc_tokens: int
                    ) -> tuple[list[torch.Tensor], list[str]]:
    """:func:`evaluation_documents` and a label for each document naming its text and token span
    (``"document 2 ('notes.txt', tokens 2048-4096)"``), for messages.

    Raises:
        InputError: no text, ``docs < 1``, or a text with room for fewer documents than its share
            (the message names the text, its length and what to change).
    """
    if not texts:
        raise InputError("no evaluation text: give at least one text")
    if docs < 1:
        raise InputError(f"--docs {docs} must be at least 1")
    bos = torch.tensor(special_prefix(tokenizer), dtype=torch.long)
    names = list(texts)
    streams = [torch.tensor(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts.values()]
    need = doc_tokens + 1 - bos.numel()
    rooms = [ids.numel() // need for ids in streams]
    per = [0] * len(streams)
    for i in range(docs):  # round-robin over the texts, skipping a text once it is full (when another has room)
        j = next((k % len(streams) for k in range(i, i + len(streams)) if per[k % len(streams)] < rooms[k % len(streams)]),
                 i % len(streams))
        per[j] += 1
    out: list[list[tuple[torch.Tensor, str]]] = []
    for name, ids, k in zip(names, streams, per):
        room = ids.numel() // need
        if k > room:
            share = "" if len(streams) == 1 else " (documents are spread round-robin over the texts with room)"
            raise InputError(f"the evaluation text {name!r} has {ids.numel()} tokens: room for {room} documents "
                             f"of {need} tokens but {k} were asked of it{share}; lower --docs or --doc-tokens, "
                             "or give a longer text")
        starts = torch.linspace(0, ids.numel() - need, k).long().tolist() if k else []
        out.append([(torch.cat([bos, ids[s: s + need]]), f"{name!r}, tokens {s}-{s + need}") for s in starts])
    pairs = [d for j in range(max(per)) for lst in out if j < len(lst) for d in [lst[j]]]
    return [d for d, _ in pairs], [f"document {i + 1} ({where})" for i, (_, where) in enumerate(pairs)]


def document_room(tokenizer, texts: dict[str, str], doc_tokens: int) -> int:
    """How many documents of ``doc_tokens + 1`` tokens (:func:`evaluation_plan`) the texts hold in all,
    each within one text."""
    need = doc_tokens + 1 - len(special_prefix(tokenizer))
    return sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) // need for text in texts.values())



def invented_names(count: int, seed: int, avoid: set[str] = frozenset()) -> list[str]:
    """``count`` distinct pronounceable invented names (2-3 syllables, capitalised), seeded, none of
    whose lowercase forms is in ``avoid``."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    seen = set(avoid)
    while len(out) < count:
        syl = int(rng.integers(2, 4))
        name = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                       + (_CODAS[rng.integers(len(_CODAS))] if k == syl - 1 else "") for k in range(syl))
        if name not in seen and 4 <= len(name) <= 10:
            seen.add(name)
            out.append(name.capitalize())
    return out


def proper_names(text: str, min_count: int = 8) -> list[str]:
    """Recurring proper names of ``text``: capitalised words (3+ letters, not all caps) seen at least
    ``min_count`` times whose lowercase form is at most 2 % as frequent, minus titles and calendar
    words. Most frequent first."""
    words = re.findall(r"[A-Za-z]+", text)
    cap = Counter(w for w in words if w[0].isupper() and len(w) >= 3 and not w.isupper())
    low = Counter(w.lower() for w in words if w[0].islower())
    return [w for w, c in cap.most_common() if c >= min_count and low[w.lower()] <= 0.02 * c
            and w.lower() not in _KEEP]


def renamed_texts(texts: Mapping[str, str], *, seed: int = 0, min_count: int = 8) -> tuple[dict[str, str], dict]:
    """Replace every recurring proper name (:func:`proper_names`) by an invented one, consistently
    within each book (a plural ``Names`` follows its ``Name``).

    Returns:
        ``({title: renamed text}, {title: {name: invented}})``.
    """
    out, mappings = {}, {}
    for i, (title, text) in enumerate(texts.items()):
        names = proper_names(text, min_count)
        vocab = {w.lower() for w in re.findall(r"[A-Za-z]+", text)}
        fake = iter(invented_names(len(names), seed * 1000 + i, vocab))
        mapping: dict[str, str] = {}
        for name in sorted(names, key=len):  # stems before their plurals
            if name.endswith("s") and name[:-1] in mapping:
                mapping[name] = mapping[name[:-1]] + "s"
            else:
                mapping[name] = next(fake)
        if mapping:
            pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
            text = pattern.sub(lambda m: mapping[m.group(1)], text)
        out[title] = text
        mappings[title] = mapping
    return out, mappings


def novel_documents(tokenizer, texts: Mapping[str, str], docs: int, doc_tokens: int, *,
                    seed: int = 0) -> tuple[list[Tensor], dict]:
    """Novel-text documents: :func:`renamed_texts`, each book rotated to start at the paragraph
    nearest its middle (so the passages differ from the plain set's, which starts at the beginning),
    then cut like :func:`evaluation_documents`.

    Returns:
        ``(documents [doc_tokens + 1] int64 each, {title: {name: invented}})``.
    """
    renamed, mappings = renamed_texts(texts, seed=seed)
    rotated = {}
    for title, text in renamed.items():
        mid = text.find("\n\n", len(text) // 2)
        mid = len(text) // 2 if mid < 0 else mid + 2
        rotated[title] = text[mid:] + "\n\n" + text[:mid]
    return evaluation_documents(tokenizer, rotated, docs, doc_tokens), mappings


