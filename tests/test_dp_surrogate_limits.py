"""Issue 38, the medium items: inputs at the edges give one clean line or the right output
(tiny and huge ε, a corpus size past the cap)."""

from __future__ import annotations

import re

import pytest

from dphub.cli.main import main
from dphub.errors import ConfigError
from dphub.notes import Note, Span
from dphub.privacy.mechanisms import BoundedLaplace
from dphub.render import SurrogateRenderer
from dphub.render.surrogate import check_surrogate_options
from dphub.synth import iter_notes
from dphub.synth.corpus import MAX_NOTES

KEY = b"0123456789abcdef-limits-test-key"


@pytest.mark.parametrize("n", ["99999999999999999999999", str(10**19), str(MAX_NOTES + 1),
                               str(10**400)])
def test_synth_refuses_a_corpus_past_the_cap_in_one_line(n: str, tmp_path, capsys) -> None:
    out = tmp_path / "s.jsonl"
    assert main(["data", "synth", "--n", n, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err and "at most" in err
    assert not out.exists()


def test_synth_checks_its_arguments_at_the_call() -> None:
    with pytest.raises(ConfigError, match="at most"):
        iter_notes(10**19)  # no next(): the check is not deferred to the first note
    assert sum(1 for _ in iter_notes(3, seed=1)) == 3


def _note(text: str, label: str, start: int, end: int, patient: str = "p1") -> Note:
    return Note("n1", text, patient_id=patient, spans=[Span(start, end, label)])


@pytest.mark.parametrize("epsilon", [1e-20, 1e-300, 5e-324, 1e-12, 1e30, 1e300])
def test_dp_dates_and_ages_at_extreme_epsilons_give_an_output(epsilon: float) -> None:
    # ε = 1e-20 and 1e-300 divided by zero in the bounded Laplace's scale search; a scale
    # beyond 1e9 domain widths now samples the uniform law (0-DP: it keeps every ε)
    r = SurrogateRenderer(KEY, dates="dp", date_epsilon=epsilon, ages="dp",
                          age_epsilon=epsilon)
    note = Note("n1", "seen 7/12/2094 and 7/14/2094, age 45.", patient_id="p1",
                spans=[Span(5, 14, "DATE"), Span(19, 28, "DATE"), Span(34, 36, "AGE")])
    r.observe(note, note.spans)
    out = r.render(note, note.spans)
    m = re.fullmatch(r"seen (\d+/\d+/\d{4}) and (\d+/\d+/\d{4}), age (\d+)\.", out)
    assert m is not None, out
    assert 0 <= int(m[3]) <= 89


@pytest.mark.parametrize(("dq", "lower", "upper"), [(1, 1, 31), (30, 32, 365), (1, 0, 89)])
@pytest.mark.parametrize("epsilon", [1e-20, 1e-300, 5e-324])
def test_a_vanishing_epsilon_samples_the_whole_domain(dq: float, lower: float, upper: float,
                                                      epsilon: float) -> None:
    m = BoundedLaplace(epsilon, dq, lower, upper)
    draws = [m.sample(lower, (i + 0.5) / 200) for i in range(200)]
    assert min(draws) < lower + 0.02 * (upper - lower)
    assert max(draws) > upper - 0.02 * (upper - lower)
    assert m.cdf((lower + upper) / 2, lower) == pytest.approx(0.5, abs=1e-6)


def test_places_at_a_vanishing_epsilon_are_one_line() -> None:
    with pytest.raises(ConfigError, match="at least"):
        SurrogateRenderer(KEY, places="geo", place_epsilon=5e-324)
    with pytest.raises(ConfigError, match="at least"):
        check_surrogate_options(places="geo", place_epsilon=1e-320)


def test_dp_dates_state_the_per_patient_total_and_what_stays_visible() -> None:
    d = SurrogateRenderer(KEY, dates="dp", date_epsilon=0.1).describe()["dates"]
    total = d["per_patient"]
    assert total["worst_case_per_interval"] == {"days": 3.0, "months": pytest.approx(1.11, 0.01),
                                                "years": pytest.approx(9.907, 0.001)}
    assert total["worst_case_per_anchor"] == pytest.approx(73.0)
    assert "sum" in total["composition"] and "number of distinct dates" in total["left_visible"]
