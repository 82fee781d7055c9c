"""Member kinds are looked up in one registry (issue 39): the example of docs/extending.md works
end to end, and no module outside the parsers reads a spec's prefix or asks a rule its class."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dphub.cli.main import main
from dphub.ensemble.kinds import kind_names, member_kind, parse_spec, unregister_member_kind
from dphub.ensemble.manifest import Manifest, entry_from_spec
from dphub.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def words_kind() -> Iterator[Any]:
    """The documented example kind, registered by running the doc's code, then unregistered."""
    doc = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    section = doc.split("## A member kind", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "docs/extending.md: the member kind section has no python example"
    namespace: dict[str, Any] = {"__name__": "words_kind_example"}
    exec(compile(code.group(1), "docs/extending.md", "exec"), namespace)
    yield namespace["KIND"]
    unregister_member_kind(namespace["KIND"])


def test_the_documented_kind_runs_in_an_ensemble(words_kind: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "words:Hallworth,Quenby", "--ensemble", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    entry = Manifest.load(m).get("words")
    assert (entry.kind, entry.options) == ("words", {"words": ["Hallworth", "Quenby"]})
    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "n1", "text": "Seen by Dr Hallworth today. Quenby called."})
                   + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--mode", "tag",
                 "--ensemble", str(m)]) == 0
    text = json.loads((out / "notes.jsonl").read_text(encoding="utf-8"))["text"]
    assert "Hallworth" not in text and "Quenby" not in text
    assert "Seen by Dr" in text
    voters = {v for line in (out / "audit.jsonl").read_text().splitlines()
              for s in json.loads(line)["spans"] for v in s["members"]}
    assert "words" in voters
    # the top-level command reads the same spec through the registry
    assert main(["deid", str(src), "--model", "words:Quenby", "--out", str(tmp_path / "one")]) == 0
    text = json.loads((tmp_path / "one" / "notes.jsonl").read_text(encoding="utf-8"))["text"]
    assert "Quenby" not in text and "Hallworth" in text


def test_an_unregistered_kind_is_gone(words_kind: Any) -> None:
    assert "words" in kind_names()
    unregister_member_kind(words_kind)
    assert "words" not in kind_names()
    with pytest.raises(ConfigError, match="unknown member kind 'words'"):
        member_kind("words")
    kind, arg = parse_spec("words:x")  # no prefix of its own: the model kind's argument
    assert kind.model and arg == "words:x"


@pytest.mark.parametrize(("spec", "kinds", "arg"), [
    ("rules:default", ("rules",), "default"), ("deidpl:/opt/deid", ("deidpl",), "/opt/deid"),
    ("presidio:default", ("presidio",), "default"), ("org/name@abc", ("registry", "dir"),
                                                     "org/name@abc"),
    ("./models/a:b", ("registry", "dir"), "./models/a:b"),
])
def test_a_spec_is_split_by_the_registry(spec: str, kinds: tuple[str, ...], arg: str) -> None:
    kind, got = parse_spec(spec)
    assert (kind.kinds, got) == (kinds, arg)


def test_the_built_in_kinds_keep_their_errors() -> None:
    with pytest.raises(ConfigError, match="unknown rule member 'rules:fancy'"):
        member_kind("rules").parse("fancy", name=None, threshold=None, timeout=None)
    with pytest.raises(ConfigError, match="unknown Presidio member 'presidio:large'"):
        member_kind("presidio").parse("large", name=None, threshold=None, timeout=None)
    with pytest.raises(ConfigError, match="unknown rule member 'rules:fancy'"):
        entry_from_spec("rules:fancy")
    with pytest.raises(ConfigError, match="--timeout applies to deid.pl members"):
        entry_from_spec("rules:default", timeout=5)
    with pytest.raises(ConfigError, match="is neither a model directory"):
        entry_from_spec("no such thing")


# ------------------------------------------------------------------------- no sniffing
#: what a member or rule spec starts with
SPEC_PREFIX = re.compile(r"(rules|deidpl|presidio|model|registry|dir|inverse|k-of-n|any)\b")
#: the parsers: the only modules allowed to split a spec
PARSERS = {"dphub/ensemble/kinds.py", "dphub/ensemble/aggregation.py"}


def _strings(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def sniffs(source: str) -> list[str]:
    """Where ``source`` reads a spec's prefix (``startswith`` a spec prefix, ``partition(':')``,
    ``re.split`` at ``:``) or asks a rule its class (``isinstance(_, InverseRule)``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f, first = node.func, node.args[0]
        if isinstance(f, ast.Attribute) and f.attr == "startswith" and any(
                SPEC_PREFIX.match(s) for s in _strings(first)):
            found.append((node.lineno, "startswith"))
        elif isinstance(f, ast.Attribute) and f.attr == "partition" and _strings(first) == [":"]:
            found.append((node.lineno, "partition"))
        elif (isinstance(f, ast.Attribute) and f.attr == "split"
              and isinstance(f.value, ast.Name) and f.value.id == "re"
              and any(":" in s for s in _strings(first))):
            found.append((node.lineno, "re.split"))
        elif (isinstance(f, ast.Name) and f.id == "isinstance" and len(node.args) == 2
              and any(isinstance(n, ast.Name) and n.id == "InverseRule"
                      for n in ast.walk(node.args[1]))):
            found.append((node.lineno, "isinstance"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_only_the_parsers_read_a_spec_s_prefix() -> None:
    source = '''
if spec.startswith("deidpl:"): pass
if model.startswith(("x", "rules:")): pass
kind, _, arg = spec.partition(":")
name = re.split(r"[:+]", text)[0]
if isinstance(ensemble.rule, (AggregateRule, InverseRule)): pass
if line.startswith("#") or host.rpartition(":") or spec.split(","): pass
'''
    assert [s.split(": ")[1] for s in sniffs(source)] == [
        "startswith", "startswith", "partition", "re.split", "isinstance"]  # every form seen
    found = {str(p.relative_to(ROOT)): hits for d in ("dphub", "cli")
             for p in sorted((ROOT / d).rglob("*.py"))
             if (hits := sniffs(p.read_text(encoding="utf-8")))}
    # the parsers' own splits are found (the scan is not vacuous), nothing else
    assert set(found) == PARSERS, found


def test_a_registry_member_reaches_a_ray_worker_as_its_pinned_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver resolves it (a worker's node has its own registry, or none): the model kind
    says so, the Ray engine only asks each kind (``for_worker``)."""
    import hashlib

    from dphub.ensemble.manifest import MemberEntry
    from dphub.ensemble.member_kinds import model

    d = tmp_path / "pulled"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(model, "model_dir_of", lambda entry: d)
    entry = MemberEntry("org/x", "registry", repo="org/x", revision="abc", threshold=0.3)
    assert member_kind("registry").for_worker(entry) == {
        "name": "org/x", "kind": "dir", "revision": "sha256:" + hashlib.sha256(b"weights")
        .hexdigest(), "path": str(d.resolve()), "threshold": 0.3}
    rules = entry_from_spec("rules:default")
    assert member_kind("rules").for_worker(rules) == rules.to_dict()
