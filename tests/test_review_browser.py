"""``dphub review`` in a real headless Chromium (issue 40): open a run, the highlighted spans are
the audit's, filter by category, mark a missed span, save, and the saved file trains a local
model with ``dphub ensemble train``. Skips only when Debian's chromium (or Playwright) is absent;
``.ci/run`` installs chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _serve(run: Path, notes: Path, corr: Path, home: Path, *extra: str
           ) -> tuple[subprocess.Popen, str]:
    # home: the run's own (its key made the audit's note digests, which review checks)
    env = {**os.environ, "DPHUB_HOME": str(home), "DPHUB_PROGRESS": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "dphub.cli.main", "review", str(run),
                             "--notes", str(notes), "--corrections", str(corr), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for _ in range(2):
        line = proc.stdout.readline()
        if "http://127.0.0.1:" in line:
            return proc, line.strip()
    proc.kill()
    raise AssertionError(proc.stderr.read())


@pytest.mark.slow
def test_review_page_in_chromium(tmp_path: Path, tiny_base_model: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    from review_fixtures import TEXTS, at, audit, leaks, make_run

    from dphub.cli.main import main
    from dphub.ensemble.evaluation import read_labelled

    run, notes, _ = make_run(tmp_path)
    corr = tmp_path / "private" / "corrections.jsonl"
    proc, url = _serve(run, notes, corr, Path(os.environ["DPHUB_HOME"]))
    try:
        base = url.split("/?")[0]
        for bad in (base + "/", base + "/?token=nope"):  # no token, a wrong one: refused
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(bad, timeout=30)
            assert e.value.code == 403
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url)
            # the highlighted spans are the audit's, note by note
            want = audit(run)
            for nid in TEXTS:
                got = page.eval_on_selector_all(
                    f'section.note[data-id="{nid}"] .phi[data-start]',
                    "els => els.map(e => [+e.dataset.start, +e.dataset.end, e.dataset.label,"
                    " e.dataset.members, e.textContent])")
                assert got == [[s["start"], s["end"], s["label"], ",".join(s["members"]),
                                TEXTS[nid][s["start"]:s["end"]]] for s in want[nid]]
            assert page.locator("section.note").first.get_attribute("data-id") == "y"
            # filter by category: only the note with a DATE stays
            page.select_option("#f-cat", "DATE")
            assert page.locator("section.note:not(.hidden)").count() == 1
            page.select_option("#f-cat", "")
            page.check("#f-disagree")
            assert page.eval_on_selector_all("section.note:not(.hidden)",
                                             "els => els.map(e => e.dataset.id)") == ["y"]
            page.uncheck("#f-disagree")
            # mark a missed span: select "home" in note y, choose LOCATION
            a, b = at("y", "home")
            page.evaluate("""([a, b]) => {
                const seg = [...document.querySelectorAll('section.note[data-id="y"] .text span')]
                    .find(s => +s.dataset.o <= a && a + (b - a) <= +s.dataset.o + s.textContent.length);
                const r = document.createRange(), o = +seg.dataset.o;
                r.setStart(seg.firstChild, a - o); r.setEnd(seg.firstChild, b - o);
                const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(r);
            }""", [a, b])
            card = page.locator('section.note[data-id="y"]')
            card.locator("select.add-cat").select_option("LOCATION")
            card.locator("button.add").click()
            assert card.locator(".added").inner_text() == "home"
            # reject the false DATE
            d0, _ = at("y", "03/04/2021")
            card.locator(f'.phi[data-start="{d0}"]').click()
            page.click("#m-reject")
            assert "rejected" in card.locator(f'.phi[data-start="{d0}"]').get_attribute("class")
            page.click("#save")
            # a locator assertion, not wait_for_function("..."): evaluating a string is what the
            # page's Content Security Policy forbids ('unsafe-eval'), and Chromium enforces it
            sync_api.expect(page.locator("#msg")).to_have_text(re.compile(r"^saved"),
                                                               timeout=30_000)
            if os.environ.get("DPHUB_REVIEW_SCREENSHOT"):
                page.screenshot(path=os.environ["DPHUB_REVIEW_SCREENSHOT"])
            browser.close()
        assert not errors
        assert all(r.startswith(base) for r in requests)  # nothing external
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert not leaks(out + err)  # no note text in the server's output or logs
    assert oct(corr.stat().st_mode & 0o777) == "0o600"
    labelled = read_labelled(corr)
    assert [(n.id, [(s.start, s.end, s.label) for s in n.spans]) for n in labelled] == [
        ("y", [(*at("y", "Quinby Marlowe"), "DOCTOR"), (*at("y", "Elmsworth Clinic"), "HOSPITAL"),
               (*at("y", "home"), "LOCATION")])]
    # the saved file trains the owner's local model (Scenario B)
    assert main(["ensemble", "train", str(corr), "--out", str(tmp_path / "own"),
                 "--base-model", str(tiny_base_model), "--warm-start", "none", "--epochs", "1",
                 "--threads", "1", "--batch-size", "1"]) == 0
    assert (tmp_path / "own" / "model.safetensors").exists()


#: select [a, b) (UTF-16 units, the page's own) of a note's text in the page
_SELECT = """([nid, a, b]) => {
    const segs = [...document.querySelectorAll(`section.note[data-id="${nid}"] .text span`)];
    const seg = segs.find(s => +s.dataset.o <= a && b <= +s.dataset.o + s.textContent.length);
    const r = document.createRange(), o = +seg.dataset.o;
    r.setStart(seg.firstChild, a - o); r.setEnd(seg.firstChild, b - o);
    const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(r);
}"""


def test_review_page_with_emoji_and_line_separators_in_chromium(tmp_path: Path) -> None:
    # issue 54: an emoji before a span shifted every later highlight by one (Python counted code
    # points, the page UTF-16 units) and a correction made there labelled other text
    sync_api = pytest.importorskip("playwright.sync_api")
    from review_astral_fixtures import TEXTS, at, make_run, u16

    from dphub.ensemble.evaluation import read_labelled

    run, notes, gold = make_run(tmp_path)
    audit = {r["id"]: r["spans"] for r in map(
        json.loads, (run / "audit.jsonl").read_bytes().decode("utf-8").split("\n")[:-1])}
    corr = tmp_path / "private" / "corrections.jsonl"
    proc, url = _serve(run, notes, corr, Path(os.environ["DPHUB_HOME"]), "--gold", str(gold))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            other = browser.new_page()  # a second tab on the same corrections
            other.on("pageerror", lambda e: errors.append(str(e)))
            other.goto(url)
            for nid in TEXTS:  # the highlighted characters are the ones the run hid
                got = page.eval_on_selector_all(f'section.note[data-id="{nid}"] .phi[data-start]',
                                                "els => els.map(e => e.textContent)")
                assert got == [s["text"] for s in audit[nid]]
                missed = page.eval_on_selector_all(f'section.note[data-id="{nid}"] .miss',
                                                   "els => els.map(e => e.textContent)")
                assert missed == ["Quarrytown"]  # the gold miss, after the emoji
            for nid in ("a", "b"):  # mark the missed place, after emoji and separators
                a, b = at(nid, "Quarrytown")
                page.evaluate(_SELECT, [nid, u16(nid, a), u16(nid, b)])
                card = page.locator(f'section.note[data-id="{nid}"]')
                card.locator("select.add-cat").select_option("LOCATION")
                card.locator("button.add").click()
                assert card.locator(".added").inner_text() == "Quarrytown"
            c0 = u16("c", at("c", "Ysolde Crane")[0])
            card = page.locator('section.note[data-id="c"]')
            assert card.locator(f'.phi[data-start="{c0}"]').inner_text() == "Ysolde Crane"
            card.locator(f'.phi[data-start="{c0}"]').click()
            page.click("#m-reject")
            # a key on a span after two emoji: the retype lands on that span's characters
            a0 = u16("a", at("a", "555-0134")[0])
            page.locator(f'section.note[data-id="a"] .phi[data-start="{a0}"]').focus()
            page.keyboard.press("8")  # OTHER
            assert page.evaluate("() => document.activeElement.dataset.tag") == "PHONE→OTHER"
            page.click("#save")
            sync_api.expect(page.locator("#msg")).to_have_text(re.compile(r"^saved"),
                                                               timeout=30_000)
            # the second tab was loaded before that save: its save is refused, not a silent
            # overwrite; the first tab saves again from the revision its save returned
            other.locator('section.note[data-id="b"] input.reviewed').check()
            other.click("#save")
            sync_api.expect(other.locator("#msg")).to_have_text(
                re.compile(r"^error: .*another page"), timeout=30_000)
            page.click("#save")
            sync_api.expect(page.locator("#msg")).to_have_text(re.compile(r"^saved 3"),
                                                               timeout=30_000)
            # the refused tab still has unsaved changes: reloading asks first (beforeunload),
            # then shows the first tab's corrections, and its own save adds to them
            assert other.locator("#unsaved").is_visible()
            asked: list[str] = []
            other.on("dialog", lambda d: (asked.append(d.type), d.accept()))
            other.reload()
            assert asked == ["beforeunload"]
            assert other.locator("#unsaved").is_hidden()
            card = other.locator('section.note[data-id="c"]')
            assert "rejected" in card.locator(f'.phi[data-start="{c0}"]').get_attribute("class")
            c1 = u16("c", at("c", "555-0199")[0])
            card.locator(f'.phi[data-start="{c1}"]').focus()
            other.keyboard.press("5")  # ID
            other.click("#save")
            sync_api.expect(other.locator("#msg")).to_have_text(re.compile(r"^saved 3"),
                                                                timeout=30_000)
            browser.close()
        assert not errors
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    saved = {n.id: [(n.text[s.start:s.end], s.label) for s in n.spans] for n in read_labelled(corr)}
    # both pages' corrections, each on its own characters
    assert saved == {
        "a": [("Yolanda Brisbee", "NAME"), ("555-0134", "OTHER"), ("Quarrytown", "LOCATION")],
        "b": [("Quinby Marlowe", "DOCTOR"), ("Elmsworth Clinic", "HOSPITAL"),
              ("Quarrytown", "LOCATION")],
        "c": [("555-0199", "ID")]}


#: the focused element as the test reads it: a span's kind, offsets, tag, accessible name
_ACTIVE = """() => { const e = document.activeElement;
    return {id: e.id, stop: e.dataset ? e.dataset.stop !== undefined : false,
            kind: e.dataset ? e.dataset.kind || null : null,
            start: e.dataset && e.dataset.start ? +e.dataset.start : null,
            text: e.textContent, aria: e.getAttribute("aria-label")}; }"""
#: each stop of a note: kind, its text, the tag written after it (its ::after content), classes
_TAGS = """(nid) => [...document.querySelectorAll(`section.note[data-id="${nid}"] .text [data-stop]`)]
    .map(e => { const s = [...e.parentElement.querySelectorAll(
        `[data-kind="${e.dataset.kind}"][data-start="${e.dataset.start}"]`)];
      const last = s[s.length - 1];
      return [e.dataset.kind, s.map(x => x.textContent).join(""),
              getComputedStyle(last, "::after").content, e.className]; })"""


def _press_until(page, key: str, test: str, most: int = 60) -> dict:
    """Press ``key`` until the focused element passes ``test`` (a JS predicate); keys only."""
    for _ in range(most):
        page.keyboard.press(key)
        got = page.evaluate(_ACTIVE)
        if page.evaluate(f"(a) => ({test})(a)", got):
            return got
    raise AssertionError(f"{key} never reached {test}")


def test_keyboard_only_review_in_chromium(tmp_path: Path) -> None:
    # issue 54 #3: a reviewer works without a mouse and without guessing: Tab reaches the spans,
    # each carries its label as visible text, a/r/digits/g correct them, Escape closes the
    # detail, the page says it has unsaved changes, and Enter on "save" writes them
    sync_api = pytest.importorskip("playwright.sync_api")
    from review_fixtures import TEXTS, at, make_run

    from dphub.ensemble.evaluation import read_labelled

    run, notes, gold = make_run(tmp_path)
    corr = tmp_path / "private" / "corrections.jsonl"
    proc, url = _serve(run, notes, corr, Path(os.environ["DPHUB_HOME"]), "--gold", str(gold))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            assert page.locator("#readonly").is_hidden()  # this page can save
            assert page.locator("#unsaved").is_hidden()
            # the label is written on every span (a tag after it), not only its colour; the
            # marks of "members disagree", "near a threshold", "false positive" and "missed"
            # differ in glyph and line
            assert page.evaluate(_TAGS, "y") == [
                ["run", "Quinby Marlowe", '"DOCTOR"', "phi cat-NAME"],
                ["run", "03/04/2021", '"DATE ≠ FP"', "phi cat-DATE disagree fp"],
                ["run", "Elmsworth Clinic", '"HOSPITAL ≠ ≈"', "phi cat-LOCATION disagree near"],
                ["miss", "home", '"✗ missed LOCATION-OTHER"', "miss"]]
            style = page.evaluate("""() => {
                const d = document.querySelector('.phi.disagree'), m = document.querySelector('.miss');
                return [getComputedStyle(d).borderBottomStyle, getComputedStyle(m).textDecorationStyle]; }""")
            assert style == ["dashed", "wavy"]
            # the released text beside the original: what the output file holds
            assert page.locator('section.note[data-id="y"] .released').inner_text() == \
                json.loads((run / notes.name).read_text().split("\n")[1])["text"]
            # Tab from the top of the page to the first span (note y, the most doubtful)
            got = _press_until(page, "Tab", "a => a.stop")
            assert (got["kind"], got["text"]) == ("run", "Quinby Marlowe")
            assert got["aria"] == "hidden as DOCTOR: Quinby Marlowe"
            page.keyboard.press("a")  # accept
            got = page.evaluate(_ACTIVE)  # the focus stays on the span after it is redrawn
            assert got["text"] == "Quinby Marlowe" and "accepted" in got["aria"]
            assert page.locator("#unsaved").is_visible()  # and the page says so
            page.keyboard.press("n")
            assert page.evaluate(_ACTIVE)["text"] == "03/04/2021"
            page.keyboard.press("Enter")  # the detail opens, its first button focused
            assert page.locator("#menu").is_visible()
            assert page.evaluate(_ACTIVE)["id"] == "m-accept"
            page.keyboard.press("Escape")  # closes it and gives the focus back
            assert page.locator("#menu").is_hidden()
            assert page.evaluate(_ACTIVE)["text"] == "03/04/2021"
            page.keyboard.press("r")  # reject: not PHI
            assert page.evaluate(_ACTIVE)["aria"].startswith("rejected, not PHI")
            page.keyboard.press("ArrowRight")
            assert page.evaluate(_ACTIVE)["text"] == "Elmsworth Clinic"
            page.keyboard.press("8")  # retype: 8 is the eighth category, OTHER
            page.keyboard.press("n")
            got = page.evaluate(_ACTIVE)
            assert (got["kind"], got["text"]) == ("miss", "home")
            page.keyboard.press("g")  # the gold's label for the missed span
            got = page.evaluate(_ACTIVE)
            assert (got["kind"], got["text"]) == ("added", "home")
            assert page.evaluate(_TAGS, "y") == [
                ["run", "Quinby Marlowe", '"✓ DOCTOR"', "phi cat-NAME accepted"],
                ["run", "03/04/2021", '"not PHI ≠ FP"', "phi cat-DATE disagree fp rejected"],
                ["run", "Elmsworth Clinic", '"HOSPITAL→OTHER ≠ ≈"',
                 "phi cat-LOCATION disagree near retyped"],
                ["added", "home", '"+ LOCATION"', "added cat-LOCATION"]]
            assert page.locator('section.note[data-id="y"] input.reviewed').is_checked()
            # back up to the save button, keys only, and press it
            _press_until(page, "Shift+Tab", "a => a.id === 'save'")
            page.keyboard.press("Enter")
            sync_api.expect(page.locator("#msg")).to_have_text(re.compile(r"^saved 1"),
                                                               timeout=30_000)
            assert page.locator("#unsaved").is_hidden()
            browser.close()
        assert not errors
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    saved = {n.id: [(n.text[s.start:s.end], s.label) for s in n.spans] for n in read_labelled(corr)}
    assert saved == {"y": [("Quinby Marlowe", "DOCTOR"), ("Elmsworth Clinic", "OTHER"),
                           ("home", "LOCATION")]}
    assert TEXTS["y"][slice(*at("y", "home"))] == "home"


def test_read_only_pages_say_so_before_any_work_in_chromium(tmp_path: Path) -> None:
    # issue 54 #3: the self-contained file, and a served page saved to disk and opened from it
    # (file://), let a reviewer work and then lost the work silently; now the notice is there
    # before the first key, and no correction is taken
    sync_api = pytest.importorskip("playwright.sync_api")
    from review_fixtures import make_run

    from dphub.review.page import render_page, write_page
    from dphub.review.run import load_review

    run, notes, _ = make_run(tmp_path)
    review = load_review(run, notes)
    html = tmp_path / "page.html"
    write_page(review, html)  # what `dphub review --html` writes
    saved_copy = tmp_path / "saved-copy.html"  # "Save page as" of the page the server sends
    saved_copy.write_text(render_page(review, save_url="/corrections", token="t" * 43,
                                      nonce="n" * 22, revision="none"))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for path, says in ((html, "this is the self-contained file"),
                           (saved_copy, "this page was opened from a file")):
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.goto(path.as_uri())
            notice = page.locator("#readonly")
            assert notice.is_visible()
            assert notice.inner_text().startswith(f"Read-only: {says}")
            assert page.locator("#save").is_disabled()
            page.locator('section.note[data-id="y"] .phi[data-stop]').first.focus()
            page.keyboard.press("r")
            assert page.locator(".phi.rejected").count() == 0  # nothing taken...
            assert page.locator("#msg").inner_text().startswith("read-only")  # ...and said
            assert page.locator("#unsaved").is_hidden()
            assert not errors
            page.close()
        browser.close()
