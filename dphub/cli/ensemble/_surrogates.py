"""The options of ``--mode surrogate``'s DP mechanisms (issue 28), declared once for ``dphub
ensemble deid`` and ``dphub deid``: ``--dates``, ``--date-epsilon``, ``--date-unit``, ``--ages``,
``--age-epsilon``, ``--places``, ``--place-epsilon`` (docs/surrogates.md)."""

from __future__ import annotations

from typing import Any

import typer

from dphub.cli.options import FLOAT, positive_float
from dphub.errors import ConfigError
from dphub.render.date_count import check_date_count
from dphub.render.surrogate import check_surrogate_options

DATES_OPT = typer.Option(
    "shift", "--dates",
    help="--mode surrogate: shift (one secret offset per patient; intervals kept exactly) | dp "
         "(intervals perturbed with bounded Laplace: resists the date linkage attack).",
)
DATE_EPSILON_OPT = typer.Option(
    None, "--date-epsilon", parser=positive_float, metavar=FLOAT,
    show_default="0.1 (from benchmarks/date_linkage.py)",
    help="With --dates dp: ε per interval, per unit of its scale (1 day / 30 days / 365 days).",
)
DATE_UNIT_OPT = typer.Option(
    "patient", "--date-unit",
    help="With --dates dp: patient (all of a patient's dates one chain, one surrogate per date "
         "across notes; the ensemble runs twice) | note (each note's dates one chain; streaming).",
)
DATE_COUNT_OPT = typer.Option(
    "keep", "--date-count",
    help="--mode tag, redact or surrogate: keep (every date mention rendered in place) | note "
         "(each note's first date rendered, its later date mentions removed) | none (every date "
         "mention removed). No ε spent; what stays visible: docs/surrogates.md.",
)
AGES_OPT = typer.Option(
    "keep", "--ages",
    help="--mode surrogate: keep (ages <= 89 kept, older 90+) | dp (ages <= 89 perturbed with "
         "bounded Laplace in 0-89; 90+ kept).",
)
AGE_EPSILON_OPT = typer.Option(
    None, "--age-epsilon", parser=positive_float, metavar=FLOAT, show_default="0.5",
    help="With --ages dp: ε per year.",
)
PLACES_OPT = typer.Option(
    "faker", "--places",
    help="--mode surrogate: faker (a made-up city) | geo (geo-indistinguishable: a real city of "
         "similar size near a noisy point; needs pip install 'dphub[geo]').",
)
PLACE_EPSILON_OPT = typer.Option(
    None, "--place-epsilon", parser=positive_float, metavar=FLOAT, show_default="0.05",
    help="With --places geo: ε per km.",
)


def surrogate_options(mode: str, *, dates: str, date_epsilon: float | None, date_unit: str,
                      ages: str, age_epsilon: float | None, places: str,
                      place_epsilon: float | None, date_count: str = "keep") -> dict[str, Any]:
    """The renderer options these flags ask for, checked before any model is loaded ({} when
    they are the defaults, so a run's settings stay those of older runs)."""
    check_date_count(date_count, mode)
    counted = {"date_count": date_count} if date_count != "keep" else {}
    opts = {"dates": dates, "date_epsilon": date_epsilon, "date_unit": date_unit, "ages": ages,
            "age_epsilon": age_epsilon, "places": places, "place_epsilon": place_epsilon}
    defaults = {"dates": "shift", "date_unit": "patient", "ages": "keep", "places": "faker"}
    chosen = {k: v for k, v in opts.items() if v is not None and defaults.get(k) != v}
    if not chosen:
        return counted
    if mode != "surrogate":
        flags = ", ".join("--" + k.replace("_", "-") for k in chosen)
        raise ConfigError(f"{flags} apply to --mode surrogate only")
    check_surrogate_options(**chosen)
    return {**chosen, **counted}
