"""A probe floor that a broken or poisoned model cannot lower (issue 53, item 4).

The gate's probe held a model to half the recall its own card recorded at training (at least
0.02), so a poisoned or broken model set its own floor: a model that flagged only ages and
contacts (recall 0.20, floor 0.10) passed. The floor now also comes from public facts: what the
public warm start of the model's base and schema does on the public probe notes, per category
(``dphub.card.probe_floor``). The tiny test models stand for their own public warm start here
(the shipped figures are the real MiniLM warm starts', measured by benchmarks/gate_floor.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hub_fixtures import card_meta, copy_model, set_hyperparams, write_card

from dphub.card import probe_floor
from dphub.card.probe import category_counts, run_category_probe, run_probe
from dphub.card.probe_floor import PublicBaseFigures, public_base
from dphub.cli.main import main
from dphub.encoders import DEFAULT_BASE_MODEL_ID
from dphub.errors import CardError, PublishRefused, PullRefused
from dphub.notes import Note, Span

pytest_plugins = ("hub_fixtures",)

FAR_BELOW = "far below the public warm start of its base"


def _figures(model_dir: Path) -> tuple[dict[str, float], float]:
    from dphub.tagger import Tagger

    result = run_probe(Tagger.load(model_dir))
    return result.category_recall(), result.kept


def _sparse(model_dir: Path) -> dict[str, float]:
    """Recall on the category probe (AGE, PROFESSION: too few words in the probe notes)."""
    from dphub.tagger import Tagger

    counts = run_category_probe(Tagger.load(model_dir))
    return {c: counts[c][0] / counts[c][1] for c in ("AGE", "PROFESSION")}


def _entry(model_dir: Path, *, rule_features: bool, **over: Any) -> PublicBaseFigures:
    """The figures of ``model_dir`` as its public warm start's (the tiny model stands for it)."""
    recall, kept = _figures(model_dir)
    fields = {"base_model": DEFAULT_BASE_MODEL_ID, "label_schema": "hipaa", "head": "crf",
              "rule_features": rule_features, "hidden_size": 32, "num_hidden_layers": 2,
              "recall": recall, "kept": kept, "sparse_recall": _sparse(model_dir), **over}
    return PublicBaseFigures(**fields)


def _with_rule_features(model_dir: Path) -> None:
    """The tiny model with the rule-feature input (zero ``rule_proj``: the same predictions)."""
    import torch
    from safetensors.torch import load_file, save_file

    from dphub.rule_features import NUM_FEATURES, feature_spec
    from dphub.tagger_model import FORMAT_VERSION

    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["dphub"].update(rule_features=feature_spec(), format_version=FORMAT_VERSION)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
    tensors = load_file(model_dir / "model.safetensors")
    n = len(cfg["id2label"])
    tensors["rule_proj.weight"] = torch.zeros(n, NUM_FEATURES)
    tensors["rule_proj.bias"] = torch.zeros(n)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def _edit(model_dir: Path, edit: Callable[[dict[str, Any], list[str]], None],
          card: dict[str, Any] | None = None) -> None:
    """Change the weights and re-card them as the aggregator or trainer would (the card's
    gate_probe block measured on the new weights), or with ``card``'s block (a forger's)."""
    from safetensors.torch import load_file, save_file

    from dphub.card import load_card

    labels = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))["id2label"]
    tags = [labels[str(i)] for i in range(len(labels))]
    tensors = load_file(model_dir / "model.safetensors")
    edit(tensors, tags)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    meta = {**card_meta(), **({"gate_probe": card} if card else {})}
    write_card(model_dir, meta)
    assert "gate_probe" in load_card(model_dir).meta


def push_o(strength: float) -> Callable[[dict[str, Any], list[str]], None]:
    """The rogue site's direction (benchmarks/federated_dev_corpus.py --what rogue): every bias,
    start/end and into-tag transition and rule weight towards "O", away from each PHI tag."""
    def edit(t: dict[str, Any], tags: list[str]) -> None:
        import torch

        sign = -torch.ones(len(tags))
        sign[tags.index("O")] = 1.0
        t["classifier.bias"] = t["classifier.bias"] + strength * sign
        for name in ("crf.start_transitions", "crf.end_transitions"):
            t[name] = t[name] + strength * sign
        t["crf.transitions"] = t["crf.transitions"] + strength * sign.expand(len(tags), -1)
        if "rule_proj.weight" in t:
            t["rule_proj.weight"] = t["rule_proj.weight"] + strength * sign[:, None]
    return edit


def only(category: str) -> Callable[[dict[str, Any], list[str]], None]:
    """A model that flags only the rule member's hits of one category."""
    def edit(t: dict[str, Any], tags: list[str]) -> None:
        from dphub.rule_features import FEATURE_NAMES

        o = tags.index("O")
        t["classifier.weight"].zero_()
        t["classifier.bias"].zero_()
        t["classifier.bias"][o] = 10.0
        t["rule_proj.weight"].zero_()
        t["rule_proj.weight"][:, FEATURE_NAMES.index(f"rule_{category.lower()}")] = 20.0
        t["rule_proj.weight"][o] = 0.0
    return edit


def flag_everything(t: dict[str, Any], tags: list[str]) -> None:
    t["classifier.bias"][tags.index("O")] = -1e3


@pytest.fixture
def model(model_template: Path, hub_env: dict[str, Path],
          monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the tiny model, registered as the public warm start of its kind."""
    out = copy_model(model_template, hub_env["tmp"] / "model")
    monkeypatch.setattr(probe_floor, "PUBLIC_WARM_STARTS", (_entry(out, rule_features=False),))
    return out


@pytest.fixture
def rule_model(model_template: Path, hub_env: dict[str, Path],
               monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny model with rule features, registered as its public warm start."""
    out = copy_model(model_template, hub_env["tmp"] / "rule-model")
    _with_rule_features(out)
    write_card(out, card_meta())
    monkeypatch.setattr(probe_floor, "PUBLIC_WARM_STARTS", (_entry(out, rule_features=True),))
    return out


def _refused_everywhere(model_dir: Path, hub_env: dict[str, Path], why: str) -> None:
    """Refused by publish, by `card validate` and by pull (nothing registered)."""
    from dphub.hub import ops
    from dphub.hub.gate import check_publishable
    from dphub.hub.local import LocalHub
    from dphub.hub.validate import validate_card
    from dphub.registry import Registry

    with pytest.raises(PublishRefused, match=why):
        check_publishable(model_dir)
    with pytest.raises(CardError, match=why):
        validate_card(model_dir)
    LocalHub(hub_env["hub"]).publish(model_dir, "evil/model", "around the gate")
    with pytest.raises(PullRefused, match=why):
        ops.pull("evil/model")
    assert Registry().list() == []


def test_a_model_pushed_towards_no_phi_is_refused(model: Path,
                                                   hub_env: dict[str, Path]) -> None:
    """The federated attack: the aggregate moved towards "O". Its card, written from the
    poisoned model, states half its own recall (0.55 here): the old gate let it through."""
    from dphub.card import load_card

    _edit(model, push_o(0.5))
    block = load_card(model).meta["gate_probe"]
    assert 0.3 < block["recall"] < 0.8 and block["floor"] < block["recall"]  # its own floor
    _refused_everywhere(model, hub_env, FAR_BELOW + r".*DATE 36% \(floor 50%\)")


def test_a_model_that_flags_one_category_is_refused(rule_model: Path,
                                                     hub_env: dict[str, Path]) -> None:
    """Flags only contacts: recall 0.15 on the probe notes, so its own floor was 0.07."""
    from dphub.card import load_card

    _edit(rule_model, only("CONTACT"))
    recall, _ = _figures(rule_model)
    assert recall["CONTACT"] > 0.5 and recall["DATE"] == recall["NAME"] == 0.0
    assert load_card(rule_model).meta["gate_probe"]["recall"] >= 0.04
    _refused_everywhere(rule_model, hub_env, FAR_BELOW + r".*DATE 0% \(floor 50%\).*NAME 0%")


def test_card_validate_says_it_in_one_line_with_the_figures(
        rule_model: Path, hub_env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _edit(rule_model, only("DATE"))
    capsys.readouterr()
    assert main(["card", "validate", str(rule_model)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in out + err
    for cat in ("CONTACT", "ID", "LOCATION", "NAME"):
        assert f"{cat} 0% (floor 50%)" in err
    assert "DATE" not in err.split(FAR_BELOW)[1]  # the category it finds is not named
    assert main(["publish", str(rule_model), "--repo", "acme/deid"]) == 2


@pytest.mark.parametrize("forged", [
    {"version": 1, "notes": 8, "recall": 1.0, "floor": 0.02},
    {"version": 1, "notes": 8, "recall": 0.04, "floor": 0.02},
])
def test_the_cards_probe_figures_are_never_trusted(model: Path, hub_env: dict[str, Path],
                                                   forged: dict[str, Any]) -> None:
    """A card that lies about its probe figures changes nothing: the gate measures again."""
    _edit(model, push_o(0.5), card=forged)
    _refused_everywhere(model, hub_env, FAR_BELOW)


def test_a_card_saying_no_warm_start_does_not_escape_the_floor(
        model: Path, hub_env: dict[str, Path]) -> None:
    """The floor is the warm start of the model's base and schema, whatever the card says the
    run started from: a model of that base far below it is worse than public data alone."""
    from dphub.hub.gate import check_publishable

    _edit(model, push_o(0.5))
    set_hyperparams(model, warm_start="none")
    with pytest.raises(PublishRefused, match=FAR_BELOW):
        check_publishable(model)


def test_a_model_that_flags_everything_is_refused_where_its_base_flags_little(
        model: Path, hub_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Recall 1.0 and useless: the real warm starts leave almost every non-PHI word unflagged,
    so the floor holds the share left too (the random tiny model keeps none, hence 0.9 here)."""
    (entry,) = probe_floor.PUBLIC_WARM_STARTS
    monkeypatch.setattr(probe_floor, "PUBLIC_WARM_STARTS",
                        (PublicBaseFigures(**{**entry.__dict__, "kept": 0.9}),))
    _edit(model, flag_everything)
    assert _figures(model)[1] == 0.0
    _refused_everywhere(model, hub_env, r"non-PHI words left unflagged 0% \(floor 45%\)")


def test_honest_models_pass_and_a_small_drift_is_not_far_below(
        model: Path, hub_env: dict[str, Path]) -> None:
    from dphub.hub.gate import check_publishable
    from dphub.hub.validate import validate_card

    check_publishable(model)
    validate_card(model, require_private=True)
    _edit(model, push_o(0.3))  # recall drops, not below half its public base's anywhere
    recall, _ = _figures(model)
    assert min(recall[c] for c in ("CONTACT", "DATE", "ID", "LOCATION", "NAME")) >= 0.5
    assert min(recall.values()) < 1.0
    check_publishable(model)
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    assert main(["pull", "acme/deid"]) == 0


def test_models_of_another_kind_keep_the_old_floor(model: Path,
                                                   hub_env: dict[str, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No figures for another base, schema, head, rule input or encoder shape: the model is held
    to its card's floor and the dphub-wide minimum, as before."""
    from dphub.hub.gate import check_publishable

    (entry,) = probe_floor.PUBLIC_WARM_STARTS
    key = (DEFAULT_BASE_MODEL_ID, "hipaa", "crf", False, 32, 2)
    assert public_base(*key) is entry
    for i, other in enumerate(("acme/other", "i2b2-2014", "softmax", True, 384, 6)):
        assert public_base(*key[:i], other, *key[i + 1:]) is None
    monkeypatch.setattr(probe_floor, "PUBLIC_WARM_STARTS",
                        (PublicBaseFigures(**{**entry.__dict__, "hidden_size": 384}),))
    _edit(model, push_o(0.5))
    check_publishable(model)  # what the old gate did with it


def test_a_category_missing_from_the_schema_counts_when_flagged_under_another_label() -> None:
    """``deid`` hides a flagged word whatever its label: the test models' schema has only NAME
    and DATE, and flagging a phone number as DATE protects it."""
    note = Note(id="n", text="Call Ann at 555 1234 today",
                spans=(Span(5, 8, "NAME"), Span(12, 20, "PHONE")))
    counts, kept = category_counts([note], [[Span(12, 20, "DATE")]])
    assert counts == {"CONTACT": (2, 2), "NAME": (0, 1)}
    assert kept == 1.0
    counts, kept = category_counts([note], [[Span(0, 26, "NAME")]])
    assert counts == {"CONTACT": (2, 2), "NAME": (1, 1)} and kept == 0.0


def test_small_categories_are_not_held_one_by_one() -> None:
    """AGE has 3 word tokens in the probe notes: one word would swing its recall by a third."""
    base = PublicBaseFigures(DEFAULT_BASE_MODEL_ID, "hipaa", "crf", False, 32, 2,
                             {"AGE": 1.0, "NAME": 0.8}, 0.9)
    counts = {"AGE": (0, 3), "NAME": (8, 10)}
    assert probe_floor.floor_shortfalls(counts, 0.9, base) == []
    counts["NAME"] = (3, 10)
    assert probe_floor.floor_shortfalls(counts, 0.9, base) == ["NAME 30% (floor 40%)"]
    assert probe_floor.floor_shortfalls(counts, float("nan"), base)[-1].startswith("non-PHI")


def test_the_default_training_is_covered_by_shipped_figures() -> None:
    """The floor of `dphub train`'s default model (and --no-rule-features) ships with dphub: a
    puller checks it without building the warm start."""
    from dphub.train.options import TrainOptions

    opts = TrainOptions()
    for rule_features in (True, False):
        entry = public_base(DEFAULT_BASE_MODEL_ID, opts.label_schema, opts.head, rule_features,
                            384, 6)
        assert entry is not None
        held = ("CONTACT", "DATE", "ID", "LOCATION", "NAME")  # 10 probe tokens or more each
        assert all(0.0 < entry.recall[c] <= 1.0 for c in held) and 0.5 < entry.kept <= 1.0


@pytest.mark.parametrize("rule_features", [True, False])
def test_shipped_figures_are_the_cached_warm_starts(rule_features: bool) -> None:
    """Where this machine has built the public warm start (any `dphub train`), its figures on the
    probe notes are the shipped ones (benchmarks/gate_floor.py builds it where it has not)."""
    from dphub.encoders import embedded_model_dir
    from dphub.io import cache_root
    from dphub.train.options import TrainOptions
    from dphub.train.warmstart import WARM_START_SEED, WarmStartConfig, cache_key

    opts = TrainOptions(rule_features=rule_features)
    ws = WarmStartConfig(max_length=opts.max_length, stride=opts.stride,
                         rule_features=rule_features)
    wdir = cache_root() / "warmstart" / cache_key(
        embedded_model_dir(), DEFAULT_BASE_MODEL_ID, opts.label_schema, opts.head, ws,
        WARM_START_SEED)
    if not (wdir / "model.safetensors").is_file():
        pytest.skip("the public warm start is not built on this machine")
    entry = public_base(DEFAULT_BASE_MODEL_ID, opts.label_schema, opts.head, rule_features,
                        384, 6)
    assert entry is not None
    recall, kept = _figures(wdir)
    assert recall == pytest.approx(dict(entry.recall), abs=0.005)
    assert kept == pytest.approx(entry.kept, abs=0.005)


def all_but(category: str) -> Callable[[dict[str, Any], list[str]], None]:
    """A model that flags the rule member's hits of every category but one (it drops one)."""
    def edit(t: dict[str, Any], tags: list[str]) -> None:
        from dphub.rule_features import FEATURE_NAMES

        o = tags.index("O")
        t["classifier.weight"].zero_()
        t["classifier.bias"].zero_()
        t["classifier.bias"][o] = 10.0
        t["rule_proj.weight"].zero_()
        for c in ("name", "date", "age", "contact", "id", "location", "profession"):
            if c != category.lower():
                t["rule_proj.weight"][:, FEATURE_NAMES.index(f"rule_{c}")] = 20.0
        t["rule_proj.weight"][o] = 0.0
    return edit


def test_a_model_that_drops_only_age_is_refused(rule_model: Path, hub_env: dict[str, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """AGE has 3 words in the probe notes, too few to hold; the category probe (12 public
    discharge summaries, 12 AGE words) holds it: a model that keeps every category but AGE was
    passed, and is refused now, naming AGE alone."""
    from dphub.hub.gate import check_publishable

    (entry,) = probe_floor.PUBLIC_WARM_STARTS  # as shipped: no public base finds a profession
    monkeypatch.setattr(probe_floor, "PUBLIC_WARM_STARTS", (PublicBaseFigures(**{
        **entry.__dict__, "sparse_recall": {**entry.sparse_recall, "PROFESSION": 0.0}}),))
    _edit(rule_model, all_but("NONE"))  # every rule category: the control
    check_publishable(rule_model)
    assert _sparse(rule_model)["AGE"] >= 0.5
    _edit(rule_model, all_but("AGE"))
    assert _sparse(rule_model)["AGE"] == 0.0
    recall, _ = _figures(rule_model)
    assert recall["AGE"] == 0.0 and recall["NAME"] == 1.0  # only 3 AGE words there
    _refused_everywhere(rule_model, hub_env, FAR_BELOW + r".*seen\): AGE 0% \(floor 50%\)\. ")


def test_profession_is_not_held_where_the_public_base_finds_none(
        rule_model: Path, hub_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """No public warm start flags a profession word (0 of 12 on the category probe, shipped
    figures): its floor is 0, so a model that drops PROFESSION passes (docs/hub.md says what
    guards it instead). With a base that finds them, the same model is refused."""
    from dphub.hub.gate import check_publishable

    (entry,) = probe_floor.PUBLIC_WARM_STARTS
    _edit(rule_model, all_but("PROFESSION"))
    finds_none = PublicBaseFigures(**{**entry.__dict__, "sparse_recall": {
        **entry.sparse_recall, "PROFESSION": 0.0}})
    monkeypatch.setattr(probe_floor, "PUBLIC_WARM_STARTS", (finds_none,))
    check_publishable(rule_model)
    finds_all = PublicBaseFigures(**{**entry.__dict__, "sparse_recall": {
        **entry.sparse_recall, "PROFESSION": 1.0}})
    monkeypatch.setattr(probe_floor, "PUBLIC_WARM_STARTS", (finds_all,))
    assert _sparse(rule_model)["PROFESSION"] < 0.5
    with pytest.raises(PublishRefused, match=r"PROFESSION \d+% \(floor 50%\)"):
        check_publishable(rule_model)


def test_sparse_categories_are_held_on_the_category_probe_when_the_floor_is_words() -> None:
    base = PublicBaseFigures(DEFAULT_BASE_MODEL_ID, "hipaa", "crf", True, 32, 2,
                             {"AGE": 0.0, "NAME": 0.8}, 0.9,
                             sparse_recall={"AGE": 0.5, "PROFESSION": 0.0})
    main_counts = {"AGE": (0, 3), "NAME": (8, 10)}
    assert probe_floor.floor_shortfalls(main_counts, 0.9, base) == []  # no category probe
    sparse = {"AGE": (2, 12), "PROFESSION": (0, 12)}
    assert probe_floor.floor_shortfalls(main_counts, 0.9, base, sparse) == ["AGE 17% (floor 25%)"]
    assert probe_floor.floor_shortfalls(main_counts, 0.9, base, {"AGE": (3, 12)}) == []
    assert probe_floor.floor_shortfalls(main_counts, 0.9, base, {"AGE": (0, 9)}) == []  # too few
    # a floor of one word is noise: the --no-rule-features warm start finds 2 of 12 AGE words
    one_word = PublicBaseFigures(**{**base.__dict__, "sparse_recall": {"AGE": 2 / 12}})
    assert probe_floor.floor_shortfalls(main_counts, 0.9, one_word, {"AGE": (0, 12)}) == []
    # the shipped figures: AGE held for the default (rule features), not without them
    rf, plain = probe_floor.PUBLIC_WARM_STARTS
    assert rf.rule_features and rf.sparse_recall["AGE"] * 0.5 * 12 >= 3
    assert not plain.rule_features and plain.sparse_recall["AGE"] * 0.5 * 12 < 3
    assert rf.sparse_recall["PROFESSION"] == plain.sparse_recall["PROFESSION"] == 0.0
