"""Members that share an encoder run it once per window (issue 15.1), with identical results."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dphub import synth
from dphub.ensemble.core import Ensemble, Slot, shared_encoder_groups
from dphub.ensemble.members import ModelMember
from dphub.tagger import Tagger, TaggerModel


def _with_new_head(src: Path, dst: Path, seed: int) -> Path:
    """A copy of ``src`` whose classifier and CRF differ (a head-only model on the same encoder)."""
    shutil.copytree(src, dst)
    model = TaggerModel.load(dst)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (*model.classifier.parameters(), *model.crf.parameters()):
            p.copy_(torch.randn(p.shape, generator=g))
    model.save(dst)
    return dst


@pytest.fixture(scope="module")
def members(tiny_tagger_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[ModelMember]:
    root = tmp_path_factory.mktemp("shared")
    dirs = [_with_new_head(tiny_tagger_dir, root / f"m{i}", seed=i) for i in range(3)]
    return [ModelMember(Tagger.load(d), f"m{i}", batch_size=4) for i, d in enumerate(dirs)]


def test_shared_encoder_outputs_give_identical_scores(members: list[ModelMember]) -> None:
    notes = synth.generate(5, kind="discharge", seed=2)
    a, b = members[0].tagger, members[1].tagger
    assert a.encoder_key == b.encoder_key
    encoded = a.encode(notes, batch_size=4)
    for marginals in (True, False):
        alone = b.token_scores(notes, batch_size=4, marginals=marginals)
        shared = b.token_scores(notes, batch_size=4, marginals=marginals, encoded=encoded)
        for x, y in zip(alone, shared, strict=True):
            assert np.allclose(x.phi_prob, y.phi_prob, atol=1e-6) and x.decoded == y.decoded


def test_an_ensemble_runs_each_distinct_encoder_once(
    members: list[ModelMember], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conftest import make_tiny_base_model

    from dphub.ensemble.words import snap_to_words, trim_spans

    other_dir = tmp_path / "other"
    other_base = make_tiny_base_model(tmp_path / "other-base" / "tiny-bert", seed=1)
    TaggerModel.from_base(other_base).save(other_dir)  # another encoder (other weights)
    other = ModelMember(Tagger.load(other_dir), "other", batch_size=4)
    slots = [Slot(m) for m in members] + [Slot(other)]
    groups = shared_encoder_groups(slots)
    assert set(groups) == {"m0", "m1", "m2"} and len(set(groups.values())) == 1

    notes = synth.generate(6, kind="nursing", seed=4)
    expected = {s.name: [trim_spans(n.text, snap_to_words(n.text, spans)) for n, spans
                         in zip(notes, s.member.tag(notes), strict=True)] for s in slots}
    n_windows = len(members[0].encode(notes).windows)
    encoded_rows: list[int] = []
    real = TaggerModel.encode

    def counting(self, batch):
        encoded_rows.append(int(batch["input_ids"].shape[0]))
        return real(self, batch)

    monkeypatch.setattr(TaggerModel, "encode", counting)
    per_note = Ensemble(slots).member_spans(notes)
    # one shared encoder pass over the windows for m0, m1 and m2 together (`other` runs its
    # own encoder inside its emissions, not through `encode`)
    assert sum(encoded_rows) == n_windows
    for name, want in expected.items():
        got = [[(s.start, s.end, s.label) for s in note[name]] for note in per_note]
        assert got == [[(s.start, s.end, s.label) for s in spans] for spans in want], name


def test_entries_on_one_model_directory_share_one_tagger(
    tiny_tagger_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The low-threshold recipe of docs/owner.md (the model twice, plus --owner-model on it):
    one tagger, quantized and switched to its runtime once, spans as separate loads give."""
    from dphub.ensemble.core import build_ensemble, member_from_entry, owner_slot
    from dphub.ensemble.manifest import Manifest, entry_from_spec
    from dphub.ray_engine import recipe_from_manifest

    model = _with_new_head(tiny_tagger_dir, tmp_path / "owner", seed=5)
    entries = [entry_from_spec(str(model)),
               entry_from_spec(str(model), name="owner-low", threshold=0.1)]
    manifest = Manifest(entries, "any")
    quantized: list[str] = []
    switched: list[str] = []
    real_quantize, real_runtime = ModelMember.quantize_int8, Tagger.use_runtime

    def quantize(self: ModelMember) -> None:
        quantized.append(self.name)
        real_quantize(self)

    def use_runtime(self: Tagger, runtime: str, **kw: object) -> object:
        switched.append(runtime)
        return real_runtime(self, runtime, **kw)

    monkeypatch.setattr(ModelMember, "quantize_int8", quantize)
    monkeypatch.setattr(Tagger, "use_runtime", use_runtime)
    shared = build_ensemble(manifest, owner_model=model, int8=True)
    a, b, owner = (s.member for s in shared.slots)
    assert isinstance(a, ModelMember) and isinstance(b, ModelMember)
    assert isinstance(owner, ModelMember)
    assert a.tagger is b.tagger is owner.tagger
    assert [a.name, b.name, owner.name] == ["owner", "owner-low", "owner:owner"]
    assert quantized == ["owner"] and switched == ["torch"]
    assert not any(type(m) is torch.nn.Linear for m in a.tagger.model.encoder.modules())
    assert a.path == b.path == model

    # the Ray engine's workers build from a recipe through the same path
    rebuilt = recipe_from_manifest(manifest, owner_model=model, aggregate_rule=None,
                                   batch_size=16, int8=False).build()
    assert len({id(s.member.tagger) for s in rebuilt.slots}) == 1

    separate = Ensemble([member_from_entry(e, int8=True) for e in entries]
                        + [owner_slot(model, int8=True)], "any")
    assert len({id(s.member.tagger) for s in separate.slots}) == 3
    notes = synth.generate(5, kind="discharge", seed=3)
    got, want = shared.member_spans(notes), separate.member_spans(notes)
    assert got == want
    # the shared tagger keeps the members apart: each applies its own threshold
    assert any(n["owner"] != n["owner-low"] for n in got)
    assert all(n["owner"] == [replace(s, source="owner") for s in n["owner:owner"]]
               for n in got)
