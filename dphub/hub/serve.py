"""Serve a local hub over the Hugging Face protocol with olah (offline mirror mode).

olah looks local git repos up as ``<mirrors-path>/<repo_type>/<org>/<repo>``, which is the local
hub layout (``<hub>/models/<org>/<name>``, bare repos). ``offline = true`` keeps it from ever
contacting huggingface.co; its download cache and logs go to a scratch directory. olah reads the
repositories with GitPython, i.e. with git: it runs under the same git environment as the local
backend (:func:`dphub.hub.local.git_env`), so nothing a hub repository configures can run.

olah may run from its own environment: ``$DPHUB_OLAH_PYTHON`` names that environment's Python
(olah pins fastapi >= 0.141, which Flower 1.42, the ``federate`` extra, refuses, so the project's
environment keeps Flower and ``scripts/setup.sh`` gives olah ``./.venv-olah``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from dphub.errors import HubError
from dphub.hub.local import git_env, git_executable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_olah_config(hub_dir: Path, workdir: Path, port: int, host: str = "127.0.0.1") -> Path:
    """An olah TOML config serving ``hub_dir`` read-only and offline."""
    import tomli_w

    workdir.mkdir(parents=True, exist_ok=True)
    cfg = {
        "basic": {
            "host": host, "port": port, "repos-path": str(workdir / "cache"),
            "mirror-netloc": f"{host}:{port}", "mirror-lfs-netloc": f"{host}:{port}",
            "mirrors-path": [str(Path(hub_dir).resolve())],
        },
        "accessibility": {"offline": True},
    }
    path = workdir / "olah.toml"
    path.write_text(tomli_w.dumps(cfg), encoding="utf-8")
    return path


#: the Python of an environment with olah installed (default: this one)
OLAH_PYTHON_ENV = "DPHUB_OLAH_PYTHON"


def olah_python() -> str:
    """The Python that runs olah: ``$DPHUB_OLAH_PYTHON`` if set, else this one."""
    py = os.environ.get(OLAH_PYTHON_ENV)
    if not py:
        return sys.executable
    if not (Path(py).is_file() and os.access(py, os.X_OK)):
        raise HubError(f"${OLAH_PYTHON_ENV} is not an executable Python: {py}")
    return py


def has_olah() -> bool:
    """Whether :func:`olah_python` can import olah."""
    py = olah_python()
    if py == sys.executable:
        return importlib.util.find_spec("olah") is not None
    return subprocess.run([py, "-c", "import olah"], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=120).returncode == 0


def olah_command(config: Path, workdir: Path) -> list[str]:
    return [olah_python(), "-m", "olah.server", "--config", str(config),
            "--log-path", str(workdir / "logs")]


def start_olah(hub_dir: Path, workdir: Path, port: int | None = None,
               host: str = "127.0.0.1", timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Start olah in the background; return (process, base URL) once it answers."""
    if not has_olah():
        raise HubError("`dphub hub serve` needs olah: pip install 'dphub[serve]', or olah in "
                       f"its own environment named by ${OLAH_PYTHON_ENV}") from None
    if not (Path(hub_dir) / "models").is_dir():
        raise HubError(f"{hub_dir} is not a dphub hub (no models/ directory)")
    port = port or free_port(host)
    config = write_olah_config(Path(hub_dir), workdir, port, host)
    log = open(workdir / "olah.out", "wb")  # noqa: SIM115 - lives as long as the process

    # PATH names no directory (see git_env), so GitPython is given git's absolute path
    env = git_env(GIT_PYTHON_GIT_EXECUTABLE=git_executable())
    proc = subprocess.Popen(olah_command(config, workdir), stdout=log, stderr=subprocess.STDOUT,
                            cwd=workdir, env=env)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HubError(f"olah exited with code {proc.returncode}; see {workdir / 'olah.out'}")
        try:
            with urllib.request.urlopen(url + "/", timeout=2):
                return proc, url
        except urllib.error.HTTPError:
            return proc, url  # any HTTP answer means it is up
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    stop_olah(proc)
    raise HubError(f"olah did not answer on {url} within {timeout:g}s")


def stop_olah(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
