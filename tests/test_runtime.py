"""ONNX Runtime encoders (issue 15.2): same outputs as torch, a digest-keyed cache that detects
tampering, and the ``--runtime`` choice stored in the ensemble manifest."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from dphub import runtime, synth
from dphub.cli.main import main
from dphub.errors import ConfigError, ModelError
from dphub.io import file_sha256
from dphub.tagger import Tagger

pytest.importorskip("onnxruntime")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))  # the cache's HMAC key lives there
    monkeypatch.setattr(runtime, "_LOADED", {})  # no session kept from another test
    return tmp_path / "cache" / "onnx"


@pytest.fixture(scope="module")
def notes() -> list:
    return synth.generate(4, kind="discharge", seed=5)


def test_onnx_encoder_matches_torch(tiny_tagger_dir: Path, cache: Path, notes: list) -> None:
    ref = Tagger.load(tiny_tagger_dir).token_scores(notes, batch_size=4)
    fast = Tagger.load(tiny_tagger_dir)
    status = fast.use_runtime("onnx", threads=1)
    assert status.status == "built" and fast.encoder_key[-1] == "onnx"
    got = fast.token_scores(notes, batch_size=4)
    for x, y in zip(ref, got, strict=True):
        assert np.allclose(x.phi_prob, y.phi_prob, atol=1e-4)
        assert x.decoded == y.decoded
    int8 = Tagger.load(tiny_tagger_dir)
    assert int8.use_runtime("onnx-int8", threads=1).status == "built"
    q = int8.token_scores(notes, batch_size=4)
    assert [len(s.phi_prob) for s in q] == [len(s.phi_prob) for s in ref]


def test_cache_is_keyed_by_encoder_digest(tiny_tagger_dir: Path, cache: Path,
                                          tmp_path: Path) -> None:
    a = Tagger.load(tiny_tagger_dir)
    status = a.use_runtime("onnx", threads=1)
    assert status.path.parent == cache / a.encoder_digest
    meta = json.loads((status.path.parent / "meta.json").read_text())
    assert meta["encoder_digest"] == a.encoder_digest and set(meta["macs"]) == {"onnx"}
    assert (status.path.parent.stat().st_mode & 0o777) == 0o700
    runtime._LOADED.clear()  # a new process: the file is found and verified, not rebuilt
    copy = shutil.copytree(tiny_tagger_dir, tmp_path / "copy")  # same encoder, other directory
    b = Tagger.load(copy)
    again = b.use_runtime("onnx", threads=1)
    assert again.status == "cached" and again.path == status.path


def test_tampered_cache_is_rebuilt(tiny_tagger_dir: Path, cache: Path, notes: list,
                                   tmp_path: Path) -> None:
    t = Tagger.load(tiny_tagger_dir)
    path = t.use_runtime("onnx", threads=1).path
    ref = t.token_scores(notes, batch_size=4)
    # 1. bytes changed behind meta.json's back: the digest no longer matches
    runtime._LOADED.clear()
    path.write_bytes(path.read_bytes()[:-64] + b"\0" * 64)
    t2 = Tagger.load(tiny_tagger_dir)
    assert t2.use_runtime("onnx", threads=1).status == "rebuilt"
    for x, y in zip(ref, t2.token_scores(notes, batch_size=4), strict=True):
        assert np.allclose(x.phi_prob, y.phi_prob, atol=1e-4)
    # 2. another encoder's graph with a forged meta.json (without the key: its SHA-256 in place
    # of the authentication code)
    from conftest import make_tiny_base_model

    from dphub.tagger import TaggerModel

    other = TaggerModel.from_base(make_tiny_base_model(tmp_path / "other", seed=7)).eval()
    runtime.export_encoder(other.encoder, path)
    d = path.parent
    meta = json.loads((d / "meta.json").read_text())
    meta["macs"]["onnx"] = file_sha256(path)
    (d / "meta.json").write_text(json.dumps(meta))
    runtime._LOADED.clear()
    assert Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1).status == "rebuilt"


def _forge_meta(d: Path, runtime_name: str, path: Path) -> None:
    """What an attacker without the user's key can write: the file's SHA-256 (all that format 1
    checked) and an authentication code under a key of their own."""
    meta = json.loads((d / "meta.json").read_text())
    meta.setdefault("files", {})[runtime_name] = file_sha256(path)
    meta.setdefault("macs", {})[runtime_name] = runtime.file_mac(
        b"k" * 32, d.name, runtime_name, path.read_bytes()) if hasattr(runtime, "file_mac") \
        else "0" * 64
    (d / "meta.json").write_text(json.dumps(meta))


def _john_graph(tagger: Tagger, path: Path) -> bytes:
    """Write at ``path`` the tagger's encoder with the embedding of the word piece "john" (not in
    the public probe batch) changed: a graph that passes the probe and misbehaves on names."""
    import copy

    import onnxruntime as ort

    john = tagger.tokenizer.convert_tokens_to_ids("john")
    assert john not in runtime._probe_batch(30522)["input_ids"]
    evil = copy.deepcopy(tagger.model.encoder).eval()
    with torch.no_grad():
        row = evil.embeddings.word_embeddings.weight[john]
        evil.embeddings.word_embeddings.weight[john] = -50 * row
    runtime.export_encoder(evil, path)
    assert runtime._probe_ok("onnx", ort.InferenceSession(str(path)), tagger.model.encoder)
    return path.read_bytes()


def test_a_planted_graph_that_passes_the_probe_is_rebuilt(
        tiny_tagger_dir: Path, cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 31 item 10: the probe batch is public, so a graph can behave on it and misbehave on
    real input. The probe passes the planted graph; the authentication code does not."""
    import logging

    from dphub.notes import Note

    note = [Note("n1", "Call John Smith at home.")]
    t = Tagger.load(tiny_tagger_dir)
    ref = t.token_scores(note, batch_size=1)
    path = t.use_runtime("onnx", threads=1).path
    _john_graph(t, path)
    _forge_meta(path.parent, "onnx", path)
    runtime._LOADED.clear()
    fresh = Tagger.load(tiny_tagger_dir)
    with caplog.at_level(logging.WARNING, logger="dphub.runtime"):
        status = fresh.use_runtime("onnx", threads=1)
    assert status.status == "rebuilt"
    assert [r.getMessage() for r in caplog.records if str(path) in r.getMessage()], \
        "the rebuilt path is named in a log line"
    assert "John" not in caplog.text
    got = fresh.token_scores(note, batch_size=1)
    assert np.allclose(ref[0].phi_prob, got[0].phi_prob, atol=1e-4)
    assert runtime.file_mac(runtime.cache_key(), path.parent.name, "onnx",
                            path.read_bytes()) == json.loads(
        (path.parent / "meta.json").read_text())["macs"]["onnx"]


def test_an_int8_graph_is_never_quantized_from_a_planted_fp32_graph(
        tiny_tagger_dir: Path, cache: Path) -> None:
    t = Tagger.load(tiny_tagger_dir)
    fp32 = t.use_runtime("onnx", threads=1).path
    planted = _john_graph(t, fp32)
    _forge_meta(fp32.parent, "onnx", fp32)
    runtime._LOADED.clear()
    assert Tagger.load(tiny_tagger_dir).use_runtime("onnx-int8", threads=1).status == "built"
    assert fp32.read_bytes() != planted, "the fp32 graph was exported again before quantizing"


def test_a_cache_copied_from_elsewhere_is_rebuilt(tiny_tagger_dir: Path, cache: Path,
                                                  tmp_path: Path) -> None:
    """The key lives in the dphub home, not in the cache: a cache made under another key (another
    user, another machine) verifies nothing and is rebuilt; the key file is private."""
    Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1)
    key = runtime.cache_key_path()
    assert key.parent == tmp_path / "home" and (key.stat().st_mode & 0o777) == 0o600
    assert not any(p.name == key.name for p in cache.parent.rglob("*"))
    key.unlink()
    runtime._LOADED.clear()
    assert Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1).status == "rebuilt"
    key.chmod(0o644)
    runtime._LOADED.clear()
    with pytest.raises(ModelError, match="not a private key file"):
        Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1)


def test_a_cache_directory_of_another_user_or_writable_by_others_is_refused(
        tiny_tagger_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import os

    t = Tagger.load(tiny_tagger_dir)
    d = t.use_runtime("onnx", threads=1).path.parent
    runtime._LOADED.clear()
    if os.geteuid() == 0:
        os.chown(d, 4242, -1)
    else:  # not root: the directory cannot be given away; the owner check sees another user
        real = os.geteuid()
        monkeypatch.setattr(runtime.os, "geteuid", lambda: real + 1)
    with pytest.raises(ModelError, match="belongs to another user") as err:
        Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1)
    assert err.value.exit_code == 2 and str(d) in err.value.message
    monkeypatch.undo()
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(cache.parent))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))
    if os.geteuid() == 0:
        os.chown(d, 0, -1)
    runtime._LOADED.clear()
    assert Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1).status == "cached"
    cache.parent.chmod(0o777)  # the cache root, writable by everyone
    runtime._LOADED.clear()
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "-e", str(m)]) in (0, None)
    capsys.readouterr()
    assert main(["ensemble", "runtime", "onnx", "-e", str(m)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith("error: ONNX cache directory") and "writable by other" in err_text
    assert len(err_text.strip().splitlines()) == 1


def test_a_build_that_fails_the_probe_is_refused(tiny_tagger_dir: Path, cache: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_probe_ok", lambda *a: False)
    with pytest.raises(ModelError, match="does not reproduce"):
        Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1)


def test_runtime_round_trip_through_the_manifest(tiny_tagger_dir: Path, cache: Path,
                                                 tmp_path: Path, notes: list,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "-e", str(m)]) in (0, None)
    assert main(["ensemble", "runtime", "-e", str(m)]) in (0, None)
    # none stored: auto, with what it means on this machine (issue 55)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("auto (torch")
    assert not cache.exists()
    assert main(["ensemble", "runtime", "onnx-int8", "-e", str(m)]) in (0, None)
    assert tomllib.loads(m.read_text())["runtime"] == "onnx-int8"
    # the graph is built when the runtime is chosen, not at the first run
    assert [p.name for p in cache.glob("*/encoder-int8.onnx")] == ["encoder-int8.onnx"]
    assert "1 encoder ready" in capsys.readouterr().out
    shutil.rmtree(cache)  # a member added later gets its graph at `ensemble add` time
    runtime._LOADED.clear()
    other = shutil.copytree(tiny_tagger_dir, tmp_path / "other")
    assert main(["ensemble", "add", str(other), "-e", str(m)]) in (0, None)
    assert [p.name for p in cache.glob("*/encoder-int8.onnx")] == ["encoder-int8.onnx"]
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(m)
    assert manifest.runtime == "onnx-int8"
    assert build_ensemble(manifest).runtime == "onnx-int8"
    assert build_ensemble(manifest, runtime="torch").runtime == "torch"  # the flag wins
    capsys.readouterr()
    assert main(["ensemble", "runtime", "fast", "-e", str(m)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err
    # a run with --runtime onnx writes what the torch run writes (decoded tags are identical)
    src = tmp_path / "in"
    src.mkdir()
    for i, n in enumerate(notes):
        (src / f"n{i}.txt").write_text(n.text, encoding="utf-8")
    outs = {}
    for rt in ("torch", "onnx"):
        out = tmp_path / f"out-{rt}"
        code = main(["ensemble", "deid", str(src), "--out", str(out), "-e", str(m),
                     "--runtime", rt, "--threads", "1"])
        assert code in (0, None)
        outs[rt] = {p.name: p.read_bytes() for p in sorted(out.glob("*.txt"))}
        assert json.loads((out / ".dphub-run" / "run.json").read_text())["settings"][
            "ensemble"].get("runtime", "torch") == rt
    assert outs["torch"] == outs["onnx"]


def test_bf16_runtime_is_close_to_fp32_and_shares_by_runtime(
        tiny_tagger_dir: Path, notes: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch-bf16 runs the encoder in bfloat16 (its scores differ from fp32's, slightly) and is
    part of the encoder key, so fp32 and bf16 members never share encoder outputs."""
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)
    ref_tagger = Tagger.load(tiny_tagger_dir)
    ref = ref_tagger.token_scores(notes, batch_size=4)
    fast = Tagger.load(tiny_tagger_dir)
    assert fast.use_runtime("torch-bf16") is None
    assert fast.encoder_key[-1] == "torch-bf16" != ref_tagger.encoder_key[-1]
    got = fast.token_scores(notes, batch_size=4)
    diffs = [float(np.abs(x.phi_prob - y.phi_prob).max()) for x, y in zip(ref, got, strict=True)]
    assert max(diffs) < 0.05
    assert max(diffs) > 0  # bfloat16 really ran: fp32 would be bit-identical
    enc = fast.encode(notes, batch_size=4)
    assert all(h.dtype == torch.float32 for h in enc.hidden)  # heads get fp32 hidden states


def test_bf16_runtime_refused_without_native_support(
        tiny_tagger_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: False)
    tagger = Tagger.load(tiny_tagger_dir)
    with pytest.raises(ConfigError, match="native bfloat16") as err:
        tagger.use_runtime("torch-bf16")
    assert "torch or onnx-int8" in err.value.message and tagger.runtime == "torch"


def test_bf16_runtime_from_the_cli(tiny_tagger_dir: Path, tmp_path: Path, notes: list,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "-e", str(m)]) in (0, None)
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: False)
    capsys.readouterr()
    assert main(["ensemble", "runtime", "torch-bf16", "-e", str(m)]) == 2  # refused up front
    assert "native bfloat16" in capsys.readouterr().err
    assert "runtime" not in tomllib.loads(m.read_text())
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)
    assert main(["ensemble", "runtime", "torch-bf16", "-e", str(m)]) in (0, None)
    assert tomllib.loads(m.read_text())["runtime"] == "torch-bf16"
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text(notes[0].text, encoding="utf-8")
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: False)  # another machine
    capsys.readouterr()
    assert main(["ensemble", "deid", str(src), "--out", str(tmp_path / "no"), "-e", str(m)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "native bfloat16" in err and "Traceback" not in err
    assert not (tmp_path / "no").exists()
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "-e", str(m),
                 "--threads", "1"]) in (0, None)
    assert json.loads((out / ".dphub-run" / "run.json").read_text())["settings"][
        "ensemble"]["runtime"] == "torch-bf16"
