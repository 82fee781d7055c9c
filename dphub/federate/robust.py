"""What a lying minority of sites can do to the global model, bounded (issue 53).

The per-coordinate reach of :mod:`dphub.federate.reports` stops garbage (1e30, NaN, another
shape) but not a site that pushes, inside that reach, in a direction that hurts: one rogue of
three sending 0.3 × the reach towards "no PHI" took the federated model's held-out recall from
0.68 to 0.01 with ``mean``, and coordinate-wise ``median`` of three still lost most of it. Three
defences, each costing no privacy budget (they read only what the server already receives, the
sites' DP-trained weights, and public synthetic notes):

* **norm clipping to the median** (Sun et al. 2019, "Can you really backdoor federated
  learning?"): each accepted update (new weights minus global, per tensor) is scaled down to
  the median L2 norm of that tensor's updates this round, so one site cannot move a tensor
  further than a typical (honest, with a minority of liars) site does;
* **the public probe** (:mod:`dphub.card.probe`, the publish gate's own public notes): the server
  tags the probe notes with the global weights plus each site's clipped update, and drops a
  site whose candidate's token recall there is more than :data:`PROBE_MARGIN` below the median
  site's; with three or more sites the median is an honest site's while the
  liars are a minority;
* **trimmed mean that trims at three sites** (:func:`trimmed_mean`): Flower's
  ``aggregate_trimmed_avg`` cuts ``int(0.2 n)`` per end, none below five sites.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from dphub.card.probe import probe_notes, token_recall
from dphub.federate import reports
from dphub.scores import spans_from_scores
from dphub.tagger import Tagger

#: a site's candidate (global + its update) is dropped when its token recall on the probe notes is
#: more than this below the median site's. Measured (docs/federated.md, "One rogue of three",
#: a synthetic corpus): honest sites of one federation lie at most 0.064 below the median; a
#: rogue at an honest norm pushing towards "no PHI" 0.12-0.33 below it. Half the median (the
#: publish gate's FLOOR_SHARE) let that rogue through and cost 12 points of held-out recall.
PROBE_MARGIN = 0.10
#: the probe check needs a majority to compare with: below this many trained sites it is skipped
PROBE_MIN_SITES = 3
#: trimmed-mean: the share cut at each end, per coordinate; at least one per end from 3 sites on
TRIM_PROPORTION = 0.2


def card_block(aggregation: str, dropped_per_round: Sequence[int | None]) -> dict[str, Any]:
    """The card's ``federation.robustness``: the server's defences as run (settings only) and
    how many site replies it dropped in each round (None: not recorded, a resumed older
    checkpoint). Each drop is decided from the sites' reports, their DP-trained weights and
    the public probe notes: post-processing of what the guarantee covers, so its count is
    inside it."""
    block: dict[str, Any] = {
        # multiples of lr x local steps (rule tensors: x rule_lr_scale), per tensor
        "update_bounds": {"per_coordinate": reports.ADAM_STEP_BOUND,
                          "rms": reports.ADAM_RMS_BOUND},
        "norm_clipping": "median",
        "probe_check": {"margin": PROBE_MARGIN, "min_sites": PROBE_MIN_SITES},
        "dropped_per_round": list(dropped_per_round),
    }
    if aggregation == "trimmed-mean":
        block["trim"] = {"proportion": TRIM_PROPORTION, "at_least_one_from_sites": 3}
    return block


def updates(trained: Sequence[Mapping[str, torch.Tensor]],
            global_weights: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Each site's update (its weights minus the global weights), in float64."""
    return [{n: w[n].to(torch.float64) - g.to(torch.float64) for n, g in global_weights.items()}
            for w in trained]


def clip_to_median(deltas: list[dict[str, torch.Tensor]]) -> tuple[list[dict[str, torch.Tensor]],
                                                                  float]:
    """Every update's tensors scaled down to the median L2 norm of that tensor over the sites;
    also returns the largest scale-down applied (1.0: nothing clipped)."""
    if len(deltas) < 2:
        return deltas, 1.0
    out = [dict(d) for d in deltas]
    worst = 1.0
    for name in deltas[0]:
        norms = [float(d[name].norm()) for d in deltas]
        cap = statistics.median(norms)
        for d, norm in zip(out, norms, strict=True):
            if norm > cap > 0 or (cap == 0 and norm > 0):
                scale = cap / norm
                d[name] = d[name] * scale
                worst = min(worst, scale)
    return out, worst


def trim_count(n: int) -> int:
    """Values cut at each end of a coordinate: ``int(0.2 n)``, at least one from 3 sites."""
    return max(1, int(TRIM_PROPORTION * n)) if n >= 3 else 0


def trimmed_mean(stack: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise mean over dim 0 after cutting :func:`trim_count` values at each end."""
    k = trim_count(stack.shape[0])
    s = torch.sort(stack, dim=0).values
    return s[k: stack.shape[0] - k].mean(dim=0)


def coordinate_median(stack: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median over dim 0 (the mean of the two middle values for an even count)."""
    n = stack.shape[0]
    s = torch.sort(stack, dim=0).values
    return s[(n - 1) // 2: n // 2 + 1].mean(dim=0)


class ProbeScreen:
    """The server's view of what a candidate model does on the public probe notes.

    Encodes the probe notes once with the server's (frozen) encoder; each candidate then costs
    one pass of the head and the CRF over about 8 short notes. The model's trainable
    parameters are restored after each measurement.
    """

    def __init__(self, model: torch.nn.Module, tokenizer_dir: Path) -> None:
        from transformers import AutoTokenizer  # heavy: loaded only when the server probes

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)
        was_training = model.training
        self.tagger = Tagger(model, tokenizer)
        model.train(was_training)
        self.model = model
        self.notes = probe_notes()
        self._encoded: Any = None

    def recall(self, weights: Mapping[str, torch.Tensor]) -> float:
        """Token recall on the probe notes of the model with these trainable weights."""
        params = dict(self.model.named_parameters())
        saved = {n: params[n].detach().clone() for n in weights}
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for n, w in weights.items():
                    params[n].copy_(w.to(params[n].dtype))
            if self._encoded is None:
                self._encoded = self.tagger.encode(self.notes)
            scores = self.tagger.token_scores(self.notes, marginals=False,
                                              encoded=self._encoded)
            spans = [spans_from_scores(ts, None) for ts in scores]
            return token_recall(self.notes, spans)[0]
        finally:
            with torch.no_grad():
                for n, t in saved.items():
                    params[n].copy_(t)
            self.model.train(was_training)


def probe_outliers(recalls: Sequence[float]) -> list[int]:
    """Indices of the candidates whose probe recall is more than :data:`PROBE_MARGIN` below the
    median's (none below :data:`PROBE_MIN_SITES` candidates)."""
    if len(recalls) < PROBE_MIN_SITES:
        return []
    ref = statistics.median(recalls)
    return [i for i, r in enumerate(recalls) if r < ref - PROBE_MARGIN]
