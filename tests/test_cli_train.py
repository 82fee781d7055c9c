"""`dphub init` and `dphub train`: project file, flag overrides, errors, last-model state."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from dphub import config as project
from dphub import formats, synth
from dphub.cli.main import main


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    notes = synth.generate(12, kind="nursing", seed=11, patients=4)
    path = tmp_path_factory.mktemp("corpus") / "notes.jsonl"
    formats.write(notes, path, "jsonl")
    return path


def test_init_writes_a_commented_project_file_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init"]) == 0
    text = (tmp_path / "dphub.toml").read_text()
    assert text.lstrip().startswith("#")
    cfg = tomllib.loads(text)
    for section in ("data", "model", "privacy", "train", "output"):
        assert section in cfg
    assert cfg["privacy"]["privacy_unit"] == "patient"
    assert cfg["train"]["warm_start"] == "synth"

    (tmp_path / "dphub.toml").write_text("# mine\n")
    capsys.readouterr()
    assert main(["init"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--force" in err and "Traceback" not in err
    assert (tmp_path / "dphub.toml").read_text() == "# mine\n"
    assert main(["init", "--force"]) == 0
    assert "[privacy]" in (tmp_path / "dphub.toml").read_text()


def _project(tmp_path: Path, corpus: Path, base: Path) -> None:
    """A dphub.toml describing a tiny run (relative paths, as a user would write them)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.jsonl").write_bytes(corpus.read_bytes())
    (tmp_path / "dphub.toml").write_text(f"""
[data]
path = "data/notes.jsonl"
format = "jsonl"
[model]
base_model = "{base}"
[privacy]
noise = 1.0
accountant = "rdp"
[train]
epochs = 1.0
batch_size = 2
max_physical_batch = 2
warm_start = "none"
[output]
dir = "out/model"
""")


def test_train_without_arguments_uses_dphub_toml(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _project(tmp_path, corpus, tiny_base_model)
    assert main(["train"]) == 0
    out = tmp_path / "out" / "model"
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    printed = capsys.readouterr().out
    assert "ε =" in printed and "patient" in printed
    assert project.last_trained_model(tmp_path) == out.resolve()
    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["steps"] == 2 and cfg["noise_multiplier"] == 1.0


def test_flags_override_project_keys(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _project(tmp_path, corpus, tiny_base_model)
    assert main(["train", "--epochs", "2", "--noise", "1.5", "--out", "elsewhere",
                 "--privacy-unit", "note"]) == 0
    out = tmp_path / "elsewhere"
    cfg = json.loads((out / "training_config.json").read_text())
    # 12 notes as units, batch 2 -> 6 steps per epoch
    assert cfg["steps"] == 12 and cfg["noise_multiplier"] == 1.5 and cfg["sample_rate"] == pytest.approx(1 / 6)
    assert cfg["dphub_training"]["privacy_unit"] == "note"
    assert not (tmp_path / "out").exists()


def test_no_dp_flag_says_not_private(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(corpus), "--out", "base", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--no-dp", "--epochs", "1", "--batch-size", "2"]) == 0
    assert "NOT PRIVATE" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--noise", "1", "--target-epsilon", "3"], "either"),
        (["--privacy-unit", "ward"], "privacy-unit"),
        (["--delta", "0.5"], "1/N"),
        (["--max-epsilon", "0.0001", "--noise", "0.3"], "max-epsilon"),
    ],
)
def test_bad_input_is_one_error_line(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str],
    args: list[str], needle: str,
) -> None:
    code = main(["train", str(corpus), "--out", "m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--accountant", "rdp", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error:") and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists()


def test_missing_data_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "nope.jsonl", "--out", "m"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
    assert main(["train"]) == 2  # no data anywhere (no dphub.toml)
    assert "DATA" in capsys.readouterr().err


def test_errors_never_quote_note_text(
    tmp_path: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = synth.generate(3, kind="nursing", seed=2)
    for n in notes:
        n.patient_id = None
    path = tmp_path / "n.jsonl"
    formats.write(notes, path, "jsonl")
    assert main(["train", str(path), "--out", "m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--noise", "1"]) == 2
    err = capsys.readouterr().err
    assert "patient id" in err
    for n in notes:
        for s in n.spans:
            if len(n.span_text(s)) >= 4:  # shorter strings could match by accident
                assert n.span_text(s) not in err


def test_init_template_states_the_real_defaults() -> None:
    from dphub.cli.train import CONFIG_KEYS, INIT_TEMPLATE
    from dphub.train import TrainOptions

    cfg = tomllib.loads(INIT_TEMPLATE)
    defaults = TrainOptions()
    checked = 0
    for field, (section, key) in CONFIG_KEYS.items():
        if key in cfg.get(section, {}) and field not in ("data", "out", "base_model"):
            if field == "target_epsilon":
                continue  # the template pins the default target explicitly
            assert cfg[section][key] == getattr(defaults, field), field
            checked += 1
    assert checked >= 12


def test_train_warns_when_epsilon_is_above_the_hub_policy(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 12.9: `--noise 0.55` gave ε ≈ 96 and nothing said so before publish refused it."""
    monkeypatch.setenv("DPHUB_HUB", str(tmp_path / "hub"))
    _project(tmp_path, corpus, tiny_base_model)
    # issue 31 item 21: refused before the first step unless --allow-above-policy
    assert main(["train", "--noise", "0.3", "--epochs", "4"]) == 2
    assert "--allow-above-policy" in capsys.readouterr().err
    assert main(["train", "--noise", "0.3", "--epochs", "4", "--allow-above-policy"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 2 and "exceeds the policy's maximum 10" in err
    assert "training anyway (--allow-above-policy)" in err
    assert "dphub publish` will refuse" in err

    # issue 53: the same patients already lost more than the policy (the privacy ledger
    # records the run above): a run within it alone is refused too, before the first step
    assert main(["train", "--noise", "3", "--epochs", "1", "--out", "quiet", "--force"]) == 2
    assert "for these patients (this run composed with 1 earlier release" in \
        capsys.readouterr().err
    # within the policy, on patients the ledger has no release of: no warning
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "another-home"))
    assert main(["train", "--noise", "3", "--epochs", "1", "--out", "quiet", "--force"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_projected_epsilon_above_the_policy_refuses_to_start(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 31 item 21: the `dphub init` recipe (batch 96, 32 epochs) with --noise 0.55 on fewer
    patients than the batch gives q = 1 and ε ≈ 96; that is known before the first step."""
    import dphub.train.run as run
    from dphub.errors import DphubError

    monkeypatch.setenv("DPHUB_HUB", str(tmp_path / "hub"))

    def first_step(*a, **k):
        raise DphubError("reached the first step")

    monkeypatch.setattr(run, "TrainLoop", first_step)
    code = main(["train", str(corpus), "--out", "m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--noise", "0.55"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[0] == ("privacy plan: 4 patients, q = 1, σ = 0.55, 32 steps, δ = 1e-05: "
                        "projected ε = 95.93")
    assert lines[1].startswith("note: the expected batch (96 patients) is not below the 4 "
                               "patients: every step uses every patient (q = 1)")
    assert len(lines) == 3 and lines[2].startswith("error: projected ε = 95.93 exceeds the "
                                                   "maximum 10 of the policy of the hub")
    for way in ("--noise 2.9 or more", "--target-epsilon 10", "--epochs 1 or fewer",
                "--max-epsilon 10", "a --batch-size well below the 4 patients",
                "--allow-above-policy"):
        assert way in lines[2], way
    assert "reached the first step" not in err
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m*"))

    # the advice works: with the suggested noise the run reaches its first step
    assert main(["train", str(corpus), "--out", "m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--noise", "2.9"]) == 2
    err = capsys.readouterr().err
    assert "projected ε = 9.705" in err and err.endswith("error: reached the first step\n")


def test_a_unit_weaker_than_the_policy_is_said_before_the_first_step(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sequence-level run under a patient-level policy: said before training, not after."""
    import dphub.train.run as run
    from dphub.errors import DphubError

    monkeypatch.setenv("DPHUB_HUB", str(tmp_path / "hub"))

    def first_step(*a, **k):
        raise DphubError("reached the first step")

    monkeypatch.setattr(run, "TrainLoop", first_step)
    assert main(["train", str(corpus), "--out", "m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--noise", "5", "--privacy-unit", "sequence"]) == 2
    err = capsys.readouterr().err
    warning = "warning: privacy unit sequence is weaker than the policy's minimum patient"
    assert warning in err
    assert err.index(warning) < err.index("error: reached the first step")


@pytest.mark.parametrize("dp", [True, False])
def test_diverging_training_stops_with_one_error_line(
    tmp_path: Path, corpus: Path, tiny_base_model: Path, capsys: pytest.CaptureFixture[str],
    dp: bool,
) -> None:
    """Issue 31 item 8: `--lr 1e308` made every head and CRF tensor ±inf, and the run wrote a
    model that validated, published and removed nothing."""
    code = main(["train", str(corpus), "--out", "m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--epochs", "1", "--batch-size", "2",
                 "--checkpoint-every", "1", "--lr", "1e308",
                 *(["--noise", "1", "--accountant", "rdp"] if dp else ["--no-dp"])])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 + dp, err  # DP runs first print the privacy plan
    assert lines[-1].startswith("error: training stopped at step 1 of 2: the weights became "
                                "non-finite (inf or NaN)"), err
    assert "smaller --lr" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists(), "no half-written output"
    assert not list(tmp_path.glob(".m*")), "no checkpoint left to trip over"


def test_encoder_layers_keep_the_first_blocks_through_warm_start_and_training(
        tmp_path: Path, corpus: Path, tiny_base_model: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--encoder-layers: the model keeps the base's first N blocks (the saved config says N),
    the warm start is cached under its own key, and the choice is recorded; a trained model's
    depth cannot be changed."""
    from dataclasses import replace

    from dphub.tagger import Tagger, TaggerModel
    from dphub.tagger_model import _encoder_layers
    from dphub.train import pretrain, warmstart  # noqa: F401 (pretrain reads the real class)
    from dphub.train.warmstart import WarmStartConfig, cache_key

    full = TaggerModel.from_base(tiny_base_model)
    cut = TaggerModel.from_base(tiny_base_model, encoder_layers=1)
    assert len(_encoder_layers(full.encoder)) == 2 and len(_encoder_layers(cut.encoder)) == 1
    first = dict(_encoder_layers(full.encoder)[0].named_parameters())
    for name, p in _encoder_layers(cut.encoder)[0].named_parameters():
        assert torch.equal(p, first[name])  # the same first block, not a fresh one
    ws = WarmStartConfig()
    keys = {cache_key(tiny_base_model, "tiny-bert", "hipaa", "crf", replace(ws, encoder_layers=n),
                      0) for n in (None, 1, 2)}
    assert len(keys) == 3
    small = {"notes": (("nursing", 3),), "epochs": 1.0, "batch_size": 4, "rule_epochs": 1.0}
    monkeypatch.setattr(warmstart, "WarmStartConfig",
                        lambda **kw: WarmStartConfig(**{**small, **kw}))  # a quick warm start
    assert main(["train", str(corpus), "--out", "m", "--base-model", str(tiny_base_model),
                 "--encoder-layers", "1", "--epochs", "1", "--batch-size", "2"]) == 0
    cfg = json.loads((tmp_path / "m" / "training_config.json").read_text())
    assert cfg["dphub_training"]["encoder_layers"] == 1
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_hidden_layers"] == 1
    loaded = Tagger.load(tmp_path / "m")
    assert len(_encoder_layers(loaded.model.encoder)) == 1
    from dphub.card import load_card

    assert load_card(tmp_path / "m").dp["public_pretraining"]["encoder_layers"] == 1
    assert main(["train", str(corpus), "--out", "m2", "--init-from", str(tmp_path / "m"),
                 "--encoder-layers", "1", "--epochs", "1"]) == 2
    assert main(["train", str(corpus), "--out", "m3", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--encoder-layers", "5"]) == 2
    assert not (tmp_path / "m2").exists() and not (tmp_path / "m3").exists()
