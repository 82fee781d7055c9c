"""``dphub ensemble ...`` (manifest, deid, calibrate, evaluate, distill, train) and the
top-level ``dphub deid``.

Thin: parse options, call :mod:`dphub.ensemble` / :mod:`dphub.runner`, print. Exit codes: 0 ok,
2 a :class:`~dphub.errors.DphubError`, 3 when a run skipped notes that failed
(:data:`dphub.runner.EXIT_SOME_FAILED`).

One module per subcommand group; importing them, in this order, registers their commands on
:data:`ensemble_app` (the order ``dphub ensemble --help`` lists them in):

- :mod:`._common`: the sub-app, the options several groups share, output helpers;
- :mod:`.manifest`: ``add``, ``remove``, ``list``, ``show``, ``runtime``, ``aggregate``, ``undo``
  (the manifest);
- :mod:`.deid`: ``deid`` and the top-level ``dphub deid`` (directory runs, local or Ray);
- :mod:`.evaluate`: ``calibrate`` and ``evaluate`` (measured on labelled notes);
- :mod:`.owner`: ``distill`` and ``train`` (the owner's own models).
"""

from __future__ import annotations

import typer

# the order the commands are listed in (imported for their registrations, not sorted)
# isort: off
from dphub.cli.ensemble import manifest
from dphub.cli.ensemble import deid
from dphub.cli.ensemble import evaluate
from dphub.cli.ensemble import owner
# isort: on
from dphub.cli.ensemble._common import ensemble_app
from dphub.cli.ensemble.deid import DEFAULT_OUT_SUFFIX, default_out_dir, deid_cmd, deid_top_cmd

__all__ = ["DEFAULT_OUT_SUFFIX", "default_out_dir", "deid", "deid_cmd", "deid_top_cmd",
           "ensemble_app", "evaluate", "manifest", "owner", "register"]


def register(app: typer.Typer) -> None:
    """Add the ``ensemble`` group and the top-level ``deid`` command to the root app."""
    app.add_typer(ensemble_app, name="ensemble")
    app.command("deid")(deid_top_cmd)
