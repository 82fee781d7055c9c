"""Hand-checked aggregation on characters: any, k-of-n, thresholds, label choice, ties, merging."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dphub.ensemble.aggregate import AggregateRule, aggregate
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import FixedMember
from dphub.errors import ConfigError
from dphub.notes import Note, Span

#          0         1         2         3
#          0123456789012345678901234567890123456
TEXT = "Seen by John Smith on 01/02/2003 ok."


def _sp(a: int, b: int, label: str, score: float | None = None) -> Span:
    return Span(a, b, label, score=score)


def test_any_is_union_and_overlaps_merge() -> None:
    out = aggregate(
        {
            "a": [_sp(8, 12, "NAME", 0.9)],  # John
            "b": [_sp(10, 18, "NAME", 0.8)],  # hn Smith (different tokenizer boundary)
            "c": [_sp(22, 32, "DATE", 1.0)],
        },
        "any",
    )
    assert [(m.start, m.end, m.label, m.voters) for m in out] == [
        (8, 18, "NAME", ("a", "b")),
        (22, 32, "DATE", ("c",)),
    ]
    assert out[0].score == 0.9


def test_k_of_n_needs_agreement_on_characters() -> None:
    spans = {
        "a": [_sp(8, 18, "NAME", 0.9), _sp(22, 32, "DATE", 0.9)],
        "b": [_sp(13, 18, "NAME", 0.7)],
        "c": [_sp(22, 24, "DATE", 0.6)],
    }
    out = aggregate(spans, "k-of-n:2")
    assert [(m.start, m.end) for m in out] == [(13, 18), (22, 24)]
    assert out[0].voters == ("a", "b")
    assert aggregate(spans, "k-of-n:3") == []
    with pytest.raises(ConfigError):
        aggregate(spans, "k-of-n:4")
    with pytest.raises(ConfigError):
        AggregateRule.parse("most")


def test_members_named_in_the_rule_count_alone() -> None:
    spans = {
        "site1": [_sp(8, 12, "NAME", 0.9), _sp(22, 32, "DATE", 0.9)],
        "site2": [_sp(8, 18, "NAME", 0.7)],
        "rules": [_sp(33, 35, "OTHER", 1.0)],  # "ok": flagged by the rules only
        "owner": [_sp(13, 18, "NAME", 0.6)],
    }
    rule = AggregateRule.parse("k-of-n:2+rules+owner")
    assert (rule.k, rule.alone, str(rule)) == (2, ("rules", "owner"), "k-of-n:2+rules+owner")
    assert AggregateRule.parse(str(rule)) == rule
    assert [rule.weight(n) for n in spans] == [1, 1, 2, 2]
    out = aggregate(spans, rule)
    # John: two sites agree; Smith: the owner alone (site2 beside it); the space between has one
    # site's vote only; the date: one site only (dropped); ok: the rules alone
    assert [(m.start, m.end, m.voters) for m in out] == [
        (8, 12, ("site1", "site2")), (13, 18, ("site2", "owner")), (33, 35, ("rules",))]
    # without the alone names, the rules' span needs a second vote (Smith has site2's)
    assert [(m.start, m.end) for m in aggregate(spans, "k-of-n:2")] == [(8, 12), (13, 18)]
    # K = 3 among two sites: they could never agree, so the sites would count for nothing and
    # the result would silently be the rules' and the owner's alone (issue 56): refused, with
    # the quorum they can reach
    with pytest.raises(ConfigError, match=r"the 2 members that do not count alone \(site1, "
                       r"site2\) can never reach 3 votes.*use k-of-n:2\+rules\+owner"):
        aggregate(spans, "k-of-n:3+rules+owner")


@pytest.mark.parametrize("text", ["any+rules", "k-of-n:1+rules", "k-of-n:2+", "k-of-n:2++a",
                                  "k-of-n:2+a+a", "k-of-n:0+a", "+a"])
def test_alone_rule_syntax_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="aggregate rule"):
        AggregateRule.parse(text)


def test_alone_names_must_be_members() -> None:
    a = FixedMember("a", {"n1": [_sp(8, 12, "NAME")]})
    b = FixedMember("b", {"n1": [_sp(22, 32, "DATE")]})
    with pytest.raises(ConfigError, match="no member named c"):
        Ensemble([Slot(a), Slot(b)], "k-of-n:2+c")
    # a alone could never reach K = 2 beside b counting alone: refused (issue 56), not run
    with pytest.raises(ConfigError, match=r"the 1 member that does not count alone \(a\)"):
        Ensemble([Slot(a), Slot(b)], "k-of-n:2+b")
    c = FixedMember("c", {"n1": [_sp(8, 12, "NAME")]})
    (res,) = Ensemble([Slot(a), Slot(b), Slot(c)], "k-of-n:2+b").deid([Note("n1", TEXT)])
    assert [(s.start, s.end, s.voters) for s in res.merged] == [(8, 12, ("a", "c")),
                                                                (22, 32, ("b",))]


def test_thresholds_drop_low_scoring_member_spans() -> None:
    spans = {"a": [_sp(8, 12, "NAME", 0.3)], "b": [_sp(22, 32, "DATE", 0.9)]}
    out = aggregate(spans, "any", thresholds={"a": 0.5, "b": 0.5})
    assert [(m.start, m.end) for m in out] == [(22, 32)]
    out = aggregate(spans, "any", thresholds={"a": 0.2})
    assert [(m.start, m.end) for m in out] == [(8, 12), (22, 32)]


def test_label_from_highest_score_then_precedence_then_member_order() -> None:
    # highest score wins regardless of precedence
    out = aggregate({"a": [_sp(8, 18, "LOCATION", 0.95)], "b": [_sp(8, 18, "NAME", 0.9)]})
    assert out[0].label == "LOCATION"
    # tie on score: NAME precedes DATE/LOCATION in CATEGORY_PRECEDENCE
    out = aggregate({"a": [_sp(8, 18, "CITY", 0.9)], "b": [_sp(8, 18, "DOCTOR", 0.9)]})
    assert out[0].label == "DOCTOR"
    # unscored spans count as 1.0
    out = aggregate({"a": [_sp(8, 18, "AGE", None)], "b": [_sp(8, 18, "NAME", 0.99)]})
    assert out[0].label == "AGE" and out[0].score == 1.0
    # full tie: first member
    out = aggregate({"a": [_sp(8, 18, "PATIENT", 0.5)], "b": [_sp(8, 18, "DOCTOR", 0.5)]})
    assert out[0].label == "PATIENT"


def test_touching_spans_stay_separate_but_bridged_ones_merge() -> None:
    out = aggregate({"a": [_sp(8, 12, "NAME", 0.9)], "b": [_sp(12, 18, "DATE", 0.9)]})
    assert [(m.start, m.end, m.label) for m in out] == [(8, 12, "NAME"), (12, 18, "DATE")]
    out = aggregate(
        {"a": [_sp(8, 12, "NAME", 0.9), _sp(12, 18, "NAME", 0.9)], "b": [_sp(10, 14, "DATE", 0.5)]}
    )
    assert [(m.start, m.end, m.label) for m in out] == [(8, 18, "NAME")]


def test_ensemble_with_fixed_members_records_voters() -> None:
    note = Note("n1", TEXT)
    a = FixedMember("a", {"n1": [_sp(8, 12, "NAME", 0.4), _sp(13, 18, "NAME", 0.9)]})
    b = FixedMember("b", {"n1": [_sp(22, 32, "DATE", 1.0)]})
    ens = Ensemble([Slot(a, threshold=0.5), Slot(b)], "any")
    (res,) = ens.deid([note])
    assert [(s.start, s.end, s.label, s.source) for s in res.spans] == [
        (13, 18, "NAME", "a"),
        (22, 32, "DATE", "b"),
    ]
    assert set(res.by_member) == {"a", "b"}


_span_lists = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 8), st.sampled_from(["NAME", "DATE", "AGE"]),
              st.floats(0.0, 1.0)),
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_span_lists, min_size=1, max_size=4), st.integers(1, 4))
def test_properties_union_covers_members_and_k_of_n_is_a_subset(
    members: list[list[tuple[int, int, str, float]]], k: int
) -> None:
    spans = {f"m{i}": [_sp(a, a + n, lab, sc) for a, n, lab, sc in m]
             for i, m in enumerate(members)}
    union = aggregate(spans, "any")
    covered = {c for m in union for c in range(m.start, m.end)}
    member_chars = {c for ss in spans.values() for s in ss for c in range(s.start, s.end)}
    assert covered == member_chars  # a character is PHI iff some member flags it
    assert all(a.end <= b.start for a, b in zip(union, union[1:], strict=False))  # sorted, disjoint
    if k <= len(spans):
        strict = aggregate(spans, AggregateRule(k))
        strict_chars = {c for m in strict for c in range(m.start, m.end)}
        assert strict_chars <= covered
        for c in strict_chars:
            votes = sum(any(s.start <= c < s.end for s in ss) for ss in spans.values())
            assert votes >= k
        if k >= 2 and 0 < len(spans) - 1 < k:  # the others could never agree: refused
            with pytest.raises(ConfigError, match="can never reach"):
                aggregate(spans, AggregateRule(k, ("m0",)))
        elif k >= 2:  # m0 counts alone: exactly the characters it or k others flag
            weighted = aggregate(spans, AggregateRule(k, ("m0",)))
            chars = {c for m in weighted for c in range(m.start, m.end)}
            m0 = {c for s in spans["m0"] for c in range(s.start, s.end)}
            assert chars == m0 | strict_chars
