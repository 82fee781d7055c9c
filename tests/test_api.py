"""The Python API (issue 56 item 1) as a user calls it: ``import dphub``, load once, de-identify.

What is tested is that it is the CLI's path (the same spans and renderings as ``dphub ensemble
deid`` on the same notes, an emoji and a U+2028 included), that it streams, that ``import dphub``
stays light, and that the README's snippet runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dphub
from dphub.cli.main import main
from dphub.errors import ConfigError, InputError
from dphub.notes import Note

ROOT = Path(__file__).resolve().parent.parent

#: synthetic notes (nothing from a real corpus): a name, dates, a phone, an emoji (one code
#: point, two UTF-16 units) before PHI, and a line separator U+2028 inside a note
NOTES = [
    Note("n1", "Seen by Dr. Kowalczyk on 03/04/2021. Call 555-123-4567 to follow up."),
    Note("n2", "Pt \U0001f600 happy; wife Anna Berg visited 12/25/2020 at Mercy Hospital."),
    Note("n3", "Discharged 01/02/2022.\u2028Follow-up with Dr. Okafor, 617-555-0199."),
    Note("n4", "No PHI here, vitals stable."),
]


@pytest.fixture(scope="module")
def manifest(tiny_tagger_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model member (the tiny untrained tagger, at a low threshold so it flags something)
    and the rules: both kinds of member through the API."""
    m = tmp_path_factory.mktemp("api") / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "--name", "tiny", "--threshold",
                 "0.3", "-e", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "-e", str(m)]) == 0
    return m


def _cli(manifest: Path, notes: list[Note], tmp_path: Path, mode: str) -> list[dict]:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": n.id, "text": n.text}) + "\n" for n in notes),
                   encoding="utf-8")
    out = tmp_path / f"out-{mode}"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--mode", mode,
                 "-e", str(manifest)]) == 0
    return [json.loads(x) for x in (out / "in.jsonl").read_text(encoding="utf-8").splitlines()]


def test_three_lines_give_the_spans_of_ensemble_deid(manifest: Path, tmp_path: Path) -> None:
    """The issue's 'done when': load, de-identify a string; the same spans as the CLI."""
    deid = dphub.load(manifest)
    res = deid(NOTES[0].text)
    assert res.spans and res.id == "text"

    cli = {r["id"]: r["spans"] for r in _cli(manifest, NOTES, tmp_path, "spans")}
    api = {r.id: [s.to_dict() for s in r.spans] for r in deid.deid(NOTES)}
    assert api == cli
    assert [s.to_dict() for s in res.spans] == cli["n1"]
    # the emoji counts one code point: the name after it starts where Python's str says
    n2 = next(r for r in deid.deid([NOTES[1]]))
    assert any(n2.text[s.start:s.end] == "Anna Berg" or "Berg" in n2.text[s.start:s.end]
               for s in n2.spans)
    assert {m for r in deid.deid(NOTES) for s in r.spans for m in s.members} <= {
        "tiny", "rules:default"}


@pytest.mark.parametrize("mode", ["tag", "redact"])
def test_renderings_are_those_of_ensemble_deid(manifest: Path, tmp_path: Path,
                                               mode: str) -> None:
    # a directory of .txt (one output file per note): the JSONL layout's part files are read
    # back by lines, and a U+2028 inside a rendered text breaks that (a runner bug fixed apart)
    src = tmp_path / "txt"
    src.mkdir()
    for n in NOTES:
        (src / f"{n.id}.txt").write_text(n.text, encoding="utf-8", newline="")
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--mode", mode,
                 "-e", str(manifest)]) == 0
    cli = {n.id: (out / f"{n.id}.txt").read_bytes().decode("utf-8") for n in NOTES}
    deid = dphub.load(manifest)
    assert dict(zip([n.id for n in NOTES], deid.render(NOTES, mode), strict=True)) == cli
    assert deid(NOTES[2]).render(mode) == cli["n3"] and "\u2028" in cli["n3"]
    assert "Kowalczyk" not in cli["n1"]


def test_members_specs_without_a_manifest_and_the_rule_override(tiny_tagger_dir: Path) -> None:
    deid = dphub.load(members=["rules:default", str(tiny_tagger_dir)], aggregate="k-of-n:2")
    assert deid.members == ["rules:default", tiny_tagger_dir.name]
    assert deid.rule == "k-of-n:2" and deid.manifest is None
    # one model beside the rules counting alone: the model could never hide anything
    with pytest.raises(ConfigError, match="never reach 2 votes"):
        dphub.load(members=["rules:default", str(tiny_tagger_dir)],
                   aggregate="k-of-n:2+rules:default")
    with pytest.raises(ConfigError, match="did you mean rules:default"):
        dphub.load(members=["rules:default", str(tiny_tagger_dir)],
                   aggregate="k-of-n:2+rules:defualt")
    with pytest.raises(ConfigError, match="needs a manifest path"):
        dphub.load()


def test_deid_streams_in_batches_and_keeps_order() -> None:
    deid = dphub.load(members=["rules:default"], batch_size=2)
    pulled: list[int] = []

    def notes() -> Iterator[str]:
        for i in range(7):
            pulled.append(i)
            yield f"Seen on 0{i + 1}/02/2021."

    stream = deid.deid(notes())
    first = next(stream)
    assert len(pulled) == 2  # one batch read, not the whole input
    rest = list(stream)
    assert [r.id for r in [first, *rest]] == [str(i) for i in range(1, 8)]
    assert all(r.render("tag") == "Seen on [**DATE**]." for r in [first, *rest])
    with pytest.raises(InputError, match="expected a string or a Note, got int"):
        list(deid.deid([3]))  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="batch_size"):
        dphub.load(members=["rules:default"], batch_size=0)


def test_results_never_show_the_text() -> None:
    deid = dphub.load(members=["rules:default"])
    res = deid("Dr. Kowalczyk called 555-123-4567.")
    assert "Kowalczyk" not in repr(res) and "555" not in repr(res)
    assert "Kowalczyk" not in repr(deid)
    assert res.text.startswith("Dr.")  # the user's own text is there when asked for


def test_surrogates_need_a_real_key(tmp_path: Path) -> None:
    deid = dphub.load(members=["rules:default"])
    res = deid("Call 555-123-4567 on 03/04/2021.")
    with pytest.raises(ConfigError, match="key"):
        res.render("surrogate")
    with pytest.raises(ConfigError, match="at least"):
        res.render("surrogate", key=b"short")
    key = tmp_path / "key"
    key.write_text("k" * 32)
    a, b = res.render("surrogate", key=key), res.render("surrogate", key=b"k" * 32)
    assert a == b and "555-123-4567" not in a
    with pytest.raises(ConfigError, match="unknown mode"):
        res.render("blur")


def test_evaluate_is_ensemble_evaluate(manifest: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from dphub import synth

    gold = synth.generate(4, seed=5)
    src = tmp_path / "gold.jsonl"
    src.write_text("".join(json.dumps({"id": n.id, "text": n.text, "spans": [
        s.to_dict() for s in n.spans]}) + "\n" for n in gold), encoding="utf-8")
    capsys.readouterr()
    assert main(["ensemble", "evaluate", str(src), "--json", "-e", str(manifest)]) == 0
    cli = json.loads(capsys.readouterr().out)
    deid = dphub.load(manifest)
    assert deid.evaluate(src) == cli
    assert deid.evaluate(gold) == cli
    with pytest.raises(InputError, match="gold spans"):
        deid.evaluate([Note("x", "no gold")])


def test_import_dphub_stays_light_and_exports_the_api() -> None:
    code = ("import sys, dphub; heavy = [m for m in ('torch', 'transformers', 'dphub.ensemble', "
            "'dphub.api') if m in sys.modules]; assert not heavy, heavy; "
            "assert {'load', 'Deidentifier', 'DeidResult', 'PhiSpan'} <= set(dphub.__all__); "
            "assert 'load' in dir(dphub); dphub.load; assert 'dphub.api' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dphub.nope  # noqa: B018


def test_readme_python_api_snippet_runs(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102
