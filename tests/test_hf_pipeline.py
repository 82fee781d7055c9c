"""Issue 31, item 23: what plain ``transformers`` loading loses of a dphub model (as the card says),
and the ``dphub.hf`` pipeline that keeps the CRF and the rule features and returns whole words."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from dphub.notes import Note

TEXT = ("Pt seen by Dr. Jonathan Smithers on 03/14/2021 at Lowell General, call 555-123-4567. "
        "Daughter Mary Ellen visited.")


@pytest.fixture(scope="module")
def rule_model(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tagger with rule features whose CRF and rule projection carry weight (random, so that
    dropping them changes the output), saved as a model directory."""
    from dphub.tagger import TaggerModel

    torch.manual_seed(3)
    model = TaggerModel.from_base(tiny_base_model, schema="hipaa", head="crf", rule_features=True)
    with torch.no_grad():
        model.rule_proj.weight.normal_(0, 3.0)
        model.crf.transitions.normal_(0, 3.0)
    out = tmp_path_factory.mktemp("hf") / "model"
    model.save(out)
    return out


def test_plain_transformers_drops_crf_and_rule_projection_as_the_card_says(
    rule_model: Path,
) -> None:
    from transformers import AutoModelForTokenClassification

    from dphub.card import TEMPLATE_FILE
    from dphub.cards import asset
    from dphub.encoders import quiet_transformers as _quiet_transformers

    with _quiet_transformers():
        _, info = AutoModelForTokenClassification.from_pretrained(
            rule_model, output_loading_info=True)
    dropped = {k.split(".")[0] for k in info["unexpected_keys"]}
    assert dropped == {"crf", "rule_proj"} and not info["missing_keys"]
    card = asset(TEMPLATE_FILE).read_text(encoding="utf-8")
    for prefix in dropped:  # the card names every part plain loading drops
        assert f"`{prefix}.*`" in card
    assert 'pipeline("dphub-phi"' in card and "import dphub.hf" in card
    # ... and that the plain pipeline labels word pieces with BIOES tags
    from transformers import pipeline

    with _quiet_transformers():
        plain = pipeline("token-classification", model=str(rule_model))
    pieces = plain(TEXT)
    assert any(p["word"].startswith("##") for p in pieces)
    assert {p["entity"][:2] for p in pieces} & {"S-", "E-"}
    assert "`##ll`" in card and "BIOES" in card


def test_dphub_pipeline_keeps_the_model_and_returns_whole_words(rule_model: Path) -> None:
    from transformers import pipeline

    import dphub.hf
    from dphub.tagger import Tagger

    phi = pipeline(dphub.hf.TASK, model=str(rule_model))
    assert isinstance(phi, dphub.hf.DphubPhiPipeline)
    got = phi(TEXT)
    assert got, "the random model flags something"
    for e in got:
        assert set(e) == {"entity_group", "start", "end", "word", "score"}
        assert e["word"] == TEXT[e["start"]:e["end"]] and "##" not in e["word"]
        s, t = e["start"], e["end"]  # whole words: never a word cut at either end
        assert s == 0 or not (TEXT[s - 1].isalnum() and TEXT[s].isalnum())
        assert t == len(TEXT) or not (TEXT[t - 1].isalnum() and TEXT[t].isalnum())
    # exactly dphub's tagger (CRF Viterbi over emissions + rule features), widened to words
    spans = Tagger.load(rule_model).tag([Note(id="n", text=TEXT)])[0]
    widened = [dphub.hf.whole_words(TEXT, sp.start, sp.end) for sp in spans]
    covered = {i for s, t in widened for i in range(s, t)}
    assert covered == {i for e in got for i in range(e["start"], e["end"])}
    # the rule projection and the CRF matter: without them the decoded tags differ
    tagger = Tagger.load(rule_model)
    tagger.model.rule_proj.weight.data.zero_()
    tagger.model.rule_proj.bias.data.zero_()
    assert tagger.tag([Note(id="n", text=TEXT)])[0] != spans
    # lists and thresholds go through the pipeline API as usual
    both = phi([TEXT, "nothing here"], threshold=0.99)
    assert isinstance(both, list) and len(both) == 2


def test_whole_words_widens_cut_words_only() -> None:
    from dphub.hf import whole_words

    text = "Call Johnathan now"
    assert whole_words(text, 5, 8) == (5, 14)  # "Joh" -> "Johnathan"
    assert whole_words(text, 7, 14) == (5, 14)
    assert whole_words(text, 5, 14) == (5, 14)
    assert whole_words("03/14/2021", 3, 5) == (3, 5)  # digits between slashes stay as they are


def test_loader_refuses_what_dphub_cannot_load(tmp_path: Path) -> None:
    import dphub.hf
    from dphub.errors import DphubError

    with pytest.raises(DphubError, match=re.escape("dphub pull")):
        dphub.hf.model_dir("acme/not-pulled")  # never a download
    with pytest.raises(DphubError):
        dphub.hf.DphubPipelineModel.from_pretrained(str(tmp_path))  # not a dphub model
