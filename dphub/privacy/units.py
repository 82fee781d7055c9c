"""Privacy units: what one "individual" is for the DP guarantee, and how DP-SGD respects it.

The guarantee protects a *unit* — a patient (default), a note, or a single training sequence
(window) — under add/remove adjacency. For that, every window of one unit must

* be **sampled together**: the Poisson sampler draws units, not windows. :class:`UnitDataset` has
  one item per unit, holding at most ``max_examples_per_unit`` (K) of its windows, so Opacus's
  ``DPDataLoader`` (``UniformWithReplacementSampler`` over ``len(dataset)`` = number of units) and
  the accountant's sample rate ``q = expected units per step / number of units`` are about units;
* be **clipped as one**: :func:`unit_collate` flattens the sampled units' windows into one batch
  with a ``unit_index`` per window; after ``loss.backward()`` (hooks mode),
  :func:`aggregate_grad_sample_by_unit` sums each parameter's ``grad_sample`` rows by unit, so the
  ``DPOptimizer`` sees one row per unit and clips each unit's *total* gradient to ``C``.
  A unit's influence on one step is therefore bounded by ``C`` however many windows it has.

Physical batches: Opacus's ``BatchMemoryManager`` splits a sampled logical batch by *dataset
items* (``BatchSplittingSampler`` chunks the list of sampled indices), i.e. by whole units, so a
unit's windows never straddle two physical batches and ``max_physical_batch_size`` counts units,
not windows (a physical batch holds up to ``max_physical_batch_size * K`` windows).

Ghost clipping only exposes per-sample *norms*, which cannot be summed by unit, so unit-level
clipping needs ``grad_sample_mode="hooks"``; with ``unit="sequence"`` every window is its own unit
and any mode works (the aggregation is the identity and can be skipped).

Empty Poisson batches: ``DPDataLoader`` feeds an empty sample to its empty-batch wrapper, which
returns zero-row tensors shaped like the first non-empty batch (or, if the very first batch is
empty, a list of zero-row tensors shaped like ``dataset[0]``; that is why a unit item is a tuple of
tensors). :func:`is_empty_unit_batch` recognises both; the training loop then skips the forward
pass, calls ``aggregate_grad_sample_by_unit(model, empty_index, 0)`` (which installs zero-row
``grad_sample`` tensors) and still calls ``optimizer.step()``: a noise-only step, as the accountant
assumes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import Dataset

from dphub.errors import ConfigError, PrivacyError

PRIVACY_UNITS: tuple[str, ...] = ("patient", "note", "sequence")

#: Tag value for positions without a label ([CLS], [SEP], padding): ignored by losses.
IGNORE_INDEX = -100


def unit_key(unit: str, note_id: str, patient_id: str | None, window_index: int) -> str:
    """The privacy-unit key of one window of a note.

    ``patient`` uses the patient id (falling back to the note id when a corpus has none — then a
    note is its own patient), ``note`` the note id, ``sequence`` the note id plus window index.
    """
    if unit == "patient":
        return f"p:{patient_id if patient_id is not None else note_id}"
    if unit == "note":
        return f"n:{note_id}"
    if unit == "sequence":
        return f"s:{note_id}#{window_index}"
    raise ConfigError(f"unknown privacy unit {unit!r}; choose one of {', '.join(PRIVACY_UNITS)}")


class UnitItem(NamedTuple):
    """One privacy unit as a dataset item: its windows, concatenated.

    ``input_ids`` and ``tags`` are the unit's windows laid end to end (1-D, long); ``lengths[k]``
    is window ``k``'s length; ``features`` (float, ``[total length, F]``) are the windows' rule
    features laid end to end, ``F = 0`` for a model without them (always a tensor: Opacus's
    ``DPDataLoader`` inspects ``dataset[0]`` element-wise for shapes and dtypes, which is also why
    an item is a tuple of tensors, not a dict or dataclass). ``confidence`` (float, ``[total
    length]``) is the soft labels' per-position confidence in the tag, empty for hard labels.
    """

    input_ids: torch.Tensor
    tags: torch.Tensor
    lengths: torch.Tensor
    features: torch.Tensor
    confidence: torch.Tensor


class UnitDataset(Dataset):
    """A dataset whose items are privacy units (each ≤ ``max_examples_per_unit`` windows).

    Build it with :meth:`from_windows`. Units are ordered by first appearance of their key; when a
    unit has more than K windows, K evenly spaced ones are kept, in their original order. The
    choice is a function of that unit's own windows only: it depends on no other unit, no seed
    and no published value, so the data a unit contributes is fixed before the mechanism runs.
    """

    def __init__(self, units: Sequence[UnitItem], keys: Sequence[Hashable],
                 max_examples_per_unit: int, dropped_windows: int = 0) -> None:
        self.units = list(units)
        self.keys = list(keys)
        self.max_examples_per_unit = max_examples_per_unit
        #: windows left out because their unit had more than K (reported in training logs)
        self.dropped_windows = dropped_windows

    @classmethod
    def from_windows(
        cls,
        input_ids: Sequence[Sequence[int]],
        tags: Sequence[Sequence[int]],
        unit_keys: Sequence[Hashable],
        *,
        max_examples_per_unit: int = 64,
        features: Sequence[Any] | None = None,
        confidence: Sequence[Any] | None = None,
    ) -> UnitDataset:
        """Group windows (token ids incl. specials, tag ids with -100 at specials) by unit key.

        ``features``: per window an array ``[window length, F]`` of rule features (see
        :mod:`dphub.rule_features`), kept with the window through sampling and collation.
        ``confidence``: per window ``[window length]`` soft-label confidences, kept likewise."""
        if not (len(input_ids) == len(tags) == len(unit_keys)):
            raise PrivacyError(
                "windows, tags and unit keys differ in number "
                f"({len(input_ids)}, {len(tags)}, {len(unit_keys)})"
            )
        if features is not None and len(features) != len(input_ids):
            raise PrivacyError(f"{len(input_ids)} windows but {len(features)} feature rows")
        if confidence is not None and len(confidence) != len(input_ids):
            raise PrivacyError(f"{len(input_ids)} windows but {len(confidence)} confidence rows")
        if max_examples_per_unit < 1:
            raise ConfigError(f"max examples per unit must be >= 1, got {max_examples_per_unit}")
        groups: dict[Hashable, list[int]] = {}
        for i, key in enumerate(unit_keys):
            groups.setdefault(key, []).append(i)
        units: list[UnitItem] = []
        dropped = 0
        for members in groups.values():
            if len(members) > max_examples_per_unit:
                dropped += len(members) - max_examples_per_unit
                members = keep_evenly_spaced(members, max_examples_per_unit)
            for i in members:
                if len(input_ids[i]) != len(tags[i]):
                    raise PrivacyError(
                        f"window {i}: {len(input_ids[i])} token ids but {len(tags[i])} tags"
                    )
                if len(input_ids[i]) == 0:
                    raise PrivacyError(f"window {i} is empty (it needs at least [CLS] [SEP])")
            units.append(
                UnitItem(
                    input_ids=torch.tensor([t for i in members for t in input_ids[i]],
                                           dtype=torch.long),
                    tags=torch.tensor([t for i in members for t in tags[i]], dtype=torch.long),
                    lengths=torch.tensor([len(input_ids[i]) for i in members], dtype=torch.long),
                    features=_unit_features(features, members, [len(input_ids[i]) for i in members]),
                    confidence=_unit_confidence(confidence, members,
                                                [len(input_ids[i]) for i in members]),
                )
            )
        return cls(units, list(groups), max_examples_per_unit, dropped)

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, index: int) -> UnitItem:
        return self.units[index]

    @property
    def num_windows(self) -> int:
        return sum(int(u.lengths.numel()) for u in self.units)


def _unit_features(features: Sequence[Any] | None, members: Sequence[int],
                   lengths: Sequence[int]) -> torch.Tensor:
    """One unit's windows' features laid end to end (``[total, 0]`` without features)."""
    return _end_to_end(features, members, lengths, "features", (sum(lengths), 0), ndim=2)


def _unit_confidence(confidence: Sequence[Any] | None, members: Sequence[int],
                     lengths: Sequence[int]) -> torch.Tensor:
    """One unit's windows' soft-label confidences laid end to end (empty for hard labels)."""
    return _end_to_end(confidence, members, lengths, "confidence", (0,), ndim=1)


def _end_to_end(values: Sequence[Any] | None, members: Sequence[int], lengths: Sequence[int],
                what: str, empty: tuple[int, ...], ndim: int) -> torch.Tensor:
    """Per-window float rows of ``members`` (one row per token id) concatenated, checked."""
    if values is None:
        return torch.zeros(empty, dtype=torch.float32)
    rows = [torch.as_tensor(values[i], dtype=torch.float32) for i in members]
    for i, r, n in zip(members, rows, lengths, strict=True):
        if r.ndim != ndim or r.shape[0] != n:
            raise PrivacyError(f"window {i}: {n} token ids but {what} of shape {tuple(r.shape)}")
    return torch.cat(rows, dim=0)


def keep_evenly_spaced(members: Sequence[int], k: int) -> list[int]:
    """``k`` of ``members`` spread evenly over the sequence (all of them when there are ≤ k)."""
    n = len(members)
    if n <= k:
        return list(members)
    return [members[(i * n) // k] for i in range(k)]


def unit_collate(items: Sequence[UnitItem], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Flatten sampled units into one window batch.

    Returns batch-shaped, contiguous ``input_ids``, ``attention_mask``, ``token_type_ids``,
    ``position_ids`` (BERT's embedding buffers are ``[1, L]``; Opacus needs them per sample),
    ``tags`` (``-100`` at padding), ``unit_index`` (``[W]``: which of the batch's units each window
    belongs to, 0-based in item order) and ``unit_sizes`` (``[U]`` windows per unit). Use with
    ``functools.partial(unit_collate, pad_id=tokenizer.pad_token_id)`` as a DataLoader collate_fn.
    """
    windows: list[tuple[torch.Tensor, torch.Tensor]] = []
    feats: list[torch.Tensor] = []
    confs: list[torch.Tensor] = []
    unit_index: list[int] = []
    sizes: list[int] = []
    for u, item in enumerate(items):
        ids, tg, lengths = item[0], item[1], item[2]
        sizes.append(int(lengths.numel()))
        for a, b in zip(ids.split(lengths.tolist()), tg.split(lengths.tolist()), strict=True):
            windows.append((a, b))
            unit_index.append(u)
        if len(item) > 3 and item[3].ndim == 2 and item[3].shape[1] > 0:
            feats.extend(item[3].split(lengths.tolist()))
        if len(item) > 4 and item[4].numel() > 0:
            confs.extend(item[4].split(lengths.tolist()))
    n = len(windows)
    width = max((len(a) for a, _ in windows), default=0)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    tags = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    for r, (a, b) in enumerate(windows):
        input_ids[r, : len(a)] = a
        tags[r, : len(b)] = b
        attention[r, : len(a)] = 1
    out = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "token_type_ids": torch.zeros((n, width), dtype=torch.long),
        "position_ids": torch.arange(width, dtype=torch.long).expand(n, width).contiguous(),
        "tags": tags,
        "unit_index": torch.tensor(unit_index, dtype=torch.long),
        "unit_sizes": torch.tensor(sizes, dtype=torch.long),
    }
    if feats:
        if len(feats) != n:
            raise PrivacyError("some sampled units have rule features and others have none")
        rule = torch.zeros((n, width, feats[0].shape[1]), dtype=torch.float32)
        for r, f in enumerate(feats):
            rule[r, : f.shape[0]] = f
        out["rule_features"] = rule
    if confs:
        if len(confs) != n:
            raise PrivacyError("some sampled units have soft labels and others have none")
        conf = torch.ones((n, width), dtype=torch.float32)
        for r, c in enumerate(confs):
            conf[r, : c.shape[0]] = c
        out["confidence"] = conf
    return out


def is_empty_unit_batch(batch: Any) -> bool:
    """True for every shape an empty Poisson batch can take (see module docstring)."""
    if isinstance(batch, dict):
        if "unit_sizes" in batch:
            return int(batch["unit_sizes"].numel()) == 0
        return all(torch.is_tensor(v) and v.shape[0] == 0 for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return all(torch.is_tensor(v) and v.numel() == 0 for v in batch)
    return False


def batch_num_units(batch: dict[str, torch.Tensor]) -> int:
    """Number of units in a collated batch (0 for an empty Poisson batch)."""
    return 0 if is_empty_unit_batch(batch) else int(batch["unit_sizes"].numel())


def aggregate_grad_sample_by_unit(
    module: nn.Module, unit_index: torch.Tensor, n_units: int
) -> None:
    """Sum every trainable parameter's per-window ``grad_sample`` rows by unit, in place.

    Call after ``loss.backward()`` and before ``optimizer.step()`` (hooks mode). Afterwards
    ``p.grad_sample`` has ``n_units`` rows, so the ``DPOptimizer`` clips each unit's summed
    gradient to ``max_grad_norm``. With ``n_units == 0`` (empty Poisson batch, no backward) it
    installs zero-row ``grad_sample`` tensors so that the optimizer can take its noise-only step.

    ``module`` may be the ``GradSampleModule`` or the model it wraps. The sum is the gradient of
    the sum of the unit's window losses, whatever the loss reduction: with
    ``loss_reduction="mean"`` Opacus has already rescaled each row to the window's own gradient.
    """
    index = unit_index.long()
    for p in module.parameters():
        if not p.requires_grad:
            continue
        if n_units == 0:
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
            continue
        gs = getattr(p, "grad_sample", None)
        if gs is None:
            raise PrivacyError(
                "a trainable parameter has no per-sample gradient; call "
                "aggregate_grad_sample_by_unit after loss.backward() in hooks mode"
            )
        if isinstance(gs, list):
            raise PrivacyError(
                "per-sample gradients were accumulated over several backward passes; "
                "aggregate after each backward (one physical batch) before optimizer.step()"
            )
        if gs.shape[0] != index.shape[0]:
            raise PrivacyError(
                f"per-sample gradient has {gs.shape[0]} rows but the batch has "
                f"{index.shape[0]} windows"
            )
        out = torch.zeros((n_units, *gs.shape[1:]), dtype=gs.dtype, device=gs.device)
        out.index_add_(0, index.to(gs.device), gs)
        p.grad_sample = out


def check_one_gradient_per_unit(module: nn.Module, n_units: int) -> None:
    """Refuse a step unless every trainable parameter has exactly one gradient row per unit.

    The DP optimizer clips each ``grad_sample`` row to ``C``; the accounted sensitivity is ``C``
    per *unit* only if each row is one unit's summed gradient. If per-window rows reached the
    optimizer (the aggregation skipped or broken), a patient with k windows would move the update
    by up to ``k·C`` and the published ε would be wrong — so training stops instead.
    """
    for p in module.parameters():
        if not p.requires_grad:
            continue
        gs = getattr(p, "grad_sample", None)
        rows = None if gs is None or isinstance(gs, list) else int(gs.shape[0])
        if rows != n_units:
            raise PrivacyError(
                f"internal privacy check failed: {rows} per-sample gradient rows for "
                f"{n_units} sampled units; refusing a step whose sensitivity would exceed the "
                "accounted bound"
            )
