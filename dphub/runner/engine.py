"""Engines: how a run's batches reach the ensemble (here, or on workers elsewhere).

Why a module of its own: the expensive part of a run, the ensemble on each batch, is the only
part that may move to other processes (:mod:`dphub.ray_engine` runs the same batches on Ray
actors through :func:`deid_isolated`); reading, rendering, writing and the journal stay in the
driver whatever the engine, so the bytes are the same. A batch that fails is retried note by note
so that one bad note fails alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dphub.errors import DphubError
from dphub.runner.inputs import WorkItem

Engine = Callable[[Iterator[list[WorkItem]]], Iterator[tuple[list[WorkItem], list[Any]]]]


def local_engine(ensemble: Any, batches: Iterator[list[WorkItem]], *,
                 on_chunk: Callable[[int, int], None] | None = None
                 ) -> Iterator[tuple[list[WorkItem], list[Any]]]:
    """The single-process engine: each batch through ``ensemble`` here, one at a time;
    ``on_chunk`` hears the chunks of a long note (see :func:`run_deid`'s ``chunk_progress``)."""
    for batch in batches:
        yield batch, deid_isolated(ensemble, [it for it in batch if it.note is not None],
                                   on_chunk=on_chunk)


def deid_isolated(ensemble: Any, items: Sequence[WorkItem], *,
                  on_chunk: Callable[[int, int], None] | None = None) -> list[Any]:
    """Public name of :func:`_deid_isolated` (engines on other processes call it per batch)."""
    return _deid_isolated(ensemble, items, on_chunk=on_chunk)


def _takes_on_chunk(ensemble: Any) -> bool:
    """Whether ``ensemble.deid`` reports a long note's chunks (an :class:`Ensemble` does; a
    stand-in with ``deid(notes)`` alone does not)."""
    try:
        return "on_chunk" in inspect.signature(ensemble.deid).parameters
    except (TypeError, ValueError):
        return False


def _deid_isolated(ensemble: Any, items: Sequence[WorkItem], *,
                   on_chunk: Callable[[int, int], None] | None = None) -> list[Any]:
    """Run the ensemble on a batch; if the batch fails, run notes one by one to isolate failures.

    Returns per item a NoteResult, or a PHI-free error message.
    """
    if not items:
        return []
    notes = [it.note for it in items]
    extra = {"on_chunk": on_chunk} if on_chunk is not None and _takes_on_chunk(ensemble) else {}
    try:
        return list(ensemble.deid(notes, **extra))
    except DphubError as e:
        if len(items) == 1:
            return [e.message]
    out: list[Any] = []
    for it in items:
        try:
            out.append(ensemble.deid([it.note], **extra)[0])
        except DphubError as e:
            out.append(e.message)
    return out
