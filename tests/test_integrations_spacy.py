"""dphub inside spaCy (issue 56 item 3): the ``"dphub"`` component on a blank English pipeline.

What is tested: ``nlp.add_pipe("dphub")`` works through the ``spacy_factories`` entry point
without importing dphub first (and building any spaCy pipeline does not load dphub's models);
``nlp(text)`` finds the PHI ``dphub ensemble deid`` finds on the same notes (an emoji and a
U+2028 included), exactly in ``doc._.dphub_spans`` and widened to tokens in ``doc.ents`` and the
span group; overlapping existing entities, the merge of spans that share a token, and the
options that would make the component set nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

spacy = pytest.importorskip("spacy")

from spacy.tokens import Doc  # noqa: E402

import dphub  # noqa: E402
from dphub.api import Deidentifier, DeidResult, PhiSpan  # noqa: E402
from dphub.cli.main import main  # noqa: E402
from dphub.errors import ConfigError  # noqa: E402
from dphub.integrations.spacy import DphubComponent  # noqa: E402
from dphub.notes import Note  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: synthetic notes: an emoji (one code point) before PHI, a U+2028 inside a note
NOTES = [
    Note("n1", "Seen by Dr. Kowalczyk on 03/04/2021. Call 555-123-4567 to follow up."),
    Note("n2", "Pt \U0001f600 happy; wife Anna Berg visited 12/25/2020 at Mercy Hospital."),
    Note("n3", "Discharged 01/02/2022.\u2028Follow-up with Dr. Okafor, 617-555-0199."),
    Note("n4", "No PHI here, vitals stable."),
]


@pytest.fixture(scope="module")
def manifest(tiny_tagger_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    m = tmp_path_factory.mktemp("spacy") / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "--name", "tiny", "--threshold",
                 "0.3", "-e", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "-e", str(m)]) == 0
    return m


def _cli_spans(manifest: Path, tmp_path: Path) -> dict[str, list[dict]]:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": n.id, "text": n.text}) + "\n" for n in NOTES),
                   encoding="utf-8")
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--mode", "spans",
                 "-e", str(manifest)]) == 0
    return {r["id"]: r["spans"] for r in
            (json.loads(x) for x in (out / "in.jsonl").read_text(encoding="utf-8").splitlines())}


def _check_against(doc: Doc, spans: list[dict]) -> None:
    """``doc`` carries exactly ``spans`` (the CLI's records), widened to whole tokens."""
    assert doc._.dphub_spans == spans
    ents = list(doc.ents)
    for s in spans:
        (ent,) = [e for e in ents if e.start_char <= s["start"] and s["end"] <= e.end_char]
        assert [s["start"], s["end"]] in ent._.dphub_offsets
        assert set(s["members"]) <= set(ent._.dphub_members)
    for ent in ents:  # each entity is its spans' tokens, nothing more
        assert ent.label_ in {s["label"] for s in spans if [s["start"], s["end"]]
                              in ent._.dphub_offsets}
        assert ent._.dphub_score == max(s["score"] for s in spans
                                        if [s["start"], s["end"]] in ent._.dphub_offsets)
        for tok in ent:
            assert any(tok.idx < e and s < tok.idx + len(tok.text)
                       for s, e in ent._.dphub_offsets)
    assert [(s.start, s.end, s.label_) for s in doc.spans["dphub"]] == [
        (e.start, e.end, e.label_) for e in ents]


def test_nlp_ents_are_the_phi_of_ensemble_deid(manifest: Path, tmp_path: Path) -> None:
    """The issue's 'done when': ``nlp(text).ents`` = the CLI's spans on the same notes."""
    cli = _cli_spans(manifest, tmp_path)
    assert sum(map(len, cli.values())) >= 6
    nlp = spacy.blank("en")
    nlp.add_pipe("dphub", config={"manifest": str(manifest)})
    for note in NOTES:
        _check_against(nlp(note.text), cli[note.id])
    # the batched path gives the same as one doc at a time
    for note, doc in zip(NOTES, nlp.pipe([n.text for n in NOTES], batch_size=3), strict=True):
        _check_against(doc, cli[note.id])


def test_rules_ents_after_an_emoji_and_a_line_separator() -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe("dphub", config={"members": ["rules:default"]})
    doc = nlp(NOTES[1].text)
    assert [(e.text, e.start_char, e.label_) for e in doc.ents] == [
        ("Anna", 17, "RELATIVE"), ("Berg", 22, "RELATIVE"), ("12/25/2020", 35, "DATE"),
        ("Mercy Hospital", 49, "HOSPITAL")]
    doc = nlp(NOTES[2].text)
    assert [(e.text, e.label_, e._.dphub_members) for e in doc.ents] == [
        ("01/02/2022", "DATE", ["rules:default"]), ("Okafor", "DOCTOR", ["rules:default"]),
        ("617-555-0199", "PHONE", ["rules:default"])]
    # the extensions survive serialisation (they live in the doc's user data)
    again = Doc(nlp.vocab).from_bytes(doc.to_bytes())
    assert [(e.text, e._.dphub_score) for e in again.ents] == [
        (e.text, e._.dphub_score) for e in doc.ents]
    assert again._.dphub_spans == doc._.dphub_spans


def test_add_pipe_by_name_without_importing_dphub() -> None:
    """The entry point: a fresh interpreter, spaCy only; building a pipeline loads the small
    registration module, not the ensemble; ``add_pipe("dphub")`` loads it."""
    code = (
        "import json, sys, spacy\n"
        "nlp = spacy.blank('en')\n"
        "before = sorted(m for m in sys.modules if m.startswith('dphub'))\n"
        "nlp.add_pipe('dphub', config={'members': ['rules:default']})\n"
        "doc = nlp('Call 555-123-4567 on 03/04/2021.')\n"
        "print(json.dumps([before, 'dphub.api' in sys.modules,"
        " [(e.text, e.label_) for e in doc.ents]]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    before, api_loaded, ents = json.loads(out.stdout.strip().splitlines()[-1])
    assert "dphub.integrations.spacy" in before and "dphub.api" not in before
    assert not any(m.startswith(("dphub.ensemble", "dphub.tagger")) for m in before)
    assert api_loaded and ents == [["555-123-4567", "PHONE"], ["03/04/2021", "DATE"]]
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="spacy_factories") if e.name == "dphub"]
    assert ep.value == "dphub.integrations.spacy:make_dphub"


class _Fixed(Deidentifier):
    """A Deidentifier that answers given spans (to test token alignment by itself)."""

    def __init__(self, spans: list[PhiSpan]) -> None:
        super().__init__(dphub.load(members=["rules:default"]).ensemble)
        self.fixed = spans

    def __call__(self, text: str | Note) -> DeidResult:
        return DeidResult(Note("text", str(text)), tuple(self.fixed))


def test_spans_inside_a_token_are_widened_and_merged() -> None:
    nlp = spacy.blank("en")
    text = "ref AB12CD34 and \u2028 end"
    # two spans inside one token, and one of whitespace only (no token can carry it)
    spans = [PhiSpan(4, 6, "ID", 0.4, ("a",)), PhiSpan(8, 10, "NAME", 0.9, ("b",)),
             PhiSpan(16, 17, "OTHER", 0.5, ("c",))]
    doc = DphubComponent(_Fixed(spans))(nlp.make_doc(text))
    (ent,) = doc.ents
    assert (ent.text, ent.label_, ent._.dphub_score) == ("AB12CD34", "NAME", 0.9)
    assert ent._.dphub_members == ["a", "b"] and ent._.dphub_offsets == [[4, 6], [8, 10]]
    assert [d["start"] for d in doc._.dphub_spans] == [4, 8, 16]  # the exact record keeps all


def test_existing_entities_overwritten_or_kept() -> None:
    text = "Seen by Dr. Kowalczyk today."
    for overwrite in (True, False):
        nlp = spacy.blank("en")
        ruler = nlp.add_pipe("entity_ruler")
        ruler.add_patterns([{"label": "ORG", "pattern": "Dr. Kowalczyk"},
                            {"label": "DATE_WORD", "pattern": "today"}])
        nlp.add_pipe("dphub", config={"members": ["rules:default"],
                                      "overwrite_ents": overwrite})
        doc = nlp(text)
        ents = [(e.text, e.label_) for e in doc.ents]
        if overwrite:
            assert ents == [("Kowalczyk", "DOCTOR"), ("today", "DATE_WORD")]
        else:
            assert ents == [("Dr. Kowalczyk", "ORG"), ("today", "DATE_WORD")]
        # the span group holds dphub's spans either way: nothing is lost
        assert [(s.text, s.label_) for s in doc.spans["dphub"]] == [("Kowalczyk", "DOCTOR")]


def test_span_group_only_and_bad_options() -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe("dphub", config={"members": ["rules:default"], "set_ents": False,
                                  "spans_key": "phi"})
    doc = nlp("Call 555-123-4567.")
    assert not doc.ents and [s.text for s in doc.spans["phi"]] == ["555-123-4567"]
    with pytest.raises(ConfigError, match="would set nothing"):
        spacy.blank("en").add_pipe("dphub", config={"members": ["rules:default"],
                                                    "set_ents": False, "spans_key": None})
    with pytest.raises(ConfigError, match="needs a manifest path"):
        spacy.blank("en").add_pipe("dphub")
    with pytest.raises(ConfigError, match="needs at least 2 members"):
        spacy.blank("en").add_pipe("dphub", config={
            "members": ["rules:default"], "aggregate": "k-of-n:2+rules:defualt"})



def test_a_saved_pipeline_loads_the_ensemble_again(tmp_path: Path) -> None:
    """``nlp.to_disk`` keeps the component's config (not the models): ``spacy.load`` rebuilds
    the ensemble through the entry point from the same specs."""
    nlp = spacy.blank("en")
    nlp.add_pipe("dphub", config={"members": ["rules:default"], "spans_key": "phi"})
    nlp.to_disk(tmp_path / "pipe")
    again = spacy.load(tmp_path / "pipe")
    assert again.pipe_names == ["dphub"]
    assert again.get_pipe("dphub").spans_key == "phi"
    doc = again("Call 555-123-4567.")
    assert [(e.text, e.label_) for e in doc.ents] == [("555-123-4567", "PHONE")]

def test_the_docs_spacy_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """docs/api.md's "spaCy" section runs as written."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("## spaCy\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/api.md", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == ["Kowalczyk DOCTOR 0.6 ['rules:default']",
                                    "03/04/2021 DATE 1.0 ['rules:default']",
                                    "555-123-4567 PHONE 1.0 ['rules:default']"]
