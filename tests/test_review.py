"""``dphub review`` (issue 40): the run read back, the order of doubt, corrections as labels, the
page's guards (loopback Host, token), the self-contained file. The browser drives the page in
test_review_browser.py."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from review_fixtures import TEXTS, at, audit, leaks, make_run  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from dphub.cli.main import main  # noqa: E402
from dphub.ensemble.evaluation import read_labelled  # noqa: E402
from dphub.errors import ConfigError, InputError  # noqa: E402
from dphub.review.corrections import (  # noqa: E402
    check_corrections_path,
    corrections_revision,
    default_corrections_path,
    load_corrections,
    save_corrections,
)
from dphub.review.doubt import NEAR, note_doubt  # noqa: E402
from dphub.review.page import render_page, script_json  # noqa: E402
from dphub.review.run import load_review  # noqa: E402
from dphub.review.server import make_app  # noqa: E402

TOKEN = "t0k3n-" + "a" * 40


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_run(tmp_path)


def _client(review, path: Path, host: str = "127.0.0.1:8123") -> TestClient:
    # the Host header is set directly: some Starlette test clients cannot parse an IPv6 netloc
    return TestClient(make_app(review, path, TOKEN), headers={"host": host})


def _page_data(html: str) -> dict:
    m = re.search(r'<script id="review-data" type="application/json">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1))


# ------------------------------------------------------------------------------ the run read back
def test_spans_rendered_match_the_audit(run, tmp_path: Path) -> None:
    out, notes, _ = run
    review = load_review(out, notes)
    r = _client(review, tmp_path / "c.jsonl").get(f"/?token={TOKEN}")
    assert r.status_code == 200
    data = _page_data(r.text)
    want = audit(out)
    for n in data["notes"]:
        got = [{k: s[k] for k in ("start", "end", "label", "score", "members")} for s in n["spans"]]
        assert got == want[n["id"]]
        assert n["text"] == TEXTS[n["id"]]
    # the disagreeing note first, then the others in the run's order
    assert [n["id"] for n in data["notes"]] == ["y", "x", "z"]
    y = data["notes"][0]
    assert [s["disagree"] for s in y["spans"]] == [False, True, True]
    assert y["doubt"] == {"total": 2.5, "disagree": 2, "near": 0.5, "inverse": 0}
    assert data["counts"] == {"NAME": 2, "DATE": 1, "CONTACT": 1, "LOCATION": 1}
    assert data["words"]["total"] > data["words"]["kept"] > 0
    assert data["run"]["members"] == ["m1", "m2"]


def test_note_text_cannot_close_the_script_element() -> None:
    assert "</script>" not in script_json({"t": "</script><script>alert(1)</script>"})
    assert json.loads(script_json({"t": "a</b>&\u2028"})) == {"t": "a</b>&\u2028"}


def test_gold_marks_misses_false_positives_and_scores(run) -> None:
    out, notes, gold = run
    review = load_review(out, notes, gold_path=gold)
    y = review.note("line 2")
    assert [s["gold"] for s in y.spans] == ["tp", "fp", "tp"]  # the DATE is not in the gold
    assert y.misses == [{"start": at("y", "home")[0], "end": at("y", "home")[1],
                         "label": "LOCATION-OTHER", "category": "LOCATION"}]
    assert review.scores is not None and review.scores["notes"] == 3
    assert 0 < review.scores["precision"] < 1 and 0 < review.scores["recall"] < 1
    assert review.scores["leaks"] == 1


def test_inverse_rule_words_and_doubt_neighbours() -> None:
    members, th = ["a", "b"], {"a": 0.5}
    on = note_doubt([{"voters": ["a"], "score": 0.5}], members, th)
    assert on.near == 1.0 and on.disagree == 1 and on.inverse == 0
    for edge in (0.5 + NEAR, 0.5 - NEAR, 1.0, 0.0):
        assert note_doubt([{"voters": ["a", "b"], "score": edge}], members, th).near == \
            pytest.approx(0.0, abs=1e-9)
    # a member without a threshold (rules) gives no nearness; all members agreeing no disagreement
    assert note_doubt([{"voters": ["b"], "score": 0.5}], members, th).near == 0
    assert note_doubt([{"voters": ["a", "b"], "score": 0.9}], members, th).disagree == 0
    inv = note_doubt([{"voters": [], "score": 0.1, "label": "PHI"}], members, th)
    assert (inv.inverse, inv.disagree, inv.near) == (1, 0, 0)


def test_the_run_and_the_notes_must_match(run, tmp_path: Path) -> None:
    out, notes, _ = run
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "q", "text": "Brisbee Yolanda"}) + "\n")
    with pytest.raises(InputError) as e:
        load_review(out, other)
    assert not leaks(str(e.value))
    shorter = tmp_path / "short.jsonl"
    shorter.write_text("".join(json.dumps({"id": k, "text": t[:10]}) + "\n"
                               for k, t in TEXTS.items()))
    with pytest.raises(InputError, match="not the text the run read") as e:  # issue 54
        load_review(out, shorter)
    assert not leaks(str(e.value))
    with pytest.raises(InputError, match="not a de-identification run"):
        load_review(tmp_path, notes)


# ----------------------------------------------------------------------------------- the guards
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8123", "127.0.0.1.evil.example",
                                  "localhost.evil.example:80", "10.0.0.5:8123", "0.0.0.0:8123",
                                  "[::2]:8123"])
def test_a_non_loopback_host_is_refused(run, tmp_path: Path, host: str) -> None:
    out, notes, _ = run
    c = _client(load_review(out, notes), tmp_path / "c.jsonl", host=host)
    r = c.get(f"/?token={TOKEN}")
    assert r.status_code == 421 and not leaks(r.text)
    r = c.post(f"/corrections?token={TOKEN}", json={"notes": {"line 1": {"reviewed": True}}})
    assert r.status_code == 421 and not (tmp_path / "c.jsonl").exists()


@pytest.mark.parametrize("host", ["127.0.0.1:8123", "localhost:8123", "[::1]:8123", "localhost"])
def test_loopback_hosts_are_served(run, tmp_path: Path, host: str) -> None:
    out, notes, _ = run
    assert _client(load_review(out, notes), tmp_path / "c.jsonl",
                   host=host).get(f"/?token={TOKEN}").status_code == 200


@pytest.mark.parametrize("query", ["", "?token=", "?token=wrong", f"?token={TOKEN[:-1]}b",
                                   f"?token={TOKEN}x", f"?tok={TOKEN}"])
def test_a_missing_or_wrong_token_is_refused(run, tmp_path: Path, query: str) -> None:
    out, notes, _ = run
    c = _client(load_review(out, notes), tmp_path / "c.jsonl")
    r = c.get("/" + query)
    assert r.status_code == 403 and not leaks(r.text)
    r = c.post("/corrections" + query, json={"notes": {"line 1": {"reviewed": True}}})
    assert r.status_code == 403 and not (tmp_path / "c.jsonl").exists()


def test_page_headers_forbid_external_requests_and_caching(run, tmp_path: Path) -> None:
    out, notes, _ = run
    r = _client(load_review(out, notes), tmp_path / "c.jsonl").get(f"/?token={TOKEN}")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert not re.search(r'(src|href)="(https?:)?//', r.text)


# ---------------------------------------------------------------------------------- corrections
def _payload() -> dict:  # the page's units: UTF-16 (equal to code points in these ASCII notes)
    a, b = at("y", "home")
    return {"units": "utf-16", "revision": "none", "notes": {  # "none": no file yet
        "line 2": {"reviewed": True, "rejected": [list(at("y", "03/04/2021"))],
                   "added": [{"start": a, "end": b, "label": "LOCATION"}]},
        "line 1": {"reviewed": True, "retyped": [{**dict(zip(("start", "end"),
                                                            at("x", "555-0134"),
                                                            strict=True)),
                                                   "label": "CONTACT"}]},
        "line 3": {"reviewed": False},
    }}


def test_corrections_are_saved_0600_atomically_as_labelled_jsonl(run, tmp_path: Path,
                                                                caplog) -> None:
    out, notes, _ = run
    dest = tmp_path / "private" / "corr.jsonl"
    before = {p: p.read_bytes() for p in (notes, *out.iterdir()) if p.is_file()}
    caplog.set_level(logging.DEBUG)
    r = _client(load_review(out, notes), dest).post(f"/corrections?token={TOKEN}",
                                                     json=_payload())
    assert r.status_code == 200, r.text
    assert r.json()["notes"] == 2
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    assert [p.name for p in dest.parent.iterdir()] == ["corr.jsonl"]  # no temp file left
    got = {n.id: [(s.start, s.end, s.label) for s in n.spans] for n in read_labelled(dest)}
    assert got == {
        "y": [(*at("y", "Quinby Marlowe"), "DOCTOR"), (*at("y", "Elmsworth Clinic"), "HOSPITAL"),
              (*at("y", "home"), "LOCATION")],
        "x": [(*at("x", "Yolanda Brisbee"), "NAME"), (*at("x", "555-0134"), "CONTACT")],
    }
    # nothing else was written, the inputs are unchanged, nothing logged holds note text
    assert {p: p.read_bytes() for p in before} == before
    assert not any(leaks(rec.getMessage()) for rec in caplog.records)
    # and a later session starts from them
    again = load_corrections(load_review(out, notes), dest)["notes"]
    assert again["line 2"]["rejected"] == [list(at("y", "03/04/2021"))]
    assert again["line 2"]["added"] == [{"start": at("y", "home")[0], "end": at("y", "home")[1],
                                         "label": "LOCATION"}]


def test_inverse_rule_untyped_spans_are_written_other(run, tmp_path: Path) -> None:
    out, notes, _ = run
    review = load_review(out, notes)
    review.note("line 3").spans.append(
        {"start": 0, "end": 7, "label": "PHI", "category": "PHI", "voters": [], "score": 0.2,
         "inverse": True, "disagree": False, "gold": None})
    dest = tmp_path / "c.jsonl"
    save_corrections(review, {"notes": {"line 3": {"reviewed": True}}}, dest)
    assert [(s.start, s.end, s.label) for s in read_labelled(dest)[0].spans] == [(0, 7, "OTHER")]


@pytest.mark.parametrize("bad", [
    {"units": "utf-16", "notes": {"line 9": {"reviewed": True}}},
    {"units": "utf-16", "notes": {"line 2": {"rejected": [[0, 3]]}}},
    {"units": "utf-16", "notes": {"line 2": {"added": [{"start": 5, "end": 3, "label": "NAME"}]}}},
    {"units": "utf-16", "notes": {"line 2": {"added": [{"start": 0, "end": 10_000, "label": "NAME"}]}}},
    {"units": "utf-16", "notes": {"line 2": {"added": [{"start": -1, "end": 3, "label": "NAME"}]}}},
    {"units": "utf-16", "notes": {"line 2": {"added": [{"start": 0, "end": 3, "label": "DRAGON"}]}}},
    {"units": "utf-16", "notes": {"line 2": {"added": [{"start": 0, "end": 3.5, "label": "NAME"}]}}},
    {"units": "utf-16", "notes": {"line 2": {"added": [{"start": 12, "end": 20, "label": "NAME"}]}}},  # overlaps
    {"units": "utf-16", "notes": {"line 2": {"retyped": [{"start": 12, "end": 26, "label": "PHI"}]}}},
    {"units": "utf-16", "notes": {}},
    {"units": "utf-16", "notes": []},
    [],
])
def test_bad_corrections_are_refused_and_nothing_is_written(run, tmp_path: Path, bad) -> None:
    out, notes, _ = run
    dest = tmp_path / "c.jsonl"
    dest.write_text("earlier\n")
    if isinstance(bad, dict):  # based on the file there (else the revision check refuses it)
        bad = {**bad, "revision": corrections_revision(dest)}
    r = _client(load_review(out, notes), dest).post(f"/corrections?token={TOKEN}", json=bad)
    assert r.status_code == 400 and r.json()["error"] and not leaks(r.text)
    assert dest.read_text() == "earlier\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c.jsonl", "notes.jsonl",
                                                                 "gold.jsonl", "run"])


def test_corrections_refuse_non_json(run, tmp_path: Path) -> None:
    out, notes, _ = run
    c = _client(load_review(out, notes), tmp_path / "c.jsonl")
    assert c.post(f"/corrections?token={TOKEN}", content=b"{",
                  headers={"content-type": "application/json"}).status_code == 400
    assert c.post(f"/corrections?token={TOKEN}", content=b"a=b",
                  headers={"content-type": "application/x-www-form-urlencoded"}
                  ).status_code == 415
    assert not (tmp_path / "c.jsonl").exists()


def test_corrections_never_beside_the_output(run, tmp_path: Path, monkeypatch) -> None:
    out, notes, gold = run
    for bad in (out / "c.jsonl", out / "sub" / "c.jsonl", notes, gold):
        with pytest.raises(ConfigError):
            check_corrections_path(bad, out, [notes, gold])
    with pytest.raises(ConfigError, match="jsonl"):
        check_corrections_path(tmp_path / "c.txt", out, [notes])
    run_id = load_review(out, notes).run_id
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))
    p = default_corrections_path(out, run_id)
    assert p.parent == tmp_path / "home" / "review"
    assert re.fullmatch(r"run-[0-9a-f]{12}\.corrections\.jsonl", p.name)


# ------------------------------------------------------------------------------------ the CLI
def test_cli_html_file_is_0600_self_contained_with_a_warning(run, tmp_path: Path, capsys) -> None:
    out, notes, gold = run
    page = tmp_path / "page.html"
    assert main(["review", str(out), "--notes", str(notes), "--gold", str(gold),
                 "--html", str(page)]) == 0
    cap = capsys.readouterr()
    assert "warning" in cap.err and "note text" in cap.err and not leaks(cap.out + cap.err)
    assert stat.S_IMODE(os.stat(page).st_mode) == 0o600
    html = page.read_text()
    assert "Quinby Marlowe" in html and "default-src 'none'" in html
    assert not re.search(r'(src|href)="(https?:)?//', html) and "fetch(C.save_url" in html
    assert _page_data(html)["scores"]["notes"] == 3


@pytest.mark.parametrize("args", [
    ["--html", "{run}/page.html"],          # the page holds note text: not in the release
    ["--html", "{tmp}/page.txt"],
    ["--corrections", "{run}/c.jsonl"],
    ["--corrections", "{tmp}/notes.jsonl"],
    ["--gold", "{tmp}/missing.jsonl", "--html", "{tmp}/p.html"],
])
def test_cli_bad_input_is_one_error_line(run, tmp_path: Path, capsys, args) -> None:
    out, notes, _ = run
    args = [a.format(run=out, tmp=tmp_path) for a in args]
    assert main(["review", str(out), "--notes", str(notes), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not leaks(err)
    assert not (out / "page.html").exists() and not (out / "c.jsonl").exists()
    assert not (tmp_path / "page.txt").exists()


def test_cli_not_a_run(tmp_path: Path, capsys) -> None:
    notes = tmp_path / "n.jsonl"
    notes.write_text(json.dumps({"id": "a", "text": "Quinby"}) + "\n")
    assert main(["review", str(tmp_path), "--notes", str(notes), "--html",
                 str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not leaks(err)


def test_static_page_has_no_save(run) -> None:
    out, notes, _ = run
    html = render_page(load_review(out, notes))
    cfg = json.loads(re.search(r'id="review-config" type="application/json">(.*?)</script>',
                               html, re.S).group(1))
    assert cfg["save_url"] is None and cfg["token"] is None
