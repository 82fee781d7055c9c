"""Site-local safe words (issue 54 item 4): a reviewer's "not PHI" on a word the inverse rule hid
is recorded beside the manifest and lets the next run keep that word, under a guard that never
releases a word written, placed or listed as a name, nor one a model is sure of."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from dphub.cli.main import main
from dphub.ensemble import Ensemble, FixedMember
from dphub.ensemble.core import Slot
from dphub.ensemble.inverse import InverseRule, inverse_aggregate, word_table
from dphub.ensemble.members import ModelMember
from dphub.ensemble.release_paths import PATHS, ReleasePath
from dphub.errors import ConfigError, DphubError
from dphub.notes import Note, Span
from dphub.review.corrections import labelled_notes
from dphub.review.run import Review, load_review
from dphub.review.safe_words import (
    check_safe_words_path,
    default_safe_words_path,
    read_site_file,
    record_safe_words,
)
from dphub.runner import run_deid
from dphub.safe_vocab import SITE_FORMAT, SafeVocabulary, load, site_entry_key
from dphub.scores import TokenScores

#: ordinary words of the synthetic notes (the tests' vocabulary; "zentrix", "monday", "smith",
#: "zorbak" are not in it)
WORDS = ("checked", "reviewed", "and", "seen", "by", "today", "pt", "stable", "on", "the",
         "note", "in", "was", "at", "patient")
RULE = "inverse:0.05,0.2"
KEY = "ab" * 32


def vocab(site: Sequence[str] = ()) -> SafeVocabulary:
    v = SafeVocabulary.from_words(WORDS)
    return SafeVocabulary(v.words, v.digest, site=frozenset(site))


def site_file(path: Path, words: dict[str, int], refused: Sequence[str] = ()) -> Path:
    """A site file whose words each have ``n`` different sources."""
    doc = {"format": SITE_FORMAT, "version": 1, "key": KEY,
           "words": {w: [{"run": "r", "source": f"s{i}", "date": "2026-12-07"}
                         for i in range(n)] for w, n in words.items()},
           "refused": [site_entry_key(bytes.fromhex(KEY), w) for w in refused]}
    path.write_text(json.dumps(doc))
    return path


def hidden(text: str, v: SafeVocabulary, members: dict[str, list[Span]] | None = None,
           models: dict | None = None, rule: str = RULE) -> list[str]:
    spans = inverse_aggregate(text, members or {"m": []}, InverseRule.parse(rule), v,
                              models=models)
    return [text[s.start:s.end] for s in spans]


# ---------------------------------------------------------------------------- the guard, applied
def test_a_site_word_in_lower_case_comes_back() -> None:
    text = "zentrix checked on monday and reviewed"
    assert hidden(text, vocab()) == ["zentrix", "monday"]
    assert hidden(text, vocab(["zentrix", "monday"])) == []


def test_a_capitalised_site_word_stays_hidden() -> None:
    v = vocab(["zentrix", "monday"])
    # inside a sentence (a sign of a name) and at a line's start (no sign, but capitalised)
    assert hidden("checked on Monday and reviewed", v) == ["Monday"]
    assert hidden("Zentrix checked", v) == ["Zentrix"]
    assert hidden("CAREVUE CHECKED", v) == ["CAREVUE"]  # a vocabulary word in capitals comes back


def test_a_name_in_the_lists_never_comes_back_even_in_lower_case() -> None:
    # a crafted or stale file: "smith" (a surname) and "rose" (a name that is also a word)
    v = vocab(["smith", "rose", "zentrix"])
    assert hidden("smith checked and rose reviewed zentrix", v) == ["smith", "rose"]


@pytest.mark.parametrize("text", ["seen by zentrix today", "checked by dr zentrix",
                                  "j zentrix checked"])
def test_a_site_word_where_a_name_stands_stays_hidden(text: str) -> None:
    # after a name cue ("by", "dr") or an initial: placed as a name is
    assert "zentrix" in " ".join(hidden(text, vocab(["zentrix"])))


class _Tagger:
    """One token per word, P(PHI) from ``probs``."""

    def __init__(self, probs: dict[str, float]) -> None:
        self.probs = probs

    def token_scores(self, notes: Sequence[Note], batch_size: int = 16,
                     marginals: bool = True, **_: object) -> list[TokenScores]:
        import re

        import numpy as np

        out = []
        for n in notes:
            ms = list(re.finditer(r"\w+", n.text))
            p = np.array([self.probs.get(m.group(), 0.001) for m in ms], dtype=np.float32)
            probs = np.stack([1 - p, p], axis=1)
            out.append(TokenScores(np.array([[m.start(), m.end()] for m in ms], dtype=np.int64)
                                   .reshape(-1, 2), p, probs, ("O", "NAME")))
        return out


def _model_hidden(text: str, p: float, site: Sequence[str]) -> list[str]:
    member = ModelMember.__new__(ModelMember)
    member.name, member.tagger, member.batch_size = "model", _Tagger({"zentrix": p}), 16
    ens = Ensemble([Slot(member, threshold=0.5)], RULE, safe_vocab=vocab(site))
    (res,) = ens.deid([Note("n", text)])
    return [text[s.start:s.end] for s in res.spans]


def test_a_site_word_needs_every_model_unsure_below_high() -> None:
    text = "zentrix checked"
    # P 0.1: between LOW (0.05) and HIGH (0.2): hidden as an unknown word, back as a site word
    assert _model_hidden(text, 0.1, ()) == ["zentrix"]
    assert _model_hidden(text, 0.1, ["zentrix"]) == []
    # P 0.3: the model leans to PHI (at or above HIGH): hidden, site word or not
    assert _model_hidden(text, 0.3, ["zentrix"]) == ["zentrix"]
    # P 0.9: the model flags it: hidden
    assert _model_hidden(text, 0.9, ["zentrix"]) == ["zentrix"]


def test_a_member_s_flag_wins_over_a_site_word() -> None:
    text = "zentrix checked"
    flag = {"rules": [Span(0, 7, "NAME")]}
    assert hidden(text, vocab(["zentrix"]), flag) == ["zentrix"]


def test_a_site_word_inside_an_institution_s_name_stays_hidden() -> None:
    # blocked words (a hospital's name) are hidden whatever vouches for them
    assert "zentrix" in " ".join(hidden("at zentrix hospital today", vocab(["zentrix"])))


# -------------------------------------------------------------------------- the file, as read
def test_a_word_counts_only_with_two_independent_rejections(tmp_path: Path) -> None:
    f = site_file(tmp_path / "s.json", {"zentrix": 2, "monday": 1})
    v = load(extra=[f])
    assert v.site == {"zentrix"}
    assert not v.contains("zentrix")  # never a vocabulary word: released only under the guard
    assert v.digest != load().digest  # a resume with another file is refused


def test_a_word_once_labelled_phi_never_counts(tmp_path: Path) -> None:
    f = site_file(tmp_path / "s.json", {"zentrix": 3, "monday": 3}, refused=["monday"])
    assert load(extra=[f]).site == {"zentrix"}


@pytest.mark.parametrize("word", ["Zentrix", "abc123", "q", "x-ray", "care vue", "MONDAY"])
def test_a_file_with_a_capital_digit_letter_or_shape_is_refused(tmp_path: Path,
                                                               word: str) -> None:
    f = site_file(tmp_path / "s.json", {"zentrix": 2, word: 2})
    with pytest.raises(ConfigError, match="word 2") as e:
        load(extra=[f])
    assert word not in str(e.value)  # errors name the entry, never the word


@pytest.mark.parametrize("doc", [
    {"format": "other"}, [], {"format": SITE_FORMAT, "version": 9},
    {"format": SITE_FORMAT, "version": 1, "key": "x", "words": {}, "refused": []},
    {"format": SITE_FORMAT, "version": 1, "key": KEY, "words": {"zentrix": [{"run": 1}]},
     "refused": []},
])
def test_a_malformed_site_file_is_one_config_error(tmp_path: Path, doc) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc) if doc != [] else "{not json")
    with pytest.raises(ConfigError):
        load(extra=[f])


# -------------------------------------------------------------- recorded from a reviewed run
NOTES = {  # id: (patient, text)
    "a": ("p1", "zentrix checked monday and smith reviewed"),
    "b": ("p2", "zentrix checked monday"),
    "c": ("p1", "zentrix checked and reviewed"),
    "d": ("p3", "pt stable on monday"),
}


def _run(tmp_path: Path) -> tuple[Review, Path]:
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"id": k, "text": t, "patient_id": p}) + "\n"
                             for k, (p, t) in NOTES.items()))
    ens = Ensemble([Slot(FixedMember("fixed", {}), threshold=0.5)], RULE, safe_vocab=vocab())
    assert run_deid(notes, tmp_path / "run", ens, mode="spans").exit_code == 0
    return load_review(tmp_path / "run", notes), notes


def _reject_all(review: Review, ids: Sequence[str], keep: Sequence[str] = ()) -> dict:
    """The page's corrections: in notes ``ids`` every hidden span rejected, but the words of
    ``keep`` (which stay hidden: labelled PHI)."""
    out = {}
    for note in review.notes:
        if note.id in ids:
            out[note.key] = {"reviewed": True, "rejected": [
                [s["start"], s["end"]] for s in note.spans
                if note.text[s["start"]:s["end"]] not in keep]}
    return {"notes": out}


def _record(review: Review, payload: dict, path: Path):
    return record_safe_words(review, labelled_notes(review, payload), path, vocab=vocab())


def test_rejections_from_two_patients_make_a_safe_word(tmp_path: Path) -> None:
    review, _ = _run(tmp_path)
    path = tmp_path / "site" / "site-safe-words.json"
    got = _record(review, _reject_all(review, ["a", "b"]), path)
    assert (got.counted, got.waiting) == (2, 0)
    assert load(extra=[path]).site == {"zentrix", "monday"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    raw = path.read_text()
    # only the words themselves: no name, no patient or note id, no other text of a note
    for secret in ("smith", "p1", "p2", "checked", '"a"', "reviewed"):
        assert secret not in raw
    doc = json.loads(raw)
    recs = doc["words"]["zentrix"]
    assert len(recs) == 2 and {r["date"] for r in recs} and len({r["run"] for r in recs}) == 1


def test_one_patient_s_notes_are_one_rejection(tmp_path: Path) -> None:
    review, _ = _run(tmp_path)
    path = tmp_path / "s.json"
    got = _record(review, _reject_all(review, ["a", "c"]), path)  # both patient p1
    assert got.counted == 0 and got.waiting == 2
    assert load(extra=[path]).site == set()


def test_saving_again_counts_once(tmp_path: Path) -> None:
    review, _ = _run(tmp_path)
    path = tmp_path / "s.json"
    payload = _reject_all(review, ["a"])
    for _ in range(3):
        got = _record(review, payload, path)
    assert got.counted == 0
    assert len(read_site_file(path)["words"]["zentrix"]) == 1
    # withdrawing the rejection (the reviewer accepts the span again) withdraws the record
    _record(review, _reject_all(review, ["a"], keep=["zentrix"]), path)
    assert "zentrix" not in read_site_file(path)["words"]


def test_a_word_the_reviewer_kept_hidden_anywhere_is_refused_for_good(tmp_path: Path) -> None:
    review, _ = _run(tmp_path)
    path = tmp_path / "s.json"
    assert _record(review, _reject_all(review, ["a", "b"]), path).counted == 2
    # note d reviewed with "monday" accepted as PHI: refused, now and after later saves
    payload = _reject_all(review, ["a", "b", "d"], keep=["monday"])
    got = _record(review, payload, path)
    assert got.counted == 1 and got.refused >= 1
    assert load(extra=[path]).site == {"zentrix"}
    assert "monday" not in path.read_text()
    _record(review, _reject_all(review, ["a", "b"]), path)
    assert load(extra=[path]).site == {"zentrix"}


def test_a_gold_miss_refuses_its_words(tmp_path: Path) -> None:
    review, _ = _run(tmp_path)
    d = next(n for n in review.notes if n.id == "d")
    i = d.text.index("stable")
    d.misses.append({"start": i, "end": i + 6, "label": "NAME", "category": "NAME"})
    review.notes[0].spans  # noqa: B018 - the review is otherwise as loaded
    path = tmp_path / "s.json"
    _record(review, _reject_all(review, ["a", "b"]), path)
    key = bytes.fromhex(read_site_file(path)["key"])
    assert site_entry_key(key, "stable") in read_site_file(path)["refused"]


def test_the_file_stays_out_of_the_run_and_the_inputs(tmp_path: Path) -> None:
    review, notes = _run(tmp_path)
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="released"):
        check_safe_words_path(run / "site.json", run, [notes])
    with pytest.raises(ConfigError, match="input"):
        check_safe_words_path(notes, run, [notes])
    with pytest.raises(ConfigError, match="JSON"):
        check_safe_words_path(tmp_path / "site.txt", run, [notes])
    assert default_safe_words_path(tmp_path / "m" / "dphub-ensemble.toml") == \
        (tmp_path / "m" / "site-safe-words.json").resolve()


# ---------------------------------------------------------------------------------- end to end
def test_the_page_s_save_records_and_deid_applies_them(tmp_path: Path, capsys) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from dphub.review.server import make_app

    review, _ = _run(tmp_path)
    site = tmp_path / "site-safe-words.json"
    token = "t" * 43
    client = TestClient(make_app(review, tmp_path / "c.jsonl", token, safe_words=site),
                        headers={"host": "127.0.0.1:1"})
    payload = {"units": "utf-16", "revision": "none", **_reject_all(review, ["a", "b"])}
    r = client.post(f"/corrections?token={token}", json=payload)
    assert r.status_code == 200, r.text
    assert r.json()["safe_words"] == {"counted": 2, "waiting": 0}
    assert load(extra=[site]).site == {"zentrix", "monday"}
    # the next run: rules:default, the inverse rule, the site file next to the manifest
    manifest = tmp_path / "dphub-ensemble.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(manifest)]) == 0
    src = tmp_path / "new.jsonl"
    text = "zentrix data checked. Zentrix data checked."
    src.write_text(json.dumps({"id": "n", "text": text}) + "\n")
    capsys.readouterr()
    assert main(["ensemble", "deid", str(src), "--out", str(tmp_path / "o1"), "--aggregate",
                 "inverse", "--mode", "spans", "-e", str(manifest)]) == 0
    assert f"not applied; add --safe-words {site}" in capsys.readouterr().err
    assert main(["ensemble", "deid", str(src), "--out", str(tmp_path / "o2"), "--aggregate",
                 "inverse", "--mode", "spans", "-e", str(manifest), "--safe-words",
                 str(site)]) == 0
    assert "site-local safe words: 2 word(s)" in capsys.readouterr().err

    def kept(out: Path) -> list[str]:
        (rec,) = [json.loads(x) for x in (out / "audit.jsonl").read_text().splitlines()]
        return [text[s["start"]:s["end"]] for s in rec["spans"]]

    assert "zentrix" in kept(tmp_path / "o1")
    assert "zentrix" not in kept(tmp_path / "o2") and "Zentrix" in kept(tmp_path / "o2")


def test_a_model_directory_holding_the_file_is_not_publishable(tmp_path: Path) -> None:
    from hub_fixtures import make_model_dir

    from dphub.hub.gate import check_publishable

    model = make_model_dir(tmp_path / "model")
    check_publishable(model)
    site_file(model / "site-safe-words.json", {"zentrix": 2})
    with pytest.raises(DphubError, match="site-safe-words.json"):
        check_publishable(model)


def test_a_rejected_span_gold_calls_phi_is_no_rejection(tmp_path: Path) -> None:
    review, _ = _run(tmp_path)
    for note in review.notes:  # the gold says the run's "zentrix" spans are PHI
        for s in note.spans:
            if note.text[s["start"]:s["end"]] == "zentrix":
                s["gold"] = "tp"
    path = tmp_path / "s.json"
    _record(review, _reject_all(review, ["a", "b"]), path)
    assert "zentrix" not in read_site_file(path)["words"]
    assert load(extra=[path]).site == {"monday"}


def test_review_cli_checks_the_file_before_serving(tmp_path: Path, capsys,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("starlette")
    review, notes = _run(tmp_path)
    run = str(tmp_path / "run")
    served = []
    monkeypatch.setattr("dphub.review.server.serve", lambda app, sock: served.append(sock))
    assert main(["review", run, "--notes", str(notes), "--safe-words",
                 str(tmp_path / "run" / "s.json")]) == 2
    assert "released" in capsys.readouterr().err
    assert main(["review", run, "--notes", str(notes), "--safe-words", str(tmp_path / "s.json"),
                 "--no-safe-words"]) == 2
    assert not served
    # no manifest: nothing recorded, and nothing said about it
    manifest = tmp_path / "m" / "dphub-ensemble.toml"
    assert main(["review", run, "--notes", str(notes), "-e", str(manifest)]) == 0
    assert "site-local safe words" not in capsys.readouterr().err
    # beside an existing manifest, said on stderr
    assert main(["ensemble", "add", "rules:default", "-e", str(manifest)]) == 0
    assert main(["review", run, "--notes", str(notes), "-e", str(manifest)]) == 0
    assert str(manifest.parent.resolve() / "site-safe-words.json") in capsys.readouterr().err
    assert main(["review", run, "--notes", str(notes), "-e", str(manifest),
                 "--no-safe-words"]) == 0
    assert "site-local safe words" not in capsys.readouterr().err
    assert len(served) == 3
    for sock in served:
        sock.close()


def test_a_symlink_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    review, notes = _run(tmp_path)
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    link = tmp_path / "s.json"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="regular file"):
        check_safe_words_path(link, tmp_path / "run", [notes])


def test_a_site_word_release_names_its_path() -> None:
    # issue 54 item 5: the audit says a reviewer's safe word released it, not the vocabulary
    text = "zentrix checked and reviewed"
    rule = InverseRule.parse(RULE)
    table = word_table(text, {"m": []}, vocab(["zentrix"]))
    codes = table.release_paths(rule.low, rule.high, rule.named, rule.sure)
    assert PATHS[codes[0]] == ReleasePath.SITE_WORD
    assert PATHS[codes[1]] == ReleasePath.VOCABULARY
    codes = word_table(text, {"m": []}, vocab()).release_paths(rule.low, rule.high)
    assert codes[0] < 0  # without the site file: hidden
