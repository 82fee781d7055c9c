"""Flower's SuperLink on a Unix socket that only the server's user can open (issue 53).

Flower 1.42's ``flower-superlink`` serves every API (Fleet, Control, Runtime) from one uvicorn
server on ``--host``/``--port``; it has no option for a Unix socket, and its Control API has no
account authentication. On TCP loopback, *any* local user of the server machine could connect
and act as the operator (register nodes, submit runs) behind the gate's back.

So ``dphub federate superlink`` starts Flower's own ``flower-superlink`` entry point through
this module (``python -m dphub.federate.unix_superlink --uds PATH -- FLOWER-ARGS``), which
hands uvicorn ``uds=PATH`` in place of ``host``/``port``. Everything else is Flower's: its
argument parsing, checks, lifespan, TLS. PATH lies in a directory the server's user made 0700
(:func:`dphub.federate.superlink.socket_dir`): the kernel refuses ``connect`` to another uid
before a byte is exchanged (uvicorn makes the socket itself 0666; the directory is the lock).

Fail-closed: the ``--port`` Flower is given is held bound by the parent (without
``SO_REUSEADDR``), so a future Flower that bound TCP some other way would fail to start
instead of listening on loopback; and a second ``uvicorn.run`` is refused.
"""

from __future__ import annotations

import sys
from typing import Any

USAGE = "usage: python -m dphub.federate.unix_superlink --uds PATH -- FLOWER-SUPERLINK-ARGS"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] != "--uds" or args[2] != "--":
        sys.exit(USAGE)
    path, flower_args = args[1], args[3:]

    import uvicorn  # comes with Flower
    from flwr.superlink.cli import flower_superlink

    real_run = uvicorn.run
    calls: list[str] = []

    def run_on_socket(*a: Any, **kw: Any) -> None:
        if calls:
            raise RuntimeError("dphub: Flower started a second HTTP server; refusing")
        calls.append(path)
        kw.pop("host", None)
        kw.pop("port", None)
        kw.pop("fd", None)
        real_run(*a, uds=path, **kw)

    uvicorn.run = run_on_socket
    sys.argv = ["flower-superlink", *flower_args]
    flower_superlink()


if __name__ == "__main__":
    main()
