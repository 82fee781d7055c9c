"""Issue 55: the runtime and device picked by default for the machine, and nothing heavy on the
deid path (Opacus is for training only).

The CPU's flags and PyTorch's CUDA view are mocked: the choice logic is tested for machines this
one is not. No test needs a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dphub import runtime, synth
from dphub.cli.main import main
from dphub.ensemble.core import pick_runtime
from dphub.ensemble.manifest import Manifest, MemberEntry
from dphub.errors import ConfigError
from dphub.tagger import Tagger

BF16 = frozenset({"fpu", "avx2", "avx512f", "avx512_bf16"})
AMX = frozenset({"fpu", "avx2", "avx512f", "amx_bf16", "amx_tile"})
AVX512_ONLY = frozenset({"fpu", "avx2", "avx512f", "avx512bw", "avx512_vnni"})
AVX2_ONLY = frozenset({"fpu", "avx2", "fma"})


@pytest.fixture
def torch_says_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's own check says yes (it does on every AVX-512 core, emulated or not)."""
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)


@pytest.mark.parametrize(("flags", "want"), [(BF16, "torch-bf16"), (AMX, "torch-bf16"),
                                             (AVX512_ONLY, "torch"), (AVX2_ONLY, "torch")])
def test_cpu_runtime_follows_the_native_bf16_flags(flags: frozenset[str], want: str,
                                                   torch_says_bf16: None) -> None:
    name, why = runtime.choose_runtime("cpu", flags=flags)
    assert name == want
    assert (why == "native bf16") == (want == "torch-bf16")


def test_cpu_without_pytorch_bf16_support_gets_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: False)
    assert runtime.choose_runtime("cpu", flags=BF16)[0] == "torch"


def test_without_cpuinfo_pytorch_decides(monkeypatch: pytest.MonkeyPatch,
                                         torch_says_bf16: None) -> None:
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="/proc/cpuinfo": None)
    assert runtime.choose_runtime("cpu")[0] == "torch-bf16"


def test_int8_is_never_the_automatic_choice(torch_says_bf16: None) -> None:
    """onnx-int8 lost recall beyond the bar (docs/speed.md): only a user's explicit choice."""
    for flags in (BF16, AMX, AVX512_ONLY, AVX2_ONLY, frozenset()):
        assert runtime.choose_runtime("cpu", flags=flags)[0] in ("torch", "torch-bf16")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\nbugs\t: none\n")
    assert runtime.cpu_flags(str(f)) == frozenset({"fpu", "avx2", "avx512_bf16"})
    assert runtime.cpu_flags(str(tmp_path / "missing")) is None


def test_gpu_runtime_follows_cuda_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert runtime.choose_runtime("cuda") == ("torch-bf16", "native bf16 on this GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert runtime.choose_runtime("cuda")[0] == "torch"


def test_device_defaults_to_cuda_when_pytorch_sees_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert runtime.choose_device(None) == "cuda"
    assert runtime.choose_device("auto") == "cuda"
    assert runtime.choose_device("cpu") == "cpu"
    assert runtime.choose_device("cuda:0") == "cuda:0"
    with pytest.raises(ConfigError, match="only 1 CUDA"):
        runtime.choose_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.choose_device(None) == "cpu"
    with pytest.raises(ConfigError, match="no CUDA GPU"):  # asked for, absent: not a silent CPU
        runtime.choose_device("cuda")
    for bad in ("tpu", "gpu!", "meta"):
        with pytest.raises(ConfigError, match="unknown device"):
            runtime.choose_device(bad)


def test_set_device_is_what_taggers_load_on(monkeypatch: pytest.MonkeyPatch,
                                            tiny_tagger_dir: Path) -> None:
    monkeypatch.setattr(runtime, "_DEVICE", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.inference_device() == "cuda"
    assert runtime.set_inference_device("cpu") == "cpu"
    assert runtime.inference_device() == "cpu"
    assert Tagger.load(tiny_tagger_dir).device.type == "cpu"


def test_a_tagger_wrapping_a_model_leaves_it_where_it_is(monkeypatch: pytest.MonkeyPatch,
                                                         tiny_tagger_dir: Path) -> None:
    """A server's or a training run's model handed to Tagger is not moved by the auto device."""
    monkeypatch.setattr(runtime, "_DEVICE", ["cuda"])  # would fail here if it were used
    t = Tagger.load(tiny_tagger_dir, device="cpu")
    assert Tagger(t.model, t.tokenizer).device.type == "cpu"


def test_onnx_runtimes_refused_off_the_cpu(tiny_tagger_dir: Path) -> None:
    t = Tagger.load(tiny_tagger_dir, device="cpu")
    t.device = torch.device("cuda")  # as a GPU tagger would be
    for rt in ("onnx", "onnx-int8"):
        with pytest.raises(ConfigError, match="runs on the CPU"):
            t.use_runtime(rt)


def _manifest(*kinds: str, runtime_name: str | None = None) -> Manifest:
    entries = [MemberEntry("rules:default", "rules") if k == "rules" else
               MemberEntry("m", "dir", path="/nowhere") for k in kinds]
    return Manifest(entries, "inverse", None, runtime_name)


def test_pick_runtime_flag_then_manifest_then_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    from dphub.ensemble import core

    monkeypatch.setattr(core, "choose_runtime", lambda device: ("torch-bf16", "native bf16"))
    assert pick_runtime(_manifest("model", "rules")) == ("torch-bf16", "native bf16")
    assert pick_runtime(_manifest("model"), "onnx") == ("onnx", None)
    assert pick_runtime(_manifest("model", runtime_name="onnx-int8")) == ("onnx-int8", None)
    assert pick_runtime(_manifest("model", runtime_name="onnx-int8"), "torch") == ("torch", None)
    assert pick_runtime(_manifest("model"), "auto") == ("torch-bf16", "native bf16")
    # nothing runs an encoder, or torch's own int8 was asked for: fp32 torch, nothing said
    assert pick_runtime(_manifest("rules")) == ("torch", None)
    assert pick_runtime(_manifest("model"), int8=True) == ("torch", None)
    assert pick_runtime(None, owner_model=True) == ("torch-bf16", "native bf16")
    with pytest.raises(ConfigError, match="unknown runtime"):
        pick_runtime(_manifest("model"), "fast")


@pytest.fixture
def note_dir(tmp_path: Path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    for i, n in enumerate(synth.generate(6, seed=5)):
        (src / f"n{i}.txt").write_text(n.text, encoding="utf-8")
    return src


def test_cli_says_the_automatic_runtime_once_and_the_flag_overrides(
        tiny_tagger_dir: Path, tmp_path: Path, note_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="/proc/cpuinfo": BF16)
    m = tmp_path / "ens.toml"
    for spec in (str(tiny_tagger_dir), "rules:default"):
        assert main(["ensemble", "add", spec, "-e", str(m)]) in (0, None)
    assert main(["ensemble", "aggregate", "inverse", "-e", str(m)]) in (0, None)
    capsys.readouterr()
    assert main(["ensemble", "runtime", "-e", str(m)]) in (0, None)
    assert capsys.readouterr().out.strip() == "auto (torch-bf16 here: native bf16)"
    outs = {}
    for rt in (None, "torch"):
        out = tmp_path / f"out-{rt}"
        extra = [] if rt is None else ["--runtime", rt]
        assert main(["ensemble", "deid", str(note_dir), "--out", str(out), "-e", str(m),
                     "--threads", "1", *extra]) in (0, None)
        err = capsys.readouterr().err
        said = [ln for ln in err.splitlines() if ln.startswith("runtime:")]
        assert said == ([] if rt else ["runtime: torch-bf16 (native bf16); --runtime overrides"])
        settings = json.loads((out / ".dphub-run" / "run.json").read_text())["settings"]
        assert settings["ensemble"].get("runtime", "torch") == (rt or "torch-bf16")
        outs[rt] = {p.name: p.read_text() for p in sorted(out.glob("*.txt"))}
    assert outs[None].keys() == outs["torch"].keys() and len(outs[None]) == 6
    # rules only: nothing to pick, nothing said, the settings a rules run always had
    r = tmp_path / "rules.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(r)]) in (0, None)
    capsys.readouterr()
    out = tmp_path / "out-rules"
    assert main(["ensemble", "deid", str(note_dir), "--out", str(out), "-e", str(r)]) in (0, None)
    assert "runtime:" not in capsys.readouterr().err
    assert "runtime" not in json.loads((out / ".dphub-run" / "run.json").read_text())[
        "settings"]["ensemble"]


def test_cli_device_refuses_a_missing_gpu_in_one_line(
        tmp_path: Path, note_dir: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    capsys.readouterr()
    code = main(["deid", str(note_dir), "--model", "rules:default", "--device", "cuda",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and "no CUDA GPU" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_bf16_decisions_match_fp32_on_synthetic_notes(tiny_tagger_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The automatic choice may change the runtime: torch-bf16's P(PHI) stays within the
    documented tolerance of fp32's (0.05), so every token farther than that from a threshold is
    flagged or kept alike, at the thresholds the recall-first rule reads and at 0.5. (The test
    model is untrained, its probabilities near uniform: its Viterbi paths are not compared.)"""
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)
    notes = synth.generate(12, seed=11)
    ref = Tagger.load(tiny_tagger_dir, device="cpu")
    fast = Tagger.load(tiny_tagger_dir, device="cpu")
    fast.use_runtime("torch-bf16")
    a, b = ref.token_scores(notes), fast.token_scores(notes)
    tol = 0.05
    checked = 0
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.offsets, y.offsets)
        assert float(np.abs(x.phi_prob - y.phi_prob).max()) < tol
        for t in (0.0005, 0.002, 0.005, 0.01, 0.5):
            clear = np.abs(x.phi_prob - t) > tol
            assert np.array_equal((x.phi_prob >= t)[clear], (y.phi_prob >= t)[clear])
            checked += int(clear.sum())
    assert checked > 0


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=300)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_deid_path_does_not_load_opacus(tiny_tagger_dir: Path) -> None:
    """Opacus (with SciPy, sympy, torch.distributed) was a third of `dphub deid`'s start-up."""
    mods = _modules_after(
        "import dphub.cli.main, dphub.cli.ensemble.deid, dphub.ensemble.core\n"
        "from dphub.tagger import Tagger\n"
        f"Tagger.load({str(tiny_tagger_dir)!r}, device='cpu')")
    assert "opacus" not in mods
    assert "dphub.tagger" in mods


def test_a_model_built_where_opacus_is_loaded_gets_the_crf_sampler(
        tiny_tagger_dir: Path) -> None:
    """Training still gets the exact CRF per-sample gradient (registered before the wrap)."""
    code = ("import opacus\nfrom torchcrf import CRF\n"
            "from opacus.grad_sample import GradSampleModule\n"
            "from dphub.tagger_model import TaggerModel\n"
            f"TaggerModel.load({str(tiny_tagger_dir)!r})\n"
            "assert CRF in GradSampleModule.GRAD_SAMPLERS, 'CRF sampler not registered'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_the_training_loop_registers_the_crf_sampler() -> None:
    """A model built before Opacus was loaded: the loop registers the sampler itself."""
    src = Path(__file__).resolve().parents[1] / "dphub" / "train" / "loop.py"
    text = src.read_text(encoding="utf-8")
    wrap = text.index("make_private(")
    assert 0 <= text.rfind("register_grad_sampler()", 0, wrap) < wrap


def test_timing_line_keeps_start_up_apart_from_the_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    from dphub.cli.ensemble import deid

    monkeypatch.setattr(deid, "process_age", lambda: 12.0)
    monkeypatch.setattr(deid.time, "monotonic", lambda: 1000.0)
    line = deid.timing_line(995.0, 1000.0, 50)  # the process started at 988, notes from 995
    assert line == "timing: start-up 7.0 s; 50 note(s) in 5.0 s (10.0 notes/s, 100 ms/note)"
    assert deid.process_age() is not None or not Path("/proc/self/stat").exists()


def test_cli_prints_the_timing_line_with_its_progress(
        tmp_path: Path, note_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DPHUB_PROGRESS", "plain")
    capsys.readouterr()
    assert main(["deid", str(note_dir), "--model", "rules:default",
                 "--out", str(tmp_path / "o")]) in (0, None)
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("timing:")]
    assert "start-up " in line and "6 note(s) in " in line and "notes/s" in line
    monkeypatch.setenv("DPHUB_PROGRESS", "off")
    assert main(["deid", str(note_dir), "--model", "rules:default",
                 "--out", str(tmp_path / "o2")]) in (0, None)
    assert "timing:" not in capsys.readouterr().err


def test_a_resume_where_auto_picks_otherwise_is_refused_not_mixed(
        tiny_tagger_dir: Path, tmp_path: Path, note_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run begun on a CPU without native bf16 (auto: torch), resumed on one with it (auto:
    torch-bf16): one error line, nothing rewritten; --runtime torch continues it."""
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "-e", str(m)]) in (0, None)
    out = tmp_path / "out"
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: False)
    assert main(["ensemble", "deid", str(note_dir), "--out", str(out), "-e", str(m)]) in (0, None)
    before = {p.name: p.read_bytes() for p in out.glob("*.txt")}
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="/proc/cpuinfo": BF16)
    capsys.readouterr()
    assert main(["ensemble", "deid", str(note_dir), "--out", str(out), "-e", str(m),
                 "--resume"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.glob("*.txt")} == before
    assert main(["ensemble", "deid", str(note_dir), "--out", str(out), "-e", str(m),
                 "--resume", "--runtime", "torch"]) in (0, None)


def test_top_level_deid_of_one_model_picks_and_says_the_runtime(
        tiny_tagger_dir: Path, tmp_path: Path, note_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runtime, "native_bf16", lambda kind: True)
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="/proc/cpuinfo": AMX)
    capsys.readouterr()
    out = tmp_path / "o"
    assert main(["deid", str(note_dir), "--model", str(tiny_tagger_dir), "--out", str(out),
                 "--threads", "1"]) in (0, None)
    assert "runtime: torch-bf16 (native bf16)" in capsys.readouterr().err
    assert json.loads((out / ".dphub-run" / "run.json").read_text())["settings"][
        "ensemble"]["runtime"] == "torch-bf16"
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="/proc/cpuinfo": AVX2_ONLY)
    out2 = tmp_path / "o2"
    assert main(["deid", str(note_dir), "--model", str(tiny_tagger_dir), "--out", str(out2),
                 "--threads", "1"]) in (0, None)
    assert "runtime: torch (no native bf16" in capsys.readouterr().err
    assert "runtime" not in json.loads((out2 / ".dphub-run" / "run.json").read_text())[
        "settings"]["ensemble"]


def test_torch_int8_refused_off_the_cpu(tiny_tagger_dir: Path) -> None:
    from dphub.ensemble.members import ModelMember

    member = ModelMember.load(tiny_tagger_dir)
    member.tagger.device = torch.device("cuda")  # as a GPU member would be
    with pytest.raises(ConfigError, match="runs on the CPU"):
        member.quantize_int8()
