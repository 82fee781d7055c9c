"""Privacy units: units are sampled whole, clipped whole, and never split across physical batches.

The patient-unit proof: after per-unit aggregation, Opacus's per-unit gradient equals the sum of
the naive per-window gradients of that patient's windows, and the clipped per-unit gradient has
norm <= C. BatchMemoryManager splits logical batches by units only.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch.utils.data import DataLoader

from dphub.errors import ConfigError, PrivacyError
from dphub.privacy.units import (
    UnitDataset,
    aggregate_grad_sample_by_unit,
    batch_num_units,
    is_empty_unit_batch,
    unit_collate,
    unit_key,
)
from dphub.tagger import TaggerModel

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

ENCODER_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def _windows(unit_sizes: list[int], num_tags: int = 33, seed: int = 0):
    """Windows [CLS] marker pieces [SEP]; the marker token 1000+u identifies unit u."""
    g = torch.Generator().manual_seed(seed)
    ids, tags, keys = [], [], []
    for u, k in enumerate(unit_sizes):
        for w in range(k):
            n = 4 + (u + w) % 5
            pieces = [1000 + u] + torch.randint(2000, 9000, (n - 1,), generator=g).tolist()
            ids.append([101, *pieces, 102])
            tags.append([-100, *torch.randint(0, num_tags, (n,), generator=g).tolist(), -100])
            keys.append(f"patient-{u}")
    return ids, tags, keys


def test_unit_key_per_unit_kind():
    assert unit_key("patient", "n1", "p7", 3) == unit_key("patient", "n2", "p7", 0)
    assert unit_key("patient", "n1", None, 0) != unit_key("patient", "n2", None, 0)
    assert unit_key("note", "n1", "p7", 0) == unit_key("note", "n1", "p7", 5)
    assert unit_key("sequence", "n1", "p7", 0) != unit_key("sequence", "n1", "p7", 1)
    with pytest.raises(ConfigError):
        unit_key("hospital", "n1", "p7", 0)


def test_unit_dataset_groups_windows_and_caps_per_unit():
    ids, tags, keys = _windows([2, 1, 5])
    ds = UnitDataset.from_windows(ids, tags, keys, max_examples_per_unit=3)
    assert len(ds) == 3
    assert [int(u.lengths.numel()) for u in ds] == [2, 1, 3]
    assert ds.dropped_windows == 2 and ds.num_windows == 6
    # the kept windows are real windows of that unit, in their original order
    third = ds[2]
    starts = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), third.lengths]), 0)
    kept = [third.input_ids[a:b].tolist() for a, b in zip(starts[:-1], starts[1:], strict=True)]
    originals = ids[3:]
    assert all(k in originals for k in kept)
    assert [originals.index(k) for k in kept] == sorted(originals.index(k) for k in kept)
    # evenly spaced over the unit's own windows (5 windows, keep 3: windows 0, 1, 3)
    assert [originals.index(k) for k in kept] == [0, 1, 3]


def test_window_cap_of_a_unit_depends_on_that_unit_only():
    """A unit's kept windows are a function of its own windows: adding, removing or reordering
    other units (or any seed) never changes them."""
    ids, tags, keys = _windows([7, 2, 9, 4], seed=3)
    alone = UnitDataset.from_windows(ids[9:18], tags[9:18], keys[9:18], max_examples_per_unit=4)
    together = UnitDataset.from_windows(ids, tags, keys, max_examples_per_unit=4)
    reordered = UnitDataset.from_windows(ids[9:] + ids[:9], tags[9:] + tags[:9],
                                         keys[9:] + keys[:9], max_examples_per_unit=4)
    assert torch.equal(alone[0].input_ids, together[2].input_ids)
    assert torch.equal(alone[0].input_ids, reordered[0].input_ids)


def test_unit_dataset_rejects_inconsistent_input():
    ids, tags, keys = _windows([1, 1])
    with pytest.raises(PrivacyError):
        UnitDataset.from_windows(ids, tags, keys[:1])
    tags[0] = tags[0][:-1]
    with pytest.raises(PrivacyError, match="window 0"):
        UnitDataset.from_windows(ids, tags, keys)
    with pytest.raises(ConfigError):
        UnitDataset.from_windows(ids[1:], tags[1:], keys[1:], max_examples_per_unit=0)


def test_unit_collate_flattens_units_with_index():
    ids, tags, keys = _windows([2, 1, 3])
    ds = UnitDataset.from_windows(ids, tags, keys)
    batch = unit_collate([ds[2], ds[0]], pad_id=0)
    assert batch["unit_index"].tolist() == [0, 0, 0, 1, 1]
    assert batch["unit_sizes"].tolist() == [3, 2]
    assert batch_num_units(batch) == 2
    n, width = batch["input_ids"].shape
    assert n == 5 and width == max(len(x) for x in ids[:2] + ids[3:])
    for k in ENCODER_KEYS:
        assert batch[k].shape == (n, width) and batch[k].is_contiguous()
    assert torch.equal(batch["position_ids"][3], torch.arange(width))
    assert ((batch["attention_mask"] == 0) <= (batch["tags"] == -100)).all()
    assert batch["input_ids"][0, 1] == 1002 and batch["input_ids"][4, 1] == 1000


def _tiny_model(base) -> TaggerModel:
    torch.manual_seed(0)
    model = TaggerModel.from_base(base, head="crf")
    model.set_trainable(train_layers=1)
    model.double()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.train()


def _naive_window_grads(model, batch):
    out = []
    for i in range(batch["tags"].shape[0]):
        model.zero_grad(set_to_none=True)
        one = {k: batch[k][i : i + 1] for k in ENCODER_KEYS}
        model.per_sample_loss(one, batch["tags"][i : i + 1]).sum().backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    model.zero_grad(set_to_none=True)
    return out


def _make_private(model, dataset, max_grad_norm, noise=0.0, sample_rate=None, seed=0):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loader = DataLoader(dataset, batch_size=len(dataset), collate_fn=unit_collate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="prv")
        gsm, opt, dp_loader = engine.make_private(
            module=model, optimizer=opt, data_loader=loader, noise_multiplier=noise,
            max_grad_norm=max_grad_norm, poisson_sampling=True, grad_sample_mode="hooks",
            loss_reduction="mean", noise_generator=torch.Generator().manual_seed(seed),
        )
    return gsm, opt, dp_loader


def test_patient_unit_gradient_is_sum_of_its_windows_and_clipped(tiny_base_model):
    model = _tiny_model(tiny_base_model)
    ids, tags, keys = _windows([2, 1, 3], num_tags=len(model.tags))
    ds = UnitDataset.from_windows(ids, tags, keys)
    batch = unit_collate([ds[i] for i in range(len(ds))])
    naive = _naive_window_grads(model, batch)

    gsm, opt, _ = _make_private(model, ds, max_grad_norm=1e9)
    loss = gsm({k: batch[k] for k in ENCODER_KEYS}, batch["tags"])
    loss.mean().backward()  # "mean": Opacus rescales rows back to each window's own gradient
    aggregate_grad_sample_by_unit(gsm, batch["unit_index"], batch_num_units(batch))

    params = dict(model.named_parameters())
    names = [n for n, p in params.items() if p.requires_grad]
    assert "crf.transitions" in names
    index = batch["unit_index"].tolist()
    for n in names:
        gs = params[n].grad_sample
        assert gs.shape[0] == 3
        for u in range(3):
            expected = sum(naive[w][n] for w in range(len(index)) if index[w] == u)
            assert float((gs[u] - expected).abs().max()) <= 1e-5, (n, u)

    # clipping acts on the per-unit rows: each unit's clipped gradient has norm <= C
    c = 0.01
    opt.max_grad_norm = c
    full = [p.grad_sample for p in opt.params]
    for u in range(3):
        for p, g in zip(opt.params, full, strict=True):
            p.grad_sample = g[u : u + 1]
            p.summed_grad = None
        opt.clip_and_accumulate()
        norm = torch.sqrt(sum((p.summed_grad**2).sum() for p in opt.params))
        assert float(norm) <= c * (1 + 1e-6)


def test_physical_batches_never_split_a_unit():
    """Poisson sampling draws units; BatchMemoryManager chunks the drawn units, not windows."""
    sizes = [3, 1, 4, 2, 5, 1, 2, 3, 1, 4]
    ids, tags, keys = _windows(sizes)
    ds = UnitDataset.from_windows(ids, tags, keys)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(ds, batch_size=5, collate_fn=functools.partial(unit_collate, pad_id=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="prv")
        _, opt, dp_loader = engine.make_private(
            module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
            max_grad_norm=1.0, poisson_sampling=True,
        )
    # the sampler's population is the units, at rate expected-units / units
    assert dp_loader.batch_sampler.num_samples == len(ds) == len(sizes)
    assert dp_loader.sample_rate == pytest.approx(5 / len(sizes))

    seen_multi_chunk = False
    with BatchMemoryManager(data_loader=dp_loader, max_physical_batch_size=2,
                            optimizer=opt) as phys:
        logical: list[list[int]] = [[]]
        chunks_in_step = 0
        for _ in range(3):  # a few epochs of logical steps
            for batch in phys:
                last_of_step = not opt._step_skip_queue[-1]
                if not is_empty_unit_batch(batch):
                    markers = batch["input_ids"][:, 1] - 1000
                    units = markers[batch["unit_sizes"].cumsum(0) - 1].tolist()
                    assert len(units) <= 2  # max_physical_batch counts units
                    for u in units:
                        # every window of a drawn unit is in this physical batch
                        assert int((markers == u).sum()) == sizes[u]
                        assert u not in logical[-1]  # and in no other chunk of this step
                    logical[-1].extend(units)
                    chunks_in_step += 1
                if last_of_step:
                    seen_multi_chunk |= chunks_in_step > 1
                    logical.append([])
                    chunks_in_step = 0
    assert seen_multi_chunk, "test must exercise logical batches split into physical ones"


def test_empty_poisson_batch_takes_a_noise_only_step(tiny_base_model):
    model = _tiny_model(tiny_base_model)
    ids, tags, keys = _windows([1, 2], num_tags=len(model.tags))
    ds = UnitDataset.from_windows(ids, tags, keys)
    gsm, opt, _ = _make_private(model, ds, max_grad_norm=1.0, noise=1.0)
    before = model.classifier.weight.detach().clone()
    empty = unit_collate([])
    assert is_empty_unit_batch(empty) and batch_num_units(empty) == 0
    aggregate_grad_sample_by_unit(gsm, empty["unit_index"], 0)
    opt.step()
    assert not torch.equal(before, model.classifier.weight)  # noise moved the weights


def test_empty_batch_shapes_are_recognised():
    ids, tags, keys = _windows([1, 2])
    ds = UnitDataset.from_windows(ids, tags, keys)
    assert is_empty_unit_batch([])
    # a DPDataLoader whose very first Poisson batch is empty returns zero-row tensors shaped
    # like dataset[0] (why a unit item is a tuple of tensors)
    dl = DPDataLoader(ds, sample_rate=1e-9, collate_fn=unit_collate,
                      generator=torch.Generator().manual_seed(0))
    first = next(iter(dl))
    assert is_empty_unit_batch(first)
    assert not is_empty_unit_batch(unit_collate([ds[0]]))


def test_aggregate_refuses_missing_or_mismatched_grad_samples():
    lin = torch.nn.Linear(3, 2)
    with pytest.raises(PrivacyError, match="per-sample gradient"):
        aggregate_grad_sample_by_unit(lin, torch.tensor([0, 1]), 2)
    for p in lin.parameters():
        p.grad_sample = torch.ones((3, *p.shape))
    with pytest.raises(PrivacyError, match="3 rows"):
        aggregate_grad_sample_by_unit(lin, torch.tensor([0, 1]), 2)
    aggregate_grad_sample_by_unit(lin, torch.tensor([0, 1, 0]), 2)
    assert lin.weight.grad_sample[0].eq(2).all() and lin.weight.grad_sample[1].eq(1).all()
