"""Smoke tests of the end-to-end examples: the CLI demo, the framework reproduction and the
privacy/utility sweep, each run tiny in a subprocess (the way users run them).

Tiny means: the ``tiny_base_model`` (random 2-layer BERT with the MiniLM tokenizer), a handful of
synthetic notes, one epoch, no public warm start. Publishing checks the model's tokenizer against
its public base model, so the tiny base is also laid out as an offline Hugging Face cache entry
named like its directory (``tiny-bert``), which is how a custom public base model resolves without
network. Everything each script writes (hub, registry, warm-start cache) stays in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dphub import formats, synth

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SNAPSHOT = "0" * 40


@pytest.fixture(scope="module")
def env(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Subprocess environment: offline HF cache holding the tiny base, isolated dphub dirs."""
    root = tmp_path_factory.mktemp("examples-env")
    repo = root / "hf-cache" / f"models--{tiny_base_model.name}"
    shutil.copytree(tiny_base_model, repo / "snapshots" / SNAPSHOT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    e = dict(os.environ)
    e.update({
        "HF_HUB_CACHE": str(root / "hf-cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DPHUB_HOME": str(root / "home"),
        "DPHUB_HUB": str(root / "hub"),
        "DPHUB_CACHE_DIR": str(root / "cache"),
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        # the demo calls `dphub`: the console script of the interpreter running the tests
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    })
    return e


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PhysioNet-format corpus: 16 synthetic patients, 2 notes each, ids ``P-N``."""
    notes = synth.generate(32, kind="nursing", seed=5, patients=16)
    patient_no: dict[str, int] = {}
    note_no: dict[int, int] = {}
    out = []
    for n in notes:
        p = patient_no.setdefault(n.patient_id, len(patient_no) + 1)
        note_no[p] = note_no.get(p, 0) + 1
        out.append(replace(n, id=f"{p}-{note_no[p]}", patient_id=str(p), metadata={}))
    d = tmp_path_factory.mktemp("physionet-corpus")
    assert formats.write(out, d, "physionet") == 32
    return d


def _phi_strings(corpus: Path) -> list[str]:
    """Gold PHI strings of the corpus long enough to be unambiguous (for leak checks)."""
    return sorted({n.text[s.start:s.end] for n in formats.read(corpus)
                   for s in n.spans if s.end - s.start >= 8 and not n.text[s.start:s.end].isdigit()})


def _run(args: list[str], env: dict[str, str], cwd: Path,
         timeout: int = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_demo_runs_tiny_end_to_end(env: dict[str, str], tiny_base_model: Path,
                                   tmp_path: Path) -> None:
    demo_env = {**env, "DEMO_NOTES": "24", "DEMO_PATIENTS": "8", "DEMO_EPOCHS": "1",
                "DEMO_WARM_START": "none", "DEMO_BASE_MODEL": str(tiny_base_model)}
    proc = _run(["bash", str(EXAMPLES / "demo.sh"), "out"], demo_env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # every stage ran, in order
    stages = [line.split("] ", 1)[1][:2] for line in out.splitlines() if line.startswith("== [")]
    assert stages[:9] == [f"{i}." for i in range(1, 10)], stages
    assert "published demo/site-a@" in out and "published demo/site-b@" in out
    # issue 29: the public student publishes at its teacher's ε (post-processing)
    assert "public student of local-teacher-1@" in out and "published demo/site-a-student@" in out
    assert "pulled demo/site-a@" in out and "pulled demo/site-b@" in out
    # the evaluation tables: Scenario A without, Scenario B with the owner's model
    a, b = out.split("Scenario A (pulled")[1].split("Scenario B (pulled")
    for table in (a, b):
        assert "ensemble (any)" in table and "rules:default" in table and "demo/site-a" in table
        assert "phrase R" in table
    assert "owner:owner" in b and "owner:owner" not in a
    # an equal ensemble row is explained, a different one quantified (issue 31 item 24)
    assert ("Scenario B's ensemble row equals Scenario A's" in b
            or "The owner's model changes the ensemble: recall" in b)
    # issue 36 item 4: the inverse rule next to any, each with its non-PHI kept share
    recall_first = out.split("Recall first (")[1]
    assert "\n  any " in recall_first and "\n  inverse " in recall_first
    assert recall_first.count("non-PHI words kept") == 2
    assert "kept" in a.splitlines()[1]  # the tables' kept column
    assert json.loads((tmp_path / "out" / "eval-inv.json").read_text())[-1]["name"].startswith(
        "ensemble (inverse")
    assert "outputs under" in out

    root = tmp_path / "out"
    tagged = (root / "deid-a" / "owner-test.jsonl").read_text(encoding="utf-8")
    assert "[**" in tagged
    assert (root / "deid-b" / "audit.jsonl").is_file()
    # isolated: hub and registry inside the demo directory, manifest pinned to pulled revisions
    assert (root / "hub" / "models" / "demo" / "site-a").is_dir()
    assert (root / "home" / "registry.json").is_file()
    manifest = (root / "dphub-ensemble.toml").read_text(encoding="utf-8")
    assert manifest.count('kind = "registry"') == 2 and "revision = " in manifest
    assert not Path(env["DPHUB_HUB"]).exists()  # the caller's hub was never touched


def test_scripts_demo_refuses_a_non_empty_output_dir_before_the_set_up(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 31 item 24: a rerun spent 32 s on set-up before saying demo-out exists."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "demo.sh", repo / "scripts" / "demo.sh")
    (repo / "scripts" / "setup.sh").write_text("touch \"$(dirname \"$0\")/SETUP_RAN\"; exit 1\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    proc = _run(["bash", str(repo / "scripts" / "demo.sh"), "out"], env, tmp_path, timeout=60)
    assert proc.returncode == 2 and "exists and is not empty" in proc.stderr
    assert not (repo / "scripts" / "SETUP_RAN").exists()


def test_demo_refuses_a_non_empty_output_dir(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    proc = _run(["bash", str(EXAMPLES / "demo.sh"), "out"], env, tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "exists and is not empty" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]


@pytest.mark.slow
def test_reproduce_framework_quick_writes_tables_and_resumes(
    env: dict[str, str], tiny_base_model: Path, corpus: Path, tmp_path: Path
) -> None:
    cmd = [sys.executable, str(EXAMPLES / "reproduce_framework.py"), str(corpus), "--out",
           "results", "--quick", "--base-model", str(tiny_base_model)]
    proc = _run(cmd, env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = tmp_path / "results"
    md = (res / "tables.md").read_text(encoding="utf-8")
    data = json.loads((res / "tables.json").read_text(encoding="utf-8"))
    assert "Table 5.1" in md and "Table 5.2" in md and "Wall times" in md

    # the split: three sites and the owner's two halves cover every patient exactly once
    parts = data["splits"]
    assert sum(parts[k]["patients"] for k in ("site-1", "site-2", "site-3", "owner-train",
                                              "owner-test")) == 16
    assert sum(parts[k]["notes"] for k in parts if k != "community") == 32
    # every model is patient-level DP at ε <= 8
    dp_models = {"site-1", "site-2", "site-3", "community", "owner", "owner-ft", "student-dp"}
    local = {"student", "student-r2", "student-soft", "student-q3", "owner-local",
             "owner-local-ft"}  # no DP
    assert set(data["models"]) == dp_models | local
    for name in dp_models:
        m = data["models"][name]
        assert m["unit"] == "patient" and 0 < m["epsilon"] <= 8.0
    assert all(data["models"][name]["epsilon"] is None for name in local)
    rows_owner = {r["name"]: r for r in data["rows"] if r["table"] in ("A+", "B local")}
    assert {"student", "student + rules (any)", "owner-local", "owner-local + rules (any)",
            "owner-local-ft"} <= set(rows_owner)
    assert rows_owner["student + rules (any)"]["epsilon"] is None  # a local member: no ε
    # the owner's model and the rules count alone under the quorum: nothing of theirs is lost
    q = rows_owner["sites (3 of 3) + owner-local + rules"]
    assert q["aggregation"] == "k-of-n:3+owner-local+rules:default"
    assert q["recall"] >= rows_owner["owner-local + rules (any)"]["recall"] - 1e-9
    assert "## Scenario A+" in md and "## Scenario B local" in md
    assert data["models"]["owner-ft"]["init_from"].startswith("site-1/deid-tagger@")

    rows_a = {r["name"]: r for r in data["rows"] if r["table"] == "A"}
    assert {"site-1", "site-2", "site-3", "community", "rules:default", "ensemble (any)",
            "ensemble (any) + rules", "sites (any) + rules"} <= set(rows_a)
    # the union cannot recall less than any of its members
    ens = rows_a["ensemble (any) + rules"]
    assert all(ens["recall"] >= rows_a[n]["recall"] - 1e-9 for n in ("site-1", "rules:default"))
    assert rows_a["rules:default"]["epsilon"] == 0.0
    q_a = rows_a["sites (3 of 3) + rules"]
    assert q_a["aggregation"] == "k-of-n:3+rules:default"
    r_rules, r_any = rows_a["rules:default"]["recall"], rows_a["sites (any) + rules"]["recall"]
    assert r_rules - 1e-9 <= q_a["recall"] <= r_any + 1e-9
    rows_b = [r for r in data["rows"] if r["table"] == "B"]
    calibrated = [r for r in rows_b if r["aggregation"] == "calibrated"]
    targets = data["settings"]["target_recalls"]
    assert targets == [0.9, 0.95, 0.99]
    assert len(calibrated) == 4 * len(targets) and all(r["thresholds"] for r in calibrated)
    assert {r["target_recall"] for r in calibrated} == set(targets)
    assert {r["name"] for r in rows_b if r["kind"] == "member"} == {"owner", "owner-ft"}
    for r in data["rows"]:
        assert 0.0 <= r["precision"] <= 1.0 and 0.0 <= r["f1"] <= 1.0

    # tables hold numbers, never note text or local paths
    for text in (md, json.dumps(data)):
        assert str(tmp_path) not in text and str(tiny_base_model.parent) not in text
        leaked = [s for s in _phi_strings(corpus) if s in text]
        assert not leaked

    # resumable: a second run trains nothing and reproduces the same scores from the cache
    again = _run(cmd, env, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ": training" not in again.stderr and again.stderr.count("trained earlier") == len(data["models"])
    data2 = json.loads((res / "tables.json").read_text(encoding="utf-8"))
    assert data2["rows"] == data["rows"]


@pytest.mark.slow
def test_privacy_utility_quick_writes_table_and_plot(
    env: dict[str, str], tiny_base_model: Path, corpus: Path, tmp_path: Path
) -> None:
    proc = _run([sys.executable, str(EXAMPLES / "privacy_utility.py"), str(corpus), "--out",
                 "docs", "--quick", "--base-model", str(tiny_base_model)], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = tmp_path / "docs"
    png = (docs / "privacy_utility.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    md = (docs / "privacy_utility.md").read_text(encoding="utf-8")
    lines = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| σ")]
    sigmas = [ln.split("|")[1].strip() for ln in lines if not ln.startswith("| :--")]
    # the thesis's noise levels plus the two that reach patient-level ε ≈ 15 and ≈ 8
    assert sigmas == ["0.4", "0.55", "0.8", "1.2", "2", "3.4", "– (no DP)"]
    assert "| ∞ |" in md
    rows = json.loads((docs / "privacy_utility.json").read_text(encoding="utf-8"))["rows"]
    eps = [r["epsilon"] for r in rows if r["noise_multiplier"] is not None]
    assert eps == sorted(eps, reverse=True) and all(e > 0 for e in eps)  # more noise, smaller ε
    assert rows[-1]["epsilon"] is None and rows[-1]["unit"] == "patient"
    assert str(tmp_path) not in md


def test_privacy_utility_rejects_bad_noise_list(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "privacy_utility.py"), str(tmp_path),
                           "--noises", "0.5,-1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--noises must be positive" in proc.stderr


def test_privacy_utility_rejects_bad_epsilon_list(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "privacy_utility.py"), str(tmp_path),
                           "--epsilons", "8,0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--epsilons must be positive" in proc.stderr
