"""Local ensembles of published DP taggers and rules, combined on characters.

* :mod:`~dphub.ensemble.members`   the member contract, :class:`ModelMember`, :class:`FixedMember`
* :mod:`dphub.rules`               ``rules:default`` (patterns + dictionaries, ε = 0), a layer below
* :mod:`~dphub.ensemble.peers`     tools the owner has: ``deidpl:DIR`` (deid.pl via perl), ``presidio:default``
* :mod:`~dphub.ensemble.aggregate` ``any`` / ``k-of-n`` on characters, label choice, voters
* :mod:`~dphub.ensemble.kinds`     member kinds by name (``parse``, ``load``, ``describe``); the
                                   built-in ones in :mod:`~dphub.ensemble.member_kinds`
* :mod:`~dphub.ensemble.manifest`  ``dphub-ensemble.toml``: members, pinned revisions, thresholds
* :mod:`~dphub.ensemble.core`      :class:`Ensemble` (members + rule), Scenario A/B construction
* :mod:`~dphub.ensemble.calibrate` per-member thresholds for a target ensemble recall
* :mod:`~dphub.ensemble.evaluation` members and aggregate side by side on labelled notes

Directory runs (journal, resume, audit) live in :mod:`dphub.runner`.
"""

# the built-in member kinds register themselves (dphub.ensemble.kinds) before any manifest is read
from dphub.ensemble import member_kinds  # noqa: F401
from dphub.ensemble.aggregate import AggregateRule, MergedSpan, aggregate
from dphub.ensemble.core import Ensemble, NoteResult, Slot, build_ensemble
from dphub.ensemble.manifest import DEFAULT_MANIFEST, Manifest, MemberEntry
from dphub.ensemble.members import FixedMember, Member, ModelMember
from dphub.rules.engine import RuleMember, RuleOptions

__all__ = [
    "DEFAULT_MANIFEST",
    "AggregateRule",
    "Ensemble",
    "FixedMember",
    "Manifest",
    "Member",
    "MemberEntry",
    "MergedSpan",
    "ModelMember",
    "NoteResult",
    "RuleMember",
    "RuleOptions",
    "Slot",
    "aggregate",
    "build_ensemble",
]
