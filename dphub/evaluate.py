"""Scoring de-identification: how much PHI was caught, and how much text survived.

Every later claim (recall, precision, the privacy-utility curve) is measured here, so the metrics
follow established conventions:

* **token-binary** — the i2b2 scorer's view: tokens are runs of letters/digits; a token is PHI when
  it overlaps a span. Labels are ignored: for privacy, catching a name as a DATE still hides it.
* **entity strict / relaxed** per HIPAA category — strict needs identical offsets and category,
  relaxed any overlap with the same category; micro and macro averages, plus a label-agnostic
  variant.
* **gold-phrase recall** — *any-overlap* (a gold phrase counts as caught if any prediction touches
  it; this is how deid.pl reports recall) and *full-cover* (every letter/digit of the phrase is
  covered: the number that matters for leaks).
* **leaks** — gold phrases not fully covered (note id, offsets, category; text only on request).
* **utility** — corpus BLEU (sacrebleu) of the prediction-de-identified text against the
  gold-de-identified text (both rendered with ``[**CATEGORY**]`` markers), and the share of gold
  non-PHI tokens left untouched.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dphub import formats
from dphub.errors import DphubError, FormatError, InputError
from dphub.io import jsonl_lines
from dphub.labels import CATEGORIES, category_of
from dphub.notes import Note, Span

#: letters and digits (Unicode aware), as the i2b2 scorer tokenizes
TOKEN_RE = re.compile(r"[^\W_]+")


def _prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    p = tp / (tp + fp) if tp + fp else 1.0 if fn == 0 else 0.0
    r = tp / (tp + fn) if tp + fn else 1.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f, "tp": tp, "fp": fp, "fn": fn}


def _mask(spans: Iterable[Span], n: int) -> np.ndarray:
    m = np.zeros(n + 1, dtype=np.int32)
    for s in spans:
        m[max(0, s.start)] += 1
        m[min(n, s.end)] -= 1
    return np.cumsum(m[:n]) > 0


@dataclass
class Leak:
    """A gold phrase that predictions did not fully cover."""

    note_id: str
    start: int
    end: int
    category: str
    covered: float  # share of its letters/digits covered
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "note_id": self.note_id,
            "start": self.start,
            "end": self.end,
            "category": self.category,
            "covered": round(self.covered, 4),
        }
        if self.text is not None:
            d["text"] = self.text
        return d


@dataclass
class EvaluationResult:
    notes: int
    gold_phrases: int
    pred_spans: int
    token: dict[str, float]
    entity_strict: dict[str, Any]
    entity_relaxed: dict[str, Any]
    entity_binary: dict[str, dict[str, float]]
    phrase_recall: dict[str, Any]
    utility: dict[str, float]
    leaks: list[Leak] = field(default_factory=list)
    missing_predictions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "notes": self.notes,
            "gold_phrases": self.gold_phrases,
            "pred_spans": self.pred_spans,
            "missing_predictions": self.missing_predictions,
            "token": self.token,
            "entity_strict": self.entity_strict,
            "entity_relaxed": self.entity_relaxed,
            "entity_binary": self.entity_binary,
            "phrase_recall": self.phrase_recall,
            "utility": self.utility,
            "leaks": [leak.to_dict() for leak in self.leaks],
        }

    def headline(self) -> dict[str, float]:
        """The few numbers tables quote: token-binary P/R/F1 and phrase recall."""
        return {
            "precision": self.token["precision"],
            "recall": self.token["recall"],
            "f1": self.token["f1"],
            "phrase_recall_any": self.phrase_recall["any_overlap"],
            "phrase_recall_full": self.phrase_recall["full_cover"],
        }


def render_markers(text: str, spans: Sequence[Span]) -> str:
    """Replace each (merged) span with ``[**CATEGORY**]`` — the de-identified view BLEU compares."""
    out: list[str] = []
    pos = 0
    for s in sorted(spans, key=lambda s: (s.start, -s.end)):
        if s.start < pos:  # overlapping prediction: extend the previous replacement
            pos = max(pos, s.end)
            continue
        out.append(text[pos : s.start])
        out.append(f"[**{category_of(s.label)}**]")
        pos = s.end
    out.append(text[pos:])
    return "".join(out)


class _Counter:
    """Accumulates counts over notes so metrics are computed once at the end."""

    def __init__(self) -> None:
        self.tok = [0, 0, 0, 0]  # tp fp fn tn
        self.strict: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        self.relaxed: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        self.bin_strict = [0, 0, 0]
        self.bin_relaxed = [0, 0, 0]
        self.phr_total: dict[str, int] = defaultdict(int)
        self.phr_any: dict[str, int] = defaultdict(int)
        self.phr_full: dict[str, int] = defaultdict(int)
        self.hyp: list[str] = []
        self.ref: list[str] = []
        self.leaks: list[Leak] = []
        self.n_gold = 0
        self.n_pred = 0

    def add(self, note: Note, pred: Sequence[Span], show_leaks: bool) -> None:
        text = note.text
        n = len(text)
        gold = list(note.spans)
        pred = [s for s in pred if s.end > s.start]
        self.n_gold += len(gold)
        self.n_pred += len(pred)
        gmask = _mask(gold, n)
        pmask = _mask(pred, n)
        # token-binary
        bounds = [(m.start(), m.end()) for m in TOKEN_RE.finditer(text)]
        if bounds:
            gcs = np.concatenate([[0], np.cumsum(gmask)])
            pcs = np.concatenate([[0], np.cumsum(pmask)])
            b = np.array(bounds)
            g = (gcs[b[:, 1]] - gcs[b[:, 0]]) > 0
            p = (pcs[b[:, 1]] - pcs[b[:, 0]]) > 0
            self.tok[0] += int(np.sum(g & p))
            self.tok[1] += int(np.sum(~g & p))
            self.tok[2] += int(np.sum(g & ~p))
            self.tok[3] += int(np.sum(~g & ~p))
        # entities
        gcat = [(s.start, s.end, category_of(s.label)) for s in gold]
        pcat = [(s.start, s.end, category_of(s.label)) for s in pred]
        gset, pset = set(gcat), set(pcat)
        for c in CATEGORIES:
            gs = {x for x in gset if x[2] == c}
            ps = {x for x in pset if x[2] == c}
            tp = len(gs & ps)
            self.strict[c][0] += tp
            self.strict[c][1] += len(ps) - tp
            self.strict[c][2] += len(gs) - tp
            g_hit = sum(1 for a in gs if any(a[0] < b[1] and b[0] < a[1] for b in ps))
            p_hit = sum(1 for b in ps if any(a[0] < b[1] and b[0] < a[1] for a in gs))
            self.relaxed[c][0] += g_hit
            self.relaxed[c][1] += len(ps) - p_hit
            self.relaxed[c][2] += len(gs) - g_hit
        gpos = {(a, b) for a, b, _ in gcat}
        ppos = {(a, b) for a, b, _ in pcat}
        tp = len(gpos & ppos)
        self.bin_strict[0] += tp
        self.bin_strict[1] += len(ppos) - tp
        self.bin_strict[2] += len(gpos) - tp
        # phrase recall and leaks; relaxed binary counted from the masks
        pcs_all = np.concatenate([[0], np.cumsum(pmask)])
        gcs_all = np.concatenate([[0], np.cumsum(gmask)])
        for s in gold:
            c = category_of(s.label)
            self.phr_total[c] += 1
            hit = pcs_all[s.end] - pcs_all[s.start] > 0
            if hit:
                self.phr_any[c] += 1
            alnum = [m.span() for m in TOKEN_RE.finditer(text, s.start, s.end)]
            need = sum(e - b for b, e in alnum)
            got = sum(int(pcs_all[e] - pcs_all[b]) for b, e in alnum)
            if need == 0:
                need, got = s.end - s.start, int(pcs_all[s.end] - pcs_all[s.start])
            if got >= need:
                self.phr_full[c] += 1
            else:
                self.leaks.append(
                    Leak(note.id, s.start, s.end, c, got / need if need else 0.0,
                         text[s.start : s.end] if show_leaks else None)
                )
        self.bin_relaxed[0] += sum(
            1 for s in gold if pcs_all[s.end] - pcs_all[s.start] > 0
        )
        self.bin_relaxed[2] += sum(
            1 for s in gold if pcs_all[s.end] - pcs_all[s.start] == 0
        )
        self.bin_relaxed[1] += sum(
            1 for s in pred if gcs_all[min(n, s.end)] - gcs_all[max(0, s.start)] == 0
        )
        self.hyp.append(render_markers(text, pred))
        self.ref.append(render_markers(text, gold))

    def result(self, notes: int, missing: int) -> EvaluationResult:
        tp, fp, fn, tn = self.tok
        token = _prf(tp, fp, fn)
        token["tn"] = tn

        def table(counts: dict[str, list[int]]) -> dict[str, Any]:
            per = {c: _prf(*counts[c]) for c in CATEGORIES if sum(counts[c])}
            tot = [sum(counts[c][i] for c in CATEGORIES) for i in range(3)]
            micro = _prf(*tot)
            present = [v for c, v in per.items() if counts[c][0] + counts[c][2] > 0]
            macro = {
                k: float(np.mean([v[k] for v in present])) if present else 0.0
                for k in ("precision", "recall", "f1")
            }
            return {"micro": micro, "macro": macro, "per_category": per}

        total = sum(self.phr_total.values())
        phrase = {
            "phrases": total,
            "any_overlap": sum(self.phr_any.values()) / total if total else 1.0,
            "full_cover": sum(self.phr_full.values()) / total if total else 1.0,
            "per_category": {
                c: {
                    "phrases": self.phr_total[c],
                    "any_overlap": self.phr_any[c] / self.phr_total[c],
                    "full_cover": self.phr_full[c] / self.phr_total[c],
                }
                for c in CATEGORIES
                if self.phr_total[c]
            },
        }
        import sacrebleu

        bleu = sacrebleu.corpus_bleu(self.hyp, [self.ref]).score if self.hyp else 100.0
        kept = tn / (tn + fp) if tn + fp else 1.0
        return EvaluationResult(
            notes=notes,
            gold_phrases=self.n_gold,
            pred_spans=self.n_pred,
            token=token,
            entity_strict=table(self.strict),
            entity_relaxed=table(self.relaxed),
            entity_binary={
                "strict": _prf(*self.bin_strict),
                "relaxed": _prf(*self.bin_relaxed),
            },
            phrase_recall=phrase,
            utility={"bleu": bleu, "non_phi_tokens_kept": kept},
            leaks=self.leaks,
            missing_predictions=missing,
        )


def evaluate_spans(
    gold_notes: Iterable[Note],
    pred_spans_by_id: Mapping[str, Sequence[Span]],
    *,
    show_leaks: bool = False,
    ignore_extra: bool = False,
) -> EvaluationResult:
    """Score predicted spans (by note id) against gold notes.

    Gold notes without predictions count as all missed (``missing_predictions``); predictions for
    notes that are not in the gold set raise :class:`InputError` unless ``ignore_extra``.
    """
    counter = _Counter()
    seen: set[str] = set()
    missing = 0
    n = 0
    for note in gold_notes:
        if not note.labelled:
            raise InputError(f"note {note.id}: gold notes must be labelled (this one has no spans "
                             "annotation)")
        if note.id in seen:
            raise InputError(f"note {note.id}: duplicate note id in gold")
        seen.add(note.id)
        n += 1
        pred = pred_spans_by_id.get(note.id)
        if pred is None:
            missing += 1
            pred = []
        for s in pred:
            if s.end > len(note.text):
                raise InputError(
                    f"note {note.id}: a predicted span ends at {s.end}, beyond the gold note's "
                    f"{len(note.text)} characters (predictions for another version of the note?)"
                )
        counter.add(note, pred, show_leaks)
    extra = [k for k in pred_spans_by_id if k not in seen]
    if extra and not ignore_extra:
        raise InputError(
            f"{len(extra)} predicted note(s) have no gold counterpart (first: {extra[0]}); "
            "pass --ignore-extra to skip them"
        )
    if n == 0:
        raise InputError("no gold notes to evaluate")
    return counter.result(n, missing)


def evaluate(
    gold: Iterable[Note],
    pred: Mapping[str, Sequence[Span]] | Iterable[Note],
    **options: Any,
) -> EvaluationResult:
    """Score predictions given as a mapping note id -> spans, or as notes carrying spans."""
    if not isinstance(pred, Mapping):
        pred = {note.id: list(note.spans) for note in pred}
    return evaluate_spans(gold, pred, **options)


# ---------------------------------------------------------------------------- reading predictions
#: what ``dphub ... deid`` leaves next to its outputs (see :mod:`dphub.runner`); never predictions
_RUN_DIR = ".dphub-run"
_AUDIT = "audit.jsonl"

_NEED_SPANS = (
    "tagged, redacted or surrogate text cannot be scored (its offsets no longer match the "
    "notes): de-identify with `--mode spans` (e.g. `dphub ensemble deid NOTES --mode spans "
    "--out DIR`) and pass --pred DIR"
)


def looks_like_predictions(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a dphub deid output (a run directory, or span records without text):
    what ``--pred`` takes, never gold. Why: ``--gold``/``--pred`` swapped used to end in "cannot
    detect the corpus format", which does not say what is wrong."""
    p = Path(path)
    if p.is_dir():
        return (p / _AUDIT).is_file() or (p / _RUN_DIR).is_dir()
    if p.is_file() and _looks_like_jsonl(p):
        first = _first_record(p)
        return isinstance(first, dict) and "spans" in first and "text" not in first
    return False


def check_gold(path: str | os.PathLike[str], notes: Sequence[Note], *,
               pred: str | os.PathLike[str] | None = None) -> None:
    """Refuse gold that is not gold, saying when the two sides look swapped.

    ``notes`` were read from ``path``; with no note labelled, the gold side holds no annotations
    (the notes a model was run on, or a tagged output): if ``pred`` is a labelled corpus, the
    arguments are most likely the wrong way round.
    """
    if any(n.labelled for n in notes):
        return
    swapped = ""
    if pred is not None:
        try:
            swapped = (" (--pred holds annotations: are --gold and --pred swapped?)"
                       if looks_like_predictions(pred) or any(
                           n.labelled for n in formats.read(pred)) else "")
        except DphubError:
            swapped = ""
    raise InputError(f"{path}: --gold has no annotations (gold must be labelled notes){swapped}")


def read_predictions(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    text_path: str | os.PathLike[str] | None = None,
) -> dict[str, list[Span]]:
    """Predicted spans by note id from ``path``, or :class:`InputError` if it holds none.

    Accepted: dphub's own ``deid --mode spans`` output (``{"id", "spans"}`` JSONL records, no
    text) as a file or as the output directory of a run; any labelled corpus (a JSONL file with
    ``spans``, brat, i2b2, PhysioNet, deid.pl with ``text_path`` ...). Refused, with what to pass
    instead: text without span annotations (the tag / redact / surrogate outputs of a deid run,
    a directory of ``.txt``). Scoring those as "no spans" reported every metric as 0 and every
    phrase as a leak, with exit 0 (issue 16).
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if p.is_dir() and ((p / _AUDIT).is_file() or (p / _RUN_DIR).is_dir()):
        return _read_deid_output_dir(p)
    if p.is_file() and format in (None, "jsonl") and _looks_like_jsonl(p):
        first = _first_record(p)
        if isinstance(first, dict) and "spans" in first and "text" not in first:
            return _read_span_records([p])
        if isinstance(first, dict) and "text" in first and "spans" not in first:
            raise InputError(f"{p}: records have text but no spans; {_NEED_SPANS}")
    opts: dict[str, Any] = {}
    if text_path is not None:
        opts["text_path"] = text_path
    try:
        notes = list(formats.read(p, format=format, **opts))
    except FormatError as e:
        raise InputError(f"{e.message} (predictions must carry spans; {_NEED_SPANS})") from None
    if notes and not any(n.labelled or n.spans for n in notes):
        raise InputError(f"{p}: no span annotations in these predictions; {_NEED_SPANS}")
    return {n.id: list(n.spans) for n in notes}


def _looks_like_jsonl(path: Path) -> bool:
    return path.suffix.lower() in (".jsonl", ".ndjson", ".json")


def _first_record(path: Path) -> Any:
    """The first JSON record of a JSONL file (None when empty or not JSON)."""
    try:
        for _, line in jsonl_lines(path):  # "\n" only (never splitlines / text mode)
            if line.strip():
                return json.loads(line)
    except (OSError, InputError, ValueError, RecursionError):
        return None
    return None


def _deid_files(root: Path) -> Iterator[Path]:
    """Output files of a deid run: everything but the audit file and the run's bookkeeping."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != _RUN_DIR)
        for name in sorted(filenames):
            f = Path(dirpath) / name
            if f.parent == root and name == _AUDIT:
                continue
            yield f


def _read_deid_output_dir(root: Path) -> dict[str, list[Span]]:
    """A directory written by ``dphub deid`` / ``dphub ensemble deid``: spans or brat mode only."""
    files = list(_deid_files(root))
    if any(f.suffix == ".ann" for f in files):  # --mode brat: a brat corpus plus audit.jsonl

        return {n.id: list(n.spans) for n in formats.read(root, format="brat")}
    span_files: list[Path] = []
    for f in files:
        rec = _first_record(f) if f.suffix == ".jsonl" else None
        if not (isinstance(rec, dict) and "spans" in rec and "text" not in rec):
            raise InputError(
                f"{root}: a dphub deid output without spans ({f.relative_to(root)} holds text); "
                f"{_NEED_SPANS}"
            )
        span_files.append(f)
    if not span_files:
        raise InputError(f"{root}: a dphub deid output directory with no outputs in it")
    return _read_span_records(span_files)


def _read_span_records(files: Sequence[Path]) -> dict[str, list[Span]]:
    """``{"id", "spans": [{"start", "end", "label", ...}]}`` lines (the ``spans`` renderer)."""
    out: dict[str, list[Span]] = {}
    for f in files:
        try:  # "\n" only, streamed: ids may hold U+2028 or U+0085 raw (never splitlines)
            for lineno, line in jsonl_lines(f):
                if not line.strip():
                    continue
                where = f"{f} line {lineno}"
                try:
                    rec = json.loads(line)
                except (ValueError, RecursionError):
                    raise InputError(f"{where}: not valid JSON") from None
                if not (isinstance(rec, dict) and isinstance(rec.get("id"), str)
                        and isinstance(rec.get("spans"), list)):
                    raise InputError(f"{where}: a spans record needs an 'id' string and a "
                                     "'spans' list")
                if rec["id"] in out:
                    raise InputError(f"{where}: note {rec['id']} predicted twice")
                out[rec["id"]] = [_span(s, where) for s in rec["spans"]]
        except OSError as e:
            raise InputError(f"{f}: cannot read ({e.strerror})") from None
    return out


def _span(d: Any, where: str) -> Span:
    ok = (isinstance(d, dict) and isinstance(d.get("label"), str)
          and all(isinstance(d.get(k), int) and not isinstance(d.get(k), bool)
                  for k in ("start", "end")))
    if not ok or not 0 <= d["start"] < d["end"]:
        raise InputError(f"{where}: a span needs integer 0 <= start < end and a label string")
    score = d.get("score")
    return Span(d["start"], d["end"], d["label"],
                score=float(score) if isinstance(score, (int, float)) else None)
