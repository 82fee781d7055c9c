"""Aggregation rules are looked up by name in one registry (issue 39), never by string prefix."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from dphub.ensemble import aggregation
from dphub.ensemble.aggregate import AggregateRule
from dphub.ensemble.aggregation import parse_rule, register_rule, rule_names
from dphub.ensemble.inverse import InverseRule
from dphub.errors import ConfigError
from dphub.runner.state import _describe_ensemble as run_settings  # the settings a resume checks

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("text", "cls", "vocab"), [
    ("any", AggregateRule, False), (" ANY ", AggregateRule, False),
    ("k-of-n:2", AggregateRule, False), ("k-of-n:2+rules:default", AggregateRule, False),
    ("inverse", InverseRule, True), ("INVERSE:0.1,0.4", InverseRule, True),
    (" inverse:0.2,0.9", InverseRule, True),
])
def test_a_rule_is_parsed_by_the_class_its_name_registers(text: str, cls: type,
                                                          vocab: bool) -> None:
    rule = parse_rule(text)
    assert type(rule) is cls
    assert rule.uses_safe_vocabulary is vocab


@pytest.mark.parametrize("bad", ["", "all", "k-of-n", "k-of-n:0", "inverse:0.9,0.1", "inverse:x"])
def test_an_unknown_or_malformed_rule_is_one_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="aggregate rule"):
        parse_rule(bad)


def test_adding_a_rule_is_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclass(frozen=True)
    class Unanimous(AggregateRule):
        @classmethod
        def parse(cls, text: str) -> Unanimous:
            return cls(k=99)

    monkeypatch.setattr(aggregation, "_RULES", dict(aggregation._RULES))
    register_rule("unanimous", Unanimous)
    assert "unanimous" in rule_names()
    assert parse_rule("unanimous").k == 99


def test_a_resumed_run_pins_the_safe_vocabulary_by_what_the_rule_reads() -> None:
    """The runner asks the parsed rule, not its spelling (it once tested ``startswith``)."""

    class _Vocab:
        digest = "abc"

    class _Ensemble:
        slots: list = []
        runtime = "torch"
        vocabulary = _Vocab()

        def __init__(self, rule: object) -> None:
            self.rule = rule

    assert run_settings(_Ensemble(parse_rule("inverse")))["safe_vocab_sha256"] == "abc"
    assert "safe_vocab_sha256" not in run_settings(_Ensemble(parse_rule("k-of-n:1")))


def _startswith_on_a_rule(path: Path) -> list[int]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "startswith" and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith(("inverse", "any", "k-of-n"))):
            hits.append(node.lineno)
    return hits


def test_no_module_asks_a_rule_spec_its_prefix() -> None:
    found = {str(p.relative_to(ROOT)): lines  # dphub/ holds the CLI (dphub/cli/)
             for p in (ROOT / "dphub").rglob("*.py") if (lines := _startswith_on_a_rule(p))}
    assert found == {}
