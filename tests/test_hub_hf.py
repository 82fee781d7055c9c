"""Hugging Face protocol backend.

Pull is tested for real: olah serves a tmp local hub on a free loopback port (offline mirror mode)
and ``huggingface_hub`` downloads from it. Push cannot be tested against a real HF server here, so
the exact HfApi calls are checked on ``RecordingHfApi``, a stub that records calls.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import pytest
from hub_fixtures import card_meta, copy_model, write_card

from dphub.errors import PullRefused
from dphub.hub import ops
from dphub.hub.local import LocalHub
from dphub.hub.serve import start_olah, stop_olah
from dphub.registry import Registry

pytest_plugins = ("hub_fixtures",)


@pytest.fixture
def model(model_template, hub_env):
    return copy_model(model_template, hub_env["tmp"] / "model")


@pytest.fixture
def olah_hub(model, hub_env, tmp_path):
    """Two revisions (v1, then latest) published locally, served by olah on 127.0.0.1."""
    old, _ = ops.publish(model, "acme/deid", tag="v1")
    write_card(model, card_meta(noise=1.5))
    new, _ = ops.publish(model, "acme/deid")
    proc, url = start_olah(hub_env["hub"], tmp_path / "olah")
    try:
        yield SimpleNamespace(url=url, old=old, new=new, proc=proc)
    finally:
        stop_olah(proc)


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file()}


def test_pull_through_olah_is_byte_identical(olah_hub, hub_env, tmp_path):
    over_http = ops.pull("acme/deid", hub=olah_hub.url)
    assert over_http.revision == olah_hub.new and over_http.hub == olah_hub.url
    local = ops.pull("acme/deid", hub=str(hub_env["hub"]), registry=Registry(tmp_path / "r2"))
    assert _files(over_http.path) == _files(local.path)
    assert "README.md" in _files(over_http.path) and ".cache" not in str(over_http.path)
    old = ops.pull("acme/deid@v1", hub=olah_hub.url)
    assert old.revision == olah_hub.old and old.epsilon > over_http.epsilon
    assert ops.pull(f"acme/deid@{olah_hub.old}", hub=olah_hub.url).path == old.path


def test_info_through_olah(olah_hub):
    revs = ops.info("acme/deid", hub=olah_hub.url)
    assert [r.revision for r in revs] == [olah_hub.new, olah_hub.old]
    assert revs[1].tags == ("v1",) and revs[1].summary.epsilon > revs[0].summary.epsilon
    assert all(r.summary.verified for r in revs), [r.summary.problem for r in revs]


def test_pull_through_olah_refuses_tampered_weights(olah_hub, hub_env):
    hub = LocalHub(hub_env["hub"])
    oid = next(e.oid for e in hub.tree("acme/deid", olah_hub.new)
               if e.path == "model.safetensors")
    obj = hub.repo_dir("acme/deid") / "objects" / oid[:2] / oid[2:]
    raw = bytearray(zlib.decompress(obj.read_bytes()))
    raw[-3] ^= 0x01
    obj.chmod(0o644)
    obj.write_bytes(zlib.compress(bytes(raw)))
    with pytest.raises(PullRefused, match="nothing was registered"):
        ops.pull("acme/deid", hub=olah_hub.url)
    assert Registry().list() == []


class RecordingHfApi:
    """Stub HfApi: records the calls publish/search make, returns canned answers."""

    def __init__(self, models=()):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.models = list(models)

    def create_repo(self, *a, **kw):
        self.calls.append(("create_repo", a, kw))

    def upload_folder(self, *a, **kw):
        self.calls.append(("upload_folder", a, kw))
        return SimpleNamespace(oid="c0ffee" * 6 + "c0de")

    def create_tag(self, *a, **kw):
        self.calls.append(("create_tag", a, kw))

    def list_models(self, *a, **kw):
        self.calls.append(("list_models", a, kw))
        return self.models


def test_publish_over_hf_protocol_makes_the_expected_calls(model, hub_env):
    api = RecordingHfApi()
    sha, _ = ops.publish(model, "acme/deid", hub="https://hub.example.org", message="m", tag="v1",
                         api=api)
    assert sha == "c0ffee" * 6 + "c0de"
    names = [c[0] for c in api.calls]
    assert names == ["create_repo", "upload_folder", "create_tag"]
    assert api.calls[0][1] == ("acme/deid",) and api.calls[0][2]["exist_ok"] is True
    up = api.calls[1][2]
    assert up["repo_id"] == "acme/deid" and up["folder_path"] == str(model)
    assert up["commit_message"] == "m" and up["delete_patterns"] == ["*"]
    assert api.calls[2][2] == {"tag": "v1", "revision": sha, "repo_type": "model"}


def test_publish_over_hf_still_goes_through_the_gate(model, hub_env):
    (model / "optimizer.pt").write_bytes(b"\x80\x04N.")
    api = RecordingHfApi()
    with pytest.raises(Exception, match="refusing to publish"):
        ops.publish(model, "acme/deid", hub="hf://", api=api)
    assert api.calls == []


def test_search_over_hf_filters_by_tag_then_card_fields(hub_env):
    from huggingface_hub.hf_api import ModelInfo

    low, high = card_meta(noise=1.5), card_meta()
    models = [ModelInfo(id="acme/low", sha="a" * 40, cardData=low),
              ModelInfo(id="acme/high", sha="b" * 40, cardData=high),
              ModelInfo(id="acme/nocard", sha="c" * 40)]
    api = RecordingHfApi(models)
    cap = (low["differential_privacy"]["epsilon"] + high["differential_privacy"]["epsilon"]) / 2
    rows = ops.search(hub="hf://", max_epsilon=cap, api=api)
    assert [r.repo for r in rows] == ["acme/low"]
    assert api.calls == [("list_models", (), {"filter": "differential-privacy",
                                              "cardData": True})]


def test_search_over_hf_marks_cards_that_fail_the_checks_unverified(hub_env):
    """Fault 16 over the HF protocol: the server's card data is re-checked, not trusted."""
    from huggingface_hub.hf_api import ModelInfo

    honest, lying = card_meta(), card_meta(epsilon=0.5)
    api = RecordingHfApi([ModelInfo(id="acme/honest", sha="a" * 40, cardData=honest),
                          ModelInfo(id="evil/lying", sha="b" * 40, cardData=lying)])
    rows = {r.repo: r.summary for r in ops.search(hub="hf://", api=api)}
    assert rows["acme/honest"].verified and not rows["evil/lying"].verified
    assert "claims 0.5" in rows["evil/lying"].problem
    cap = honest["differential_privacy"]["epsilon"] + 1
    assert [r.repo for r in ops.search(hub="hf://", max_epsilon=cap, api=api)] == ["acme/honest"]
