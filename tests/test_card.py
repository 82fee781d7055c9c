"""Model card: build/write/load/validate, schema violations, accounting check, privacy statement."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from faker import Faker
from hub_fixtures import ALIAS_BOMB, coarse_dataset, private_dp_block

from dphub import card as C
from dphub.card.render import _with_defaults as with_defaults
from dphub.errors import CardError
from dphub.hub.validate import validate_card
from dphub.notes import Note, Span
from dphub.privacy.statement import privacy_statement

PLANTED = "Zyxwvut Qqplanted"  # appears in note text only; must never reach a card

DATASET = {
    "patients": "5-9",
    "notes": "20-49",
    "sequences": "20-49",
    "phi_per_category": {"NAME": "5-9", "DATE": "2-4"},
    "note_types": {"nursing": "20-49"},
    "language": "en",
    "label_schema": "hipaa",
}


@pytest.fixture(scope="module")
def dp() -> dict[str, Any]:
    """A private block with RDP accounting (fast to recompute), in the new card contract."""
    return private_dp_block(
        accountant="rdp",
        sample_rate=0.5,
        noise_multiplier=1.0,
        steps=3,
        delta=1e-5,
        privacy_unit="patient",
        max_grad_norm=1.0,
        epochs=1.5,
        max_examples_per_unit=8,
        num_units=8,
        grad_sample_mode="ghost",
        recall_weighting={"enabled": True, "delta_p": 1.0},
        public_pretraining={"enabled": True, "data": "dphub-synth", "kinds": ["nursing"],
                            "notes": 600, "epsilon_cost": 0},
    )


@pytest.fixture
def meta(dp: dict[str, Any]) -> dict[str, Any]:
    return C.card_meta(copy.deepcopy(dp), dict(DATASET),
                       base_model="sentence-transformers/all-MiniLM-L6-v2")


def _write_unvalidated(model_dir: Path, meta: dict[str, Any]) -> Path:
    """Write a card the way a careless or malicious editor would: no validation."""
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "README.md"
    path.write_text(C.build_card(meta), encoding="utf-8")
    return path


def test_private_card_round_trips(tmp_path: Path, meta: dict[str, Any]) -> None:
    path = C.write_card(tmp_path, meta)
    assert path == tmp_path / "README.md"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    card = validate_card(tmp_path, require_private=True)
    assert card.meta["differential_privacy"] == with_defaults(meta)["differential_privacy"]
    assert card.meta["dataset"] == DATASET
    for tag in C.REQUIRED_TAGS:
        assert tag in card.meta["tags"]
    assert card.meta["pipeline_tag"] == "token-classification"
    assert card.meta["library_name"] == "transformers"
    assert card.meta["language"] == ["en"]
    assert "protects each *patient*" in card.body
    assert card.text() == text  # rendering is deterministic: load -> render gives the same file
    # loading from the README path is the same as from the directory
    assert C.load_card(path).meta == card.meta
    summary = C.dp_summary(card)
    assert summary["epsilon"] == pytest.approx(meta["differential_privacy"]["epsilon"])
    assert summary["unit"] == "patient"
    assert summary["patients"] == "5-9"
    assert "NAME" in summary["labels"]


def test_dp_block_records_matching_cross_check(dp: dict[str, Any]) -> None:
    from dphub.privacy import accounting

    assert dp["epsilon"] == pytest.approx(accounting.epsilon_for("rdp", 0.5, 1.0, 3, 1e-5))
    assert dp["cross_check"]["method"] == "rdp"
    assert dp["cross_check"]["epsilon"] == pytest.approx(dp["epsilon"], rel=0.05)


def _drop(path: str):
    def edit(m: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        cur = m
        for p in parents:
            cur = cur[p]
        del cur[last]

    return edit


def _set(path: str, value: Any):
    def edit(m: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        cur = m
        for p in parents:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        cur[last] = value

    return edit


VIOLATIONS = [
    ("missing DP block", _drop("differential_privacy"), "differential_privacy: required"),
    ("missing dataset block", _drop("dataset"), "dataset: required"),
    ("missing noise", _drop("differential_privacy.noise_multiplier"),
     "differential_privacy.noise_multiplier: required"),
    ("missing sample rate", _drop("differential_privacy.sample_rate"),
     "differential_privacy.sample_rate: required"),
    ("missing cross-check", _drop("differential_privacy.cross_check"),
     "differential_privacy.cross_check: required"),
    ("bad unit", _set("differential_privacy.privacy_unit", "hospital"),
     "differential_privacy.privacy_unit: value is not one of patient, note, sequence"),
    ("negative epsilon", _set("differential_privacy.epsilon", -1),
     "differential_privacy.epsilon: -1 is less than the minimum of 0"),
    ("delta out of range", _set("differential_privacy.delta", 1.5),
     "differential_privacy.delta: 1.5 is greater than or equal to the maximum of 1"),
    ("non-integer steps", _set("differential_privacy.steps", 2.5),
     "differential_privacy.steps: 2.5 is not of type 'integer'"),
    ("free text in dataset", _set("dataset.description", f"notes about {PLANTED}"),
     "dataset: field(s) not allowed here: description"),
    ("file path in dataset", _set("dataset.name", "/home/owner/notes/train.jsonl"),
     "dataset.name: value does not match the pattern"),
    ("path as note type", _set("dataset.note_types", {"/home/owner/a.txt": 3}),
     "dataset.note_types: a key is not an allowed name"),
    ("free-text PHI category", _set("dataset.phi_per_category", {PLANTED: 1}),
     "dataset.phi_per_category: a key is not an allowed name"),
    ("local base model path", _set("base_model", "/home/owner/models/minilm"),
     "base_model: value does not match the pattern"),
    ("bad lineage entry", _set("differential_privacy.lineage",
                               [{"repo": "org/src", "epsilon": 3.0, "delta": 1e-5,
                                 "privacy_unit": "patient"}]),
     "differential_privacy.lineage.0.revision: required"),
    ("non-private with epsilon", _set("differential_privacy.private", False),
     "differential_privacy.epsilon"),
]


@pytest.mark.parametrize("edit,expected", [v[1:] for v in VIOLATIONS],
                         ids=[v[0] for v in VIOLATIONS])
def test_schema_violation_names_path(
    tmp_path: Path, meta: dict[str, Any], edit, expected: str
) -> None:
    edit(meta)
    # write_card refuses and writes nothing
    with pytest.raises(CardError) as exc:
        C.write_card(tmp_path / "m", meta)
    assert not (tmp_path / "m" / "README.md").exists()
    assert str(exc.value).startswith(expected), str(exc.value)
    # a card written without validation fails validate_card with the same one-line message
    _write_unvalidated(tmp_path / "m", meta)
    with pytest.raises(CardError) as exc2:
        validate_card(tmp_path / "m")
    message = str(exc2.value)
    assert message == str(exc.value)
    assert "\n" not in message
    assert PLANTED not in message and "/home/owner" not in message


def test_tags_are_required_and_filled_by_build(meta: dict[str, Any]) -> None:
    meta["tags"] = ["token-classification", "ner"]
    with pytest.raises(CardError, match="^tags: must contain 'de-identification'"):
        C.validate_meta(meta, check_accounting=False)
    filled = C.parse_card(C.build_card(meta)).meta["tags"]
    assert filled[: len(C.REQUIRED_TAGS)] == list(C.REQUIRED_TAGS) and "ner" in filled


def test_hand_written_card_with_scalar_language_validates(
    tmp_path: Path, meta: dict[str, Any]
) -> None:
    path = C.write_card(tmp_path, meta)
    _edit_card(path, r"^language:\n- en$", "language: en")
    assert validate_card(tmp_path).meta["language"] == "en"
    _edit_card(path, r"^language: en$", "language: English")
    with pytest.raises(CardError, match="^language: "):
        validate_card(tmp_path)


def _edit_card(path: Path, pattern: str, repl: str) -> None:
    text = path.read_text(encoding="utf-8")
    new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    assert n == 1
    path.write_text(new, encoding="utf-8")


def test_edited_smaller_epsilon_fails_accounting(tmp_path: Path, meta: dict[str, Any]) -> None:
    path = C.write_card(tmp_path, meta)
    _edit_card(path, r"^  epsilon: .*$", "  epsilon: 1.0")
    assert C.load_card(tmp_path).epsilon == 1.0
    with pytest.raises(CardError) as exc:
        validate_card(tmp_path)
    msg = str(exc.value)
    assert msg.startswith("differential_privacy.epsilon: claims 1 but the recorded accounting")
    # the schema alone is satisfied: it is the recomputation that catches the edit
    validate_card(tmp_path, check_accounting=False)


def test_larger_claimed_epsilon_is_conservative_and_valid(
    tmp_path: Path, meta: dict[str, Any]
) -> None:
    meta["differential_privacy"]["epsilon"] = meta["differential_privacy"]["epsilon"] * 1.5
    C.write_card(tmp_path, meta)
    validate_card(tmp_path)


def test_edited_accounting_fields_fail(tmp_path: Path, meta: dict[str, Any]) -> None:
    # fewer steps would make the claim look fine against Opacus, but the recorded cross-check
    # no longer matches what dp-accounting computes for the edited fields
    path = C.write_card(tmp_path, meta)
    _edit_card(path, r"^  steps: .*$", "  steps: 1")
    with pytest.raises(CardError, match=r"^differential_privacy.cross_check.epsilon: records"):
        validate_card(tmp_path)


def test_edited_cross_check_fails(tmp_path: Path, meta: dict[str, Any]) -> None:
    path = C.write_card(tmp_path, meta)
    _edit_card(path, r"^    epsilon: .*$", "    epsilon: 0.5")
    with pytest.raises(CardError, match=r"^differential_privacy.cross_check.epsilon"):
        validate_card(tmp_path)


def test_prv_card_validates_against_pld(tmp_path: Path) -> None:
    dp = private_dp_block(accountant="prv", sample_rate=0.5, noise_multiplier=1.0, steps=3,
                          delta=1e-5, privacy_unit="note", max_grad_norm=1.0, epochs=1.5,
                          max_examples_per_unit=4, num_units=8,
                          grad_sample_mode="hooks")
    assert dp["cross_check"]["method"] == "pld"
    C.write_card(tmp_path, C.card_meta(dp, dict(DATASET), base_model="org/base"))
    validate_card(tmp_path, require_private=True)
    # a claim below the PRV recomputation by more than the tolerance is refused
    dp["epsilon"] = dp["epsilon"] * 0.9
    with pytest.raises(CardError, match="differential_privacy.epsilon: claims"):
        C.write_card(tmp_path, C.card_meta(dp, dict(DATASET), base_model="org/base"))


def test_infinite_epsilon_private_card_refused(tmp_path: Path, meta: dict[str, Any]) -> None:
    meta["differential_privacy"]["epsilon"] = float("inf")
    with pytest.raises(CardError, match="differential_privacy.epsilon: a private model needs"):
        C.write_card(tmp_path, meta)


def test_non_private_card_validates_but_gate_refuses(tmp_path: Path) -> None:
    meta = C.card_meta(C.non_private_block(steps=10, epochs=1.0), dict(DATASET),
                       base_model="sentence-transformers/all-MiniLM-L6-v2")
    C.write_card(tmp_path, meta)
    card = validate_card(tmp_path)
    assert card.private is False and card.epsilon is None
    assert "NOT PRIVATE" in card.body
    with pytest.raises(CardError, match=r"^differential_privacy.private: .*without differential"):
        validate_card(tmp_path, require_private=True)


def test_statement_patient_unit() -> None:
    dp = {"private": True, "epsilon": 7.91, "delta": 1e-5, "privacy_unit": "patient",
          "max_examples_per_unit": 64, "accountant": "prv", "sample_rate": 0.12,
          "noise_multiplier": 0.55, "steps": 300,
          "cross_check": {"library": "dp-accounting", "method": "pld", "epsilon": 7.9},
          "not_covered": ["pretraining data of the base model", "hyperparameter search",
                          "public tokenizer"]}
    s = privacy_statement(dp)
    assert "protects each *patient*: everything one patient contributed" in s
    assert "epsilon = 7.91" in s and "delta = 1e-05" in s
    assert "NOT patient-level" not in s and "NOT PRIVATE" not in s
    assert "pretraining data of the base model" in s and "hyperparameter search" in s
    assert "at most 64 training sequences" in s
    assert "(about 2,724)" in s and "weak formal guarantee" not in s
    assert "weak formal guarantee" in privacy_statement({**dp, "epsilon": 40.0})
    plain = privacy_statement(dp, markdown=False)
    assert "*" not in plain and "protects each patient" in plain


def test_weak_guarantee_leads_the_statement_and_headline(tmp_path: Path) -> None:
    """Issue 31 item 22: the design recipe on 40 patients (q = 1, σ 0.55, 32 steps) gives
    ε ≈ 96; the card must say "weak" before it says "protects", and must not call the two
    cases "almost equally likely"."""
    block = private_dp_block(
        accountant="rdp", sample_rate=1.0, noise_multiplier=0.55, steps=32, delta=1e-5,
        privacy_unit="patient", max_grad_norm=1.0, epochs=32.0, max_examples_per_unit=8,
        num_units=40, grad_sample_mode="hooks",
    )
    assert block["epsilon"] > 10
    C.write_card(tmp_path, C.card_meta(block, dict(DATASET), base_model="org/base"))
    body = validate_card(tmp_path).body
    privacy = body.split("## Privacy", 1)[1].lstrip()
    assert privacy.startswith(f"**Weak guarantee: epsilon = {block['epsilon']:.3g} is far above "
                              "10**")
    assert privacy.index("Weak guarantee") < privacy.index("protect each *patient*")
    assert "almost equally likely" not in body
    assert "**a weak guarantee** (ε above 10" in body.split("## Privacy", 1)[0]
    plain = privacy_statement(block, markdown=False)
    assert plain.startswith("Weak guarantee: epsilon = ")
    # at ε ≤ 10 nothing changes: the statement opens with the summary, no weak headline
    strong = privacy_statement({**block, "epsilon": 7.9})
    assert strong.startswith("**In short:**") and "Weak guarantee" not in strong
    assert "almost equally likely" in strong


@pytest.mark.parametrize("unit", ["sequence", "note"])
def test_statement_warns_for_weaker_units(unit: str) -> None:
    s = privacy_statement({"private": True, "epsilon": 3.0, "delta": 1e-5, "privacy_unit": unit})
    assert f"protects each *{unit}*" in s
    assert "NOT patient-level protection" in s


def test_statement_non_private_is_loud() -> None:
    s = privacy_statement({"private": False, "epsilon": None})
    assert s.startswith("**NOT PRIVATE.**")
    assert "WITHOUT differential privacy" in s
    assert "epsilon =" not in s


def test_statement_lineage_and_warm_start(tmp_path: Path, dp: dict[str, Any]) -> None:
    block = copy.deepcopy(dp)
    block["lineage"] = [{"repo": "hospital-a/deid", "revision": "v1", "epsilon": 4.0,
                         "delta": 1e-5, "privacy_unit": "patient"}]
    C.write_card(tmp_path, C.card_meta(block, dict(DATASET), base_model="org/base"))
    card = validate_card(tmp_path)
    assert "fine-tuned from hospital-a/deid@v1" in card.body
    assert "covers only the data of this training round" in card.body
    assert "costs no epsilon" in card.body
    assert C.dp_summary(card)["init_from"] == "hospital-a/deid@v1"


def _teacher(eps: float, composed: bool = True, unit: str = "patient") -> dict[str, Any]:
    return {"repo": "s1", "revision": "ab" * 32, "epsilon": eps, "delta": 1e-5,
            "privacy_unit": unit, "composed": composed}


def test_composed_teachers_are_part_of_the_claim(tmp_path: Path, dp: dict[str, Any]) -> None:
    """Issue 31 #1, the published rule: a card's ε and δ cover the run plus every composed
    teacher of its lineage; one below the sum, a missing composition or a finer-unit teacher
    is refused by validation (which `card validate` and the gate run)."""
    block = C.compose_teachers(copy.deepcopy(dp), [_teacher(4.0), _teacher(9.0, False)])
    assert block["epsilon"] == pytest.approx(dp["epsilon"] + 4.0)
    assert block["delta"] == pytest.approx(2e-5)
    assert block["composition"] == {"method": "basic", "run_epsilon": dp["epsilon"],
                                    "run_delta": 1e-5}
    assert [e["composed"] for e in block["lineage"]] == [True, False]
    C.write_card(tmp_path, C.card_meta(block, dict(DATASET), base_model="org/base"))
    card = validate_card(tmp_path)
    assert "basic composition" in card.body and "declared by the trainer" in card.body
    assert C.dp_summary(card)["init_from"] is None
    # the run's own accounting: the claim without the teacher is refused
    for key, value in (("epsilon", dp["epsilon"]), ("epsilon", dp["epsilon"] + 3.9),
                       ("delta", 1.5e-5)):
        bad = {**copy.deepcopy(block), key: value}
        assert any(p.startswith(f"differential_privacy.{key}") for p in C.meta_problems(
            C.card_meta(bad, dict(DATASET), base_model="org/base"))), (key, value)
    no_comp = {k: v for k, v in copy.deepcopy(block).items() if k != "composition"}
    assert any("composition" in p for p in C.meta_problems(
        C.card_meta(no_comp, dict(DATASET), base_model="org/base")))
    finer = C.compose_teachers(copy.deepcopy(dp), [_teacher(4.0, unit="note")])
    assert any("finer unit" in p for p in C.meta_problems(
        C.card_meta(finer, dict(DATASET), base_model="org/base")))


def test_randomness_paragraph_says_which_seed_is_published(dp: dict[str, Any]) -> None:
    """Issue 31 #6: the card said no seed was published while training_config.json publishes
    --seed; it now says which seed that is and why it is harmless."""
    for rng, secure in (("os-seeded", False), ("csprng", True)):
        s = privacy_statement({**dp, "mechanism_rng": rng, "secure_rng": secure})
        assert "The seed published in training_config.json (--seed)" in s
        assert "never the noise or the sampling" in s


def _synthetic_notes(n: int = 12) -> list[Note]:
    fake = Faker()
    Faker.seed(7)
    notes = []
    for i in range(n):
        name = fake.name()
        date = fake.date()
        text = f"Pt {name} seen {date}. {PLANTED} c/o pain. MRN {fake.random_int(10**6, 10**7)}"
        spans = [Span(3, 3 + len(name), "PATIENT"),
                 Span(text.index(date), text.index(date) + len(date), "DATE"),
                 Span(text.index(PLANTED), text.index(PLANTED) + len(PLANTED), "DOCTOR")]
        kind = "nursing" if i % 2 else f"free text {PLANTED}"  # a non-identifier note type
        notes.append(Note(id=f"{i // 3}-{i}", text=text, patient_id=str(i // 3),
                          metadata={"kind": kind}, spans=spans, labelled=True))
    return notes


def test_card_never_contains_note_text(tmp_path: Path, dp: dict[str, Any]) -> None:
    notes = _synthetic_notes()
    blocks = [C.dataset_block(notes, sequences=24, name="synthetic-train")]
    try:
        from dphub.stats import compute_stats
    except ImportError:  # stats module not landed: the counts-only path above still runs
        pass
    else:
        blocks.append(C.dataset_from_stats(compute_stats(notes), sequences=24,
                                           note_types={"nursing": 12}))
    # the builders' counts are coarsened (exact ints before the trainer's half of issue 12 lands)
    blocks = [coarse_dataset(b) for b in blocks]
    for i, block in enumerate(blocks):
        assert block["patients"] == "2-4" and block["notes"] == "10-19"
        assert block["phi_per_category"] == {"NAME": "20-49", "DATE": "10-19"}
        out = tmp_path / str(i)
        C.write_card(out, C.card_meta(copy.deepcopy(dp), block, base_model="org/base"))
        text = (out / "README.md").read_text(encoding="utf-8")
        assert PLANTED.lower() not in text.lower()
        for note in notes:  # no PHI string and no note id either
            for span in note.spans:
                assert note.span_text(span) not in text
        validate_card(out)
    assert blocks[0]["note_types"] == {"nursing": "5-9", "unspecified": "5-9"}


def test_add_evaluation_records_numbers_only(tmp_path: Path, meta: dict[str, Any]) -> None:
    C.write_card(tmp_path, meta)
    results = {
        "token": {"precision": 0.91234567, "recall": 0.8, "f1": 0.85},
        "phrase_recall": {"any_overlap": 0.95, "full_cover": 0.9},
        "entity_strict": {"micro": {"f1": 0.7}},
        "leaks": [{"note_id": "1-1", "start": 0, "end": 4, "text": PLANTED}],
    }
    C.add_evaluation(tmp_path, results, "/home/owner/data/physionet test.jsonl")
    text = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert PLANTED not in text and "/home/owner" not in text
    card = validate_card(tmp_path)
    result = card.meta["model-index"][0]["results"][0]
    assert result["dataset"]["name"] == "physionet-test.jsonl"  # no path, no space
    assert result["task"]["type"] == "token-classification"
    values = {m["type"]: m["value"] for m in result["metrics"]}
    assert values == {"token_precision": 0.9123, "token_recall": 0.8, "token_f1": 0.85,
                      "phrase_recall": 0.95, "phrase_recall_full": 0.9, "entity_f1_strict": 0.7}
    assert "## Evaluation" in card.body
    summary = C.dp_summary(card)
    assert summary["eval_f1"] == 0.85 and summary["eval_dataset"] == "physionet-test.jsonl"
    # same dataset again replaces; another dataset is added; the DP block is untouched
    C.add_evaluation(tmp_path, {"precision": 0.5, "recall": 0.5, "f1": 0.5}, "physionet-test.jsonl")
    C.add_evaluation(tmp_path, {"precision": 0.6, "recall": 0.6, "f1": 0.6}, "synth")
    card = validate_card(tmp_path)
    names = [r["dataset"]["name"] for r in card.meta["model-index"][0]["results"]]
    assert names == ["physionet-test.jsonl", "synth"]
    assert card.meta["model-index"][0]["results"][0]["metrics"][2]["value"] == 0.5
    assert card.dp == C.load_card(tmp_path).dp


def test_add_evaluation_rejects_empty_results(tmp_path: Path, meta: dict[str, Any]) -> None:
    C.write_card(tmp_path, meta)
    before = (tmp_path / "README.md").read_bytes()
    with pytest.raises(CardError, match="no token precision"):
        C.add_evaluation(tmp_path, {"leaks": []}, "test")
    assert (tmp_path / "README.md").read_bytes() == before


def test_load_card_errors(tmp_path: Path) -> None:
    with pytest.raises(CardError, match="no model card found"):
        C.load_card(tmp_path)
    (tmp_path / "README.md").write_text("# just markdown\n", encoding="utf-8")
    with pytest.raises(CardError, match="no YAML front matter"):
        C.load_card(tmp_path)
    (tmp_path / "README.md").write_text(f"---\na: [{PLANTED}\n---\nbody\n", encoding="utf-8")
    with pytest.raises(CardError, match="not valid YAML at line") as exc:
        C.load_card(tmp_path)
    assert PLANTED not in str(exc.value)


# --------------------------------------------------------------------------- cannot under-claim


@pytest.fixture(scope="module")
def prv_dp() -> dict[str, Any]:
    """A PRV block near the 8.0 of issue 12's finding 3 (q 0.12, σ 1.0, 100 steps: ε ≈ 8.5)."""
    return private_dp_block(accountant="prv", sample_rate=0.12, noise_multiplier=1.0, steps=100,
                            delta=1e-5, privacy_unit="patient", max_grad_norm=1.0, epochs=12.0,
                            max_examples_per_unit=8, num_units=100, grad_sample_mode="ghost")


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
@pytest.mark.parametrize("factor, ok", [(1.0, True), (0.99, False), (0.9525, False),
                                        (0.9995, True), (1.5, True)])
def test_claim_scaled_below_recomputation_fails(
    dp: dict[str, Any], prv_dp: dict[str, Any], accountant: str, factor: float, ok: bool
) -> None:
    block = copy.deepcopy(dp if accountant == "rdp" else prv_dp)
    block["epsilon"] = block["epsilon"] * factor
    meta = C.card_meta(block, dict(DATASET), base_model="org/base")
    if ok:
        C.validate_meta(meta)
        return
    with pytest.raises(CardError, match=r"^differential_privacy.epsilon: claims .* more than "
                                        r"0\.1% below it is refused"):
        C.validate_meta(meta)


@pytest.mark.parametrize("factor, ok", [(1.0, True), (0.99, False), (1.01, False)])
def test_recorded_cross_check_scaled_fails(prv_dp: dict[str, Any], factor: float, ok: bool) -> None:
    block = copy.deepcopy(prv_dp)
    block["cross_check"]["epsilon"] = block["cross_check"]["epsilon"] * factor
    meta = C.card_meta(block, dict(DATASET), base_model="org/base")
    if ok:
        C.validate_meta(meta)
        return
    with pytest.raises(CardError, match=r"^differential_privacy.cross_check.epsilon: records"):
        C.validate_meta(meta)


@pytest.mark.parametrize("secure, rng, ok", [(False, "os-seeded", True), (True, "csprng", True),
                                             (True, "os-seeded", False),
                                             (False, "csprng", False)])
def test_secure_rng_and_mechanism_rng_agree(dp, secure, rng, ok) -> None:
    block = {**copy.deepcopy(dp), "secure_rng": secure, "mechanism_rng": rng}
    meta = C.card_meta(block, dict(DATASET), base_model="org/base")
    if ok:
        C.validate_meta(meta)
    else:
        with pytest.raises(CardError, match="secure_rng and mechanism_rng disagree"):
            C.validate_meta(meta)


def test_tolerances_are_tight() -> None:
    from dphub.privacy import accounting

    assert accounting.CLAIM_RTOL <= 1e-3 and accounting.RECORD_RTOL <= 1e-3
    assert accounting.CROSS_CHECK_RTOL <= 0.01


# (q, σ, T): cells of the measured grid in the regime cards are published in (ε ≲ 12), q = 1
# included; a card whose ε is its own accountant's recomputation must pass the cross-check there.
GRID = [(1.0, 5.0, 10), (0.3, 5.0, 1000), (0.01, 5.0, 10), (0.12, 1.0, 100), (0.05, 0.55, 10)]


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
@pytest.mark.parametrize(("q", "sigma", "steps"), GRID)
def test_honest_cards_pass_the_tightened_cross_check(accountant, q, sigma, steps) -> None:
    block = private_dp_block(accountant=accountant, sample_rate=q, noise_multiplier=sigma,
                             steps=steps, delta=1e-5, privacy_unit="patient", max_grad_norm=1.0,
                             epochs=q * steps, max_examples_per_unit=8, num_units=100,
                             grad_sample_mode="ghost")
    assert C.accounting_problems(block) == []


# --------------------------------------------------------------------------- old cards explained


def _legacy_meta(dp: dict[str, Any]) -> dict[str, Any]:
    """Front matter as dphub wrote it before issue 12: exact counts, no weights hash or RNG mode,
    expected_logical_batch, an exact number of units."""
    block = copy.deepcopy(dp)
    for key in ("weights_sha256", "mechanism_rng"):
        block.pop(key, None)
    block["expected_logical_batch"] = 4
    block["num_units"] = 8
    dataset = {"patients": 8, "notes": 20, "sequences": 30, "phi_per_category": {"NAME": 5},
               "note_types": {"nursing": 20}, "language": "en", "label_schema": "hipaa"}
    return C.card_meta(block, dataset, base_model="org/base")


def test_old_card_is_explained_not_passed(tmp_path: Path, dp: dict[str, Any]) -> None:
    _write_unvalidated(tmp_path, _legacy_meta(dp))
    (tmp_path / "training_config.json").write_text(
        '{"lr": 0.001, "seed": 0, "loss_history": [2.5, 2.1]}', encoding="utf-8")
    with pytest.raises(CardError) as exc:
        validate_card(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg
    for expected in (
        "differential_privacy.weights_sha256: required field is missing (the card does not bind",
        "differential_privacy.mechanism_rng: required field is missing",
        "field(s) not allowed here: expected_logical_batch",
        "differential_privacy.num_units is an exact count",
        "dataset.patients is an exact count, published outside the guarantee",
        "dataset.phi_per_category.<key> is an exact count",
        "counts must be coarsened ranges",
        "retrain with this dphub version or re-card",
        "loss_history",
        "training_config.json format_version must be 2",
    ):
        assert expected in msg, (expected, msg)


def test_old_card_through_the_cli(tmp_path: Path, dp: dict[str, Any], capsys) -> None:
    from dphub.cli.main import main

    _write_unvalidated(tmp_path, _legacy_meta(dp))
    assert main(["card", "validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "weights_sha256" in err and "dataset.notes is an exact count" in err


def test_card_next_to_weights_is_checked_against_them(tmp_path: Path, dp: dict[str, Any]) -> None:
    from hub_fixtures import make_model_dir

    model = make_model_dir(tmp_path / "m")
    validate_card(model, require_private=True)
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(CardError, match="does not match the card's weights_sha256.*empty or "
                                        "truncated"):
        validate_card(model)
    validate_card(model, check_files=False)  # the card alone is still well-formed


def test_non_private_model_dir_validates_with_its_files(tmp_path: Path) -> None:
    import json

    from hub_fixtures import make_model_dir, training_config

    model = make_model_dir(tmp_path / "m")
    meta = C.card_meta(C.non_private_block(steps=10, epochs=1.0), dict(DATASET),
                       base_model="sentence-transformers/all-MiniLM-L6-v2")
    C.write_card(model, meta)
    cfg = training_config({"private": False})
    (model / "training_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert validate_card(model).private is False
    cfg["no_dp"] = False
    (model / "training_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with pytest.raises(CardError, match="does not say no_dp: true but the card is not private"):
        validate_card(model)


# --------------------------------------------------------------------------- bounded YAML (16.4)



@pytest.mark.parametrize("command", [None, "validate", "show"])
def test_billion_laughs_card_is_refused_fast(tmp_path: Path, command: str | None, capsys) -> None:
    import time

    from dphub.cli.main import main

    (tmp_path / "README.md").write_text(ALIAS_BOMB, encoding="utf-8")
    t0 = time.perf_counter()
    if command is None:
        with pytest.raises(CardError, match=r"front matter uses a YAML anchor at line 2; cards "
                                            "must be plain YAML"):
            C.load_card(tmp_path)
    else:
        assert main(["card", command, str(tmp_path)]) == 2
        assert "YAML anchor" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("front, expected", [
    ("x: *undefined\n", "front matter uses a YAML alias"),
    ("x: &anchor 1\n", "front matter uses a YAML anchor"),
    ("x: " + "[" * 200 + "]" * 200 + "\n", "nesting deeper than 32 levels"),
    ("x: '" + "a" * 300_000 + "'\n", "front matter is larger than 256 kB"),
])
def test_front_matter_limits(tmp_path: Path, front: str, expected: str) -> None:
    (tmp_path / "README.md").write_text(f"---\n{front}---\nbody\n", encoding="utf-8")
    with pytest.raises(CardError, match=re.escape(expected)):
        C.load_card(tmp_path)


def test_oversized_readme_is_refused_before_parsing(tmp_path: Path, meta: dict[str, Any]) -> None:
    C.write_card(tmp_path, meta)
    with open(tmp_path / "README.md", "a", encoding="utf-8") as fh:
        fh.write("x" * 1_000_001)
    with pytest.raises(CardError, match="model card is larger than 1 MB"):
        C.load_card(tmp_path)


def test_hub_front_matter_parser_shares_the_limits() -> None:
    from dphub.hub.common import parse_front_matter

    with pytest.raises(CardError, match="YAML anchor"):
        parse_front_matter(ALIAS_BOMB, where="acme/x")


# --------------------------------------------------------------------------- card_text (item 7)


def test_card_text_sections_validate(meta: dict[str, Any], tmp_path: Path) -> None:
    meta["card_text"] = {"intended_use": "De-identify nursing notes.\nNot for images.",
                         "out_of_scope": "Radiology reports.", "limitations": "English only.",
                         "provenance": "Notes of one hospital, 2019-2021."}
    C.validate_meta(meta)
    meta["card_text"] = {"intended_use": "x" * 4001}
    with pytest.raises(CardError, match="^card_text.intended_use: text longer than 4000"):
        C.validate_meta(meta)
    meta["card_text"] = {"summary": "free text"}
    with pytest.raises(CardError, match="^card_text: field.s. not allowed here: summary"):
        C.validate_meta(meta)
    meta["card_text"] = {"limitations": "bell\x07"}
    with pytest.raises(CardError, match="^card_text.limitations: value does not match"):
        C.validate_meta(meta)
