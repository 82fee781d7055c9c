"""``dphub.toml`` is validated against a schema (issue 16, fault 12).

An unknown section or key, a wrong type or a non-finite number used to pass silently (``noise =
"loud"`` trained at the default ε); now each is refused with exit 2, naming section and key.
"""

from __future__ import annotations

import re
import tempfile
import tomllib
from pathlib import Path

import pytest
from hub_fixtures import copy_model

from dphub import config
from dphub.cli.main import main
from dphub.cli.train import INIT_TEMPLATE
from dphub.errors import ConfigError

pytest_plugins = ("hub_fixtures",)


def _load(tmp_path: Path, text: str) -> dict:
    f = tmp_path / "dphub.toml"
    f.write_text(text, encoding="utf-8")
    return config.load_project_config(f)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[privacy]\nnosie = 1.0\n", ["[privacy] nosie", "unknown key", "noise"]),
        ("[trian]\nepochs = 2\n", ["[trian]", "unknown section", "train"]),
        ('[privacy]\nnoise = "loud"\n', ["[privacy] noise", "'loud'", "number"]),
        ("[privacy]\nnoise = nan\n", ["[privacy] noise", "finite"]),
        ("[privacy]\ntarget_epsilon = inf\n", ["[privacy] target_epsilon", "finite"]),
        ("[hub]\nmax_epsilon = nan\n", ["[hub] max_epsilon", "finite"]),
        ("[privacy]\nnoise = -1.0\n", ["[privacy] noise", "> 0"]),
        ("[privacy]\ndelta = 1.5\n", ["[privacy] delta", "< 1"]),
        ('[privacy]\nprivacy_unit = "ward"\n', ["[privacy] privacy_unit", "patient"]),
        ("[train]\nbatch_size = true\n", ["[train] batch_size", "integer"]),
        ("[train]\nbatch_size = 0\n", ["[train] batch_size", ">= 1"]),
        ('[hub]\nrequire_unit = "site"\n', ["[hub] require_unit", "sequence"]),
        ('[hub]\nrepo = "no-slash"\n', ["[hub] repo", "org/name"]),
        ("[card]\nlimitations = 3\n", ["[card] limitations", "string"]),
        ('[card]\nsummary = "x"\n', ["[card] summary", "unknown key", "provenance"]),
        ('data = "notes.jsonl"\n', ["[data]", "table"]),
        # issue 31 #13: a 400-digit integer overflowed float() (OverflowError, exit 1)
        ("[privacy]\nmax_epsilon = " + "9" * 400 + "\n", ["[privacy] max_epsilon", "400 digits"]),
        ("[privacy]\nnoise = " + "9" * 400 + "\n", ["[privacy] noise", "out of range"]),
        ("[privacy]\ntarget_epsilon = " + "9" * 400 + "\n", ["[privacy] target_epsilon"]),
        ("[hub]\nmax_epsilon = -" + "9" * 400 + "\n", ["[hub] max_epsilon", "out of range"]),
        ("[train]\nseed = " + "9" * 400 + "\n", ["[train] seed", "out of range"]),
        # more than 4,300 digits: a ValueError inside the TOML parser
        ("[privacy]\nnoise = " + "9" * 5000 + "\n", ["not valid TOML", "too large"]),
    ],
)
def test_mistakes_are_refused_naming_section_and_key(
    tmp_path: Path, text: str, needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    message = info.value.message
    assert "dphub.toml" in message and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_huge_integer_in_dphub_toml_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31 #13 through the CLI: exit 2, one line, no crash log."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "n.jsonl").write_text('{"text": "x", "spans": []}\n')
    (tmp_path / "dphub.toml").write_text("[privacy]\ntarget_epsilon = " + "9" * 400 + "\n")
    assert main(["train", "n.jsonl", "--out", "m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[privacy] target_epsilon" in err[0]
    assert not list(tmp_path.glob("dphub-crash-*"))


def test_every_key_a_command_reads_is_accepted(tmp_path: Path) -> None:
    cfg = _load(tmp_path, """
[data]
path = "d.jsonl"
format = "jsonl"
[model]
base_model = "default"
head = "crf"
label_schema = "hipaa"
[privacy]
noise = 1.0
target_epsilon = 8
delta = 1e-5
privacy_unit = "patient"
accountant = "rdp"
max_grad_norm = 1.0
max_examples_per_unit = 64
max_epsilon = 9.5
secure_rng = false
[train]
epochs = 3
batch_size = 8
max_physical_batch = 4
lr = 5e-3
train_layers = 0
lora_rank = 8
recall_weight = 0
seed = 1
warm_start = "none"
[output]
dir = "m"
[hub]
url = "hub"
repo = "org/name"
max_epsilon = 10
require_unit = "patient"
[card]
intended_use = "De-identify nursing notes of adult inpatients."
out_of_scope = "Radiology reports."
limitations = "Trained on 100 patients."
provenance = "Site A nursing notes, 2019-2021."
""")
    assert cfg["privacy"]["noise"] == 1.0 and cfg["card"]["provenance"].startswith("Site A")


def test_every_train_key_is_in_the_schema() -> None:
    from dphub.cli.train import CONFIG_KEYS

    for section, key in CONFIG_KEYS.values():
        assert key in config.PROJECT_SCHEMA["properties"][section]["properties"], (section, key)


def test_the_init_template_is_valid() -> None:
    config.validate_project_config(tomllib.loads(INIT_TEMPLATE))
    # the commented-out keys too, once uncommented
    for key in re.findall(r"^# ([a-z_]+) = ", INIT_TEMPLATE, flags=re.M):
        assert any(key in s["properties"]
                   for s in config.PROJECT_SCHEMA["properties"].values()), key


def test_train_refuses_a_misspelt_key_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a crash log (old code) stays here

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained despite a bad dphub.toml")

    monkeypatch.setattr("dphub.train.train", must_not_run)
    (tmp_path / "dphub.toml").write_text('[privacy]\nnoise = "loud"\n[trian]\nepochs = 1\n')
    assert main(["train", "notes.jsonl", "--out", "m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "[trian]" in err and len(err.splitlines()) == 1


def test_pull_applies_the_project_epsilon_policy(
    model_template: Path, hub_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = copy_model(model_template, hub_env["tmp"] / "model")
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    (hub_env["tmp"] / "dphub.toml").write_text("[hub]\nmax_epsilon = 5\n")
    capsys.readouterr()
    assert main(["pull", "acme/deid"]) == 2  # the model's ε is 8.51
    assert "refusing acme/deid@" in capsys.readouterr().err
    (hub_env["tmp"] / "dphub.toml").write_text('[hub]\nrequire_unit = "patient"\n')
    assert main(["pull", "acme/deid"]) == 0
    assert "pulled acme/deid@" in capsys.readouterr().out
