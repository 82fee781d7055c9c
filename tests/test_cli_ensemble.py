"""End to end from the CLI: manifest, Scenario A and B in every mode, two tokenizers, surrogates.

Models are tiny and untrained (random weights): what is tested is the plumbing (each member tags
with its own tokenizer, the union on characters, outputs and audits), not accuracy.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest

from dphub.cli.main import main
from dphub.notes import Note, Span

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _tiny_bert(vocab_size: int, out: Path, seed: int) -> None:
    import torch
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=512,
                     pad_token_id=0)
    torch.manual_seed(seed)
    BertModel(cfg).save_pretrained(out, safe_serialization=True)


def _wordpiece_base(out: Path) -> Path:
    """A tiny BERT whose WordPiece vocabulary is trained here on synthetic notes."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizerFast

    from dphub import synth

    texts = [n.text for n in synth.generate(40, seed=3)]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                             cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(out)
    _tiny_bert(tok.get_vocab_size(), out, seed=1)
    return out


def _tagger_dir(base: Path, out: Path) -> Path:
    from dphub.tagger import TaggerModel

    TaggerModel.from_base(base).save(out)
    return out


@pytest.fixture(scope="module")
def models(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ens-models")
    minilm = _tagger_dir(tiny_base_model, root / "minilm-tagger")
    wp = _tagger_dir(_wordpiece_base(root / "wp-base"), root / "wp-tagger")
    return {"minilm": minilm, "wordpiece": wp}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from dphub import synth

    notes = synth.generate(6, seed=11, patients=2)
    root = tmp_path_factory.mktemp("ens-corpus")
    txt = root / "txt"
    (txt / "ward").mkdir(parents=True)
    for i, n in enumerate(notes):
        sub = txt / ("ward" if i % 2 else "")
        (sub / f"note{i}.txt").write_text(n.text, encoding="utf-8")
    jsonl = root / "notes.jsonl"
    jsonl.write_text("".join(json.dumps({"id": n.id, "text": n.text, "patient_id": n.patient_id,
                                         "spans": [s.to_dict() for s in n.spans]}) + "\n"
                             for n in notes), encoding="utf-8")
    return {"notes": notes, "txt": txt, "jsonl": jsonl}


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_manifest_add_list_show_remove(models: dict[str, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(models["minilm"]), "--threshold", "0.4",
                 "--ensemble", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 2  # duplicate
    data = tomllib.loads(m.read_text())
    first = data["members"][0]
    assert first["kind"] == "dir" and first["revision"].startswith("sha256:")
    assert first["threshold"] == 0.4
    capsys.readouterr()
    assert main(["ensemble", "list", "--json", "--ensemble", str(m)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [x["name"] for x in listed["members"]] == ["minilm-tagger", "rules:default"]
    assert main(["ensemble", "show", "rules:default", "--ensemble", str(m)]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == 0.0
    assert main(["ensemble", "remove", "rules:default", "--ensemble", str(m)]) == 0
    assert [x["name"] for x in tomllib.loads(m.read_text())["members"]] == ["minilm-tagger"]
    assert main(["ensemble", "remove", "nope", "--ensemble", str(m)]) == 2
    assert main(["ensemble", "add", "rules:fancy", "--ensemble", str(m)]) == 2


def test_rule_member_says_which_ages_it_flags(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 #16: the default flags every age while the README's rule figures use
    min_age = 90; `ensemble add` and `ensemble list` say which one is in effect and how to
    change it."""
    m = tmp_path / "ens.toml"
    capsys.readouterr()
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "flags EVERY age (min_age = 0" in out and "min_age = 90" in out
    m.write_text(m.read_text().replace('kind = "rules",',
                                       'kind = "rules", options = { min_age = 90 },'))
    assert main(["ensemble", "list", "--ensemble", str(m)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "rules:default: flags ages of 90 and over (min_age = 90)" in out


def test_pinned_weights_are_verified(models: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    model = tmp_path / "copy"
    shutil.copytree(models["minilm"], model)
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(model), "--ensemble", str(m)]) == 0
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes() + b" ")
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("DR. SMITH", encoding="utf-8")
    assert main(["ensemble", "deid", str(src), "--out", str(tmp_path / "o"),
                 "--ensemble", str(m)]) == 2


def test_two_tokenizers_plus_rules_combine_on_characters(models: dict[str, Path],
                                                         corpus: dict[str, object]) -> None:
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import ModelMember
    from dphub.rules.engine import RuleMember

    a = ModelMember.load(models["minilm"])
    b = ModelMember.load(models["wordpiece"])
    assert a.tokenizer_id != b.tokenizer_id
    ens = Ensemble([Slot(a), Slot(b, threshold=0.5), Slot(RuleMember())], "any")
    notes: list[Note] = corpus["notes"]  # type: ignore[assignment]
    results = ens.deid(notes)
    for note, res in zip(notes, results, strict=True):
        covered = set()
        for m in res.merged:
            assert 0 <= m.start < m.end <= len(note.text)
            assert set(m.voters) <= {a.name, b.name, "rules:default"}
            covered.update(range(m.start, m.end))
        for name, spans in res.by_member.items():
            for s in spans:  # the union rule: every member character stays covered
                assert set(range(s.start, s.end)) <= covered, name
    # the rule member alone catches the synthetic phone numbers and dates
    assert any("rules:default" in m.voters for r in results for m in r.merged)


@pytest.mark.parametrize("mode", ["tag", "redact", "surrogate", "spans", "brat"])
def test_scenario_a_every_mode(models: dict[str, Path], corpus: dict[str, object],
                               tmp_path: Path, mode: str) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(models["minilm"]), "--ensemble", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123456789abcdef")
    src: Path = corpus["txt"]  # type: ignore[assignment]
    before = _hashes(src)
    out = tmp_path / "out"
    args = ["ensemble", "deid", str(src), "--out", str(out), "--mode", mode, "--ensemble", str(m)]
    if mode == "surrogate":
        args += ["--key-file", str(key)]
    assert main(args) == 0
    assert _hashes(src) == before  # inputs untouched
    suffixes = {"tag": [".txt"], "redact": [".txt"], "surrogate": [".txt"], "spans": [".jsonl"],
                "brat": [".txt", ".ann"]}[mode]
    for rel in before:
        stem = rel[: -len(".txt")]
        for suf in suffixes:
            assert (out / f"{stem}{suf}").is_file(), (stem, suf)
    audit = [json.loads(x) for x in (out / "audit.jsonl").read_text().splitlines()]
    assert len(audit) == len(before)
    assert all("text" not in s for rec in audit for s in rec["spans"])
    assert all(s["members"] for rec in audit for s in rec["spans"])


def test_quorum_rule_with_members_counting_alone(models: dict[str, Path],
                                                corpus: dict[str, object], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "ens.toml"
    for spec in (str(models["minilm"]), str(models["wordpiece"]), "rules:default"):
        assert main(["ensemble", "add", spec, "--ensemble", str(m)]) == 0
    src: Path = corpus["txt"]  # type: ignore[assignment]
    out = tmp_path / "out"
    rule = "k-of-n:2+rules:default"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--mode", "spans",
                 "--ensemble", str(m), "--aggregate", rule]) == 0
    spans = [s for line in (out / "audit.jsonl").read_text().splitlines()
             for s in json.loads(line)["spans"]]
    assert spans and any("rules:default" in s["members"] for s in spans)
    # a span is there because the rules flagged it or both models did
    assert all("rules:default" in s["members"] or len(s["members"]) >= 2 for s in spans)
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert main(["ensemble", "deid", str(src), "--out", str(bad), "--ensemble", str(m),
                 "--aggregate", "k-of-n:2+nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no member named nosuch" in err[0]
    assert not bad.exists()


def test_scenario_b_owner_model_and_jsonl(models: dict[str, Path], corpus: dict[str, object],
                                          tmp_path: Path) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    src: Path = corpus["jsonl"]  # type: ignore[assignment]
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--owner-model",
                 str(models["wordpiece"]), "--mode", "spans", "--ensemble", str(m),
                 "--audit-text"]) == 0
    lines = (out / "notes.jsonl").read_text().splitlines()
    notes: list[Note] = corpus["notes"]  # type: ignore[assignment]
    assert [json.loads(x)["id"] for x in lines] == [n.id for n in notes]
    audit = [json.loads(x) for x in (out / "audit.jsonl").read_text().splitlines()]
    voters = {v for rec in audit for s in rec["spans"] for v in s["members"]}
    assert "rules:default" in voters
    assert all("text" in s for rec in audit for s in rec["spans"])  # --audit-text
    # owner model only, no manifest: the top-level command
    out2 = tmp_path / "out2"
    assert main(["deid", str(src), "--model", str(models["wordpiece"]), "--out", str(out2),
                 "--int8"]) == 0
    assert len((out2 / "notes.jsonl").read_text().splitlines()) == len(notes)


def test_tag_output_hides_every_marked_gold_string(corpus: dict[str, object],
                                                   tmp_path: Path) -> None:
    src: Path = corpus["jsonl"]  # type: ignore[assignment]
    notes: list[Note] = corpus["notes"]  # type: ignore[assignment]
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "t")]) == 0
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "s"),
                 "--mode", "spans"]) == 0
    tagged = {json.loads(x)["id"]: json.loads(x)["text"]
              for x in (tmp_path / "t" / "notes.jsonl").read_text().splitlines()}
    marked = {json.loads(x)["id"]: json.loads(x)["spans"]
              for x in (tmp_path / "s" / "notes.jsonl").read_text().splitlines()}
    checked = 0
    for n in notes:
        for g in n.spans:
            phrase = n.text[g.start : g.end]
            covered = any(s["start"] <= g.start and s["end"] >= g.end for s in marked[n.id])
            if covered and len(phrase) >= 4 and n.text.count(phrase) == 1:
                assert phrase not in tagged[n.id]
                checked += 1
    assert checked >= 5


def test_surrogates_are_consistent_and_keyed(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    recs = [{"id": "a", "patient_id": "p1", "text": "DR. KOWALCZYK SAW PT 10/12/2003."},
            {"id": "b", "patient_id": "p1", "text": "CALLED DR. KOWALCZYK ON 10/13/2003."}]
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    k1, k2 = tmp_path / "k1", tmp_path / "k2"
    k1.write_text("a" * 32)
    k2.write_text("b" * 32)

    def run(out: str, key: Path) -> list[str]:
        assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / out),
                     "--mode", "surrogate", "--key-file", str(key)]) == 0
        return [json.loads(x)["text"] for x in (tmp_path / out / "in.jsonl").read_text().splitlines()]

    first, again, other = run("o1", k1), run("o2", k1), run("o3", k2)
    assert first == again and first != other
    assert all("KOWALCZYK" not in t and "10/1" not in t for t in first)
    name_a = first[0].split()[1]
    assert name_a in first[1]  # same patient, same surrogate name
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "o4"),
                 "--mode", "surrogate"]) == 2  # no key: refused


def test_calibrate_and_evaluate(models: dict[str, Path], corpus: dict[str, object],
                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(models["minilm"]), "--ensemble", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(m)]) == 0
    src = str(corpus["jsonl"])
    # untrained model: its precision means nothing, so no precision floor (tests/test_calibrate.py)
    assert main(["ensemble", "calibrate", src, "--target-recall", "0.95", "--min-precision", "0",
                 "--ensemble", str(m)]) == 0
    t = tomllib.loads(m.read_text())["members"][0]["threshold"]
    assert 0.0 < t <= 0.95
    capsys.readouterr()
    assert main(["ensemble", "evaluate", src, "--json", "--ensemble", str(m)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows][:2] == ["minilm-tagger", "rules:default"]
    assert rows[-1]["name"].startswith("ensemble")
    # the union never has lower recall than any member
    assert rows[-1]["recall"] >= max(r["recall"] for r in rows[:-1]) - 1e-9


def test_calibration_search_hand_checked() -> None:
    """Two fake model members over one note: thresholds that reach recall 1 at best precision."""
    import numpy as np

    from dphub.ensemble.calibrate import calibrate
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import ModelMember
    from dphub.scores import TokenScores

    text = "aa bb cc dd"
    note = Note("n", text, spans=[Span(0, 2, "NAME"), Span(6, 8, "DATE")], labelled=True)
    offs = np.array([[0, 2], [3, 5], [6, 8], [9, 11]])

    class Fake:
        def __init__(self, name: str, probs: list[float]) -> None:
            self.name, self.probs = name, np.array(probs)

        def token_scores(self, notes: list[Note], batch_size: int = 16) -> list[TokenScores]:
            lp = np.tile(np.array([[1.0, 0.0]]), (4, 1))
            return [TokenScores(offs, self.probs, lp, ("NAME", "DATE"))]

    # member a finds token 0 confidently and token 2 weakly; member b finds token 2 at 0.6 but
    # also token 1 (a false positive) at 0.55
    a = ModelMember(Fake("a", [0.97, 0.1, 0.25, 0.0]), "a")
    b = ModelMember(Fake("b", [0.0, 0.55, 0.6, 0.0]), "b")
    res = calibrate(Ensemble([Slot(a), Slot(b)]), [note], target_recall=1.0)
    assert res.reached and res.recall == 1.0
    # best: a at 0.2 (tokens 0 and 2, no false positive), b above 0.6 (nothing)
    assert res.precision == 1.0
    assert res.thresholds["a"] <= 0.2 and res.thresholds["b"] > 0.6


def test_registry_member_is_pinned_to_the_pulled_revision(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dphub.registry import Entry, Registry

    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))
    sha = "a" * 40
    Registry().add(Entry(name="org/ward", hub="local", revision=sha, epsilon=3.5, delta=1e-5,
                         unit="patient", path=models["minilm"], requested="v1"))
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "org/ward@v1", "--ensemble", str(m)]) == 0
    entry = tomllib.loads(m.read_text())["members"][0]
    assert entry["kind"] == "registry" and entry["revision"] == sha
    assert entry["epsilon"] == 3.5 and entry["unit"] == "patient"
    capsys.readouterr()
    assert main(["ensemble", "list", "--ensemble", str(m)]) == 0
    listing = capsys.readouterr().out
    assert "org/ward" in listing and "3.5" in listing and "patient" in listing
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("DR. SMITH ON 10/12/2003", encoding="utf-8")
    assert main(["ensemble", "deid", str(src), "--out", str(tmp_path / "o"), "--ensemble",
                 str(m)]) == 0
    assert main(["ensemble", "add", "org/missing", "--ensemble", str(m)]) == 2
