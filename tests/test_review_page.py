"""The review page without a browser (issue 54 #3): what the generated HTML and its data say
before any script runs: the notices (read-only, corrections train the next model), the order
line, the released text beside each note, spans near a threshold, misses that are only blanks,
and the self-contained file's Content-Security-Policy. The browser drives the keys in
test_review_browser.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markupsafe import escape

pytest.importorskip("starlette")
from review_fixtures import TEXTS, at, make_run  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from dphub.ensemble import Ensemble, FixedMember  # noqa: E402
from dphub.ensemble.core import Slot  # noqa: E402
from dphub.notes import Span  # noqa: E402
from dphub.review.corrections import unwritable  # noqa: E402
from dphub.review.page import order_line, render_page, write_page  # noqa: E402
from dphub.review.run import load_review  # noqa: E402
from dphub.review.server import make_app  # noqa: E402
from dphub.runner import run_deid  # noqa: E402

TOKEN = "t0k3n-" + "b" * 40


def _data(page: str, which: str = "review-data") -> dict:
    m = re.search(rf'<script id="{which}" type="application/json">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m.group(1))


def _readonly(page: str) -> str | None:
    """The read-only notice's text when it is shown by the HTML itself (no script needed)."""
    m = re.search(r'<div id="readonly" class="ro" role="alert"( hidden)?>(.*?)</div>', page, re.S)
    assert m, "the page has no read-only notice element"
    return None if m.group(1) else re.sub(r"<[^>]+>", "", m.group(2))


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_run(tmp_path)


def test_served_page_says_corrections_train_the_next_model_and_not_this_release(run, tmp_path
                                                                                 ) -> None:
    out, notes, gold = run
    review = load_review(out, notes, gold_path=gold)
    page = render_page(review, save_url="/corrections", token=TOKEN, revision="none")
    assert "Corrections train the next model; they do not change this release." in page
    assert "dphub ensemble train" in page
    assert _readonly(page) is None  # a page that can save shows no read-only notice
    assert 'id="unsaved"' in page and 'id="keys"' in page and 'role="status"' in page
    assert "notes in order of doubt" in page
    # the legend names the marks by glyph and line, not by colour alone
    for mark in ("≠ members disagree (purple dashed line)", "≈ score near a threshold",
                 "✗ missed (gold; red wavy line)", "+ marked missed (green double line)"):
        assert mark in page


def test_released_text_is_what_the_output_file_holds(run) -> None:
    out, notes, _ = run
    data = _data(render_page(load_review(out, notes), save_url="/c", token=TOKEN,
                             revision="none"))
    released = {r["id"]: r["text"] for r in map(json.loads, (out / notes.name).open())}
    assert {n["id"]: n["released"] for n in data["notes"]} == released
    assert "[**NAME**]" in released["x"]  # what was handed out, not the original
    assert data["release"] == {"mode": "tag", "path": str(out / notes.name)}


def test_released_text_of_a_directory_run_and_what_is_missing(tmp_path: Path) -> None:
    src = tmp_path / "notes"
    src.mkdir()
    for k, t in TEXTS.items():
        (src / f"{k}.txt").write_text(t)
    spans = {"x": [Span(*at("x", "Yolanda Brisbee"), "NAME", 0.9)]}
    out = tmp_path / "run"
    assert run_deid(src, out, Ensemble([Slot(FixedMember("m1", spans), threshold=0.5)]),
                    mode="redact").exit_code == 0
    review = load_review(out, src)
    got = {n.id: n.released for n in review.notes}
    assert got == {k: (out / f"{k}.txt").read_text() for k in TEXTS}
    assert "Yolanda" not in got["x"]
    assert "why" not in review.release
    (out / "z.txt").unlink()  # an output gone: said, never silently the original
    review = load_review(out, src)
    assert {n.id: n.released for n in review.notes}["z"] is None
    assert review.release["why"].startswith("1 of 3 note(s) have no released text")


def test_spans_mode_has_no_released_text_and_says_why(tmp_path: Path) -> None:
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"id": k, "text": t}) + "\n" for k, t in TEXTS.items()))
    out = tmp_path / "run"
    spans = {"x": [Span(*at("x", "Yolanda Brisbee"), "NAME", 0.9)]}
    assert run_deid(notes, out, Ensemble([Slot(FixedMember("m1", spans), threshold=0.5)]),
                    mode="spans").exit_code == 0
    review = load_review(out, notes)
    assert all(n.released is None for n in review.notes)
    assert "holds annotations, not text" in review.release["why"]


def test_the_order_line_says_when_there_is_no_order_of_doubt(run, tmp_path: Path) -> None:
    out, notes, _ = run
    assert order_line(load_review(out, notes)).startswith("notes in order of doubt")
    # one member, no score near its threshold: every doubt is 0, the order is the run's
    one = tmp_path / "one"
    one.mkdir()
    spans = {"x": [Span(*at("x", "Yolanda Brisbee"), "NAME", 0.99)]}
    notes1 = one / "notes.jsonl"
    notes1.write_text(notes.read_text())
    out1 = one / "run"
    assert run_deid(notes1, out1, Ensemble([Slot(FixedMember("m1", spans), threshold=0.5)]),
                    mode="tag").exit_code == 0
    review = load_review(out1, notes1)
    line = order_line(review)
    assert "one member: members cannot disagree" in line
    assert "every note's doubt is 0: the notes are in the run's order" in line
    assert [n.id for n in review.notes] == list(TEXTS)  # the run's order indeed
    assert str(escape(line)) in render_page(review, save_url="/c", token=TOKEN, revision="none")


def test_spans_near_a_threshold_are_marked(run) -> None:
    out, notes, _ = run
    review = load_review(out, notes)
    near = {(n.id, n.text[s["start"]:s["end"]]): s["near"] for n in review.notes
            for s in n.spans}
    # m2 scored Elmsworth Clinic 0.6 against its threshold 0.5: half-way into the 0.2 band
    assert near.pop(("y", "Elmsworth Clinic")) == 0.5
    assert set(near.values()) == {0.0}


def test_a_blank_between_two_hidden_words_is_not_a_miss(tmp_path: Path) -> None:
    text = "Seen by Quinby  Marlowe today."
    notes = tmp_path / "notes.jsonl"
    notes.write_text(json.dumps({"id": "q", "text": text}) + "\n")
    i, j = text.index("Quinby"), text.index("Marlowe")
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"id": "q", "text": text, "spans": [
        {"start": i, "end": j + len("Marlowe"), "label": "NAME"},
        {"start": text.index("today"), "end": text.index("today") + 5, "label": "DATE"}]}) + "\n")
    spans = {"q": [Span(i, i + 6, "NAME", 0.9), Span(j, j + 7, "NAME", 0.9)]}
    out = tmp_path / "run"
    assert run_deid(notes, out, Ensemble([Slot(FixedMember("m1", spans), threshold=0.5)]),
                    mode="tag").exit_code == 0
    review = load_review(out, notes, gold_path=gold)
    # the two blanks between the hidden words are not shown as a miss (nothing can be marked
    # there); the word the members missed is
    assert [(text[m["start"]:m["end"]], m["label"]) for m in review.notes[0].misses] == [
        ("today", "DATE")]


def test_the_file_is_read_only_before_any_work_and_allows_only_its_own_script(run, tmp_path
                                                                               ) -> None:
    out, notes, _ = run
    page = tmp_path / "page.html"
    write_page(load_review(out, notes), page)
    text = page.read_text()
    notice = _readonly(text)
    assert notice and notice.startswith("Read-only: this is the self-contained file")
    assert "dphub review DIR --notes NOTES" in notice
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text).group(1)
    assert "unsafe-inline" not in csp and "form-action 'none'" in csp
    nonce = re.search(r"script-src 'nonce-([^']+)'", csp).group(1)
    # every executable script and the style carry the file's nonce; the data blocks are JSON
    scripts = re.findall(r"<script([^>]*)>", text)
    assert [s for s in scripts if "application/json" not in s] == [f' nonce="{nonce}"']
    assert f'<style nonce="{nonce}">' in text
    assert _data(text, "review-config")["readonly"]
    # a second file gets another nonce
    write_page(load_review(out, notes), tmp_path / "again.html")
    assert f"'nonce-{nonce}'" not in (tmp_path / "again.html").read_text()


def test_a_page_that_cannot_save_says_so_before_any_work(run, tmp_path: Path) -> None:
    out, notes, _ = run
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    corr = blocker / "review" / "c.jsonl"  # its directory can never be made
    assert unwritable(corr) == f"{blocker} is not a directory"
    client = TestClient(make_app(load_review(out, notes), corr, TOKEN),
                        headers={"host": "127.0.0.1:8123"})
    r = client.get(f"/?token={TOKEN}")
    assert r.status_code == 200
    notice = _readonly(r.text)
    assert notice and notice.startswith(f"Read-only: corrections cannot be saved to {corr}")
    assert _data(r.text, "review-config")["readonly"]
    key = next(n["key"] for n in _data(r.text)["notes"] if n["id"] == "x")
    s = client.post("/corrections", headers={"x-dphub-token": TOKEN},
                    json={"units": "utf-16", "revision": "none",
                          "notes": {key: {"reviewed": True}}})
    assert s.status_code == 409 and "cannot be saved" in s.json()["error"]
    assert not corr.exists()


def test_a_writable_place_is_not_read_only(tmp_path: Path) -> None:
    assert unwritable(tmp_path / "new" / "deeper" / "c.jsonl") is None
    assert unwritable(tmp_path / "c.jsonl") is None


def test_the_server_warns_at_start_when_it_cannot_save(run, tmp_path: Path) -> None:
    out, notes, _ = run
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    corr = blocker / "c.jsonl"
    env = {**os.environ, "DPHUB_PROGRESS": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "dphub.cli.main", "review", str(out),
                             "--notes", str(notes), "--corrections", str(corr)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = proc.stderr.readline()  # printed before the URL, before anyone opens the page
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # a shutdown stuck under load; the warning is the test
            proc.kill()
            proc.communicate()
    assert first.startswith(f"warning: corrections cannot be saved to {corr} ({blocker} is not "
                            "a directory): the page is read-only")
