"""Inference speed paths of the tagger: scaled forward-backward marginals, the no-marginals
(Viterbi only) path of ``Tagger.token_scores``/``tag`` and of ``ModelMember.tag``."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dphub.ensemble.members import ModelMember
from dphub.notes import Note
from dphub.runtime import ONEDNN_CACHE_CAPACITY, ONEDNN_CACHE_ENV
from dphub.tagger import Tagger, TaggerModel
from dphub.tagger_model import crf_marginals


def _brute_force_marginals(em, length, start, end, trans):
    """P(y_t = j) by enumerating every tag path of one sequence (tiny sizes only)."""
    num_tags = em.shape[-1]
    probs = torch.zeros(length, num_tags, dtype=torch.float64)
    total = torch.tensor(0.0, dtype=torch.float64)
    for path in itertools.product(range(num_tags), repeat=length):
        s = start[path[0]] + end[path[-1]] + sum(em[t, path[t]] for t in range(length))
        s = s + sum(trans[path[t - 1], path[t]] for t in range(1, length))
        w = torch.exp(s)
        total = total + w
        for t, j in enumerate(path):
            probs[t, j] += w
    return probs / total


def test_crf_marginals_equal_brute_force_enumeration_with_prefix_masks():
    g = torch.Generator().manual_seed(3)
    num_tags, length = 3, 5
    em = torch.randn(3, length, num_tags, generator=g, dtype=torch.float64) * 2
    start, end = (torch.randn(num_tags, generator=g, dtype=torch.float64) for _ in range(2))
    trans = torch.randn(num_tags, num_tags, generator=g, dtype=torch.float64)
    lengths = [5, 3, 1]
    mask = torch.arange(length).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    got = crf_marginals(em, mask, start, end, trans)
    for b, k in enumerate(lengths):
        want = _brute_force_marginals(em[b], k, start, end, trans)
        assert torch.allclose(got[b, :k], want, atol=1e-12), b


def test_crf_marginals_stay_finite_with_extreme_scores_and_forbidden_transitions():
    g = torch.Generator().manual_seed(0)
    num_tags, length = 5, 128
    em = torch.randn(2, length, num_tags, generator=g, dtype=torch.float64) * 400
    trans = torch.randn(num_tags, num_tags, generator=g, dtype=torch.float64)
    trans[0, 1] = -1e4  # a forbidden transition (exp underflows to exactly 0)
    start = torch.zeros(num_tags, dtype=torch.float64)
    mask = torch.ones(2, length, dtype=torch.bool)
    got = crf_marginals(em, mask, start, start, trans)
    assert torch.isfinite(got).all()
    assert torch.allclose(got.sum(-1), torch.ones(2, length, dtype=torch.float64), atol=1e-9)


def test_crf_marginals_accept_float32_crf_parameters_with_float64_emissions():
    em = torch.randn(1, 4, 3, dtype=torch.float64)
    p = crf_marginals(em, torch.ones(1, 4, dtype=torch.bool), torch.zeros(3), torch.zeros(3),
                      torch.zeros(3, 3))
    assert p.dtype == torch.float64
    # no transitions: marginals are the per-position softmax
    assert torch.allclose(p, em.softmax(-1), atol=1e-12)


@pytest.fixture(scope="module")
def tagger(tiny_base_model, tmp_path_factory) -> Tagger:
    torch.manual_seed(1)
    model = TaggerModel.from_base(tiny_base_model, head="crf")
    with torch.no_grad():  # strong transitions, so marginals and softmax clearly differ
        model.crf.transitions.normal_(0.0, 3.0)
    d = tmp_path_factory.mktemp("speed") / "tiny-crf"
    model.save(d)
    return Tagger.load(d)


NOTES = [
    Note("a", "Seen by Dr. Alice Smith on 03/04/2021 at Boston General, MRN 12345."),
    Note("b", "pt stable. " * 60),
    Note("c", "ok"),
]


def test_no_marginals_path_keeps_decoded_tags_and_offsets(tagger):
    full = tagger.token_scores(NOTES, batch_size=2)
    fast = tagger.token_scores(NOTES, batch_size=2, marginals=False)
    for f, q in zip(full, fast, strict=True):
        assert q.decoded == f.decoded
        np.testing.assert_array_equal(q.offsets, f.offsets)
        assert q.phi_prob.shape == f.phi_prob.shape
        assert ((q.phi_prob >= 0) & (q.phi_prob <= 1)).all()
    # the fast path's phi_prob is the emissions' softmax, not the CRF marginal
    assert not np.allclose(full[0].phi_prob, fast[0].phi_prob)


def test_tag_without_threshold_gives_the_decoded_spans(tagger):
    full = tagger.token_scores(NOTES)
    from dphub.scores import spans_from_scores

    want = [[(s.start, s.end, s.label) for s in spans_from_scores(ts, None)] for ts in full]
    got = [[(s.start, s.end, s.label) for s in spans] for spans in tagger.tag(NOTES)]
    assert got == want


def test_model_member_decodes_fast_but_respects_overridden_token_scores(tagger, monkeypatch):
    calls: list[bool] = []
    original = Tagger.token_scores

    def spy(self, notes, batch_size=16, marginals=True):
        calls.append(marginals)
        return original(self, notes, batch_size=batch_size, marginals=marginals)

    monkeypatch.setattr(Tagger, "token_scores", spy)
    ModelMember(tagger, "m").tag(NOTES[:1])
    ModelMember(tagger, "m").tag(NOTES[:1], threshold=0.5)
    assert calls == [False, True]

    class Cached(ModelMember):
        def token_scores(self, notes):
            calls.append("cached")
            return super().token_scores(notes)

    calls.clear()
    Cached(tagger, "c").tag(NOTES[:1])
    assert calls == ["cached", True]


@pytest.mark.parametrize("preset", [None, "5"])
def test_kernel_cache_is_bounded_before_any_model_runs(preset: str | None) -> None:
    """Importing the tagger caps oneDNN's kernel cache (memory flat over long bf16 runs), unless
    the user chose a size; a fresh process, because oneDNN reads the variable once."""
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_CACHE_ENV}
    if preset is not None:
        env[ONEDNN_CACHE_ENV] = preset
    code = f"import os, dphub.tagger; print(os.environ.get({ONEDNN_CACHE_ENV!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == (preset or str(ONEDNN_CACHE_CAPACITY))


def test_encoder_sees_lengths_on_the_shape_grid_and_outputs_do_not_change(tagger, monkeypatch):
    """Inference batches are padded to a multiple of SHAPE_MULTIPLE word pieces (bounded native
    per-shape state, docs/speed.md); the mask hides the padding, so scores and tags are those of
    unpadded batches, on the model's own path and on the shared-encoder path."""
    import dphub.tagger as tagger_module
    from dphub.runtime import SHAPE_MULTIPLE

    lengths: list[int] = []
    encoder = tagger.model.encoder
    hook = encoder.register_forward_pre_hook(
        lambda _m, _args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        padded = tagger.token_scores(NOTES, batch_size=2)
        shared = tagger.token_scores(NOTES, batch_size=2, encoded=tagger.encode(NOTES, 2))
        assert lengths and all(n % SHAPE_MULTIPLE == 0 for n in lengths)
        lengths.clear()
        monkeypatch.setattr(tagger_module, "SHAPE_MULTIPLE", 1)
        plain = tagger.token_scores(NOTES, batch_size=2)
        assert any(n % SHAPE_MULTIPLE for n in lengths)  # the comparison is with ragged lengths
    finally:
        hook.remove()
    for p, s, q in zip(padded, shared, plain, strict=True):
        assert p.decoded == q.decoded == s.decoded
        np.testing.assert_allclose(p.phi_prob, q.phi_prob, atol=1e-5)
        np.testing.assert_allclose(s.phi_prob, q.phi_prob, atol=1e-5)
        np.testing.assert_allclose(p.label_probs, q.label_probs, atol=1e-5)
