"""Shared pieces of the hub: repo ids, default locations, card summaries, file hashes.

Everything that crosses the hub boundary (repo ids, revisions, file names from a remote listing)
is validated here before it is used to build a path or a git command line, so that a hostile hub
cannot make dphub write outside its target directory or run git with an option.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from dphub.card import read_card_text, split_front_matter, validate_meta
from dphub.errors import CardError, DphubError, HubError
from dphub.io import atomic_write_text, dphub_home, hash_file
from dphub.labels import SCHEMAS

#: Tag every published card must carry; Hugging Face search filters on it.
DP_TAG = "differential-privacy"
PRIVACY_UNITS = ("patient", "note", "sequence")


def check_relative_path(name: str) -> PurePosixPath:
    """A file name from a hub listing, refused if absolute or escaping with '..'."""
    p = PurePosixPath(name)
    if (
        not name
        or p.is_absolute()
        or "\\" in name
        or any(part in ("..", ".", "") for part in name.split("/"))
        or "\x00" in name
    ):
        raise HubError(f"unsafe file name in hub listing: {name!r}")
    return p


def default_hub() -> str:
    """``$DPHUB_HUB`` or ``<dphub_home>/hub`` (a local git hub)."""
    return os.environ.get("DPHUB_HUB") or str(dphub_home() / "hub")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob with this content (what ``git ls-tree`` lists)."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def file_git_sha1(path: Path) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    h.update(b"blob %d\0" % path.stat().st_size)
    return hash_file(h, path).hexdigest()


#: The YAML front matter block at the start of a README (group 1: its text).
def parse_front_matter(text: str, *, where: str) -> dict[str, Any]:
    """The YAML front matter of a model card (README.md) as a dict.

    :func:`dphub.card.split_front_matter`: size-capped, no YAML aliases or anchors (a
    billion-laughs card would otherwise grow to gigabytes in a hub listing or a pull).
    """
    return split_front_matter(text, where=where)[0]


def read_card_meta(model_dir: Path) -> dict[str, Any]:
    """Front matter of ``<model_dir>/README.md`` (size-capped before it is read)."""
    readme = Path(model_dir) / "README.md"
    if not readme.is_file():
        raise CardError(f"{readme}: model card (README.md) is missing")
    return parse_front_matter(read_card_text(readme), where=str(readme))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _count(value: Any) -> int | str | None:
    """A dataset count: an exact int (old cards) or a coarsened range string such as '100-199'."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _RANGE_RE.match(value):
        return value
    return None


_RANGE_RE = re.compile(r"^(0|[1-9][0-9]{0,17}-[1-9][0-9]{0,17})$")


def _eval_f1(meta: dict[str, Any]) -> float | None:
    """The first F1-like metric in ``model-index`` / ``eval_results``, if the card has one."""
    for result in (meta.get("model-index") or [{}])[0].get("results", []) or []:
        for metric in result.get("metrics", []) or []:
            kind = f"{metric.get('type', '')} {metric.get('name', '')}".lower()
            if "f1" in kind:
                return _number(metric.get("value"))
    ev = meta.get("eval_results")
    if isinstance(ev, dict):
        for key, value in ev.items():
            if "f1" in str(key).lower() and _number(value) is not None:
                return _number(value)
    return None


#: Where listing verdicts are remembered (under the dphub home), so ``search`` and ``hub info``
#: recompute a card's accounting once per card content, not on every listing.
CARD_CHECK_CACHE = "cache/card-checks.json"
_CACHE_MAX = 4096
_memo: dict[str, str] = {}


def _card_key(meta: dict[str, Any]) -> str:
    """Content address of a card's front matter, plus the dphub version whose checks judged it.

    Keyed by content rather than by commit so that a hub (or HTTP server) that serves different
    content under a known commit cannot inherit another card's verdict.
    """
    from importlib import metadata

    try:
        version = metadata.version("dphub")
    except metadata.PackageNotFoundError:
        version = "?"
    blob = json.dumps(meta, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(f"{version}\0{blob}".encode()).hexdigest()


def _cache_path() -> Path:
    return dphub_home() / CARD_CHECK_CACHE


def _load_cache() -> dict[str, str]:
    try:
        data = json.loads(_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _store_cache(key: str, verdict: str) -> None:
    """Best effort: a read-only home or a concurrent writer only costs a recomputation later."""
    data = _load_cache()
    data[key] = verdict
    if len(data) > _CACHE_MAX:
        data = dict(list(data.items())[-_CACHE_MAX:])
    with contextlib.suppress(OSError):
        atomic_write_text(_cache_path(), json.dumps(data, sort_keys=False) + "\n")


def card_problem(meta: dict[str, Any]) -> str | None:
    """Why a hub card's ε cannot be trusted (None: it passes), with a cache by card content.

    Runs the checks of the publish gate that need nothing but the card: ``validate_meta`` with
    ``require_private`` (JSON Schema, a finite ε, and ε recomputed from the recorded accounting
    fields with Opacus and dp-accounting). A commit written into a hub around the gate is listed,
    but its claims are shown as unverified instead of as facts (issue 16, fault 16). The weights
    are not checked here; ``pull`` does that.
    """
    if not meta:
        return "no readable model card"
    key = _card_key(meta)
    verdict = _memo.get(key)
    if verdict is None:
        verdict = _load_cache().get(key)
    if verdict is None:
        try:
            validate_meta(meta, require_private=True)
            verdict = ""
        except DphubError as e:
            verdict = e.message or "invalid card"
        except Exception as e:  # noqa: BLE001 - a hostile card must not break a listing
            verdict = f"card cannot be checked ({type(e).__name__})"
        _store_cache(key, verdict)
    _memo[key] = verdict
    return verdict or None


def _card_labels(ds: dict[str, Any], phi: Any) -> tuple[str, ...]:
    """The labels a model tags, as its card lists them: its label schema's labels in schema
    order (``OTHER`` included), else the labels its training data counted.

    Why: search listed only the labels with training examples (no ``OTHER`` for synthetic
    notes) while the card listed the schema, so the two disagreed about the same model.
    """
    name = ds.get("label_schema")
    schema = SCHEMAS.get(name) if isinstance(name, str) else None
    if schema is not None:
        return tuple(schema.labels)
    return tuple(str(k) for k in phi) if isinstance(phi, dict) else ()

@dataclass(frozen=True)
class CardSummary:
    """What search tables, registry entries and policy checks need from a card.

    ``verified`` is True only for summaries whose card passed :func:`card_problem` (listings) or
    the gate; ``problem`` says why not. Listings show unverified ε values as "unverified".
    """

    epsilon: float | None
    delta: float | None
    unit: str | None
    private: bool
    base_model: str | None
    #: the labels the model tags, as its card lists them (its label schema)
    labels: tuple[str, ...]
    patients: int | str | None
    notes: int | str | None
    language: tuple[str, ...]
    f1: float | None
    verified: bool = False
    problem: str | None = None
    #: a public base model (public synthetic notes only, ε 0): no private data to protect
    public: bool = False
    #: the labels its training data had examples of (what ``search --label`` filters on)
    trained_labels: tuple[str, ...] = ()

    @classmethod
    def checked(cls, meta: dict[str, Any],
                validated: dict[str, Any] | None = None) -> CardSummary:
        """The summary of a hub card, marked verified only if :func:`card_problem` passes it.

        ``validated`` is the front matter as ``dphub.card.parse_card`` reads it (what pull
        validates), when the caller parsed it separately; default ``meta``.
        """
        problem = card_problem(meta if validated is None else validated)
        return replace(cls.from_meta(meta), verified=problem is None, problem=problem)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> CardSummary:
        dp = meta.get("differential_privacy") or {}
        if not isinstance(dp, dict):
            dp = {}
        ds = meta.get("dataset") or {}
        if not isinstance(ds, dict):
            ds = {}
        phi = ds.get("phi_per_category") or {}
        lang = meta.get("language") or ds.get("language") or ()
        if isinstance(lang, str):
            lang = (lang,)
        eps = _number(dp.get("epsilon"))
        return cls(
            epsilon=eps,
            delta=_number(dp.get("delta")),
            unit=dp.get("privacy_unit") if isinstance(dp.get("privacy_unit"), str) else None,
            private=dp.get("private") is True and eps is not None and math.isfinite(eps),
            base_model=meta.get("base_model") if isinstance(meta.get("base_model"), str) else None,
            labels=_card_labels(ds, phi),
            trained_labels=tuple(sorted(str(k) for k in phi)) if isinstance(phi, dict) else (),
            patients=_count(ds.get("patients")),
            notes=_count(ds.get("notes")),
            language=tuple(str(x) for x in lang),
            f1=_eval_f1(meta),
            public=dp.get("training_data") == "public-synthetic" and dp.get("private") is False
            and eps == 0,
        )

    def matches(
        self,
        *,
        max_epsilon: float | None = None,
        unit: str | None = None,
        label: str | None = None,
        language: str | None = None,
    ) -> bool:
        """Search filters: all given ones must hold.

        The privacy filters (ε, unit) only match verified cards: an unverified claim of a small
        ε must not pass a puller's cap in a listing (pull would refuse it anyway).
        """
        if max_epsilon is not None and (
            not self.verified or not (self.private or self.public) or self.epsilon is None
            or self.epsilon > max_epsilon
        ):
            return False
        if unit is not None and (not self.verified or self.unit != unit):
            return False
        if label is not None and label.upper() not in {x.upper() for x in self.trained_labels}:
            return False
        return language is None or language.lower() in {x.lower() for x in self.language}


@dataclass(frozen=True)
class RepoRevision:
    """One revision of a hub repo with its card summary (a search/info row)."""

    repo: str
    revision: str
    summary: CardSummary
    date: str | None = None
    message: str | None = None
    tags: tuple[str, ...] = ()
