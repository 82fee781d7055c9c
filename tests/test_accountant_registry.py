"""Accountants are looked up in one registry (issue 39), Opacus-style: one entry adds one."""

from __future__ import annotations

import math

import pytest

from dphub.errors import PrivacyError
from dphub.privacy import accounting
from dphub.privacy.accounting import Accountant, epsilon_for, lookup_accountant
from dphub.train import options


def test_training_offers_the_registry_s_accountants() -> None:
    assert options.ACCOUNTANTS is accounting.ACCOUNTANTS
    assert accounting.ACCOUNTANTS == ("prv", "rdp")


def test_adding_an_accountant_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(accounting._ACCOUNTANTS, "gdp", Accountant(opacus="gdp", cross_check="rdp"))
    eps = epsilon_for("gdp", 0.01, 1.0, 100, 1e-5)
    assert math.isfinite(eps) and eps > 0


@pytest.mark.parametrize("name", ["", "PRV", "pld", "gdp", None])
def test_an_unknown_accountant_is_one_privacy_error(name: object) -> None:
    with pytest.raises(PrivacyError, match=r"unknown accountant .*choose one of prv, rdp"):
        lookup_accountant(name)  # type: ignore[arg-type]
    with pytest.raises(PrivacyError, match="unknown accountant"):
        epsilon_for(name, 0.01, 1.0, 10, 1e-5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "method"), [("prv", "pld"), ("rdp", "rdp")])
def test_each_accountant_is_cross_checked_by_its_registered_method(name: str,
                                                                  method: str) -> None:
    assert lookup_accountant(name).cross_check == method
    assert accounting.cross_check(name, 0.01, 1.0, 10, 1e-5).method == method
