"""Every kept word says why (issue 54 item 5): the inverse rule's release paths, named in
``--mode spans`` and ``audit.jsonl``, and what hid each hidden span."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dphub.ensemble.core import Ensemble
from dphub.ensemble.inverse import InverseRule, WordTable, word_table
from dphub.ensemble.release_paths import (
    HIDDEN_CODE,
    PATHS,
    RULE_HIDER,
    UNEXPLAINED,
    UNEXPLAINED_CODE,
    Explanation,
    ReleasePath,
    unexplained,
)
from dphub.io import jsonl_lines
from dphub.notes import Note, Span
from dphub.runner import run_deid
from tests.hostile_text import NOTES
from tests.test_inverse import fixed, model, vocab

RULE = "inverse:0.05,0.2,0.2,0.001"
TEXT = ("patient seen by dr Zorblat today, s/p fall. bp 120/80, 5 mg po. xyzzy noted. "
        "Qwertyx stable and the wife in clinic")
#: P(PHI) of the model member (others: test_inverse's default)
PROBS = {"xyzzy": 0.01, "Qwertyx": 0.0001, "Zorblat": 0.3, "noted": 0.3, "fall": 0.3}


def _ensemble() -> Ensemble:
    zorblat = TEXT.index("Zorblat")
    return Ensemble([fixed("rules", "a", [Span(zorblat, zorblat + 7, "NAME", 1.0)]),
                     model(PROBS)], RULE, safe_vocab=vocab())


def _run(tmp_path: Path, ens: Ensemble) -> tuple[dict, dict, str]:
    src = tmp_path / "n.jsonl"
    src.write_text(json.dumps({"id": "a", "text": TEXT}) + "\n")
    out = tmp_path / "out"
    rep = run_deid(src, out, ens, mode="spans")
    assert rep.exit_code == 0, rep.errors
    (record,) = [json.loads(x) for _, x in jsonl_lines(out / "n.jsonl")]
    (audit,) = [json.loads(x) for _, x in jsonl_lines(out / "audit.jsonl")]
    return record, audit, (out / "audit.jsonl").read_text(encoding="utf-8")


def test_every_kept_word_names_its_release_path(tmp_path: Path) -> None:
    record, audit, raw = _run(tmp_path, _ensemble())
    paths = {TEXT[a:b]: p for a, b, p in record["kept"]}
    assert paths["patient"] == paths["stable"] == paths["clinic"] == "vocabulary"
    assert paths["s"] == paths["p"] == "shorthand"
    assert paths["120"] == paths["80"] == "measurement"
    assert paths["xyzzy"] == "unknown_lower"  # outside the vocabulary, lower case, P < LOW
    assert paths["Qwertyx"] == "sure"  # capitalised, unknown, P < SURE
    assert "noted" not in paths and "Zorblat" not in paths and "fall" not in paths
    # every word is hidden or kept with a named path; the audit counts the same paths
    hidden = [(s["start"], s["end"]) for s in record["spans"]]
    assert unexplained(TEXT, hidden, record["kept"]) == []
    assert audit["kept"] == {p: list(paths.values()).count(p) for p in set(paths.values())}
    assert UNEXPLAINED not in audit["kept"]
    # what hid each span: the member that flagged it, or the rule alone
    by = {TEXT[s["start"]:s["end"]]: s["hidden_by"] for s in audit["spans"]}
    assert by["Zorblat"] == ["rules"] and by["noted"] == [RULE_HIDER]
    assert by["fall"] == [RULE_HIDER]
    assert {TEXT[s["start"]:s["end"]]: s["hidden_by"] for s in record["spans"]} == by
    # offsets and names only: no word of the note is in the audit
    for word in ("Zorblat", "Qwertyx", "xyzzy", "noted", "patient"):
        assert word not in raw


def test_a_release_that_no_path_names_is_flagged(tmp_path: Path, monkeypatch) -> None:
    # the check can fail: a release added to the rule without a name (here: every word kept)
    # shows as "unexplained" in the audit, and unexplained() lists the words
    kept = WordTable.kept
    monkeypatch.setattr(WordTable, "kept", lambda self, *a, **k: np.ones_like(kept(self, *a, **k)))
    record, audit, _ = _run(tmp_path, _ensemble())
    assert audit["kept"].get(UNEXPLAINED, 0) >= 2  # "noted" and "fall": nothing vouches for them
    hidden = [(s["start"], s["end"]) for s in record["spans"]]
    bad = {TEXT[a:b] for a, b in unexplained(TEXT, hidden, record["kept"])}
    assert {"noted", "fall"} <= bad
    assert unexplained(TEXT, [], []) and unexplained(TEXT, [], [[0, 7, "no-such-path"]])[0] == (0, 7)


@pytest.mark.parametrize("rule", ["inverse:0.05,0.2", "inverse:0.05,0.2,0.1", RULE,
                                  "inverse:0,0.2,0,0", "inverse:1,1,1,1", "inverse"])
def test_release_paths_name_exactly_the_kept_words(rule: str) -> None:
    # the paths are read off the same columns as kept(): every kept word has a path and no
    # hidden word has one, whatever the thresholds
    from tests.hostile_text import NOTES as HOSTILE

    r = InverseRule.parse(rule)
    for text in [TEXT, *HOSTILE.values()]:
        members = {"m": [Span(m.start(), m.end(), "NAME", p)
                         for m, p in zip(__import__("re").finditer(r"[^\W_]+", text),
                                         np.linspace(0, 0.3, 997), strict=False)]}
        table = word_table(text, members, vocab(), models={"m": 0.5})
        codes = table.release_paths(r.low, r.high, r.named, r.sure)
        keep = table.kept(r.low, r.high, r.named, r.sure)
        assert ((codes != HIDDEN_CODE) == keep).all()
        assert (codes != UNEXPLAINED_CODE).all(), [
            text[table.start[i]:table.end[i]] for i in np.flatnonzero(codes == UNEXPLAINED_CODE)]


def test_an_any_run_records_no_reasons(tmp_path: Path) -> None:
    ens = Ensemble([fixed("rules", "a", [])], "any")
    record, audit, _ = _run(tmp_path, ens)
    assert "kept" not in record and "kept" not in audit
    assert all("hidden_by" not in s for s in audit["spans"])


def test_paths_are_named_once_and_travel_between_processes() -> None:
    assert len({p.value for p in PATHS}) == len(PATHS) == len(ReleasePath)
    why = Explanation(((0, 7, "vocabulary"), (8, 12, "sure")), ((13, 20),))
    assert Explanation.from_wire(json.loads(json.dumps(why.to_wire()))) == why
    assert why.counts() == {"vocabulary": 1, "sure": 1}
    assert why.hidden_by(13, 25, ["m"]) == ["m", RULE_HIDER] and why.hidden_by(0, 7, []) == []


def test_the_hostile_corpus_under_the_inverse_rule_explains_every_word(tmp_path: Path) -> None:
    src = tmp_path / "n.jsonl"
    src.write_text("".join(json.dumps({"id": k, "text": t}) + "\n" for k, t in NOTES.items()))
    ens = Ensemble([fixed("rules", "x", []), model({})], RULE, safe_vocab=vocab())
    assert run_deid(src, tmp_path / "o", ens, mode="spans").exit_code == 0
    for _, line in jsonl_lines(tmp_path / "o" / "n.jsonl"):
        rec = json.loads(line)
        hidden = [(s["start"], s["end"]) for s in rec["spans"]]
        assert unexplained(NOTES[rec["id"]], hidden, rec["kept"]) == [], rec["id"]
    assert Note  # the corpus' notes are read as notes (the import documents the type)


def test_the_ray_engine_carries_the_reasons(tmp_path: Path) -> None:
    # a run on Ray actors writes the same bytes: the reasons cross the process boundary
    from dphub.ray_engine import _decode_results, _encode_results

    ens = _ensemble()
    res = ens.deid([Note("a", TEXT)])
    (back,) = _decode_results(_encode_results(res))
    assert back.why == res[0].why and back.merged == res[0].merged


def test_the_review_page_shows_what_hid_each_span_and_the_kept_paths(tmp_path: Path) -> None:
    from dphub.review.page import render_page
    from dphub.review.run import load_review

    src = tmp_path / "n.jsonl"
    src.write_text(json.dumps({"id": "a", "text": TEXT}) + "\n")
    assert run_deid(src, tmp_path / "o", _ensemble(), mode="tag").exit_code == 0
    review = load_review(tmp_path / "o", src)
    (note,) = review.notes
    by = {TEXT[s["start"]:s["end"]]: s["hidden_by"] for s in note.spans}
    assert by["Zorblat"] == ["rules"] and by["noted"] == [RULE_HIDER]
    assert note.kept is not None and note.kept["vocabulary"] >= 10 and note.kept["sure"] == 1
    assert note.to_dict()["kept"] == note.kept
    page = render_page(review)
    assert '"hidden_by": ["rules"]' in page or '"hidden_by":["rules"]' in page
    assert "hidden by: " in page and "dataset.hiddenBy" in page and "kept by " in page


def test_a_text_directory_run_writes_the_reasons_in_each_spans_file(tmp_path: Path) -> None:
    from dphub.evaluate import read_predictions

    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text(TEXT, encoding="utf-8")
    out = tmp_path / "out"
    assert run_deid(src, out, _ensemble(), mode="spans").exit_code == 0
    rec = json.loads((out / "a.jsonl").read_text(encoding="utf-8"))
    hidden = [(s["start"], s["end"]) for s in rec["spans"]]
    assert rec["kept"] and unexplained(TEXT, hidden, rec["kept"]) == []
    assert all("hidden_by" in s for s in rec["spans"])
    # evaluate reads the explained records as any spans output
    assert [(s.start, s.end) for s in read_predictions(out)["a"]] == hidden
