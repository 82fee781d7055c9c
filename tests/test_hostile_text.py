"""The hostile-text corpus (tests/hostile_text.py) through every entry point (issue 54 item 1).

Every format's writer and reader, ``dphub deid`` in every ``--mode`` over a JSONL file, a
directory of ``.txt`` and a brat corpus, ``dphub evaluate``, ``dphub ensemble deid`` (``any`` and
``inverse``), ``dphub review`` (page data and the page file) and ``dphub ensemble train``: no crash,
every note written, offsets round-trip (span text == note[start:end] after write and read), and
one ``error:`` line for what a format cannot represent (NUL and other C0 controls in XML 1.0, a
lone surrogate in any UTF-8 file).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from dphub import formats
from dphub.cli.main import main
from dphub.errors import FormatError, InputError
from dphub.evaluate import read_predictions
from dphub.io import jsonl_lines
from dphub.notes import Note, Span
from dphub.render.base import replace_spans
from tests.hostile_text import LONE_SURROGATE, NOTES, XML_ILLEGAL, notes

#: (format, output name) of every writer
WRITERS = [("jsonl", "c.jsonl"), ("brat", "b"), ("i2b2", "x"), ("conll", "c.conll"),
           ("physionet", "c.text"), ("text", "t"), ("deidpl", "d.phi")]


def _spans(n: Note) -> list[tuple[int, int, str]]:
    return [(s.start, s.end, s.label) for s in n.spans]


# ---------------------------------------------------------------------------- formats
@pytest.mark.parametrize("fmt,name", [w for w in WRITERS if w[0] not in ("deidpl",)])
def test_every_format_round_trips_the_corpus_or_refuses_a_note_in_one_line(
        tmp_path: Path, fmt: str, name: str) -> None:
    for n in notes():
        out = tmp_path / n.id / name
        if fmt == "i2b2" and n.id in XML_ILLEGAL:
            # XML 1.0 cannot hold NUL, \v, \f or \x1c-\x1e, even as a character reference
            with pytest.raises(FormatError, match="control characters XML cannot carry"):
                formats.write([n], out, fmt)
            assert not out.exists()
            continue
        assert formats.write([n], out, fmt) == 1
        (back,) = formats.read(out, format=fmt)
        for s in back.spans:  # offsets land on the characters they name
            assert back.text[s.start:s.end].split() == back.text[s.start:s.end].split()
        if fmt == "conll":  # whitespace is normalised: span text and labels come back
            assert [(back.text[s.start:s.end], s.label) for s in back.spans] == [
                (" ".join(n.text[s.start:s.end].split()), s.label) for s in n.spans], n.id
            continue
        assert back.text == n.text, n.id
        if fmt != "text":
            assert _spans(back) == _spans(n), n.id
            assert [back.text[s.start:s.end] for s in back.spans] == [
                n.text[s.start:s.end] for s in n.spans]


def test_deidpl_span_lists_round_trip_with_their_text(tmp_path: Path) -> None:
    ns = notes()
    formats.write(ns, tmp_path / "id.text", "physionet")
    formats.write(ns, tmp_path / "id.phi", "deidpl")
    back = {n.id: n for n in formats.read(tmp_path / "id.phi", format="deidpl")}
    for n in ns:  # untyped predictions: offsets kept, same-place spans merged
        got = [(s.start, s.end) for s in back[n.id].spans]
        assert got == [(s.start, s.end) for s in n.spans], n.id


@pytest.mark.parametrize("fmt,name", WRITERS)
def test_a_lone_surrogate_is_one_error_before_anything_is_written(tmp_path: Path, fmt: str,
                                                                  name: str) -> None:
    # a Python str holds "\ud800"; every writer crashed with a bare UnicodeEncodeError
    good = notes()[0]
    bad = Note(id="p9-9", text=LONE_SURROGATE, patient_id="p9",
               spans=[Span(5, 20, "PATIENT")], labelled=True)
    out = tmp_path / name
    with pytest.raises(InputError, match=r"lone surrogate at offset 21 .*nothing was written") \
            as e:
        formats.write([good, bad], out, fmt)
    assert "Yolanda" not in str(e.value)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_lone_surrogate_escape_in_jsonl_is_refused_on_reading(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps({"id": "a", "text": LONE_SURROGATE, "spans": []}) + "\n")
    with pytest.raises(FormatError, match=r"s.jsonl:1: note a: 'text' holds a lone surrogate "
                       r"escape at offset 21") as e:
        list(formats.read(p))
    assert "Yolanda" not in str(e.value)
    p.write_text(json.dumps({"id": "a", "text": "ok", "metadata": {"k": "\ud800"}}) + "\n")
    with pytest.raises(FormatError, match="'metadata' holds a lone surrogate"):
        list(formats.read(p))


def test_cli_lone_surrogate_is_one_error_line(tmp_path: Path, capsys) -> None:
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps({"id": "a", "text": LONE_SURROGATE, "spans": []}) + "\n")
    assert main(["data", "stats", str(src)]) == 2  # read through dphub.formats
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Yolanda" not in err, err
    # a deid run fails that note alone (the others are written), naming its line
    src.write_text(json.dumps({"id": "b", "text": "Call Quinby at 555-0134"}) + "\n"
                   + json.dumps({"id": "a", "text": LONE_SURROGATE}) + "\n")
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert "line 2" in err and "lone surrogate" in err and "Yolanda" not in err, err
    assert [r["id"] for r in (json.loads(x) for _, x in jsonl_lines(tmp_path / "o" / "s.jsonl"))
            ] == ["b"]


# ---------------------------------------------------------------------------- deid
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus as a JSONL file, a directory of .txt and a brat corpus, side by side."""
    root = tmp_path_factory.mktemp("hostile")
    formats.write(notes(), root / "n.jsonl", "jsonl")
    formats.write(notes(), root / "txt", "text")
    formats.write(notes(), root / "brat", "brat")
    (root / "key").write_bytes(os.urandom(32))
    return root


def _deid(corpus: Path, src: str, mode: str, out: Path, *extra: str) -> None:
    args = ["deid", str(corpus / src), "--model", "rules:default", "--out", str(out),
            "--mode", mode, *extra]
    if mode == "surrogate":
        args += ["--key-file", str(corpus / "key")]
    assert main(args) == 0


def _written(out: Path, src: str, mode: str) -> dict[str, str]:
    """note id -> what the run wrote for it."""
    if src == "n.jsonl" and mode != "brat":
        return {r["id"]: json.dumps(r.get("spans")) if mode == "spans" else r["text"]
                for r in (json.loads(line) for _, line in jsonl_lines(out / src))}
    suffix = {"spans": ".jsonl", "brat": ".ann"}.get(mode, ".txt")
    return {p.relative_to(out).as_posix()[: -len(suffix)]: p.read_bytes().decode("utf-8")
            for p in out.rglob(f"*{suffix}") if ".dphub-run" not in p.parts}


@pytest.mark.parametrize("src", ["n.jsonl", "txt", "brat"])
def test_deid_in_every_mode_writes_every_note_on_the_right_characters(
        corpus: Path, tmp_path: Path, src: str) -> None:
    spans_out = tmp_path / "spans"
    _deid(corpus, src, "spans", spans_out)
    pred = read_predictions(spans_out)
    assert set(pred) == set(NOTES)  # every note, U+2028 / U+0085 / emoji ones included
    for nid, spans in pred.items():
        text = NOTES[nid]
        for s in spans:  # whole words of the note as read (BOM, CRLF and all)
            assert 0 <= s.start < s.end <= len(text)
            assert text[s.start:s.end] == text[s.start:s.end].strip()
        phone = text.index("555-0134")  # hidden whatever sits beside it
        assert any(s.start <= phone and phone + 8 <= s.end for s in spans), nid
    for mode in ("tag", "redact", "surrogate", "brat"):
        out = tmp_path / mode
        _deid(corpus, src, mode, out)
        got = _written(out, src, mode)
        assert set(got) == set(NOTES), mode
        for nid, text in NOTES.items():
            note = Note(nid, text)
            if mode == "tag":  # the tags sit exactly where the spans say
                assert got[nid] == replace_spans(note, pred[nid], lambda s: f"[**{s.category}**]")
            elif mode == "brat":
                assert (out / f"{nid}.txt").read_bytes().decode("utf-8") == text
                (back,) = formats.read(out / f"{nid}.ann", format="brat")
                assert [(s.start, s.end) for s in back.spans] == [
                    (s.start, s.end) for s in pred[nid]]
            else:  # what no span covers is kept character for character, in order
                pos = 0
                for a, b in [(0, pred[nid][0].start)] + [
                        (x.end, y.start) for x, y in itertools.pairwise(pred[nid])]:
                    i = got[nid].find(text[a:b], pos)
                    assert i >= 0, (mode, nid)
                    pos = i + (b - a)
                assert got[nid].endswith(text[pred[nid][-1].end:])


def test_a_text_directory_run_and_a_jsonl_run_agree_on_every_offset(corpus: Path,
                                                                   tmp_path: Path) -> None:
    # a .txt directory run dropped a leading BOM: every span of such a note was one character
    # off the same note read from JSONL, brat or the text format (and so off the gold)
    _deid(corpus, "n.jsonl", "spans", tmp_path / "j")
    _deid(corpus, "txt", "spans", tmp_path / "t")
    assert read_predictions(tmp_path / "t") == read_predictions(tmp_path / "j")


def test_evaluate_scores_the_corpus_against_its_gold(corpus: Path, tmp_path: Path,
                                                     capsys) -> None:
    rows = []
    for src in ("n.jsonl", "txt", "brat"):
        _deid(corpus, src, "spans", tmp_path / src)
        capsys.readouterr()
        assert main(["evaluate", "--gold", str(corpus / "brat"), "--pred", str(tmp_path / src),
                     "--json"]) == 0
        rows.append(json.loads(capsys.readouterr().out))
    assert rows[0] == rows[1] == rows[2]  # the same offsets whatever the input's layout
    assert "missing" not in capsys.readouterr().err


# ---------------------------------------------------------------------------- ensemble, review
@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    m = tmp_path_factory.mktemp("ens") / "m.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    return m


@pytest.mark.parametrize("aggregate", ["any", "inverse"])
def test_ensemble_deid_and_review_over_the_corpus(corpus: Path, manifest: Path, tmp_path: Path,
                                                 aggregate: str) -> None:
    from dphub.review.run import load_review
    from dphub.review.units import page_data

    out = tmp_path / "run"
    assert main(["ensemble", "deid", str(corpus / "n.jsonl"), "--ensemble", str(manifest),
                 "--out", str(out), "--aggregate", aggregate, "--mode", "tag"]) == 0
    got = _written(out, "n.jsonl", "tag")
    assert set(got) == set(NOTES) and all("555-0134" not in t for t in got.values())
    review = load_review(out, corpus / "n.jsonl", gold_path=corpus / "brat")
    assert review.checked and len(review.notes) == len(NOTES)
    assert review.scores is not None and review.scores["notes"] == len(NOTES)
    data = page_data(review.to_dict(), {n.key: n.text for n in review.notes})
    for n, cp in zip(data["notes"], review.notes, strict=True):
        text16 = n["text"].encode("utf-16-le")
        # what the page slices (UTF-16 units) is what the run hid and the gold missed
        for s, c in zip(n["spans"] + n["misses"], cp.spans + cp.misses, strict=True):
            shown = text16[2 * s["start"]: 2 * s["end"]].decode("utf-16-le")
            assert shown == cp.text[c["start"]:c["end"]] != "", n["id"]
    page = tmp_path / "page.html"
    assert main(["review", str(out), "--notes", str(corpus / "n.jsonl"), "--html",
                 str(page)]) == 0
    assert page.stat().st_size > 0


# ---------------------------------------------------------------------------- models
def test_ensemble_train_and_a_model_member_read_the_corpus(corpus: Path, tmp_path: Path,
                                                          tiny_base_model: Path,
                                                          tiny_tagger_dir: Path) -> None:
    labelled = corpus / "n.jsonl"
    assert main(["ensemble", "train", str(labelled), "--out", str(tmp_path / "own"),
                 "--base-model", str(tiny_base_model), "--warm-start", "none", "--epochs", "1",
                 "--threads", "1"]) == 0
    for model in (tmp_path / "own", tiny_tagger_dir):
        out = tmp_path / f"deid-{model.name}"
        assert main(["deid", str(labelled), "--model", str(model), "--out", str(out),
                     "--mode", "spans", "--threshold", "0.0", "--threads", "1"]) == 0
        pred = read_predictions(out)
        assert set(pred) == set(NOTES)
        for nid, spans in pred.items():
            for s in spans:
                assert 0 <= s.start < s.end <= len(NOTES[nid])


# ---------------------------------------------------------------------------- what members read
SEPARATORS = ["\x0b", "\x0c", "\x85", "\x1c", "\x1d", "\x1e", "\x1f"]
EMOJI = ["\U0001F600", "\U0001F469\u200d\U0001F4BB", "\U0001F44D\U0001F3FD"]


def test_line_separating_controls_keep_the_words_apart_for_members(tmp_path: Path) -> None:
    # tokenizers drop these as control characters: "Brisbee<NEL>at" was one word for a model
    # member, and "then<FS>Dr. Quinby" lost its title for the rules, so the name leaked
    from transformers import AutoTokenizer

    from dphub.encoders import embedded_model_dir
    from dphub.textnorm import normalize, normalized_text

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    for sep in SEPARATORS:
        assert tok.tokenize(normalized_text(f"Brisbee{sep}at"))[-1] == "at", repr(sep)
        assert len(normalized_text(f"a{sep}b")) == 3 and normalize(f"a{sep}b") is not None
    texts = {f"n{i}": f"seen then{sep}Dr. Quinby today" for i, sep in enumerate(SEPARATORS)}
    # an emoji glued to a word: one unknown word for the tokenizer, a lost title for the rules
    for i, e in enumerate(EMOJI):
        assert "[UNK]" not in tok.tokenize(normalized_text(f"Quinby{e} at")), e
        assert normalized_text(f"a{e}b") == "a b" and normalized_text(f"a {e}b") == "a b", e
        texts[f"e{i}"] = f"then Dr. {e}Quinby{e} today"
    assert normalized_text("BP\u2713 5\u2122") == "BP\u2713 5\u2122"  # BMP symbols as written
    src = tmp_path / "n.jsonl"
    src.write_text("".join(json.dumps({"id": k, "text": t}) + "\n" for k, t in texts.items()))
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "o"),
                 "--mode", "spans"]) == 0
    pred = read_predictions(tmp_path / "o")
    for k, text in texts.items():
        assert any(text[s.start:s.end] == "Quinby" for s in pred[k]), (k, pred[k])


def test_ensemble_evaluate_and_data_stats_read_the_corpus(corpus: Path, manifest: Path,
                                                          capsys) -> None:
    for fmt in ("n.jsonl", "brat"):
        assert main(["ensemble", "evaluate", str(corpus / fmt), "--ensemble", str(manifest),
                     "--aggregate", "inverse"]) == 0
        assert main(["data", "stats", str(corpus / fmt)]) == 0
        out = capsys.readouterr().out
        assert "inverse" in out and str(len(NOTES)) in out


def test_an_i2b2_file_holding_nul_is_one_error_line(tmp_path: Path, capsys) -> None:
    # XML 1.0 cannot hold NUL even in CDATA: the reader names the file and line
    bad = tmp_path / "p1-1.xml"
    bad.write_bytes(b'<?xml version="1.0" encoding="UTF-8" ?>\n<deIdi2b2>\n<TEXT><![CDATA['
                    b"Call Yolanda\x00 Brisbee]]></TEXT>\n<TAGS>\n</TAGS>\n</deIdi2b2>\n")
    assert main(["data", "stats", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Yolanda" not in err, err
    assert "p1-1.xml:3: not well-formed XML" in err


def test_the_python_api_reads_the_corpus_and_refuses_a_lone_surrogate() -> None:
    from dphub.api import load

    deid = load(members=["rules:default"])
    for res in deid.deid(notes()):
        assert all(0 <= s.start < s.end <= len(res.text) for s in res.spans)
        assert "555-0134" not in res.render("tag")
    # a str can hold "\ud800"; a tokenizer cannot (a TypeError deep inside a model member)
    with pytest.raises(InputError, match="lone surrogate at offset 21") as e:
        deid(LONE_SURROGATE)
    assert "Yolanda" not in str(e.value)
