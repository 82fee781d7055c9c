"""The Ray engine writes what the single-process run writes, resumes like it, and fails like it.

One local Ray runtime for the module (2 CPUs, no dashboard); the ensemble is a tiny random tagger
plus the rule member, so scores are real floats that must survive the trip through Ray exactly.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dphub.cli.main import main
from dphub.ensemble.manifest import Manifest
from dphub.ray_engine import EnsembleRecipe
from dphub.runner import EXIT_SOME_FAILED, RUN_DIR, run_deid
from dphub.synth import iter_notes

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Data's own settings


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[Any]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers get _KillOnce
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and RUN_DIR not in p.parts}


def _notes(root: Path, n: int, *, broken: bool = False) -> Path:
    for i, note in enumerate(iter_notes(n, seed=3)):
        d = root / f"p{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"n{i:03d}.txt").write_text(note.text, encoding="utf-8")
    if broken:  # one undecodable file: it fails alone, the run exits 3
        (root / "p0" / "broken.txt").write_bytes(b"DR. X \xff\xfe ON 10/12/2003")
    return root


def _manifest(tmp_path: Path, tagger: Path) -> Path:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(tagger), "--threshold", "0.4", "--ensemble", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    return m


def test_engine_options_are_checked_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs before the module's runtime starts: an --address that does not answer is one error
    line at once (Ray itself would retry for minutes)."""
    src = _notes(tmp_path / "in", 1)
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    base = ["ensemble", "deid", str(src), "--out", str(tmp_path / "out"), "--ensemble", str(m)]
    capsys.readouterr()
    assert main([*base, "--engine", "spark"]) == 2
    assert main([*base, "--address", "127.0.0.1:1"]) == 2  # needs --engine ray
    assert not ray.is_initialized()
    assert main([*base, "--engine", "ray", "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "unknown --engine" in err and "needs --engine ray" in err
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_ray_output_equals_single_process_and_a_bad_note_exits_3(
        ray_runtime: Any, tiny_tagger_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    src = _notes(tmp_path / "in", 14, broken=True)
    m = _manifest(tmp_path, tiny_tagger_dir)
    common = ["--mode", "spans", "--batch-size", "3", "--ensemble", str(m)]
    assert main(["ensemble", "deid", str(src), "--out", str(tmp_path / "local"),
                 *common]) == EXIT_SOME_FAILED
    capsys.readouterr()
    assert main(["ensemble", "deid", str(src), "--out", str(tmp_path / "ray"), *common,
                 "--engine", "ray", "--ray-workers", "2", "--threads", "1"]) == EXIT_SOME_FAILED
    captured = capsys.readouterr()
    assert "p0/broken.txt" in captured.err and "\\xff" not in captured.err
    local, distributed = _tree(tmp_path / "local"), _tree(tmp_path / "ray")
    assert len(local) == 15 and local == distributed  # 14 notes + audit.jsonl, same bytes
    assert '"score"' in local["audit.jsonl"].decode()
    # the one-model command too
    top = ["deid", str(src), "--model", str(tiny_tagger_dir), "--threshold", "0.4", "--mode", "tag"]
    assert main([*top, "--out", str(tmp_path / "top-local")]) == EXIT_SOME_FAILED
    assert main([*top, "--out", str(tmp_path / "top-ray"), "--engine", "ray",
                 "--ray-workers", "1"]) == EXIT_SOME_FAILED
    assert _tree(tmp_path / "top-local") == _tree(tmp_path / "top-ray")


class _Stop(Exception):
    """Stands in for a driver killed midway."""


class _DieOnce:
    """An ensemble whose worker process dies (os._exit) on its first batch while ``marker``
    exists: a worker killed mid-batch."""

    def __init__(self, ensemble: Any, marker: str) -> None:
        self.ensemble, self.marker = ensemble, marker

    def deid(self, notes: Any) -> Any:
        try:
            os.unlink(self.marker)
        except FileNotFoundError:
            return self.ensemble.deid(notes)
        os._exit(1)


@dataclass
class _KillOnce(EnsembleRecipe):
    marker: str = ""

    def build(self) -> Any:
        return _DieOnce(super().build(), self.marker)


def test_ray_run_stopped_midway_and_resumed_with_a_killed_worker_equals_a_whole_run(
        ray_runtime: Any, tiny_tagger_dir: Path, tmp_path: Path) -> None:
    from dphub.ray_engine import RayOptions, ray_engine, recipe_from_manifest

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": n.id, "text": n.text}) + "\n"
                           for n in iter_notes(16, seed=4)), encoding="utf-8")
    manifest = Manifest.load(_manifest(tmp_path, tiny_tagger_dir))
    recipe = recipe_from_manifest(manifest, owner_model=None, aggregate_rule=None, batch_size=4,
                                  int8=False)
    ensemble = recipe.build()
    whole = run_deid(src, tmp_path / "whole", ensemble, mode="tag", batch_size=4)
    assert whole.exit_code == 0

    def stop_after_8(done: int, total: int) -> None:
        if done >= 8:
            raise _Stop

    engine = ray_engine(recipe, RayOptions(workers=1, window=2))
    out = tmp_path / "stopped"
    with pytest.raises(_Stop):
        run_deid(src, out, ensemble, mode="tag", batch_size=4, engine=engine,
                 progress=stop_after_8)
    journal = (out / RUN_DIR / "journal.jsonl").read_text().splitlines()
    assert 8 <= len(journal) < 16  # some notes done, not all
    # the resumed run loses a worker mid-batch: Ray restarts it and retries the batch
    marker = tmp_path / "kill-a-worker"
    marker.write_text("")
    killing = ray_engine(_KillOnce(recipe.members, recipe.aggregate, None, 4, False, None,
                                   str(marker)), RayOptions(workers=1))
    rep = run_deid(src, out, ensemble, mode="tag", batch_size=4, engine=killing, resume=True)
    assert not marker.exists()  # a worker did die
    assert rep.exit_code == 0 and rep.skipped == len(journal) and rep.done == 16 - len(journal)
    assert _tree(out) == _tree(tmp_path / "whole")
    assert json.loads((out / RUN_DIR / "run.json").read_text())["status"] == "complete"
