"""Local git hub: publish -> search -> pull round trip, revisions, tampering, crash safety."""

from __future__ import annotations

import json
import threading
import zlib

import pytest
from hub_fixtures import card_meta, copy_model, set_hyperparams, write_card

from dphub.errors import HubError, PullRefused
from dphub.hub import ops
from dphub.hub.common import check_relative_path
from dphub.hub.local import LocalHub
from dphub.registry import Registry, resolve_model
from dphub.repo_ids import parse_repo_spec

pytest_plugins = ("hub_fixtures",)


@pytest.fixture
def model(model_template, hub_env):
    return copy_model(model_template, hub_env["tmp"] / "model")


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file()}


def test_publish_search_pull_round_trip(model, hub_env):
    sha, summary = ops.publish(model, "acme/deid", tag="v1")
    rows = ops.search()
    assert [(r.repo, r.revision) for r in rows] == [("acme/deid", sha)]
    assert rows[0].summary.epsilon == pytest.approx(summary.epsilon)
    assert rows[0].tags == ("v1",)
    entry = ops.pull("acme/deid")
    assert entry.revision == sha and entry.unit == "patient"
    assert entry.epsilon == pytest.approx(summary.epsilon)
    assert _files(entry.path) == _files(model), "card and weights byte-identical"
    assert Registry().get("acme/deid").path == entry.path
    assert resolve_model("acme/deid") == entry.path
    assert resolve_model(f"acme/deid@{sha[:10]}") == entry.path
    assert resolve_model(str(model)) == model


def test_default_commit_message_names_the_repo_not_the_local_directory(model_template,
                                                                        hub_env):
    """Issue 31 #6: the local directory's name (a ward, a patient, a user) never reaches the
    hub; the default message names the repo id and the guarantee."""
    local = copy_model(model_template, hub_env["tmp"] / "ward7-jdoe-export")
    ops.publish(local, "acme/deid")
    [rev] = ops.info("acme/deid")
    assert "ward7-jdoe-export" not in (rev.message or "")
    assert (rev.message or "").startswith("Publish acme/deid (epsilon=")


def test_second_publish_is_a_new_revision_and_old_one_stays_pullable(model, hub_env):
    old, s1 = ops.publish(model, "acme/deid", tag="v1")
    write_card(model, card_meta(noise=1.5))
    set_hyperparams(model, lr=1e-3)
    new, s2 = ops.publish(model, "acme/deid", message="retrain with more noise")
    assert new != old and s2.epsilon < s1.epsilon
    revs = ops.info("acme/deid")
    assert [r.revision for r in revs] == [new, old]
    assert revs[0].message == "retrain with more noise" and revs[1].tags == ("v1",)
    assert ops.search()[0].revision == new
    latest = ops.pull("acme/deid")
    pinned = ops.pull(f"acme/deid@{old}")
    tagged = ops.pull("acme/deid@v1")
    assert latest.revision == new and pinned.revision == old == tagged.revision
    assert json.loads((pinned.path / "training_config.json").read_text())["dphub_training"][
        "epochs"] == 3
    assert Registry().get("acme/deid", old[:8]).path == pinned.path
    assert Registry().get("acme/deid", "v1").revision == old


def test_search_filters(model, hub_env):
    ops.publish(model, "acme/patient-level")
    write_card(model, card_meta(noise=1.5, unit="note"))
    ops.publish(model, "acme/note-level")
    eps = {r.repo: r.summary.epsilon for r in ops.search()}
    assert set(eps) == {"acme/patient-level", "acme/note-level"}
    cap = (eps["acme/note-level"] + eps["acme/patient-level"]) / 2
    assert [r.repo for r in ops.search(max_epsilon=cap)] == ["acme/note-level"]
    assert [r.repo for r in ops.search(unit="patient")] == ["acme/patient-level"]
    assert len(ops.search(label="name", language="en")) == 2
    assert ops.search(label="PROFESSION") == []
    assert ops.search(language="de") == []


def test_pull_policy_refusals_register_nothing(model, hub_env):
    _, s = ops.publish(model, "acme/deid")
    write_card(model, card_meta(unit="sequence"))
    ops.publish(model, "acme/seq")
    with pytest.raises(PullRefused, match="exceeds --max-epsilon"):
        ops.pull("acme/deid", max_epsilon=s.epsilon / 2)
    with pytest.raises(PullRefused, match="weaker than the required patient"):
        ops.pull("acme/seq", require_unit="patient")
    assert Registry().list() == []
    assert ops.pull("acme/deid", require_unit="note").unit == "patient"  # patient covers note


def _loose_object(hub: LocalHub, repo: str, oid: str):
    return hub.repo_dir(repo) / "objects" / oid[:2] / oid[2:]


def test_tampered_safetensors_in_hub_is_refused(model, hub_env):
    sha, _ = ops.publish(model, "acme/deid")
    hub = LocalHub(hub_env["hub"])
    oid = next(e.oid for e in hub.tree("acme/deid", sha) if e.path == "model.safetensors")
    obj = _loose_object(hub, "acme/deid", oid)
    raw = bytearray(zlib.decompress(obj.read_bytes()))
    raw[-10] ^= 0xFF  # flip one weight byte; the object keeps its name (= the expected hash)
    obj.chmod(0o644)
    obj.write_bytes(zlib.compress(bytes(raw)))
    with pytest.raises(PullRefused, match="does not match its hash"):
        ops.pull("acme/deid")
    assert Registry().list() == []
    staging = hub_env["home"] / "models" / ".staging"
    assert not any(staging.iterdir()), "the staged download was removed"
    assert not (hub_env["home"] / "models" / "acme").exists()


def test_model_files_are_stored_as_uncompressed_loose_objects(model, hub_env):
    sha, _ = ops.publish(model, "acme/deid")
    hub = LocalHub(hub_env["hub"])
    for entry in hub.tree("acme/deid", sha):
        obj = _loose_object(hub, "acme/deid", entry.oid).read_bytes()
        size = len(zlib.decompress(obj))
        # zlib level 0 stores: only the stream and block headers are added (config.json and the
        # card would shrink at any other level)
        assert len(obj) >= size, entry.path


def test_interrupted_publish_leaves_previous_commit(model, hub_env, monkeypatch):
    old, _ = ops.publish(model, "acme/deid")
    real_git = LocalHub._git

    def crash_at_ref_update(self, repo_dir, *args, **kw):
        if args[0] == "update-ref":
            raise KeyboardInterrupt  # killed right before the branch moves
        return real_git(self, repo_dir, *args, **kw)

    monkeypatch.setattr(LocalHub, "_git", crash_at_ref_update)
    set_hyperparams(model, lr=0.5)
    with pytest.raises(KeyboardInterrupt):
        ops.publish(model, "acme/deid", tag="v2")
    monkeypatch.setattr(LocalHub, "_git", real_git)
    hub = LocalHub(hub_env["hub"])
    assert hub.resolve("acme/deid", None) == old
    assert [r.revision for r in hub.revisions("acme/deid")] == [old]
    with pytest.raises(HubError, match="not found"):
        hub.resolve("acme/deid", "v2")


def test_concurrent_publishers_are_serialized(model, hub_env, tmp_path):
    second = copy_model(model, tmp_path / "model2")
    set_hyperparams(second, lr=0.01)
    errors: list[BaseException] = []

    def run(d):
        try:
            ops.publish(d, "acme/deid")
        except BaseException as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(d,)) for d in (model, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(ops.info("acme/deid")) == 2, "both commits are on the branch, none lost"


def test_existing_tag_is_not_moved(model, hub_env):
    ops.publish(model, "acme/deid", tag="v1")
    with pytest.raises(HubError, match="tag v1 already exists"):
        ops.publish(model, "acme/deid", tag="v1")
    assert len(ops.info("acme/deid")) == 1


@pytest.mark.parametrize("spec", ["../etc", "acme/../x", "acme/deid/x", "/abs/x", "acme/-rf",
                                  "acme/deid@--upload-pack=x", "acme/deid@a..b"])
def test_bad_repo_specs_are_refused(spec):
    with pytest.raises(HubError):
        parse_repo_spec(spec)


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "a\\b", "", "a//b"])
def test_unsafe_listing_names_are_refused(name):
    with pytest.raises(HubError, match="unsafe file name"):
        check_relative_path(name)


def test_unknown_repo_and_revision(model, hub_env):
    hub_env["hub"].mkdir(exist_ok=True)
    with pytest.raises(HubError, match="repo acme/none not found"):
        ops.pull("acme/none")
    ops.publish(model, "acme/deid")
    with pytest.raises(HubError, match="revision deadbeef not found"):
        ops.pull("acme/deid@deadbeef")


def test_resolve_model_asks_to_pull_first(hub_env):
    with pytest.raises(HubError, match="run `dphub pull acme/deid` first"):
        resolve_model("acme/deid")


def test_pulled_model_loads_in_plain_transformers(model, hub_env):
    """Interoperability: no dphub code needed to load and run a pulled model."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    torch.set_num_threads(1)
    ops.publish(model, "acme/deid")
    path = ops.pull("acme/deid").path
    tok = AutoTokenizer.from_pretrained(path)
    clf = AutoModelForTokenClassification.from_pretrained(path, trust_remote_code=False)
    assert clf.config.id2label[1] == "B-NAME"
    nlp = pipeline("token-classification", model=clf, tokenizer=tok)
    out = nlp("Mr Smith was seen on 12/03.")
    assert isinstance(out, list) and all("entity" in o for o in out)
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert {"crf.transitions", "crf.start_transitions", "crf.end_transitions"} <= set(f.keys())


def test_interrupted_pull_registers_nothing(model, hub_env, monkeypatch):
    ops.publish(model, "acme/deid")
    real_read = LocalHub.read_blob
    calls = []

    def die_after_two_files(self, repo_id, oid):
        calls.append(oid)
        if len(calls) > 2:
            raise KeyboardInterrupt  # the user hits Ctrl-C mid-download
        return real_read(self, repo_id, oid)

    monkeypatch.setattr(LocalHub, "read_blob", die_after_two_files)
    with pytest.raises(KeyboardInterrupt):
        ops.pull("acme/deid")
    assert Registry().list() == []
    assert not any((hub_env["home"] / "models" / ".staging").iterdir())
    assert not (hub_env["home"] / "models" / "acme").exists()


def _raw_publish(hub_env, model, repo="evil/model"):
    """Publish around the gate, as a hostile or buggy hub could serve."""
    return LocalHub(hub_env["hub"]).publish(model, repo, "raw")


def test_pull_refuses_pickles_that_bypassed_the_gate(model, hub_env):
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04N.")
    _raw_publish(hub_env, model)
    with pytest.raises(PullRefused, match="pytorch_model.bin is a pickle-based file"):
        ops.pull("evil/model")
    assert Registry().list() == []


def test_pull_refuses_a_non_private_card(model, hub_env):
    write_card(model, card_meta(private=False, epsilon=None))
    _raw_publish(hub_env, model)
    with pytest.raises(PullRefused, match="non-private"):
        ops.pull("evil/model")


def test_pull_refuses_symlinks_in_the_repo(model, hub_env):
    sha = _raw_publish(hub_env, model)
    hub = LocalHub(hub_env["hub"])
    d = hub.repo_dir("evil/model")
    link = hub._git(d, "hash-object", "-w", "--stdin", input=b"/etc/passwd").decode().strip()
    idx = str(hub_env["tmp"] / "index")
    env = {"GIT_INDEX_FILE": idx}
    hub._git(d, "read-tree", sha, env=env)
    hub._git(d, "update-index", "--add", "--cacheinfo", f"120000,{link},vocab2.txt", env=env)
    tree = hub._git(d, "write-tree", env=env).decode().strip()
    commit = hub._git(d, "commit-tree", tree, "-p", sha, input=b"link").decode().strip()
    hub._git(d, "update-ref", "refs/heads/main", commit)
    with pytest.raises(PullRefused, match="not a regular file"):
        ops.pull("evil/model")
    assert Registry().list() == []


def test_listing_marks_a_commit_that_bypassed_the_gate_as_unverified(model, hub_env):
    """Fault 16: a commit written straight into the hub's git repo claims epsilon 1.0."""
    good_sha, good = ops.publish(model, "acme/deid")
    write_card(model, card_meta(epsilon=1.0))  # the accounting fields imply about 23.6
    bad_sha = _raw_publish(hub_env, model)
    rows = {r.repo: r for r in ops.search()}
    assert rows["acme/deid"].summary.verified and rows["acme/deid"].summary.problem is None
    bad = rows["evil/model"].summary
    assert not bad.verified
    assert "differential_privacy.epsilon: claims 1" in bad.problem
    # an unverified claim never passes a puller's epsilon cap or unit filter in a listing
    assert [r.repo for r in ops.search(max_epsilon=2 * good.epsilon)] == ["acme/deid"]
    assert [r.repo for r in ops.search(unit="patient")] == ["acme/deid"]
    assert [r.revision for r in ops.info("evil/model")] == [bad_sha]
    assert not ops.info("evil/model")[0].summary.verified
    assert good_sha != bad_sha
    with pytest.raises(PullRefused, match="claims 1"):
        ops.pull("evil/model")


def test_listing_verdicts_are_cached_by_card_content(model, hub_env, monkeypatch):
    from dphub.hub import common

    common._memo.clear()  # verdicts of earlier tests in this process
    ops.publish(model, "acme/deid")
    assert ops.search()[0].summary.verified
    assert (hub_env["home"] / common.CARD_CHECK_CACHE).is_file()
    common._memo.clear()  # a new process: only the on-disk cache is left

    def boom(*a, **kw):
        raise AssertionError("validated again")

    monkeypatch.setattr(common, "validate_meta", boom)
    assert ops.search()[0].summary.verified
    assert ops.info("acme/deid")[0].summary.verified


def test_hub_path_that_is_a_file_or_missing(model, hub_env, tmp_path):
    """Fault 14 (publish --hub FILE crashed) and 17 (a missing hub listed "no matching models")."""
    hub_file = tmp_path / "hub.txt"
    hub_file.write_text("not a hub")
    with pytest.raises(HubError, match="hub .*hub.txt is not a directory"):
        ops.publish(model, "acme/deid", hub=str(hub_file))
    assert hub_file.read_text() == "not a hub"
    for call in (lambda h: ops.search(hub=h), lambda h: ops.list_models(hub=h),
                 lambda h: ops.info("acme/deid", hub=h), lambda h: ops.pull("acme/deid", hub=h)):
        with pytest.raises(HubError, match="is not a directory"):
            call(str(hub_file))
        with pytest.raises(HubError, match="nowhere does not exist"):
            call(str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()
    # publish creates a missing local hub, as docs/hub.md says; then it lists
    ops.publish(model, "acme/deid", hub=str(tmp_path / "new-hub" / "sub"))
    assert [r.repo for r in ops.search(hub=str(tmp_path / "new-hub" / "sub"))] == ["acme/deid"]
    with pytest.raises(HubError, match="cannot create hub"):
        ops.publish(model, "acme/deid", hub=str(hub_file / "sub"))
    # a model directory (or any non-empty non-hub directory) is not a hub: nothing written in it
    before = _files(model)
    with pytest.raises(HubError, match="is not a dphub hub"):
        ops.publish(model, "acme/deid", hub=str(model))
    with pytest.raises(HubError, match="is not a dphub hub"):
        ops.search(hub=str(model))
    assert _files(model) == before and not (model / "models").exists()
    (tmp_path / "empty").mkdir()
    assert ops.search(hub=str(tmp_path / "empty")) == []


def test_listing_does_not_expand_a_yaml_alias_bomb(model, hub_env):
    """A card that bypassed the gate with an alias bomb: listed as unverified, never expanded."""
    import time

    lines = ["---", 'a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    lines += ["tags: [differential-privacy]", "---", "# bomb", ""]
    (model / "README.md").write_text("\n".join(lines), encoding="utf-8")
    _raw_publish(hub_env, model)
    start = time.monotonic()
    (row,) = ops.search()
    assert time.monotonic() - start < 10
    assert not row.summary.verified and "YAML anchor" in row.summary.problem
    assert not ops.info("evil/model")[0].summary.verified


def test_search_lists_the_labels_the_card_lists(model, hub_env):
    """Issue 31 item 24: the card listed OTHER (its label schema), search only the labels with
    training examples; both now list the schema, and ``--label`` still filters on training."""
    from dphub.card import dp_summary, load_card

    ops.publish(model, "acme/labels")
    (row,) = ops.search()
    card_labels = dp_summary(load_card(model))["labels"]
    assert "OTHER" in card_labels
    assert list(row.summary.labels) == card_labels
    assert row.summary.trained_labels == ("DATE", "NAME")
    assert ops.search(label="OTHER") == []  # no training example of OTHER
