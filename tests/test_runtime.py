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
from dphub.hub.common import file_sha256
from dphub.tagger import Tagger

pytest.importorskip("onnxruntime")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
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
    assert meta["encoder_digest"] == a.encoder_digest and set(meta["files"]) == {"onnx"}
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
    # 2. another encoder's graph with a forged meta.json: the probe batch catches it
    from conftest import make_tiny_base_model

    from dphub.tagger import TaggerModel

    other = TaggerModel.from_base(make_tiny_base_model(tmp_path / "other", seed=7)).eval()
    runtime.export_encoder(other.encoder, path)
    d = path.parent
    meta = json.loads((d / "meta.json").read_text())
    meta["files"]["onnx"] = file_sha256(path)
    (d / "meta.json").write_text(json.dumps(meta))
    runtime._LOADED.clear()
    assert Tagger.load(tiny_tagger_dir).use_runtime("onnx", threads=1).status == "rebuilt"


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
    assert capsys.readouterr().out.strip().splitlines()[-1] == "torch"
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
