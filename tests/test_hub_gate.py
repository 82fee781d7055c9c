"""The publish gate: each test builds one bad artifact and expects exit 2 with one clear message."""

from __future__ import annotations

import io
import json
import math
import pickle

import numpy as np
import pytest
from hub_fixtures import ALIAS_BOMB, card_meta, copy_model, write_card

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


@pytest.mark.parametrize("edit, expected", [
    (lambda c: c.update(corpus_summary="mostly cardiology notes from 2019"),
     "config.json corpus_summary is not a number or a short token"),
    (lambda c: c.update(hidden_size_note=[1, 2, 3]), "hidden_size_note is not a number"),
    (lambda c: c["id2label"].update({"9": "a free text label"}), "id2label must map 0..n-1"),
    (lambda c: c["dphub"].update(num_units=131), "dphub block holds key(s) outside"),
    (lambda c: c.update(initializer_range=float("nan")), "initializer_range is not a number"),
])
def test_refuses_text_or_statistics_in_config_json(model, hub_env, capsys, edit, expected):
    cfg = json.loads((model / "config.json").read_text())
    edit(cfg)
    (model / "config.json").write_text(json.dumps(cfg))
    _refused(model, hub_env, capsys, expected)


def test_refuses_free_text_added_to_the_card_body(model, hub_env, capsys):
    with open(model / "README.md", "a", encoding="utf-8") as fh:
        fh.write("\nTrained on 131 cardiology patients of ward 7 (exact).\n")
    _refused(model, hub_env, capsys, "README.md's body is not what dphub renders")


def test_card_body_line_endings_do_not_matter(model):
    text = (model / "README.md").read_text(encoding="utf-8")
    (model / "README.md").write_bytes(text.replace("\n", "\r\n").encode())
    check_publishable(model)


def test_refuses_symlink(model, hub_env, capsys):
    (model / "notes.txt").symlink_to("/etc/hostname")
    _refused(model, hub_env, capsys, "notes.txt is a symbolic link")


def test_refusal_is_a_publish_refused_error(model):
    (model / "optimizer.pt").write_bytes(b"\x80\x04N.")
    with pytest.raises(PublishRefused):
        check_publishable(model)


# --------------------------------------------------------------------------- only accounted outputs


def _edit_training_config(model, edit) -> None:
    path = model / "training_config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))


def test_refuses_loss_history_in_training_config(model, hub_env, capsys):
    _edit_training_config(model, lambda c: c.update(loss_history=[3.2, 2.9, 2.7]))
    _refused(model, hub_env, capsys, "training_config.json holds key(s) outside the allow-list",
             "loss_history")


@pytest.mark.parametrize("where, key", [("top", "num_units"), ("hyper", "noise_seed"),
                                        ("hyper", "loss_history")])
def test_refuses_unlisted_training_config_keys(model, hub_env, capsys, where, key):
    def edit(cfg):
        (cfg if where == "top" else cfg["dphub_training"])[key] = 7

    _edit_training_config(model, edit)
    _refused(model, hub_env, capsys, "outside the allow-list", key)


def test_refuses_statistics_hidden_under_an_allowed_key(model, hub_env, capsys):
    _edit_training_config(model, lambda c: c["dphub_training"].update(seed=[0.91, 0.88, 0.85]))
    _refused(model, hub_env, capsys, "are not single numbers or short strings", "seed")


def test_refuses_old_training_config_format(model, hub_env, capsys):
    _edit_training_config(model, lambda c: c.pop("format_version"))
    _refused(model, hub_env, capsys, "format_version must be 2")


@pytest.mark.parametrize("name", ["notes_stats.json", "eval/predictions.jsonl", ".env",
                                  ".gitattributes"])
def test_refuses_files_outside_the_allow_list(model, hub_env, capsys, name):
    (model / name).parent.mkdir(exist_ok=True)
    (model / name).write_text("{}", encoding="utf-8")
    _refused(model, hub_env, capsys, f"{name} is not a file dphub publishes")


def test_pull_accepts_the_gitattributes_a_hf_hub_adds(model):
    from dphub.hub.gate import check_shareable

    (model / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    assert check_shareable(model).private


def test_allow_lists_are_module_constants():
    from dphub.hub import gate

    assert "loss_history" not in gate.TRAINING_CONFIG_KEYS | gate.TRAINING_HYPERPARAM_KEYS
    assert "num_units" not in gate.TRAINING_CONFIG_KEYS
    assert {"noise_multiplier", "sample_rate", "steps", "delta", "no_dp"} <= \
        gate.TRAINING_CONFIG_KEYS
    assert set(gate.PUBLISHED_FILES) >= {"model.safetensors", "config.json", "README.md",
                                         "training_config.json", "tokenizer.json"}


def test_every_training_option_is_either_published_or_hidden():
    """A new TrainOptions field must be decided on: published hyper-parameter (gate allow-list)
    or kept out of training_config.json (``public_dict``'s hidden set)."""
    from dphub.hub import gate
    from dphub.train import TrainOptions

    assert set(TrainOptions().public_dict()) == gate.TRAINING_HYPERPARAM_KEYS


# --------------------------------------------------------------------------- card bound to run


def test_refuses_no_dp_weights_with_a_dp_runs_card(model, hub_env, capsys, tmp_path):
    """A --no-dp directory with a DP run's README.md copied in (issue 12, finding 5)."""
    from hub_fixtures import training_config
    from safetensors.torch import load_file, save_file

    baseline = copy_model(model, tmp_path / "baseline")
    tensors = load_file(baseline / "model.safetensors")
    tensors["classifier.bias"] = tensors["classifier.bias"] + 1.0  # the baseline's own weights
    save_file(tensors, str(baseline / "model.safetensors"), metadata={"format": "pt"})
    (baseline / "training_config.json").write_text(
        json.dumps(training_config({"private": False})))
    (baseline / "README.md").write_bytes((model / "README.md").read_bytes())
    _refused(baseline, hub_env, capsys, "training_config.json says no_dp: true",
             "the card does not belong to these weights")
    # a forger who also edits the training config is caught by the weights hash
    (baseline / "training_config.json").write_bytes((model / "training_config.json").read_bytes())
    _refused(baseline, hub_env, capsys, "does not match the card's weights_sha256")


@pytest.mark.parametrize("key, value", [("noise_multiplier", 3.0), ("sample_rate", 0.5),
                                        ("steps", 7), ("delta", 1e-6),
                                        ("privacy_unit", "sequence")])
def test_refuses_training_config_disagreeing_with_card(model, hub_env, capsys, key, value):
    _edit_training_config(model, lambda c: c.update({key: value}))
    _refused(model, hub_env, capsys, f"training_config.json {key} differs from the card's")


def test_refuses_card_without_weights_hash(model, hub_env, capsys):
    write_card(model, card_meta(weights_sha256=...))
    _refused(model, hub_env, capsys, "differential_privacy.weights_sha256: required field")


# --------------------------------------------------------------------------- weights (fault 16.6)


def _rewrite_weights(model, edit) -> None:
    """Change the weights, then re-card so the card's hash names the new file (an attacker who
    controls the whole directory): only the layout check can catch what follows."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    write_card(model, card_meta())


def test_refuses_a_hidden_extra_tensor(model, hub_env, capsys):
    import torch

    _rewrite_weights(model, lambda t: t.update({"extra.hidden": torch.zeros(1000, 10)}))
    _refused(model, hub_env, capsys, "holds tensor(s) config.json does not imply",
             "extra.hidden")


def test_refuses_wrong_shape_crf_transitions(model, hub_env, capsys):
    import torch

    _rewrite_weights(model, lambda t: t.update({"crf.transitions": torch.zeros(9, 8)}))
    _refused(model, hub_env, capsys, "tensor crf.transitions has shape 9x8",
             "config.json implies 9x9")


def test_refuses_missing_tensor(model, hub_env, capsys):
    _rewrite_weights(model, lambda t: t.pop("crf.end_transitions"))
    _refused(model, hub_env, capsys, "lacks tensor(s) config.json implies: crf.end_transitions")


def test_refuses_wrong_dtype_tensor(model, hub_env, capsys):
    _rewrite_weights(model, lambda t: t.update(
        {"classifier.bias": t["classifier.bias"].half()}))
    _refused(model, hub_env, capsys, "tensor classifier.bias is F16, config.json implies F32")


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("name", ["crf.transitions", "classifier.weight"])
def test_refuses_non_finite_weights(model, hub_env, capsys, name, value):
    """Issue 31 item 8: `dphub train --lr 1e308` wrote ±inf into the head and CRF, and
    `card validate` and `publish` both passed it."""
    def poison(t):
        t[name] = t[name].clone()
        t[name].view(-1)[0] = value

    _rewrite_weights(model, poison)
    _refused(model, hub_env, capsys, f"tensor(s) {name} hold non-finite values")
    code = main(["card", "validate", str(model)])
    err = capsys.readouterr().err
    assert code == 2 and "non-finite values" in err, err


def test_deid_refuses_non_finite_weights(model, hub_env, capsys):
    """The loader refuses them too: `dphub deid` with such a model removed nothing, exit 0."""
    def poison(t):
        t["classifier.weight"] = torch.full_like(t["classifier.weight"], -math.inf)

    import torch

    _rewrite_weights(model, poison)
    notes = hub_env["tmp"] / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("Call John Smith at 555-123-4567.\n", encoding="utf-8")
    out = hub_env["tmp"] / "out"
    code = main(["deid", str(notes), "--model", str(model), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "classifier.weight" in err and "non-finite values" in err
    assert "John" not in err and not out.exists()


@pytest.mark.parametrize("cut", [0, 5, -7])
def test_refuses_empty_or_truncated_weights(model, hub_env, capsys, cut):
    raw = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(raw[:cut])
    write_card(model, card_meta())  # bound to the broken file: the layout check must catch it
    _refused(model, hub_env, capsys, "model.safetensors is")
    code, err = _publish(model, hub_env, capsys)
    assert "empty or truncated" in err or "truncated or not a safetensors file" in err


def test_refuses_free_form_safetensors_metadata(model, hub_env, capsys):
    from safetensors.torch import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    save_file(tensors, str(model / "model.safetensors"),
              metadata={"format": "pt", "note": "x" * 40})
    write_card(model, card_meta())
    _refused(model, hub_env, capsys, "header metadata may only hold format")


@pytest.mark.parametrize("trick", ["field", "padding"])
def test_refuses_text_hidden_in_the_safetensors_header(model, hub_env, capsys, trick):
    """safe_open accepts extra per-tensor fields and any amount of header padding."""
    path = model / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    if trick == "field":
        header["classifier.bias"]["note"] = "x" * 40
        new = json.dumps(header).encode()
        new += b" " * (-len(new) % 8)
    else:
        new = json.dumps(header).encode() + b" " * 4000
    path.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n:])
    write_card(model, card_meta())
    _refused(model, hub_env, capsys, "model.safetensors header")


def test_expected_tensors_match_what_the_tagger_saves(tiny_tagger_dir):
    """The layout the gate derives from config.json is exactly what TaggerModel.save writes."""
    from safetensors import safe_open

    from dphub.hub.gate_common import config_problems
    from dphub.hub.gate_tensors import _header_layout_problems, expected_tensors

    assert _header_layout_problems(tiny_tagger_dir / "model.safetensors") == []
    assert config_problems(json.loads((tiny_tagger_dir / "config.json").read_text())) == []

    with safe_open(str(tiny_tagger_dir / "model.safetensors"), framework="pt") as fh:
        saved = {k: (fh.get_slice(k).get_dtype(), tuple(fh.get_slice(k).get_shape()))
                 for k in fh.keys()}  # noqa: SIM118
    want = expected_tensors(tiny_tagger_dir)
    assert {k: v for k, v in want.items() if k in saved} == saved
    assert set(want) - set(saved) <= {k for k in want if k.endswith(("position_ids",
                                                                      "token_type_ids"))}


# --------------------------------------------------------------------------- pull repeats it


def _bypass_gate(model, hub_env, repo="acme/raw"):
    """Commit ``model`` to the local hub without the gate (what a hostile hub could hold)."""
    from dphub.hub.local import LocalHub

    LocalHub(hub_env["hub"]).publish(model, repo, "bypassed the gate")


@pytest.mark.parametrize("breakage", ["hidden", "shape", "empty", "extra_file", "loss_history",
                                      "inf"])
def test_pull_refuses_what_the_gate_refuses(model, hub_env, capsys, breakage):
    import torch

    from dphub.errors import PullRefused
    from dphub.hub import ops
    from dphub.registry import Registry

    if breakage == "hidden":
        _rewrite_weights(model, lambda t: t.update({"extra.hidden": torch.zeros(1000, 10)}))
    elif breakage == "shape":
        _rewrite_weights(model, lambda t: t.update({"crf.transitions": torch.zeros(9, 8)}))
    elif breakage == "empty":
        (model / "model.safetensors").write_bytes(b"")
        write_card(model, card_meta())
    elif breakage == "extra_file":
        (model / "side_channel.txt").write_text("1 2 3")
    elif breakage == "inf":
        _rewrite_weights(model, lambda t: t.update(
            {"crf.transitions": torch.full_like(t["crf.transitions"], math.inf)}))
    else:
        _edit_training_config(model, lambda c: c.update(loss_history=[1.0]))
    _bypass_gate(model, hub_env)
    with pytest.raises(PullRefused, match="nothing was registered"):
        ops.pull("acme/raw")
    assert Registry().list() == []


# --------------------------------------------------------------------------- alias bomb (16.4)



def test_publish_and_pull_refuse_an_alias_bomb_fast(model, hub_env, capsys):
    import time

    from dphub.errors import PullRefused
    from dphub.hub import ops

    (model / "README.md").write_text(ALIAS_BOMB, encoding="utf-8")
    t0 = time.perf_counter()
    _refused(model, hub_env, capsys, "uses a YAML anchor")
    assert time.perf_counter() - t0 < 1.0
    _bypass_gate(model, hub_env)
    t0 = time.perf_counter()
    with pytest.raises(PullRefused, match="YAML anchor"):
        ops.pull("acme/raw")
    assert time.perf_counter() - t0 < 5.0  # includes the git download
    t0 = time.perf_counter()
    rows = ops.search()  # the hub listing parses the card too: listed without a summary
    assert time.perf_counter() - t0 < 1.0
    assert [r.summary.epsilon for r in rows] == [None]
