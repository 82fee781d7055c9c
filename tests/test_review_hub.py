"""``dphub review-hub`` (issue 40 #4): the hub's models on one page, cards rendered by
markdown-it-py with raw HTML escaped."""

from __future__ import annotations

import pytest

pytest.importorskip("markdown_it")
from hub_fixtures import copy_model  # noqa: E402

from dphub.cli.main import main  # noqa: E402
from dphub.hub import ops  # noqa: E402
from dphub.review.hub_page import card_html  # noqa: E402

pytest_plugins = ("hub_fixtures",)


def test_hub_page_lists_models_with_epsilon_and_card(model_template, hub_env, capsys) -> None:
    model = copy_model(model_template, hub_env["tmp"] / "model")
    sha, summary = ops.publish(model, "acme/deid", tag="v1")
    page = hub_env["tmp"] / "hub.html"
    assert main(["review-hub", "--html", str(page)]) == 0
    assert "1 model(s)" in capsys.readouterr().out
    html = page.read_text()
    assert "acme/deid" in html and sha[:12] in html and "v1" in html
    assert f"{summary.epsilon:.3g}" in html and summary.unit in html
    assert "<details><summary>model card</summary>" in html and "<table>" in html
    assert "default-src 'none'" in html


@pytest.mark.parametrize("raw", ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>",
                                 '<a href="javascript:alert(1)">x</a>'])
def test_card_html_escapes_raw_html(raw: str) -> None:
    out = card_html(f"---\nlicense: x\n---\n# Card\n\n{raw}\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert "<script>" not in out and "<img" not in out and "<a href=\"javascript" not in out
    assert "<h1>Card</h1>" in out and "<table>" in out and "license" not in out


def test_card_link_javascript_scheme_is_not_a_link() -> None:
    assert 'href="javascript' not in card_html("[x](javascript:alert(1))")
