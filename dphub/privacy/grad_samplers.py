"""Per-sample gradients for layers Opacus does not know: pytorch-crf's ``CRF``.

Opacus computes per-sample gradients layer by layer from the layer's saved inputs ("activations")
and the gradient of the loss w.r.t. its output ("backprops"). For layers without a registered
grad sampler it falls back to ``torch.func`` and re-calls the layer with its *first* input only,
which fails for ``CRF.forward(emissions, tags, mask)``. This module registers a grad sampler for
``torchcrf.CRF`` (used in ``hooks`` mode, and by ``ghost`` mode, which falls back to grad samplers
for layers without a norm sampler and takes the norms).

Contract with the caller (``dphub.tagger.TaggerModel.per_sample_loss``): the CRF is called as
``crf(emissions, tags, mask, reduction="none")`` with ``batch_first=True`` and a boolean mask whose
first column is all on, so its output ``[B]`` holds one log-likelihood per sample and the three
positional inputs are what Opacus saves. The sampler recomputes each sample's log-likelihood with
per-sample copies of ``start_transitions``, ``end_transitions`` and ``transitions`` (sample ``b``
only ever touches copy ``b``), differentiates the sum once with autograd, which yields all
per-sample gradients at once, and multiplies them by the backprops. The result is exact, not an
approximation, which the parity test in ``tests/test_privacy_parity.py`` checks against a naive
per-example loop.

Importing this module registers the sampler; ``dphub.tagger`` imports it, so any code that builds
a ``TaggerModel`` gets it.
"""

from __future__ import annotations

import torch
from opacus.grad_sample import register_grad_sampler
from torchcrf import CRF


def crf_log_likelihood(
    emissions: torch.Tensor,
    tags: torch.Tensor,
    mask: torch.Tensor,
    start: torch.Tensor,
    end: torch.Tensor,
    transitions: torch.Tensor,
) -> torch.Tensor:
    """Per-sample CRF log-likelihood ``[B]`` (batch first), parameters shared or per sample.

    ``start``/``end`` are ``[T]`` or ``[B, T]``, ``transitions`` is ``[T, T]`` or ``[B, T, T]``
    (``transitions[b, i, j]`` scores tag ``i`` followed by tag ``j``, as in pytorch-crf). Mask
    semantics follow pytorch-crf: each row's valid positions are a prefix starting at position 0.
    The arithmetic mirrors ``torchcrf.CRF._compute_score`` / ``_compute_normalizer`` so that the
    per-sample gradients are the gradients of exactly the value the CRF returned.
    """
    batch, length, num_tags = emissions.shape
    if start.dim() == 1:
        start = start.expand(batch, num_tags)
    if end.dim() == 1:
        end = end.expand(batch, num_tags)
    if transitions.dim() == 2:
        transitions = transitions.expand(batch, num_tags, num_tags)
    maskf = mask.to(emissions.dtype)
    rows = torch.arange(batch, device=emissions.device)

    # numerator: score of the gold path
    score = start[rows, tags[:, 0]] + emissions[rows, 0, tags[:, 0]]
    for i in range(1, length):
        step = transitions[rows, tags[:, i - 1], tags[:, i]] + emissions[rows, i, tags[:, i]]
        score = score + step * maskf[:, i]
    seq_ends = mask.long().sum(dim=1) - 1
    last_tags = tags[rows, seq_ends.clamp(min=0)]
    score = score + end[rows, last_tags]

    # denominator: log partition function by the forward algorithm
    alpha = start + emissions[:, 0]
    for i in range(1, length):
        nxt = torch.logsumexp(
            alpha.unsqueeze(2) + transitions + emissions[:, i].unsqueeze(1), dim=1
        )
        alpha = torch.where(mask[:, i].unsqueeze(1), nxt, alpha)
    log_z = torch.logsumexp(alpha + end, dim=1)
    return score - log_z


@register_grad_sampler(CRF)
def compute_crf_grad_sample(
    layer: CRF, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[torch.nn.Parameter, torch.Tensor]:
    """Opacus grad sampler for ``torchcrf.CRF`` called with ``reduction="none"``.

    ``activations`` are the saved positional inputs ``(emissions, tags, mask)``; ``backprops`` is
    ``dL/d llh_b`` of shape ``[B]`` (already scaled by Opacus for ``loss_reduction="mean"``).
    Returns ``{param: [B, *param.shape]}`` for the CRF parameters that require grad.
    """
    if not layer.batch_first:
        raise ValueError("dphub's CRF grad sampler needs CRF(batch_first=True)")
    if len(activations) < 3:
        raise ValueError(
            "the CRF must be called as crf(emissions, tags, mask, reduction='none') "
            "for per-sample gradients"
        )
    emissions, tags, mask = activations[0], activations[1], activations[2]
    params = {
        "start": layer.start_transitions,
        "end": layer.end_transitions,
        "transitions": layer.transitions,
    }
    wanted = {k: p for k, p in params.items() if p.requires_grad}
    batch = emissions.shape[0]
    if batch == 0:
        return {p: torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
                for p in wanted.values()}
    if backprops.dim() != 1 or backprops.shape[0] != batch:
        raise ValueError(
            "the CRF must return one log-likelihood per sample (reduction='none') "
            f"for per-sample gradients; got output gradient of shape {tuple(backprops.shape)}"
        )
    dtype = emissions.dtype
    with torch.enable_grad():
        copies = {
            k: p.detach().to(dtype).unsqueeze(0).expand(batch, *p.shape).clone().requires_grad_(
                k in wanted
            )
            for k, p in params.items()
        }
        llh = crf_log_likelihood(
            emissions.detach(),
            tags,
            mask.bool(),
            copies["start"],
            copies["end"],
            copies["transitions"],
        )
        names = list(wanted)
        grads = torch.autograd.grad(llh.sum(), [copies[k] for k in names])
    out: dict[torch.nn.Parameter, torch.Tensor] = {}
    for k, g in zip(names, grads, strict=True):
        scale = backprops.to(g.dtype).view(batch, *([1] * (g.dim() - 1)))
        out[wanted[k]] = (g * scale).to(wanted[k].dtype)
    return out
