"""The publish gate: each test builds one bad artifact and expects exit 2 with one clear message."""

from __future__ import annotations

import io
import json
import math
import pickle

import numpy as np
import pytest
from hub_fixtures import card_meta, copy_model, write_card

from dphub.cli.main import main
from dphub.errors import PublishRefused
from dphub.hub.gate import check_publishable

pytest_plugins = ("hub_fixtures",)


@pytest.fixture
def model(model_template, hub_env):
    return copy_model(model_template, hub_env["tmp"] / "model")


def _publish(model, hub_env, capsys) -> tuple[int, str]:
    code = main(["publish", str(model), "--repo", "acme/deid", "--hub", str(hub_env["hub"])])
    return code, capsys.readouterr().err


def _refused(model, hub_env, capsys, *expected: str) -> None:
    code, err = _publish(model, hub_env, capsys)
    assert code == 2, err
    assert err.startswith("error: refusing to publish"), err
    assert err.count("\n") == 1, "one line, no traceback"
    for text in expected:
        assert text in err
    assert not (hub_env["hub"] / "models" / "acme" / "deid").exists(), "nothing was published"


def test_valid_model_passes_the_gate(model, hub_env, capsys):
    summary = check_publishable(model)
    assert summary.private and summary.unit == "patient" and summary.epsilon > 0
    code, err = _publish(model, hub_env, capsys)
    assert code == 0, err


def test_refuses_card_failing_schema(model, hub_env, capsys):
    meta = card_meta()
    meta["dataset"]["patients"] = "one hundred"  # the schema wants an integer
    write_card(model, meta)
    _refused(model, hub_env, capsys, "model card fails validation", "dataset.patients")


def test_refuses_card_without_dp_block(model, hub_env, capsys):
    meta = card_meta()
    del meta["differential_privacy"]
    write_card(model, meta)
    _refused(model, hub_env, capsys, "no differential_privacy block")


@pytest.mark.parametrize("field", ["noise_multiplier", "sample_rate", "steps", "accountant"])
def test_refuses_missing_accounting_field(model, hub_env, capsys, field):
    write_card(model, card_meta(**{field: ...}))
    _refused(model, hub_env, capsys, "lacks accounting field(s)", field)


def test_refuses_non_private_model(model, hub_env, capsys):
    write_card(model, card_meta(private=False, epsilon=None))
    _refused(model, hub_env, capsys, "non-private")


@pytest.mark.parametrize("eps", [None, math.inf])
def test_refuses_unbounded_epsilon(model, hub_env, capsys, eps):
    write_card(model, card_meta(epsilon=eps))
    _refused(model, hub_env, capsys, "epsilon must be a finite positive number")


def test_refuses_missing_card(model, hub_env, capsys):
    (model / "README.md").unlink()
    _refused(model, hub_env, capsys, "README.md is missing")


@pytest.mark.parametrize("name", ["pytorch_model.bin", "weights.pt", "head.pth", "crf.pkl",
                                  "x.pickle", "last.ckpt"])
def test_refuses_pickle_files(model, hub_env, capsys, name):
    (model / name).write_bytes(pickle.dumps({"w": [1, 2, 3]}))
    _refused(model, hub_env, capsys, name, "pickle-based")


def test_refuses_object_npy(model, hub_env, capsys):
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (model / "extra.npy").write_bytes(buf.getvalue())
    _refused(model, hub_env, capsys, "extra.npy contains pickled objects")


def test_numeric_npy_is_not_a_pickle_but_not_a_published_file(model, hub_env, capsys):
    buf = io.BytesIO()
    np.save(buf, np.zeros(3))
    (model / "thresholds.npy").write_bytes(buf.getvalue())
    _refused(model, hub_env, capsys, "thresholds.npy is not a file dphub publishes")


def test_refuses_pickle_under_innocent_name(model, hub_env, capsys):
    (model / "weights.dat").write_bytes(pickle.dumps([1, 2, 3], protocol=4))
    _refused(model, hub_env, capsys, "weights.dat contains pickled objects")


@pytest.mark.parametrize("name", ["optimizer.safetensors", "scheduler.json", "rng_state_0.json",
                                  "trainer_state.json", "checkpoint-300/model.safetensors"])
def test_refuses_training_state(model, hub_env, capsys, name):
    (model / name).parent.mkdir(exist_ok=True)
    (model / name).write_text("{}", encoding="utf-8")
    _refused(model, hub_env, capsys, "optimizer/checkpoint state")


def test_refuses_tokenizer_differing_from_base(model, hub_env, capsys):
    with open(model / "vocab.txt", "a", encoding="utf-8") as fh:
        fh.write("privatesurname\n")
    _refused(model, hub_env, capsys, "vocab.txt differs (sha256)")


def test_refuses_unresolvable_base_model(model, hub_env, capsys):
    meta = card_meta()
    meta["base_model"] = "nobody-here/no-such-model"
    write_card(model, meta)
    _refused(model, hub_env, capsys, "cannot resolve the card's base_model")


@pytest.mark.parametrize("leak, marker", [("/home/alice/corpus", "/home/"),
                                          ("/Users/bob/x", "/Users/"),
                                          ("C:\\\\data\\\\notes", "C:\\\\"),
                                          ("/tmp/run-3/out", "/tmp/")])
def test_refuses_absolute_paths(model, hub_env, capsys, leak, marker):
    cfg = json.loads((model / "training_config.json").read_text())
    cfg["init_from"] = leak  # an allow-listed key: the path check still catches the value
    (model / "training_config.json").write_text(json.dumps(cfg, indent=2))
    _refused(model, hub_env, capsys, "training_config.json line", "local path or user name")
    code, err = _publish(model, hub_env, capsys)
    assert leak not in err, "the offending value is not echoed"


def test_refuses_user_name(model, hub_env, capsys, monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "zelda")
    cfg = json.loads((model / "config.json").read_text())
    cfg["trained_by"] = "zelda"
    (model / "config.json").write_text(json.dumps(cfg))
    _refused(model, hub_env, capsys, "config.json line 1", "the current user name")


def test_refuses_path_in_safetensors_metadata(model, hub_env, capsys):
    from safetensors.torch import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    save_file(tensors, str(model / "model.safetensors"),
              metadata={"format": "pt", "source": "/home/alice/run"})
    _refused(model, hub_env, capsys, "model.safetensors", "/home/")


def test_refuses_remote_code(model, hub_env, capsys):
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_x.X"}
    (model / "config.json").write_text(json.dumps(cfg))
    _refused(model, hub_env, capsys, "custom code")


def test_refuses_symlink(model, hub_env, capsys):
    (model / "notes.txt").symlink_to("/etc/hostname")
    _refused(model, hub_env, capsys, "notes.txt is a symbolic link")


def test_refusal_is_a_publish_refused_error(model):
    (model / "optimizer.pt").write_bytes(b"\x80\x04N.")
    with pytest.raises(PublishRefused):
        check_publishable(model)
