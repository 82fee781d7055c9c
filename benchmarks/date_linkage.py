"""The date linkage attack on surrogate dates, and what DP dates cost (issue 28).

Usage::

    python benchmarks/date_linkage.py CORPUS [--format physionet] [--epsilons 0.5,1,2,5]
        [--keys 5] [--seed 0] [--json OUT.json]

The attacker (Tchouka, Couchot, Laiymani 2023) knows the true dates of each patient's notes (the
corpus's gold DATE spans) and holds the de-identified notes of every patient. For each target
patient it computes the patient's sequence of intervals between consecutive distinct dates, and
links the patient to the de-identified record (one per patient: the dates found in its notes)
whose interval sequence is nearest (an alignment distance on the intervals in days: matched
intervals cost their difference, unmatched ones their length; ties split evenly). The re-identification rate is the share of targets — patients with at least 3 dated
notes — linked to their own record. No model is needed: surrogates are rendered for the gold
spans, exactly as ``--mode surrogate`` renders them. Rows:

* ``tag``: ``[**DATE**]`` everywhere: no date to link (a guess among all records);
* ``shift``: the default surrogate, every date of a patient moved by one keyed offset;
* ``dp ε unit``: ``--dates dp --date-epsilon ε --date-unit note|patient``;
* ``... note`` / ``... none`` (``--date-counts keep,note,none``): the same with ``--date-count
  note`` (only each note's first date is rendered) or ``none`` (no date is). The attacker knows
  the option: he drops the same mentions from the target's true notes, so every attack compares
  like with like. ``reid_notes_pct`` is the floor no date option lowers: linking by the number of
  notes of each patient.

Utility, from the surrogate each true date got (its first mention, per patient): the median
absolute error of intervals between consecutive distinct dates by scale band (days <= 31,
months <= 365, years), the share of consecutive pairs whose order is kept, and the error of the
length of stay (last minus first date of the patient's main timeline, days; median and 90th
percentile). Each row is averaged over ``--keys`` random keys (derived from ``--seed``). Only
numbers are printed: no note text, no date.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from dphub import formats
from dphub.labels import category_of
from dphub.notes import Note, Span
from dphub.render import SurrogateRenderer
from dphub.render.date_count import fewer_dates
from dphub.render.dates import date_points
from dphub.render.dp_dates import BANDS, band_of, unroll

Point = tuple[str, int]


def _align(a: Sequence[int], b: Sequence[int]) -> float:
    """Alignment distance between two interval sequences: matching two intervals costs their
    difference, an interval left unmatched costs its length (so ``[1, 1, 1]`` is 2 days from
    ``[1]``: plain dynamic time warping would call them equal)."""
    prev = [0.0]
    for y in b:
        prev.append(prev[-1] + abs(y))
    for x in a:
        cur = [prev[0] + abs(x)]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j - 1] + abs(x - y), prev[j] + abs(x), cur[j - 1] + abs(y)))
        prev = cur
    return prev[-1]


def _intervals(points: set[Point]) -> dict[str, list[int]]:
    """Per timeline, the intervals between consecutive distinct points (month/day dates unrolled
    at their widest gap, as DP dates place them)."""
    out: dict[str, list[int]] = {}
    for line in ("abs", "md"):
        days = sorted(d for ln, d in points if ln == line)
        if line == "md" and len(days) > 1:
            placed = unroll(days)
            days = sorted(placed.values())
        if days:
            out[line] = [b - a for a, b in zip(days, days[1:], strict=False)]
    return out


def _steps(points: list[Point]) -> dict[str, list[int]]:
    """Per timeline, the signed steps between consecutive date *mentions* in reading order (notes
    in order, spans in order; month/day steps taken around the year, within half a year)."""
    out: dict[str, list[int]] = {}
    for line in ("abs", "md"):
        days = [d for ln, d in points if ln == line]
        if line == "md":
            out[line] = [(b - a + 183) % 366 - 183 for a, b in zip(days, days[1:], strict=False)]
        elif days:
            out[line] = [b - a for a, b in zip(days, days[1:], strict=False)]
    return {k: v for k, v in out.items() if v}


def _distance(a: dict[str, list[int]], b: dict[str, list[int]]) -> float:
    return sum(_align(a.get(line, []), b.get(line, [])) for line in ("abs", "md"))


def _date_spans(note: Note) -> list[Span]:
    return [s for s in note.spans if category_of(s.label) == "DATE"]


def _render_dates(renderer: SurrogateRenderer, note: Note) -> list[tuple[list[Point], list[Point]]]:
    """(true points, surrogate points) of each date span of the note the renderer rewrites.

    The date spans are rendered in a stand-in note of the span texts, one per line, with the
    note's id and patient (the date mapping depends only on the note's dates, so each surrogate
    is the one the real note gets)."""
    kept = []
    for s in _date_spans(note):
        if renderer.date_points(note, [s]):
            kept.append(note.text[s.start:s.end].strip())
    if not kept:
        return []
    text, spans = "", []
    for k in kept:
        spans.append(Span(len(text), len(text) + len(k), "DATE"))
        text += k + "\n"
    stand_in = Note(id=note.id, text=text, patient_id=note.effective_patient_id, spans=spans)
    out_lines = renderer.render(stand_in, spans).split("\n")
    pairs = []
    for k, o in zip(kept, out_lines, strict=False):
        true = [p[:2] for p in date_points(k)]
        sur = [p[:2] for p in date_points(o)]
        if true and len(true) == len(sur):
            pairs.append((true, sur))
    return pairs


def _evaluate(notes: list[Note], renderer: SurrogateRenderer | None,
              only: list[str] | None = None) -> dict[str, float]:
    """One row; ``only``: the targets (by default the patients with at least 3 dated notes)."""
    by_patient: dict[str, list[Note]] = defaultdict(list)
    for n in notes:
        by_patient[n.effective_patient_id].append(n)
    probe = renderer or SurrogateRenderer(b"x" * 32)
    truth: dict[str, set[Point]] = {}
    dated_notes: dict[str, int] = {}
    for pid, ns in by_patient.items():
        pts: set[Point] = set()
        dated = 0
        for n in ns:
            found = {p[:2] for p in probe.date_points(n, _date_spans(n))}
            pts |= found
            dated += bool(found)
        truth[pid], dated_notes[pid] = pts, dated
    said: dict[str, list[Point]] = {pid: [] for pid in by_patient}  # true mentions, in order
    if renderer is None:
        for pid, ns in by_patient.items():
            for n in ns:
                for s in _date_spans(n):
                    said[pid].extend(p[:2] for p in probe.date_points(n, [s]))
    if renderer is not None and renderer.needs_prepass:
        for n in notes:
            renderer.observe(n, n.spans)
    released: dict[str, set[Point]] = {pid: set() for pid in by_patient}
    released_said: dict[str, list[Point]] = {pid: [] for pid in by_patient}
    first_sur: dict[str, dict[Point, Point]] = defaultdict(dict)
    if renderer is not None:
        for pid, ns in by_patient.items():
            for n in ns:
                for true, sur in _render_dates(renderer, n):
                    said[pid].extend(true)
                    released_said[pid].extend(sur)
                    released[pid].update(sur)
                    for t, s in zip(true, sur, strict=True):
                        first_sur[pid].setdefault(t, s)
    targets = only if only is not None else [pid for pid in by_patient if dated_notes[pid] >= 3]
    # two attackers: the sorted distinct dates' intervals, and the steps between mentions in
    # reading order; the row reports each and the better of the two
    attacks = {
        "sorted": ({pid: _intervals(truth[pid]) for pid in targets},
                   {pid: _intervals(pts) for pid, pts in released.items()}),
        "order": ({pid: _steps(said[pid]) for pid in targets},
                  {pid: _steps(pts) for pid, pts in released_said.items()}),
    }
    row: dict[str, float] = {"targets": len(targets)}
    # the floor no interval noise can lower: how many distinct dates of each kind (with a year,
    # without) a record has, which DP dates keep
    attacks["count"] = ({pid: {ln: [0] * len(v) for ln, v in attacks["sorted"][0][pid].items()}
                         for pid in targets},
                        {pid: {ln: [0] * len(v) for ln, v in seq.items()}
                         for pid, seq in attacks["sorted"][1].items()})
    for name, (known_of, records) in attacks.items():
        hits = 0.0
        for pid in targets:
            if renderer is None and name != "count":  # tag mode: no date, a guess
                hits += 1 / len(records)
                continue
            if renderer is None:  # tag mode still shows how many [**DATE**] a patient has
                dist = {r: float(abs(len(said[pid]) - len(said[r]))) for r in records}
            elif name == "count":
                dist = {r: float(sum(abs(len(known_of[pid].get(ln, [])) - len(seq.get(ln, [])))
                                     for ln in ("abs", "md"))) for r, seq in records.items()}
            else:
                dist = {r: _distance(known_of[pid], seq) for r, seq in records.items()}
            best = min(dist.values())
            nearest = [r for r, d in dist.items() if d == best]
            hits += (pid in nearest) / len(nearest)
        row[f"reid_{name}_pct"] = 100 * hits / max(1, len(targets))
    # the floor no date option lowers: the number of notes of each patient (issue 38)
    notes_of = {pid: len(ns) for pid, ns in by_patient.items()}
    row["reid_notes_pct"] = 100 * sum(
        1 / sum(notes_of[r] == notes_of[pid] for r in by_patient) for pid in targets
    ) / max(1, len(targets))
    # the interval attacks (the issue's): the count attack is reported beside them
    row["reid_pct"] = max(row["reid_sorted_pct"], row["reid_order_pct"])
    if renderer is None:
        return row
    errors: dict[str, list[int]] = {b.name: [] for b in BANDS}
    kept = total = 0
    los_err: list[int] = []
    for mapping in first_sur.values():
        for line in ("abs", "md"):
            pts = sorted(p for p in mapping if p[0] == line)
            if line == "md" and len(pts) > 1:
                placed = unroll([d for _, d in pts])
                pts.sort(key=lambda p: placed[p[1]])
                pos = {p: placed[p[1]] for p in pts}
            else:
                pos = {p: p[1] for p in pts}
            sur = [mapping[p][1] for p in pts]
            if line == "md" and len(pts) > 1:  # surrogate month/days unrolled the same way
                placed_s = unroll(sur)
                sur = [placed_s[s] for s in sur]
            for i in range(1, len(pts)):
                true_gap = pos[pts[i]] - pos[pts[i - 1]]
                errors[band_of(true_gap).name].append(abs((sur[i] - sur[i - 1]) - true_gap))
                total += 1
                kept += sur[i] > sur[i - 1]
            if len(pts) > 1 and line == max(("abs", "md"), key=lambda ln: sum(
                    p[0] == ln for p in mapping)):
                los_err.append(abs((sur[-1] - sur[0]) - (pos[pts[-1]] - pos[pts[0]])))
    for b in BANDS:
        row[f"mae_{b.name}"] = statistics.median(errors[b.name]) if errors[b.name] else float("nan")
        row[f"n_{b.name}"] = len(errors[b.name])
    row["order_kept_pct"] = 100 * kept / max(1, total)
    row["los_err_median"] = statistics.median(los_err) if los_err else float("nan")
    row["los_err_p90"] = (statistics.quantiles(los_err, n=10)[-1] if len(los_err) > 1
                          else float("nan"))
    return row


def _targets(notes: list[Note]) -> list[str]:
    """The patients with at least 3 notes that hold a date dphub can place in time."""
    probe = SurrogateRenderer(b"x" * 32)
    dated: dict[str, int] = defaultdict(int)
    for n in notes:
        dated[n.effective_patient_id] += bool(probe.date_points(n, _date_spans(n)))
    return [pid for pid, k in dated.items() if k >= 3]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--format", default=None)
    ap.add_argument("--epsilons", default="0.5,1,2,5")
    ap.add_argument("--units", default="patient,note")
    ap.add_argument("--date-counts", default="keep", help="a list of keep, note, none")
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    notes = list(formats.read(args.corpus, format=args.format))
    keys = [hashlib.sha256(f"date-linkage {args.seed} {i}".encode()).digest()
            for i in range(args.keys)]
    configs: list[tuple[str, dict[str, object] | None]] = [("tag", None), ("shift", {})]
    for unit in args.units.split(","):
        for e in args.epsilons.split(","):
            configs.append((f"dp eps={e} {unit}", {"dates": "dp", "date_epsilon": float(e),
                                                   "date_unit": unit}))
    shown = {"keep": notes}
    for count in args.date_counts.split(","):
        if count != "keep":
            shown[count] = []
            for n in notes:
                reduced, spans = fewer_dates(n, n.spans, count)
                shown[count].append(Note(id=n.id, text=reduced.text, patient_id=n.patient_id,
                                         spans=spans))
    # the targets of every row: the patients with >= 3 dated notes before any date is removed
    targets = _targets(notes)
    rows = []
    for count in args.date_counts.split(","):
        for name, opts in configs:
            runs = [_evaluate(shown[count], None if opts is None else SurrogateRenderer(k, **opts),
                              targets)
                    for k in (keys if opts is not None else keys[:1])]
            row = {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}
            row["config"] = name + ("" if count == "keep" else f" {count}")
            rows.append(row)
    cols = ["reid_pct", "reid_sorted_pct", "reid_order_pct", "reid_count_pct", "reid_notes_pct",
            "mae_days", "mae_months", "mae_years", "order_kept_pct",
            "los_err_median", "los_err_p90"]
    print(f"patients: {len({n.effective_patient_id for n in notes})}, notes: {len(notes)}, "
          f"targets (>= 3 dated notes): {int(rows[0]['targets'])}, keys: {args.keys}")
    print("| config | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for r in rows:
        print(f"| {r['config']} | " + " | ".join(
            "-" if c not in r or r[c] != r[c] else f"{r[c]:.1f}" for c in cols) + " |")
    n_bands = {b.name: rows[1].get(f"n_{b.name}", 0) for b in BANDS}
    print(f"intervals per band (mean per key): {n_bands}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
