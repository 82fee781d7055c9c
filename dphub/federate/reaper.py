"""A watchdog that ends the simulation's processes (Ray's) once the process that started them dies.

``kill -9`` of ``dphub federate simulate`` gives Flower no chance to shut Ray down, and Ray's
raylet, GCS and agents outlive their driver. :func:`start` runs this module as a separate
process in its own session (so a signal to the caller's process group does not end it first);
it watches the parent, remembers the parent's descendants every ``POLL`` seconds (they are
reparented when it dies, so they must be known before), and when the parent is gone it
terminates them (SIGTERM, then SIGKILL) and exits. It also exits, reaping leftovers, when the
parent ends normally. psutil guards against a reused pid (it checks each process's start time).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil

POLL = 0.5
GRACE = 5.0


def _tree(procs: list[psutil.Process]) -> dict[int, psutil.Process]:
    """``procs`` and all their living descendants, by pid (never this watchdog)."""
    out: dict[int, psutil.Process] = {}
    for p in procs:
        try:
            for q in [p, *p.children(recursive=True)]:
                if q.pid != os.getpid():
                    out[q.pid] = q
        except psutil.Error:
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(parent_pid: int) -> int:
    """Wait for ``parent_pid`` to end, then end every process it had started; how many."""
    try:
        parent = psutil.Process(parent_pid)
    except psutil.Error:
        return 0
    known: dict[int, psutil.Process] = {}
    while _alive(parent):
        try:
            kids = parent.children(recursive=True)
        except psutil.Error:
            break
        known.update({pid: p for pid, p in _tree(kids).items() if pid not in known})
        known = {pid: p for pid, p in known.items() if _alive(p)}
        time.sleep(POLL)
    left = [p for p in _tree(list(known.values())).values() if _alive(p)]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=GRACE)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(left)


def start() -> subprocess.Popen[bytes]:
    """This module as a watchdog of the calling process."""
    return subprocess.Popen([sys.executable, "-m", "dphub.federate.reaper", str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


if __name__ == "__main__":  # pragma: no cover - run by start() in its own process
    watch(int(sys.argv[1]))
