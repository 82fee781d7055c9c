"""Proofs that Opacus computes the per-sample gradients DP-SGD needs for dphub's tagger.

With noise 0 and clipping effectively off, every trainable parameter's per-sample gradient from
Opacus (hooks mode; norms in ghost mode) must equal a naive per-example autograd loop — CRF
transitions, start/end, embeddings, LoRA adapters and the rule-feature projection included. With clipping on, every clipped
per-sample gradient has norm <= C. Tiny models, float64, CPU, seconds.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.grad_sample.grad_sample_module import GradSampleHooks
from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import (
    GradSampleHooksFastGradientClipping,
)
from torch.utils.data import DataLoader, Dataset
from torchcrf import CRF

from dphub.tagger import TaggerModel

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

TOL = 1e-5
ENCODER_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def _no_dropout(model: torch.nn.Module) -> None:
    """Dropout masks differ between the naive loop and the Opacus pass; parity needs none."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


def _make_model(base, head: str, train_layers: int | None, lora_rank: int | None,
                rule_features: bool = False) -> TaggerModel:
    torch.manual_seed(1)
    model = TaggerModel.from_base(base, head=head, rule_features=rule_features)
    model.set_trainable(train_layers=train_layers, lora_rank=lora_rank)
    if rule_features:
        # rule_proj starts at zero; random weights make the rule features shape the emissions
        # (and so every other parameter's gradient), not only rule_proj's own
        with torch.no_grad():
            model.rule_proj.weight.normal_(0.0, 0.5)
    if lora_rank:
        # peft initialises lora_B to zero, which makes lora_A's gradient identically zero: a
        # parity check on zeros proves nothing, so start from random adapters.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.normal_(0.0, 0.5)
    model.double()
    _no_dropout(model)
    model.train()
    return model


def _make_batch(n: int, length: int, num_tags: int, seed: int = 0, rule_features: bool = False):
    """Windows of different lengths: [CLS] pieces [SEP] padding, tags -100 off the pieces; with
    ``rule_features`` also random 0/1 rule flags on the pieces (zeros elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [length - (i % 4) * 2 for i in range(n)]
    ids = torch.zeros((n, length), dtype=torch.long)
    att = torch.zeros((n, length), dtype=torch.long)
    tags = torch.full((n, length), -100, dtype=torch.long)
    for i, k in enumerate(lengths):
        ids[i, 0], ids[i, k - 1] = 101, 102
        ids[i, 1 : k - 1] = torch.randint(1000, 8000, (k - 2,), generator=g)
        att[i, :k] = 1
        tags[i, 1 : k - 1] = torch.randint(0, num_tags, (k - 2,), generator=g)
    batch = {
        "input_ids": ids,
        "attention_mask": att,
        "token_type_ids": torch.zeros((n, length), dtype=torch.long),
        "position_ids": torch.arange(length).expand(n, length).contiguous(),
    }
    if rule_features:
        from dphub.rule_features import NUM_FEATURES

        flags = torch.randint(0, 2, (n, length, NUM_FEATURES), generator=g).double()
        batch["rule_features"] = flags * (tags != -100).unsqueeze(-1).double()
    return batch, tags


def _naive_grads(model: TaggerModel, batch, tags) -> list[dict[str, torch.Tensor]]:
    """Gradient of each window's own loss, one autograd call per window."""
    out = []
    for i in range(tags.shape[0]):
        model.zero_grad(set_to_none=True)
        one = {k: v[i : i + 1] for k, v in batch.items()}
        model.per_sample_loss(one, tags[i : i + 1]).sum().backward()
        out.append(
            {
                n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in model.named_parameters()
                if p.requires_grad
            }
        )
    model.zero_grad(set_to_none=True)
    return out


class _WindowData(Dataset):
    def __init__(self, batch, tags) -> None:
        self.batch, self.tags = batch, tags

    def __len__(self) -> int:
        return self.tags.shape[0]

    def __getitem__(self, i):
        return tuple(self.batch[k][i] for k in _keys(self.batch)) + (self.tags[i],)


def _keys(batch) -> tuple[str, ...]:
    return ENCODER_KEYS + (("rule_features",) if "rule_features" in batch else ())


def _private(model: TaggerModel, batch, tags, max_grad_norm: float, mode: str = "hooks"):
    """make_private with noise 0 over a loader that yields the whole batch once."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    loader = DataLoader(_WindowData(batch, tags), batch_size=tags.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="prv")
        return engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=0.0,
            max_grad_norm=max_grad_norm,
            poisson_sampling=False,
            grad_sample_mode=mode,
            loss_reduction="sum",
        )


def _as_batch(items) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    *enc, tags = items
    keys = ENCODER_KEYS + (("rule_features",) if len(enc) > len(ENCODER_KEYS) else ())
    return dict(zip(keys, enc, strict=True)), tags


def _trainable_names(model: TaggerModel) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


CASES = [
    pytest.param("crf", None, None, False, id="crf-full-encoder"),
    pytest.param("crf", 1, None, False, id="crf-top-layer"),
    pytest.param("crf", 1, 2, False, id="crf-lora"),
    pytest.param("softmax", 1, None, False, id="softmax-top-layer"),
    pytest.param("crf", 0, None, True, id="crf-head-only-rule-features"),
    pytest.param("crf", 1, None, True, id="crf-top-layer-rule-features"),
    pytest.param("softmax", 0, None, True, id="softmax-rule-features"),
]


@pytest.mark.parametrize(("head", "train_layers", "lora_rank", "rules"), CASES)
def test_per_sample_gradients_equal_naive_loop(tiny_base_model, head, train_layers, lora_rank,
                                               rules):
    model = _make_model(tiny_base_model, head, train_layers, lora_rank, rule_features=rules)
    batch, tags = _make_batch(5, 12, len(model.tags), rule_features=rules)
    naive = _naive_grads(model, batch, tags)
    names = _trainable_names(model)
    if rules:
        assert {"rule_proj.weight", "rule_proj.bias"} <= set(names)
        # not vacuous: rule_proj's per-window gradients are non-zero and differ between windows
        g = [x["rule_proj.weight"] for x in naive]
        assert all(float(x.abs().sum()) > 0 for x in g) and not torch.allclose(g[0], g[1])
    if head == "crf":
        assert {"crf.transitions", "crf.start_transitions", "crf.end_transitions"} <= set(names)
    if lora_rank:
        assert any("lora_A" in n for n in names) and any("lora_B" in n for n in names)
        assert not any("query.base_layer" in n for n in names)
    if train_layers is None:
        assert any("word_embeddings" in n for n in names)

    gsm, optimizer, loader = _private(model, batch, tags, max_grad_norm=1e9)
    b, t = _as_batch(next(iter(loader)))
    gsm(b, t).sum().backward()

    params = dict(model.named_parameters())
    worst = 0.0
    for n in names:
        gs = params[n].grad_sample
        assert gs is not None and gs.shape == (tags.shape[0], *params[n].shape), n
        for i in range(tags.shape[0]):
            worst = max(worst, float((gs[i] - naive[i][n]).abs().max()))
    assert worst <= TOL, f"max abs difference {worst}"

    # the optimizer's step gradient (no noise, no clipping, sum reduction) = sum over samples
    optimizer.pre_step()
    for n in names:
        expected = sum(g[n] for g in naive)
        assert torch.allclose(params[n].grad, expected, atol=TOL, rtol=0), n


def test_crf_gradients_are_nonzero_and_per_sample(tiny_base_model):
    """Guards the parity test against vacuity: CRF per-sample grads differ across samples."""
    model = _make_model(tiny_base_model, "crf", 0, None)
    batch, tags = _make_batch(3, 10, len(model.tags), seed=3)
    naive = _naive_grads(model, batch, tags)
    g = [x["crf.transitions"] for x in naive]
    assert all(float(x.abs().sum()) > 0 for x in g)
    assert not torch.allclose(g[0], g[1])


@pytest.mark.parametrize("rules", [False, True])
def test_ghost_mode_norms_equal_naive_norms(tiny_base_model, rules):
    """Ghost clipping uses the CRF grad sampler for its norms; they match the naive norms."""
    model = _make_model(tiny_base_model, "crf", 1, None, rule_features=rules)
    batch, tags = _make_batch(4, 12, len(model.tags), seed=5, rule_features=rules)
    naive = _naive_grads(model, batch, tags)
    names = _trainable_names(model)
    expected = torch.stack(
        [torch.sqrt(sum((g[n] ** 2).sum() for n in names)) for g in naive]
    )
    gsm = GradSampleModuleFastGradientClipping(
        model, max_grad_norm=1e9, use_ghost_clipping=True, loss_reduction="sum"
    )
    gsm(batch, tags).sum().backward()
    norms = gsm.get_norm_sample()
    assert torch.allclose(norms, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("unit_rows", [False, True])
def test_clipped_per_sample_gradients_have_norm_at_most_c(tiny_base_model, unit_rows):
    """Run Opacus's own clipping (DPOptimizer.clip_and_accumulate) one sample at a time."""
    max_norm = 0.05
    model = _make_model(tiny_base_model, "crf", 1, None)
    batch, tags = _make_batch(4, 12, len(model.tags), seed=7)
    gsm, optimizer, loader = _private(model, batch, tags, max_grad_norm=max_norm)
    b, t = _as_batch(next(iter(loader)))
    gsm(b, t).sum().backward()
    if unit_rows:
        from dphub.privacy.units import aggregate_grad_sample_by_unit

        aggregate_grad_sample_by_unit(model, torch.tensor([0, 0, 1, 1]), 2)
    params = optimizer.params
    full = [p.grad_sample for p in params]
    raw_norms = torch.stack([g.reshape(g.shape[0], -1).norm(dim=1) for g in full]).norm(dim=0)
    assert float(raw_norms.min()) > max_norm, "test must exercise clipping"
    for i in range(full[0].shape[0]):
        for p, g in zip(params, full, strict=True):
            p.grad_sample = g[i : i + 1]
            p.summed_grad = None
        optimizer.clip_and_accumulate()
        clipped = torch.sqrt(sum((p.summed_grad**2).sum() for p in params))
        assert float(clipped) <= max_norm * (1 + 1e-6)
        assert float(clipped) == pytest.approx(max_norm, rel=1e-4)


def test_without_crf_grad_sampler_opacus_fails(tiny_base_model):
    """The registered sampler is what makes the CRF work: removing it breaks per-sample grads
    (Opacus's functorch fallback calls the CRF with its emissions only)."""
    registries = {id(d): d for d in (GradSampleHooks.GRAD_SAMPLERS,
                                      GradSampleHooksFastGradientClipping.GRAD_SAMPLERS)}
    saved = {k: d.pop(CRF) for k, d in registries.items()}
    try:
        model = _make_model(tiny_base_model, "crf", 0, None)
        batch, tags = _make_batch(3, 10, len(model.tags))
        gsm, _, loader = _private(model, batch, tags, max_grad_norm=1e9)
        b, t = _as_batch(next(iter(loader)))
        with pytest.raises(TypeError):
            gsm(b, t).sum().backward()
    finally:
        for k, d in registries.items():
            d[CRF] = saved[k]


def test_crf_grad_sampler_rejects_reduced_output(tiny_base_model):
    """Per-sample gradients need reduction='none'; a summed CRF output is refused, not guessed."""
    from dphub.privacy.grad_samplers import compute_crf_grad_sample

    crf = CRF(5, batch_first=True)
    em = torch.randn(2, 4, 5)
    tags = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="reduction"):
        compute_crf_grad_sample(crf, [em, tags, mask], torch.ones(()))
    with pytest.raises(ValueError, match="reduction"):
        compute_crf_grad_sample(crf, [em], torch.ones(2))
