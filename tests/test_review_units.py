"""The review page's offsets (issue 54): code points in Python, UTF-16 units on the page, converted
at the boundary and checked there. Notes with emoji, U+2028 and friends (review_astral_fixtures).
The browser side is in test_review_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from review_astral_fixtures import TEXTS, at, js_slice, make_run, u16  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from dphub.ensemble.evaluation import read_labelled  # noqa: E402
from dphub.errors import InputError  # noqa: E402
from dphub.review.corrections import corrections_revision, load_corrections, save_corrections  # noqa: E402
from dphub.review.page import render_page  # noqa: E402
from dphub.review.run import load_review  # noqa: E402
from dphub.review.server import make_app  # noqa: E402
from dphub.review.units import Utf16, corrections_from_page  # noqa: E402

TOKEN = "t0k3n-" + "b" * 40
KEY = {"a": "line 1", "b": "line 2", "c": "line 3"}


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_run(tmp_path)


def _client(review, path: Path) -> TestClient:
    return TestClient(make_app(review, path, TOKEN), headers={"host": "127.0.0.1:8123"})


def _script(html: str, name: str) -> dict:
    m = re.search(rf'<script id="review-{name}" type="application/json">(.*?)</script>', html,
                  re.S)
    assert m
    return json.loads(m.group(1))


def _post(client: TestClient, payload: dict, dest: Path):
    """POST as the page does: based on the file's revision (unless the payload names one)."""
    if isinstance(payload, dict) and "revision" not in payload:
        payload = {**payload, "revision": corrections_revision(dest)}
    return client.post(f"/corrections?token={TOKEN}", json=payload)


def test_utf16_maps_both_ways_and_refuses_half_a_pair() -> None:
    t = "a\U0001F600b\u2028c\U0001D11E"
    m = Utf16(t)
    assert [m.to_units(i) for i in range(len(t) + 1)] == [0, 1, 3, 4, 5, 6, 8]
    assert [m.to_code_points(u) for u in (0, 1, 3, 4, 5, 6, 8)] == list(range(len(t) + 1))
    for bad in (2, 7):  # between the two units of an emoji
        with pytest.raises(InputError, match="inside a character"):
            m.to_code_points(bad)
    for bad in (-1, 9):
        with pytest.raises(InputError, match="outside"):
            m.to_code_points(bad)
    with pytest.raises(InputError, match="outside"):
        m.to_units(len(t) + 1)
    assert Utf16("plain \u2028 BMP").cum is None  # identity without astral characters


def test_the_page_highlights_the_audit_characters(run, tmp_path: Path) -> None:
    # issue 54: Python sent code points, the page sliced UTF-16 units: after an emoji every span
    # highlighted other characters
    out, notes, gold = run
    html = _client(load_review(out, notes, gold_path=gold), tmp_path / "c.jsonl").get(
        f"/?token={TOKEN}").text
    data = _script(html, "data")
    assert data["units"] == "utf-16"
    audit = {r["id"]: r["spans"] for r in map(json.loads, (out / "audit.jsonl").read_bytes()
                                              .decode("utf-8").split("\n")[:-1])}
    for n in data["notes"]:
        got = [js_slice(n["text"], s["start"], s["end"]) for s in n["spans"]]
        assert got == [s["text"] for s in audit[n["id"]]]  # the run's own text of each span
        assert [js_slice(n["text"], s["start"], s["end"]) for s in n["misses"]] == ["Quarrytown"]


def test_the_static_file_is_in_utf16_too(run) -> None:
    out, notes, _ = run
    data = _script(render_page(load_review(out, notes)), "data")
    n = next(n for n in data["notes"] if n["id"] == "a")
    assert [js_slice(n["text"], s["start"], s["end"]) for s in n["spans"]] == [
        "Yolanda Brisbee", "555-0134"]


def test_a_correction_made_on_the_page_labels_the_characters_it_showed(run, tmp_path: Path
                                                                       ) -> None:
    # the page sends UTF-16 offsets; they were saved as code points: the label landed on other
    # text and `ensemble train` took it silently
    out, notes, _ = run
    dest = tmp_path / "c.jsonl"
    qa, qb = at("a", "Quarrytown")
    ya, yb = at("a", "Yolanda Brisbee")
    ca, cb = at("c", "Ysolde Crane")
    payload = {"units": "utf-16", "notes": {
        KEY["a"]: {"reviewed": True, "added": [{"start": u16("a", qa), "end": u16("a", qb),
                                                "label": "LOCATION"}],
                   "retyped": [{"start": u16("a", ya), "end": u16("a", yb), "label": "NAME"}]},
        KEY["c"]: {"reviewed": True, "rejected": [[u16("c", ca), u16("c", cb)]]},
    }}
    r = _post(_client(load_review(out, notes), dest), payload, dest)
    assert r.status_code == 200, r.text
    saved = {n.id: [(n.text[s.start:s.end], s.label) for s in n.spans] for n in read_labelled(dest)}
    assert saved == {"a": [("Yolanda Brisbee", "NAME"), ("555-0134", "PHONE"),
                           ("Quarrytown", "LOCATION")],
                     "c": [("555-0199", "PHONE")]}
    # a later session starts from them, in the page's units again
    review = load_review(out, notes)
    config = _script(render_page(review, save_url="/corrections", token=TOKEN,
                                 corrections=load_corrections(review, dest)), "config")
    corr = config["corrections"]
    assert corr["units"] == "utf-16"
    added = corr["notes"][KEY["a"]]["added"]
    assert [js_slice(TEXTS["a"], s["start"], s["end"]) for s in added] == ["Quarrytown"]
    rej = corr["notes"][KEY["c"]]["rejected"]
    assert [js_slice(TEXTS["c"], a, b) for a, b in rej] == ["Ysolde Crane"]


@pytest.mark.parametrize("bad", [
    # no units: a payload counted in code points would land on other characters
    {"notes": {"line 1": {"reviewed": True}}},
    {"units": "code-points", "notes": {"line 1": {"reviewed": True}}},
    # inside the first emoji's surrogate pair (UTF-16 offset 1)
    {"units": "utf-16", "notes": {"line 1": {"added": [{"start": 1, "end": 6, "label": "NAME"}]}}},
    {"units": "utf-16", "notes": {"line 1": {"added": [{"start": 5, "end": 10_000,
                                                        "label": "NAME"}]}}},
    {"units": "utf-16", "notes": {"line 3": {"rejected": [[0, 1, 2]]}}},
    {"units": "utf-16", "notes": {"line 3": {"rejected": "all"}}},
    {"units": "utf-16", "notes": {"line 3": {"added": [{"start": "5", "end": 7,
                                                        "label": "NAME"}]}}},
])
def test_page_corrections_off_the_characters_are_refused(run, tmp_path: Path, bad) -> None:
    out, notes, _ = run
    dest = tmp_path / "c.jsonl"
    r = _post(_client(load_review(out, notes), dest), bad, dest)
    assert r.status_code == 400 and r.json()["error"]
    assert not any(w in r.text for w in ("Yolanda", "Quinby", "Ysolde", "Quarrytown"))
    assert not dest.exists()


def test_conversion_keeps_what_save_corrections_checks(run) -> None:
    out, notes, _ = run
    review = load_review(out, notes)
    texts = {n.key: n.text for n in review.notes}
    back = corrections_from_page({"units": "utf-16", "revision": "none",
                                  "notes": {"line 9": {"reviewed": True}}}, texts)
    with pytest.raises(InputError, match="not in the run"):
        save_corrections(review, back, Path("/nonexistent/c.jsonl"))


# ------------------------------------------------------------- --notes is the text the run read
def _rewrite(path: Path, texts: dict[str, str]) -> None:
    path.write_text("".join(json.dumps({"id": k, "text": t, "patient_id": f"p-{k}"},
                                       ensure_ascii=False) + "\n" for k, t in texts.items()),
                    encoding="utf-8")


def test_a_shifted_note_of_the_same_length_is_refused(run, tmp_path: Path) -> None:
    # issue 54: 4 characters prepended and 4 dropped: every span within the note, every one on
    # other characters, and corrections labelled them
    out, notes, _ = run
    shifted = tmp_path / "shifted.jsonl"
    _rewrite(shifted, {**TEXTS, "b": "xxxx" + TEXTS["b"][:-4]})
    with pytest.raises(InputError, match=r"line 2: note b is not the text the run read") as e:
        load_review(out, shifted)
    assert "Quinby" not in str(e.value)
    one = tmp_path / "one-char.jsonl"  # a single code point changed (a combining mark dropped)
    _rewrite(one, {**TEXTS, "c": TEXTS["c"].replace("e\u0301", "e")})
    with pytest.raises(InputError, match="line 3: note c is not the text"):
        load_review(out, one)


def test_an_extra_or_unreadable_note_is_not_silently_dropped(run, tmp_path: Path) -> None:
    out, notes, _ = run
    extra = tmp_path / "extra.jsonl"
    _rewrite(extra, {**TEXTS, "d": "Another note \U0001F600 Call Ysolde Crane"})
    with pytest.raises(InputError, match="line 4 is not in the run's audit.jsonl"):
        load_review(out, extra)
    broken = tmp_path / "broken.jsonl"
    lines = notes.read_bytes().split(b"\n")
    lines[1] = b'{"id": "b", "text": '  # no longer JSON
    broken.write_bytes(b"\n".join(lines))
    with pytest.raises(InputError, match="line 2 was read by the run but no longer reads"):
        load_review(out, broken)


def test_the_digest_is_keyed_and_private(run, tmp_path: Path) -> None:
    import hashlib
    import os
    import stat

    from dphub.io import dphub_home
    from dphub.runner.state import NOTE_KEY

    out, notes, _ = run
    audit = [json.loads(x) for x in (out / "audit.jsonl").read_bytes().split(b"\n")[:-1]]
    for rec in audit:
        text = TEXTS[rec["id"]]
        assert len(rec["text_hmac"]) == 32
        for h in (hashlib.sha256, hashlib.sha1, hashlib.md5):  # no unkeyed digest of the note
            assert rec["text_hmac"] not in h(text.encode()).hexdigest()
    key = dphub_home() / NOTE_KEY
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    params = json.loads((out / ".dphub-run" / "run.json").read_text())
    assert len(params["run_id"]) == 32 and params["note_key"]
    assert load_review(out, notes).checked


def test_another_users_run_cannot_be_checked_and_is_refused(run, tmp_path: Path,
                                                            monkeypatch) -> None:
    out, notes, _ = run
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "someone-else"))
    with pytest.raises(InputError, match="another user"):
        load_review(out, notes)
    assert not (tmp_path / "someone-else").exists()  # review makes no key of its own
    from dphub.runner.state import note_digest_key

    assert note_digest_key() is not None  # someone else's own key (a run would make it)
    with pytest.raises(InputError, match="another user"):
        load_review(out, notes)


def test_a_run_without_digests_loads_unchecked_and_says_so(run, tmp_path: Path, capsys) -> None:
    from dphub.cli.main import main

    out, notes, _ = run
    p = out / ".dphub-run" / "run.json"
    params = json.loads(p.read_text())
    del params["note_key"]
    p.write_text(json.dumps(params))
    review = load_review(out, notes)
    assert not review.checked
    assert 'id="unchecked"' in render_page(review)
    (tmp_path / "again").mkdir()
    assert 'id="unchecked"' not in render_page(load_review(*make_run(tmp_path / "again")[:2]))
    assert main(["review", str(out), "--notes", str(notes), "--html",
                 str(tmp_path / "p.html")]) == 0
    assert "recorded no note digests" in capsys.readouterr().err


# --------------------------------------------------------------- the corrections file and saves
def test_two_runs_named_alike_never_share_a_corrections_file(tmp_path: Path) -> None:
    # issue 54: the default file was keyed by the run directory's name alone
    from dphub.review.corrections import default_corrections_path

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    a, notes, _ = make_run(tmp_path / "one")
    b, _, _ = make_run(tmp_path / "two")
    assert a.name == b.name
    pa = default_corrections_path(a, load_review(a, notes).run_id)
    pb = default_corrections_path(b, load_review(b, notes).run_id)
    assert pa != pb and pa.parent == pb.parent
    assert pa == default_corrections_path(a, load_review(a, notes).run_id)  # stable per run
    import shutil

    shutil.rmtree(a)  # a new run into the same directory is another run
    (tmp_path / "one" / "notes.jsonl").unlink()
    (tmp_path / "one" / "gold.jsonl").unlink()
    a2, notes2, _ = make_run(tmp_path / "one")
    assert a2 == a and default_corrections_path(a2, load_review(a2, notes2).run_id) != pa


def _page_config(client: TestClient) -> dict:
    return _script(client.get(f"/?token={TOKEN}").text, "config")


def test_a_save_based_on_a_stale_revision_is_refused(run, tmp_path: Path) -> None:
    # issue 54: two tabs (or two reviewers) overwrote each other's corrections silently
    out, notes, _ = run
    dest = tmp_path / "c.jsonl"
    client = _client(load_review(out, notes), dest)
    tab1, tab2 = _page_config(client), _page_config(client)
    assert tab1["revision"] == tab2["revision"] == "none"
    one = {"units": "utf-16", "notes": {KEY["a"]: {"reviewed": True}}}
    two = {"units": "utf-16", "notes": {KEY["b"]: {"reviewed": True}}}
    r1 = _post(client, {**one, "revision": tab1["revision"]}, dest)
    assert r1.status_code == 200
    saved = dest.read_bytes()
    r2 = _post(client, {**two, "revision": tab2["revision"]}, dest)
    assert r2.status_code == 409 and "another page" in r2.json()["error"]
    assert r2.headers["cache-control"] == "no-store"
    assert dest.read_bytes() == saved  # tab 1's corrections are kept
    # tab 1 goes on from the revision its save returned; tab 2 reloads and sees them
    r3 = _post(client, {**one, "notes": {**one["notes"], **two["notes"]},
                        "revision": r1.json()["revision"]}, dest)
    assert r3.status_code == 200, r3.text
    assert _page_config(client)["revision"] == r3.json()["revision"]
    assert [n.id for n in read_labelled(dest)] == ["a", "b"]


@pytest.mark.parametrize("body", [
    {"notes": {"line 1": {"added": 5}}},
    {"notes": {"line 1": {"reviewed": "no"}}},  # a string is not "reviewed"
    {"notes": {"line 1": {"rejected": [[1, 2, 3]]}}},
    {"notes": {"line 1": {"added": [{"start": 0, "end": 3}]}}},
    {"notes": {"line 1": {"added": [{"start": 0, "end": 3, "label": "NAME", "text": "Yolanda"}]}}},
    {"notes": {"line 1": {"retyped": [{"start": 0, "end": 3.5, "label": "NAME"}]}}},
    {"notes": {"line 1": {"flagged": True}}},
    {"notes": {"line 1": "Yolanda Brisbee"}},
    {"notes": "all"},
    {"notes": {}, "extra": 1},
])
def test_a_malformed_body_is_one_400_without_echo(run, tmp_path: Path, body) -> None:
    # issue 54: {"added": 5} raised TypeError: a 500 with a traceback; "reviewed": "no" counted
    out, notes, _ = run
    dest = tmp_path / "c.jsonl"
    r = _post(_client(load_review(out, notes), dest), {"units": "utf-16", **body}, dest)
    assert r.status_code == 400, r.text
    assert "Yolanda" not in r.text and r.json()["error"].startswith("corrections")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert not dest.exists()
    r = _post(_client(load_review(out, notes), dest), {"units": "utf-16", "notes": {}}, dest)
    assert r.status_code == 400  # the revision is required (a page older than this check)
    nodest = {"units": "utf-16", "notes": {KEY["a"]: {"reviewed": True}}}
    r = _client(load_review(out, notes), dest).post(f"/corrections?token={TOKEN}", json=nodest)
    assert r.status_code == 400 and "revision" in r.json()["error"]


@pytest.mark.parametrize(("method", "path", "code"), [
    ("get", "/corrections", 405), ("get", "/nope", 404), ("post", "/", 405),
])
def test_every_response_is_private(run, tmp_path: Path, method: str, path: str, code: int
                                   ) -> None:
    # issue 54: Starlette's own error responses lacked Cache-Control and nosniff
    out, notes, _ = run
    client = _client(load_review(out, notes), tmp_path / "c.jsonl")
    r = getattr(client, method)(f"{path}?token={TOKEN}")
    assert r.status_code == code
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"


def test_a_temp_file_of_a_killed_save_is_removed(run, tmp_path: Path) -> None:
    # issue 54: a SIGKILL during a save left .<name>.<random>.tmp with note text, forever
    out, notes, _ = run
    dest = tmp_path / "private" / "c.jsonl"
    dest.parent.mkdir()
    stale = dest.parent / ".c.jsonl.k2j3h4.tmp"
    stale.write_text("Yolanda Brisbee")
    keep = [dest.parent / "other.jsonl", dest.parent / ".other.jsonl.abc.tmp"]
    for k in keep:
        k.write_text("{}")
    _client(load_review(out, notes), dest)
    assert not stale.exists() and all(k.exists() for k in keep)


def test_an_unexpected_error_is_a_500_without_text(run, tmp_path: Path, monkeypatch,
                                                   caplog) -> None:
    import logging

    import dphub.review.server as server

    def boom(*a, **k):
        raise RuntimeError("Yolanda Brisbee")  # a bug whose message quotes note text

    monkeypatch.setattr(server, "save_corrections", boom)
    caplog.set_level(logging.DEBUG)
    out, notes, _ = run
    dest = tmp_path / "c.jsonl"
    r = _post(_client(load_review(out, notes), dest),
              {"units": "utf-16", "notes": {KEY["a"]: {"reviewed": True}}}, dest)
    assert r.status_code == 500 and "RuntimeError" in r.json()["error"]
    assert "Yolanda" not in r.text and r.headers["cache-control"] == "no-store"
    assert not any("Yolanda" in rec.getMessage() for rec in caplog.records)
