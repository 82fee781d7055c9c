"""Empirical privacy audit: canaries, a membership signal, and a one-run ε lower bound.

A proven ε protects only if the code that claims it is right. This module measures, from the
*same* training run, how much the run reveals about canaries inserted into it (Steinke, Nasr &
Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023). Two settings:

**White-box gradient canaries** (``method="gradient"``, the default; :class:`GradientCanaries`).
``m`` Dirac canary gradients, each of norm ``C`` (the clipping norm: a valid clipped unit
gradient) on its own coordinate of an *audit tensor* that is handed to the DP optimizer's noise
step beside the model's parameters, so the audit coordinates receive the same noise, from the same
call (``DPOptimizer.add_noise``, as installed by :func:`dphub.privacy.randomness.install_noise_source`),
as the model. Each canary is included with probability ½ (bits from the OS) and, when included,
joins each step with the run's Poisson rate ``q``, exactly like a unit, so the accountant's ε
covers each canary. The auditor reads the released noisy sum on each canary's coordinate, adds it
up over the steps, and guesses "in" when the total exceeds half of what an included canary
contributes on average (``q · steps · C / 2``), "out" otherwise; it abstains on the canaries
whose totals lie closest to that threshold, a fraction chosen from the run's public
settings by the simulated detection limit below (``--abstain auto``; 20 % at the default recipe,
90 % at ε 1). Theorem 5.2 counts guesses made, so abstaining on the least confident raises the
bound of a leaky mechanism.
The canaries never reach the model (the audit tensor is removed before the optimizer's update), so
the written model is distributed exactly as ``dphub train``'s. Dirac canaries on dedicated
coordinates do not interfere with each other or with the real gradients, so a noise-free mechanism
gets every guess right and the bound reaches the audit's ceiling (the bound for ``r`` of ``r``
right), which :func:`gradient_canary_count` maximises: about 8.24 at δ = 1e-5 and 95 % (30,000
canaries; no count does better there, the ``2 m δ`` term of the bound sees to that; 8.02 with the
20 % abstention ``auto`` picks at ε 8). What it checks: that the noise actually added has the scale the accountant
assumes, for the sampling rate and number of steps it assumes; at ε 8 only coarsely. How coarsely
is in the report: the canaries are independent of the model, so the released sums of a run with
noise × k can be simulated exactly, and :func:`detection_limit` finds the largest k at which
at least 95 % of 200 simulated audits fail the claim (≈ 0.30 at the default recipe: a mechanism
with half the noise passes). What it does not check: clipping and the per-unit aggregation of
real gradients (the canaries arrive clipped), the sampling of real units (those have their own
tests, see docs/privacy.md), nor the composition of releases (federated rounds, ``--init-from``,
``distill``).

**Black-box canary patients** (``method="patients"``):

1. **Canaries.** ``m`` synthetic canary patients, each with a unique random secret — a name made
   of two random whole-word vocabulary pieces (one word piece each, so the model can memorise
   them), a random 7-digit MRN and a random date of birth — written into
   realistic :mod:`dphub.synth` notes (every patient mention and record number of the note
   becomes the canary's, and a ``Name / MRN / DOB`` header line is added). Each canary is
   included in training independently with probability ½; the inclusion bits and the secrets
   come from the OS (:mod:`secrets`), never from ``--seed``, so nobody can predict or replay
   them.
2. **Membership signal.** For each canary the trained model's loss on the secret's word pieces
   (``-log`` of the CRF marginal of their gold tags) with the *true* secret is compared with the
   same loss with ``R`` random alternative secrets of the same format in the same notes (the
   *reference*). The score is the log-ratio ``ln(median(alt)) - ln(true)`` (:func:`score`).
   Why this signal: it needs only the trained model (no shadow or reference training), it
   cancels everything about a canary that is not its secret (template, note length, how hard its
   context is), and for a canary that was *not* trained on the true secret is exchangeable
   with the alternatives, so its score has a known null distribution: whatever separates
   included canaries from excluded ones is memorisation of the secret itself. The same
   computation gives the exposure (below).
3. **Bound.** The auditor guesses "in" for the highest scores and "out" for the lowest, and
   abstains on the rest. If training is (ε, δ)-DP, the number of correct guesses is stochastically
   dominated as in the paper's Theorem 5.2 (:func:`p_value`); the audit reports the largest ε
   that this rejects at the given confidence (:func:`epsilon_lower_bound`). A few guess counts
   are tried, with a Bonferroni correction, so the choice costs no validity. ``m`` canaries can
   show at most :func:`max_possible_bound` (≈ 2.7 for 64): larger claims cannot fail the audit,
   whose verdict is then ``inconclusive``.
4. **Exposure** (Carlini et al., "The Secret Sharer", USENIX Security 2019): the rank of the true
   secret among the ``R + 1`` candidates by loss; ``exposure = log2(R + 1) - log2(rank)`` (the
   sampling estimate of the paper's exposure; at most ``log2(R + 1)`` bits).

Verdicts (:func:`judge`): ``failed`` when the bound exceeds the proven ε; ``inconclusive`` when
even a perfect attack could not have exceeded it (the ceiling is below the proven ε); ``passed``
otherwise; ``not-private`` for ``--no-dp`` runs. An audit is a **lower bound, not a proof**: a
passed audit is a sanity check that the mechanism is not grossly broken (at ε 8 the gradient audit
catches noise ≤ 0.30 × the recipe's in 95 % of runs, not a σ off by a factor of two or three: each gradient report
states its own detection limit); the accountant's
proven ε is the guarantee. A bound above the proven ε means the mechanism does not do what its
card claims.
Canary patients are public synthetic data: a model trained with them still carries its proven
ε for the real patients (the canaries are extra units under the same accounting).

Nothing here prints or exits; canary notes are synthetic, and real notes are never copied.

The bound, its ceiling and the verdicts are :mod:`dphub.privacy.audit_bound`; the card's
``empirical_audit`` text and check are :mod:`dphub.card.audit` (both re-exported here). What is
left, over 600 lines, is one concern: running an audit (canaries in, a training run, scores out).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dphub import align, synth
from dphub import rule_features as rf
from dphub import train as training
from dphub.card import load_card, write_card
from dphub.encoders import resolve_base_model
from dphub.errors import ConfigError, PrivacyError
from dphub.io import move_into_place
from dphub.labels import get_schema
from dphub.notes import Note, Span
from dphub.privacy.audit_bound import (
    ATTACK_MIN_EPSILON,
    GRADIENT_SIGNAL,
    MAX_GRADIENT_CANARIES,
    METHOD,
    OUTSIDE_GRADIENT_AUDIT,
    SETTINGS,
    SIGNAL,
    choose_abstain,
    detection_limit,
    epsilon_lower_bound,
    gradient_canary_count,
    gradient_correct,
    judge,
    max_possible_bound,
    one_run_bound,
    verdict_reason,
)
from dphub.registry import resolve_model
from dphub.tagger import TaggerModel
from dphub.tagger_model import ENCODER_INPUTS
from dphub.train import Example, batch_from_examples


class AuditFailed(PrivacyError):
    """The empirical lower bound exceeds the proven ε: the mechanism does not do what it claims.

    A refused operation: nothing is written to ``--out`` (a card claiming an ε the model
    demonstrably does not have must not exist). ``block`` holds the audit's numbers.
    """

    def __init__(self, message: str, block: dict[str, Any]) -> None:
        super().__init__(message)
        self.block = block

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class GradientCanaries:
    """White-box Dirac gradient canaries inserted into DP-SGD's clipped sum before the noise.

    :meth:`install` wraps the DP optimizer's ``add_noise``: at every step an *audit tensor* of
    ``count`` coordinates, whose clipped sum holds ``C`` for each included canary drawn into the
    step (Poisson rate ``q``, like a unit) and 0 elsewhere, is appended to the optimizer's
    parameters for the duration of the real ``add_noise`` call, which adds the same Gaussian
    noise to it as to the model's parameters; the noisy result is summed per coordinate over the
    steps (:attr:`sums`), and the tensor is removed before the optimizer's update. The
    inclusion bits and the per-step draws come from the OS (:mod:`secrets`), never ``--seed``.
    """

    def __init__(self, count: int) -> None:
        import numpy as np

        if not 2 <= count <= MAX_GRADIENT_CANARIES:
            raise ConfigError(f"--canaries must be in [2, {MAX_GRADIENT_CANARIES}] for gradient "
                              f"canaries, got {count}")
        self.count = count
        bits = secrets.randbits(count)  # bit i: canary i included (linear time, any count)
        raw = np.frombuffer(bits.to_bytes((count + 7) // 8, "little"), dtype=np.uint8)
        self.included = np.unpackbits(raw, bitorder="little")[:count].astype(bool)
        self._rng = np.random.Generator(np.random.PCG64DXSM(secrets.randbits(128)))
        self.sums = np.zeros(count, dtype=np.float64)
        self.steps = 0
        self.norm: float | None = None
        self.sample_rate: float | None = None
        #: the optimizer's noise multiplier σ (the detection limit scales it)
        self.noise_multiplier: float | None = None

    @property
    def threshold(self) -> float:
        """Guess "in" above this total: half an included canary's expected total ``q T C``."""
        if self.norm is None or self.sample_rate is None:
            raise PrivacyError("internal: gradient canaries were never installed")
        return 0.5 * self.sample_rate * self.steps * self.norm

    def install(self, optimizer: Any, sample_rate: float) -> None:
        """Make every noise step of the Opacus ``DPOptimizer`` ``optimizer`` carry the canaries."""
        import torch

        params = optimizer.params
        if not params:
            raise PrivacyError("gradient canaries need trainable parameters")
        ref = params[0]
        self.norm, self.sample_rate = float(optimizer.max_grad_norm), float(sample_rate)
        self.noise_multiplier = float(optimizer.noise_multiplier)
        audit = torch.nn.Parameter(torch.zeros(self.count, dtype=ref.dtype, device=ref.device))
        real_add_noise = optimizer.add_noise
        groups = optimizer.param_groups

        def add_noise() -> None:
            drawn = self.included & (self._rng.random(self.count) < self.sample_rate)
            audit.summed_grad = torch.from_numpy(drawn * self.norm).to(ref.dtype).to(ref.device)
            group = groups[-1]["params"]
            group.append(audit)
            try:
                real_add_noise()  # the mechanism's own noise step, audit tensor included
            finally:
                if group.pop() is not audit:  # pragma: no cover - invariant
                    raise PrivacyError("internal: the optimizer's parameters changed mid-step")
            if audit.grad is None:
                raise PrivacyError("the noise step did not process the audit canaries")
            self.sums += audit.grad.detach().to("cpu", torch.float64).numpy().reshape(-1)
            self.steps += 1
            audit.grad, audit.summed_grad = None, None

        optimizer.add_noise = add_noise


# --------------------------------------------------------------------------------------------
# canaries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Secret:
    """One canary's secret PHI: a two-word name, a medical record number, a date of birth."""

    first: str
    last: str
    mrn: str
    dob: str

    def value(self, slot: str) -> str:
        return {"name": f"{self.first} {self.last}", "mrn": self.mrn, "dob": self.dob}[slot]


#: (slot, label) of each secret slot; labels are i2b2 names that every label schema maps.
_SLOT_LABELS = {"name": "PATIENT", "mrn": "MEDICALRECORD", "dob": "DATE"}
#: Gold labels of synth notes that are replaced by the canary's secret.
_REPLACED = {"PATIENT": "name", "MEDICALRECORD": "mrn"}

#: A piece of a canary note: fixed text (label None), fixed PHI (label), or a secret slot.
_Piece = tuple[str, str | None, bool]


@dataclass
class Canary:
    """A canary patient: note templates with secret slots, its secret and its alternatives."""

    patient_id: str
    templates: list[tuple[str, list[_Piece]]]  # (note id, pieces)
    secret: Secret
    alternatives: list[Secret]
    included: bool
    kind: str = "nursing"

    def notes(self, secret: Secret | None = None) -> list[Note]:
        """The canary's notes with ``secret`` (default: its own) in every slot."""
        return [n for n, _ in self.render(secret)]

    def render(self, secret: Secret | None = None) -> list[tuple[Note, list[tuple[int, int]]]]:
        """Each note with ``secret`` in its slots, and the character ranges of those slots."""
        s = secret or self.secret
        out = []
        for note_id, pieces in self.templates:
            parts: list[str] = []
            spans: list[Span] = []
            slots: list[tuple[int, int]] = []
            pos = 0
            for text, label, is_slot in pieces:
                value = s.value(text) if is_slot else text
                if label is not None:
                    spans.append(Span(pos, pos + len(value), label))
                if is_slot:
                    slots.append((pos, pos + len(value)))
                parts.append(value)
                pos += len(value)
            note = Note(id=note_id, text="".join(parts), patient_id=self.patient_id,
                        metadata={"kind": self.kind, "canary": True}, spans=spans,
                        labelled=True)
            out.append((note, slots))
        return out


def _template(note: Note, max_chars: int | None = None) -> list[_Piece]:
    """Pieces of a synth note: the header slots, then its text with patient names and record
    numbers turned into slots (other PHI stays as generated). ``max_chars`` cuts the note body
    short (never inside a PHI span): shorter canaries make small audits cheaper."""
    text, spans = note.text, sorted(note.spans, key=lambda s: s.start)
    if max_chars is not None and len(text) > max_chars:
        cut = max_chars
        for sp in spans:
            if sp.start < cut < sp.end:
                cut = sp.start
        text, spans = text[:cut], [sp for sp in spans if sp.end <= cut]
    pieces: list[_Piece] = [("Name: ", None, False), ("name", _SLOT_LABELS["name"], True),
                            ("  MRN: ", None, False), ("mrn", _SLOT_LABELS["mrn"], True),
                            ("  DOB: ", None, False), ("dob", _SLOT_LABELS["dob"], True),
                            ("\n", None, False)]
    pos = 0
    for span in spans:
        if span.start < pos:  # overlapping gold (synth never makes it): keep the first
            continue
        if span.start > pos:
            pieces.append((text[pos:span.start], None, False))
        slot = _REPLACED.get(span.label)
        if slot is not None:
            pieces.append((slot, _SLOT_LABELS[slot], True))
        else:
            pieces.append((text[span.start:span.end], span.label, False))
        pos = span.end
    if pos < len(text):
        pieces.append((text[pos:], None, False))
    return pieces


def name_pool(tokenizer: Any) -> list[str]:
    """Capitalised whole-word vocabulary pieces (6-12 ASCII letters): each is one word piece.

    One piece per name word makes a canary's secret a distinct token the model can memorise;
    random letter strings would split into pieces shared by every canary, blurring the signal.
    """
    vocab = tokenizer.get_vocab()
    words = sorted(w for w in vocab if 6 <= len(w) <= 12 and w.isascii() and w.isalpha()
                   and w.islower())
    if len(words) < 100:
        raise ConfigError("the tokenizer's vocabulary has too few whole words for canary names")
    return [w.capitalize() for w in words]


def _random_secret(rng: secrets.SystemRandom, pool: Sequence[str], used: set[str]) -> Secret:
    while True:
        first, last = rng.choice(pool), rng.choice(pool)
        if first != last and first not in used and last not in used:
            used.update((first, last))
            break
    mrn = "".join(rng.choice("0123456789") for _ in range(7))
    mrn = str(rng.randint(1, 9)) + mrn[1:]
    day = dt.date(1920, 1, 1) + dt.timedelta(days=rng.randrange(365 * 85))
    return Secret(first, last, mrn, f"{day.month}/{day.day}/{day.year}")


def make_canaries(m: int, pool: Sequence[str], *, notes_per_canary: int = 2,
                  alternatives: int = 15, kind: str = "nursing",
                  max_note_chars: int | None = None) -> list[Canary]:
    """``m`` canary patients; secrets, alternatives and inclusion bits drawn from the OS.

    Secrets and alternatives never share a name word, so an alternative is never another
    canary's (possibly trained) secret.
    """
    if m < 2:
        raise ConfigError(f"--canaries must be at least 2, got {m}")
    if notes_per_canary < 1:
        raise ConfigError(f"--canary-notes must be at least 1, got {notes_per_canary}")
    if alternatives < 1:
        raise ConfigError(f"--candidates must be at least 1, got {alternatives}")
    if 2 * m * (alternatives + 1) > len(pool) // 2:
        raise ConfigError(
            f"{m} canaries x {alternatives + 1} candidates need more distinct names than the "
            f"vocabulary offers ({len(pool)} words); lower --canaries or --candidates"
        )
    rng = secrets.SystemRandom()
    run = secrets.token_hex(4)
    # realistic note bodies: a fresh synth seed per run (the template text is public anyway)
    base = synth.generate(m * notes_per_canary, kind=kind, seed=secrets.randbits(31), patients=m)
    used: set[str] = set()
    canaries: list[Canary] = []
    for i in range(m):
        pid = f"dphub-canary-{run}-{i:03d}"
        mine = base[i::m][:notes_per_canary]
        templates = [(f"{pid}-n{j + 1}", _template(n, max_note_chars))
                     for j, n in enumerate(mine)]
        secret = _random_secret(rng, pool, used)
        canaries.append(Canary(pid, templates, secret, [], bool(secrets.randbits(1)), kind))
    for c in canaries:
        c.alternatives = [_random_secret(rng, pool, used) for _ in range(alternatives)]
    return canaries


# --------------------------------------------------------------------------------------------
# scoring
# --------------------------------------------------------------------------------------------


@dataclass
class CanaryScore:
    """Membership score, loss of the true secret, and its rank/exposure among candidates."""

    score: float
    true_loss: float
    rank: float
    exposure: float


def secret_losses(model_dir: Path, canaries: Sequence[Canary], *, batch_size: int = 32
                  ) -> list[list[float]]:
    """Per canary: the model's loss on its secret with the true secret, then each alternative.

    The loss is ``-sum log P(gold tag)`` over the word pieces of the secret slots, with P the
    CRF's posterior marginals (each piece counted once, in the window that owns it). Restricting
    it to the secret's own pieces matters: changing the secret also shifts the encoder's output
    at every other position of the window, and a whole-window loss adds that noise (MiniLM,
    head-only, no DP, 32 canaries: bound 0.07-0.40 with the whole-window CRF loss, 1.23 with
    this). Windows without a secret piece are never run; identical windows run once.
    """
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    model = TaggerModel.load(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    schema = get_schema(model.schema)
    tag_id = {t: i for i, t in enumerate(model.tags)}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    keys: list[list[list[bytes]]] = []  # canary -> candidate -> window keys
    windows: dict[bytes, tuple[Example, list[int]]] = {}
    for c in canaries:
        per_cand = []
        for s in (c.secret, *c.alternatives):
            rendered = c.render(s)
            toks = align.tokenize(tokenizer, [n.text for n, _ in rendered])
            wins = align.make_windows(toks, tokenizer, max_length=model.max_length,
                                      stride=model.stride)
            feats = None
            if model.rule_features is not None:  # the model's inputs include the rule flags

                feats = rf.window_features(wins, rf.notes_features([n for n, _ in rendered],
                                                                   toks))
            ks = []
            for wi, w in enumerate(wins):
                note, slots = rendered[w.note_index]
                nt = toks[w.note_index]
                a, b = w.owned
                picked = [w.content_start + i - w.token_start for i in range(a, b)
                          if any(nt.offsets[i][0] < e and st < nt.offsets[i][1]
                                 for st, e in slots)]
                if not picked:
                    continue
                tags = [tag_id[t] for t in align.spans_to_tags(nt.offsets, note.spans, schema)]
                labels = [-100] * len(w.input_ids)
                labels[w.content_slice] = tags[w.token_start : w.token_end]
                k = (np.asarray(w.input_ids, dtype=np.int64).tobytes() + b"|"
                     + np.asarray(labels, dtype=np.int64).tobytes() + b"|"
                     + np.asarray(picked, dtype=np.int64).tobytes())
                windows.setdefault(k, (Example("", 0, list(w.input_ids), labels,
                                               None if feats is None else feats[wi]), picked))
                ks.append(k)
            per_cand.append(ks)
        keys.append(per_cand)
    items = sorted(windows.items(), key=lambda kv: len(kv[1][0].input_ids))
    loss: dict[bytes, float] = {}
    with torch.inference_mode():
        for i in range(0, len(items), batch_size):
            chunk = items[i : i + batch_size]
            batch = batch_from_examples([e for _, (e, _) in chunk], pad_id)
            labels = batch["labels"]
            em = model._batch_emissions({k: batch[k] for k in (*ENCODER_INPUTS, "rule_features")
                                         if k in batch}).double()
            marg = model._marginals_from_emissions(em, labels != -100)
            gold = marg.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            nll = -torch.log(gold.clamp(min=1e-12))
            for r, (k, (_, picked)) in enumerate(chunk):
                loss[k] = float(nll[r, picked].sum())
    return [[sum(loss[k] for k in ks) for ks in per_cand] for per_cand in keys]


def score(losses: Sequence[float]) -> CanaryScore:
    """Membership score and Secret-Sharer exposure from ``[true, alt_1, ..., alt_R]`` losses.

    The score is ``ln(median(alt)) - ln(true)``: positive when the model finds the true secret
    more PHI-like than random secrets of the same format in the same notes. A log-ratio rather
    than a difference because a canary whose context is hard has larger losses for every
    candidate; the median rather than a mean and a per-canary spread because with a few
    alternatives one outlier would otherwise swing the score (on tiny models this separated
    included from excluded canaries markedly better than a z-score).
    """
    import numpy as np

    true, alt = float(losses[0]), np.asarray(losses[1:], dtype=np.float64)
    tiny = 1e-9
    s = math.log(max(float(np.median(alt)), tiny)) - math.log(max(true, tiny))
    rank = 1.0 + float(np.sum(alt < true)) + 0.5 * float(np.sum(alt == true))
    exposure = math.log2(alt.size + 1) - math.log2(rank)
    return CanaryScore(s, true, rank, exposure)


# --------------------------------------------------------------------------------------------
# the audit run
# --------------------------------------------------------------------------------------------


#: Canary patients of the black-box audit when ``--canaries`` is not given.
DEFAULT_PATIENT_CANARIES = 64
#: What the canary-patient audit does not test (the report says so).
OUTSIDE_PATIENT_AUDIT: tuple[str, ...] = (
    "its detection limit (the smallest noise it would flag) is not measured: the signal depends "
    "on the model and the data, so no simulation of the released output reproduces it",
    "composition across releases: federated rounds, --init-from and distill are each audited "
    "alone, if at all",
)


@dataclass
class AuditOptions:
    """What ``dphub audit`` adds to the training options.

    ``method``: ``gradient`` (white-box Dirac gradient canaries, the default) or ``patients``
    (black-box canary patients). ``canaries`` None: :func:`gradient_canary_count` for gradient
    canaries, :data:`DEFAULT_PATIENT_CANARIES` for canary patients. The note options apply to
    canary patients only.
    """

    canaries: int | None = None
    notes_per_canary: int = 2
    candidates: int = 15
    confidence: float = 0.95
    kind: str = "nursing"
    #: cut canary note bodies to this many characters (None: whole synth notes)
    max_note_chars: int | None = None
    method: str = "gradient"
    #: gradient canaries: the fraction abstained on, those closest to the guess threshold
    #: (None: ``auto``, the fraction with the largest simulated detection limit)
    abstain: float | None = None

    def validate(self) -> None:
        if self.method not in SETTINGS:
            raise ConfigError(f"--method must be gradient or patients, got {self.method!r}")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"--confidence must be in [0.5, 1), got {self.confidence}")
        if self.kind not in ("nursing", "discharge"):
            raise ConfigError(f"--canary-kind must be nursing or discharge, got {self.kind!r}")
        if self.canaries is not None and self.canaries < 2:
            raise ConfigError(f"--canaries must be at least 2, got {self.canaries}")
        if self.canaries is not None and self.canaries > MAX_GRADIENT_CANARIES:
            raise ConfigError(f"--canaries must be at most {MAX_GRADIENT_CANARIES}, "
                              f"got {self.canaries}")
        if self.abstain is not None and not 0 <= self.abstain <= 0.95:
            raise ConfigError(f"--abstain must be auto or in [0, 0.95], got {self.abstain}")
        if self.max_note_chars is not None and self.max_note_chars < 0:
            raise ConfigError(f"--canary-note-chars must be >= 0, got {self.max_note_chars}")


@dataclass
class AuditResult:
    """What an audit found; ``block`` is the card's ``empirical_audit``."""

    train: Any
    block: dict[str, Any]
    scores: list[CanaryScore] = field(repr=False, default_factory=list)
    #: wall seconds of the training run and of the audit's own work (scoring the candidates)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return str(self.block["verdict"])

    @property
    def epsilon_lower_bound(self) -> float:
        return float(self.block["epsilon_lower_bound"])

    @property
    def attack_works(self) -> bool:
        """Only meaningful for non-private runs: did the attack reach a clearly positive bound?"""
        return self.epsilon_lower_bound >= ATTACK_MIN_EPSILON


def _tokenizer_for(opts: Any) -> Any:
    """The tokenizer the run will use (the base model's, or the ``--init-from`` model's)."""
    from transformers import AutoTokenizer

    if opts.init_from:
        p = Path(str(opts.init_from)).expanduser()
        if not p.is_dir():
            p = Path(resolve_model(str(opts.init_from)))
        return AutoTokenizer.from_pretrained(p)

    loadable, public_id = resolve_base_model(opts.base_model)
    if isinstance(loadable, str):
        raise ConfigError(f"base model {public_id!r} is not a local directory; pass --base-model")
    return AutoTokenizer.from_pretrained(loadable)


def audit_block(scores: Sequence[CanaryScore], canaries: Sequence[Canary], *, delta: float,
                proven_epsilon: float | None, audit: AuditOptions,
                today: dt.date | None = None) -> dict[str, Any]:
    """The card's ``empirical_audit`` block (numbers and fixed names only; no canary secrets)."""
    included = [c.included for c in canaries]
    bound = one_run_bound([s.score for s in scores], included, delta, audit.confidence)
    inc = [s.exposure for s, c in zip(scores, canaries, strict=True) if c.included]
    exc = [s.exposure for s, c in zip(scores, canaries, strict=True) if not c.included]
    ceiling = max_possible_bound(len(canaries), delta, audit.confidence)
    verdict = judge(bound.epsilon, ceiling, proven_epsilon)

    def mean(xs: Sequence[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    return {
        "method": METHOD,
        "setting": SETTINGS["patients"],
        "signal": SIGNAL,
        "canaries": {"count": len(canaries), "included": sum(included),
                     "notes_per_canary": audit.notes_per_canary, "inclusion_probability": 0.5,
                     "note_kind": audit.kind, "synthetic": True},
        "guesses": bound.guesses,
        "correct": bound.correct,
        "epsilon_lower_bound": round(bound.epsilon, 4),
        "max_possible_bound": round(ceiling, 4),
        "confidence": audit.confidence,
        "delta": float(delta),
        "proven_epsilon": None if proven_epsilon is None else round(float(proven_epsilon), 4),
        "verdict": verdict,
        "verdict_reason": verdict_reason(verdict, bound=bound.epsilon, ceiling=ceiling,
                                         proven=proven_epsilon, count=len(canaries),
                                         confidence=audit.confidence),
        "detection": {
            # the signal depends on the model and the data: no simulation reproduces it
            "measured": "not-measured",
            # an audit that could not have failed flags no noise level at all
            "noise_factor": 0.0 if verdict == "inconclusive" else None,
            "outside": list(OUTSIDE_PATIENT_AUDIT),
        },
        "exposure": {
            "candidates": audit.candidates + 1,
            "max_bits": round(math.log2(audit.candidates + 1), 4),
            "mean_included": mean(inc),
            "mean_excluded": mean(exc),
            "max_included": round(max(inc), 4) if inc else None,
        },
        "date": (today or dt.datetime.now(dt.UTC).date()).isoformat(),
    }


def gradient_block(canaries: GradientCanaries, *, delta: float, proven_epsilon: float | None,
                   confidence: float, abstain: float | None = None,
                   today: dt.date | None = None, rng: Any = None) -> dict[str, Any]:
    """The card's ``empirical_audit`` block of a white-box gradient-canary audit.

    The canaries are guessed "in" above :attr:`GradientCanaries.threshold` (a fixed threshold
    rather than "the top half" because the number of included canaries is itself random, and a
    top-half rule would cost a noise-free mechanism its perfect score), except the ``abstain``
    fraction closest to it (:func:`gradient_correct`); ``abstain`` None: the fraction with the
    largest simulated detection limit at the run's public settings (:func:`choose_abstain`),
    picked before the sums are looked at. ``detection``: the detection limit
    (:func:`detection_limit`, simulated with ``rng``, None: OS entropy) and what is outside.
    """
    m = canaries.count
    chosen = abstain is None
    sigma = float(canaries.noise_multiplier or 0.0)
    settings = dict(sample_rate=float(canaries.sample_rate or 1.0), steps=canaries.steps,
                    noise_multiplier=sigma, delta=delta, confidence=confidence,
                    claimed_epsilon=math.inf if proven_epsilon is None else float(proven_epsilon))
    if abstain is None:
        abstain, limit = choose_abstain(m, rng=rng, **settings)
    else:
        limit = detection_limit(m, abstain=abstain, rng=rng, **settings)
    guesses, correct = gradient_correct(canaries.sums, canaries.included, canaries.threshold,
                                        abstain)
    bound = epsilon_lower_bound(m, guesses, correct, delta, confidence)
    ceiling = epsilon_lower_bound(m, guesses, guesses, delta, confidence)
    verdict = judge(bound, ceiling, proven_epsilon)
    return {
        "method": METHOD,
        "setting": SETTINGS["gradient"],
        "signal": GRADIENT_SIGNAL,
        "canaries": {"count": m, "included": int(canaries.included.sum()),
                     "inclusion_probability": 0.5, "form": "dirac-gradient", "synthetic": True},
        "gradient": {"norm": canaries.norm, "steps": canaries.steps},
        "guesses": guesses,
        "abstained": m - guesses,
        "correct": correct,
        "epsilon_lower_bound": round(bound, 4),
        "max_possible_bound": round(ceiling, 4),
        "confidence": confidence,
        "delta": float(delta),
        "proven_epsilon": None if proven_epsilon is None else round(float(proven_epsilon), 4),
        "verdict": verdict,
        "verdict_reason": verdict_reason(verdict, bound=bound, ceiling=ceiling,
                                         proven=proven_epsilon, count=m, confidence=confidence),
        "detection": {
            "measured": "simulated-released-sums",
            "noise_factor": round(limit.noise_factor, 3),
            "noise_multiplier": round(limit.noise_factor * sigma, 4),
            "recipe_noise_multiplier": round(sigma, 4),
            "abstain_fraction": abstain,
            "abstain_chosen": chosen,
            "simulated_bound_at_recipe": round(limit.bound_at_recipe, 4),
            "repetitions": limit.repetitions,
            "statistic": "share-flagging",
            "power": limit.power,
            "outside": list(OUTSIDE_GRADIENT_AUDIT),
        },
        "date": (today or dt.datetime.now(dt.UTC).date()).isoformat(),
    }


def run_audit(opts: Any, audit: AuditOptions, *,
              on_progress: Callable[[Any], None] | None = None,
              on_plan: Callable[[Any], None] | None = None) -> AuditResult:
    """Train as ``dphub train`` would, with canary patients added; audit; write the model dir.

    The model is trained into a hidden sibling of ``opts.out`` and moved into place only after
    the audit block is in its card, so ``opts.out`` never holds an unaudited model. Raises
    :class:`DphubError` subclasses for bad options, and :class:`AuditFailed` (nothing written)
    when the empirical bound exceeds the proven ε. ``on_plan`` is :func:`dphub.train.train`'s:
    it sees the privacy plan (canary units included) before the first step, and may stop it.
    """
    audit.validate()
    opts.validate()
    if opts.privacy_unit != "patient":
        raise ConfigError(
            "dphub audit inserts canary *patients*: it audits patient-level guarantees only "
            f"(got --privacy-unit {opts.privacy_unit})"
        )
    if opts.resume:
        raise ConfigError("dphub audit cannot --resume (the canaries are fresh on every run)")
    if audit.method == "gradient" and opts.no_dp:
        raise ConfigError(
            "the gradient-canary audit audits the DP noise step, which a --no-dp run does not "
            "have; use --method patients to measure the black-box attack without DP"
        )
    out = Path(opts.out)
    training.check_output_dir(out, Path(opts.data), force=opts.force)
    extra: list[Note] = []
    canaries: list[Canary] = []
    gradient: GradientCanaries | None = None
    if audit.method == "patients":
        pool = name_pool(_tokenizer_for(opts))
        canaries = make_canaries(audit.canaries or DEFAULT_PATIENT_CANARIES, pool,
                                 notes_per_canary=audit.notes_per_canary,
                                 alternatives=audit.candidates, kind=audit.kind,
                                 max_note_chars=audit.max_note_chars)
        extra = [n for c in canaries if c.included for n in c.notes()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.audit-{os.getpid()}-{secrets.token_hex(3)}"
    run_opts = replace(opts, out=tmp, force=False,
                       checkpoint_dir=opts.checkpoint_dir or training.checkpoint_dir_for(out))
    scores: list[CanaryScore] = []
    t0 = time.monotonic()
    try:
        if audit.method == "gradient":
            # the count that maximises the ceiling needs δ, known once the plan is: the
            # canaries are drawn when the loop installs them (gradient_audit is a factory)
            def install(optimizer: Any, plan: Any) -> None:
                nonlocal gradient
                gradient = GradientCanaries(
                    audit.canaries or gradient_canary_count(float(plan.delta), audit.confidence))
                gradient.install(optimizer, plan.sample_rate)

            result = training.train(run_opts, on_progress=on_progress, on_plan=on_plan,
                                    gradient_audit=install)
        else:
            result = training.train(run_opts, on_progress=on_progress, on_plan=on_plan,
                                    extra_notes=extra)
        t1 = time.monotonic()
        delta = result.delta if result.delta is not None else training.default_delta(
            result.num_units)
        if gradient is not None:
            block = gradient_block(gradient, delta=delta, proven_epsilon=result.epsilon,
                                   confidence=audit.confidence, abstain=audit.abstain)
            count = gradient.count
        else:
            losses = secret_losses(tmp, canaries)
            scores = [score(x) for x in losses]
            block = audit_block(scores, canaries, delta=delta, proven_epsilon=result.epsilon,
                                audit=audit)
            count = len(canaries)
        if block["verdict"] == "failed":
            raise AuditFailed(
                f"audit FAILED: empirical ε lower bound {block['epsilon_lower_bound']:.3g} "
                f"exceeds the proven ε {block['proven_epsilon']:.3g} at "
                f"{block['confidence']:.0%} confidence ({block['correct']} of "
                f"{block['guesses']} membership guesses right on {count} canaries); the "
                "training mechanism does not deliver its claimed guarantee, so no model was "
                f"written to {out}",
                block,
            )
        meta = load_card(tmp).meta
        meta["empirical_audit"] = block
        write_card(tmp, meta)
        move_into_place(tmp, out, overwrite=opts.force)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    result.out_dir = out
    seconds = {"train": round(t1 - t0, 1), "audit": round(time.monotonic() - t1, 1)}
    return AuditResult(result, block, scores, seconds)
