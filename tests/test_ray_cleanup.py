"""Issue 31 #15: what a killed Ray run left behind is cleaned at the next start (no Ray needed).

``kill -9`` of a driver that had started a local Ray runtime left its ``dphub-ray-*`` directory
(which may hold spilled note text) and Ray's daemons running. The next local start removes the
directories of dead drivers and stops the processes that still run from them; a live driver's
directory, someone else's, and anything not named like dphub's are left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dphub import ray_engine
from dphub.ray_engine import PRIVATE_TMP_PREFIX, _clean_stale_runtimes

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_dead_drivers_directory_and_daemons_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f"{PRIVATE_TMP_PREFIX}{_dead_pid()}-abc123"
    (stale / "r" / "session_1" / "logs").mkdir(parents=True)
    (stale / "r" / "spilled").write_text("note text spilled by the object store")
    live = tmp_path / f"{PRIVATE_TMP_PREFIX}{os.getpid()}-def456"
    live.mkdir()
    other = tmp_path / "dphub-ray-notmine"
    other.mkdir()
    # stands in for a raylet left running: its arguments name the stale runtime's directory
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                               f"--session_dir={stale}/r/session_1"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                                  f"--session_dir={live}/r/session_1"])
    try:
        for p, d in ((daemon, stale), (bystander, live)):  # exec'd: its arguments are visible
            while str(d).encode() not in Path(f"/proc/{p.pid}/cmdline").read_bytes():
                time.sleep(0.05)
        t0 = time.monotonic()
        removed = _clean_stale_runtimes(str(tmp_path), grace=10)
        assert removed == [str(stale)]
        assert daemon.wait(timeout=10) is not None and time.monotonic() - t0 < 10
        assert not stale.exists() and live.is_dir() and other.is_dir()
        assert bystander.poll() is None  # a live driver's runtime is not touched
    finally:
        for p in (daemon, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_the_private_directory_carries_the_driver_pid(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The name is what lets a later start tell a dead driver's directory from a live one."""
    import re

    seen: list[str] = []
    real = ray_engine.tempfile.mkdtemp

    def mkdtemp(*args: object, prefix: str = "", **kwargs: object) -> str:
        seen.append(prefix)
        return real(*args, prefix=prefix, dir=str(tmp_path), **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ray_engine.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(ray_engine, "_clean_stale_runtimes", lambda *a, **k: [])

    class FakeRay:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(**kwargs: object) -> None:
            raise RuntimeError("stop here")

    monkeypatch.setattr(ray_engine, "_import_ray", lambda: FakeRay)
    with pytest.raises(ray_engine.ConfigError, match="cannot start a local Ray runtime"), \
            ray_engine.ray_session(ray_engine.RayOptions()):
        pass
    assert seen and re.fullmatch(rf"{PRIVATE_TMP_PREFIX}{os.getpid()}-", seen[0])
    assert not list(tmp_path.iterdir())  # removed again when Ray did not start


def test_rays_known_noise_is_dropped_from_stderr_and_the_rest_kept(
        capfd: pytest.CaptureFixture[str]) -> None:
    """A successful Ray run printed Ray's `E ... has constructor arguments in the object store`
    line (ray-project/ray#53727); the filter drops exactly those lines, passes a progress bar's
    unterminated "\\r" updates at once, and puts stderr back."""
    from dphub.ray_engine import _RAY_NOISE, _without_lines

    noise = (b"[2026-11-26 10:43:26,901 E 29174 29174] core_worker.cc:2465: Actor with class "
             b"name: 'MapWorker(MapBatches(DeidWorker))' and ID: '5eda' has constructor "
             b"arguments in the object store and max_restarts > 0. If the arguments ...\n")
    with _without_lines(_RAY_NOISE):
        os.write(2, b"before\n")
        os.write(2, noise)
        os.write(2, b"\rde-identifying: 1/2")  # (capfd's sys.stderr bypasses fd 2)
        os.write(2, b"[2026-11-26 10:43:27,000 E 1 1] other.cc:1: a real Ray error\n")
        os.write(2, noise[:40])  # one line in two writes
        os.write(2, noise[40:])
        os.write(2, b"after\n")
    os.write(2, b"restored\n")
    err = capfd.readouterr().err
    assert err == ("before\n\rde-identifying: 1/2[2026-11-26 10:43:27,000 E 1 1] other.cc:1: a "
                   "real Ray error\nafter\nrestored\n")
