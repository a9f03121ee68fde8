"""The exact certificates committed in ``KvaLean/CertExamples.lean``, which the CI Lean step checks.

Regenerate the file with ``python -m crossval.lean_certs`` (after a change to the checker's format or
to the instances below); ``test_certificates.py::test_committed_lean_certificates`` fails when the
committed file is not what this module produces. The instances:

- two from rational data drawn from a fixed seed (``m = 8, d = 4, p = 1`` and ``m = 6, d = 3, p = 2``);
- one tiny slice of real calibration statistics (:mod:`crossval.real`): the leading 4 × 4 block of the
  centred Gram and a 4 × 2 block of the cross term of the last layer, in data form and rounded to
  thousandths (:func:`ridgefill.certify.instance_from_stats`);
- two wrong certificates (one entry of ``W`` moved by 1/1000), which the kernel must reject.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

from ridgefill import RidgeMaps
from ridgefill.certify import (
    ExactInstance,
    export_lean_certificate,
    instance_from_stats,
    perturbed,
    solved_instance,
)

from crossval.real import REAL
from crossval.registry import LEAN_DIR

LEAN_FILE = LEAN_DIR / "CertExamples.lean"
SEED = 20261129
#: Which late layer of the real maps is sliced, and the slice's size.
SLICE = {"index": -1, "dims": 4, "outputs": 2}


def data_instances() -> list[ExactInstance]:
    """Rational instances from a fixed seed: small integers and halves/quarters."""
    rng = random.Random(SEED)

    def q() -> Fraction:
        return Fraction(rng.randint(-9, 9), rng.choice([1, 2, 4]))

    out = []
    for name, (m, d, p), lam in (("dataA", (8, 4, 1), Fraction(1, 2)), ("dataB", (6, 3, 2), Fraction(3))):
        x = [[q() for _ in range(d)] for _ in range(m)]
        y = [[q() for _ in range(p)] for _ in range(m)]
        out.append(solved_instance(name, x, y, lam, source=f"Rational data from seed {SEED}: m = {m}, d = {d}, "
                                                            f"p = {p}, λ = {lam}."))
    return out


def stats_instance(maps: RidgeMaps) -> ExactInstance:
    """The slice of the real statistics (see module docstring)."""
    index = SLICE["index"] % len(maps.lambdas)
    layer = maps.split + 1 + index
    return instance_from_stats(
        "statsLast", maps.stats, index, maps.lambdas[index], dims=SLICE["dims"], outputs=SLICE["outputs"],
        source=(f"Real statistics: SmolLM2-135M-Instruct calibrated on the first {REAL['chars']} characters of "
                f"{REAL['book']} ({REAL['tokens']} tokens, chunks of {REAL['chunk']}, split {maps.split}, λ "
                f"{REAL['lam']}); layer {layer}: leading {SLICE['dims']}×{SLICE['dims']} Gram block and "
                f"{SLICE['dims']}×{SLICE['outputs']} cross block over max diag, as X = R (G = RᵀR), Y = R⁻ᵀB, "
                "rounded to thousandths."))


def build(maps: RidgeMaps) -> tuple[list[ExactInstance], list[ExactInstance]]:
    """``(instances, wrong)`` for the committed file."""
    good = data_instances() + [stats_instance(maps)]
    wrong = [perturbed(good[0], "dataAWrong"), perturbed(good[-1], "statsLastWrong")]
    return good, wrong


HEADER = "Regenerate with `python -m crossval.lean_certs` (see `crossval/README.md`)."

_WHERE = re.compile(r"^(?:@\[expose\] )?def (\w+) : RidgeInstance where\n((?:[ \t]+\S.*\n?)+)", re.MULTILINE)
_WITH = re.compile(r"^(?:@\[expose\] )?def (\w+) : RidgeInstance :=\s*\{\s*(\w+) with ((?:[^{}]|\n)*?)\}", re.MULTILINE)
_DOC = re.compile(r"/--\s*((?:(?!-/).)*?)\s*-/\s*$", re.DOTALL)
_Q = re.compile(r"-?\d+(?:/\d+)?")


def _matrix(s: str) -> list[list[Fraction]]:
    return [[Fraction(v) for v in _Q.findall(row)] for row in re.findall(r"\[([^\[\]]*)\]", s)]


def _fields(body: str) -> dict[str, str]:
    """``name := value`` pairs of a structure body (values may continue on further lines)."""
    return dict(re.findall(r"(?:^|\n|,)\s*(\w+)\s*:=\s*((?:(?!\n\s*\w+\s*:=)(?!,\s*\w+\s*:=)[\s\S])*)", body))


def lean_instances(text: str) -> dict[str, ExactInstance]:
    """Every ``RidgeInstance`` defined in a Lean source: ``def N : RidgeInstance where`` with its fields,
    or ``def N : RidgeInstance := { M with field := value, … }``; the docstring before a ``where``
    definition becomes ``source``."""
    out: dict[str, ExactInstance] = {}
    for m in _WHERE.finditer(text):
        doc = _DOC.search(text[: m.start()].rstrip()[-2000:] + "\n")
        f = _fields(m.group(2))
        out[m.group(1)] = ExactInstance(m.group(1), _matrix(f["X"]), _matrix(f["Y"]), _matrix(f["W0"]),
                                        Fraction(f["lam"].strip()), _matrix(f["W"]),
                                        " ".join(doc.group(1).split()) if doc else "")
    for m in _WITH.finditer(text):
        base, f = out[m.group(2)], _fields(m.group(3))
        out[m.group(1)] = ExactInstance(
            m.group(1), _matrix(f["X"]) if "X" in f else base.x, _matrix(f["Y"]) if "Y" in f else base.y,
            _matrix(f["W0"]) if "W0" in f else base.prior, Fraction(f["lam"].strip()) if "lam" in f else base.lam,
            _matrix(f["W"]) if "W" in f else base.weight, base.source)
    return out


def parse_lean_certificates(text: str) -> tuple[list[ExactInstance], list[ExactInstance]]:
    """The instances of a file written by :func:`ridgefill.certify.export_lean_certificate`:
    ``(accepted, wrong)``, from its ``check = true`` and ``check = false`` theorems."""
    defs = lean_instances(text)
    accepted = [a or b for a, b in re.findall(r"have h : (\w+)\.check = true|^  (\w+)\.optimal_of_check \(by", text,
                                              re.MULTILINE)]
    wrong = re.findall(r"^theorem \w+ : (\w+)\.check = false", text, re.MULTILINE)
    return [defs[n] for n in accepted], [defs[n] for n in wrong]


def main() -> None:
    from crossval.real import real_maps

    good, wrong = build(real_maps())
    path = export_lean_certificate(good, LEAN_FILE, wrong=wrong, header=HEADER)
    print(f"wrote {path}: {len(good)} certificates, {len(wrong)} wrong ones")


if __name__ == "__main__":
    main()
