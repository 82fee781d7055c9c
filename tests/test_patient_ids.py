"""Surrogates per patient for inputs without patient ids (issue 31, item 20) and the deid
commands' checks before any member loads (item 24)."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from dphub.cli.main import main
from dphub.runner import EXIT_SOME_FAILED

# synthetic notes only: two notes of one person, in two files
NOTE_A = "Pt John Smith seen 07/22/2094 at home.\n"
NOTE_B = "John Smith returned 08/05/2094.\n"


@pytest.fixture()
def key(tmp_path: Path) -> Path:
    k = tmp_path / "surrogate.key"
    k.write_text("0123456789abcdef0123456789abcdef\n")
    return k


def _two_files(root: Path, names: tuple[str, str] = ("1234-a.txt", "1234-b.txt")) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / names[0]).write_text(NOTE_A)
    (root / names[1]).write_text(NOTE_B)
    return root


def _deid(src: Path, out: Path, key: Path, *extra: str) -> int:
    return main(["deid", str(src), "--model", "rules:default", "--mode", "surrogate",
                 "--key-file", str(key), "--out", str(out), *extra])


def _name_and_date(text: str) -> tuple[str, dt.date]:
    m = re.search(r"([A-Z][a-z]+ [A-Z][a-z]+) (?:seen|returned) (\d\d/\d\d/\d{4})", text)
    assert m is not None, "surrogate name and date expected"
    return m[1], dt.datetime.strptime(m[2], "%m/%d/%Y").date()


def test_patient_id_from_a_file_name_pattern_makes_one_mapping(
    tmp_path: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _two_files(tmp_path / "in")
    assert _deid(src, tmp_path / "out", key, "--patient-id-from", r"^(\d+)-") == 0
    a = (tmp_path / "out" / "1234-a.txt").read_text()
    b = (tmp_path / "out" / "1234-b.txt").read_text()
    (name_a, day_a), (name_b, day_b) = _name_and_date(a), _name_and_date(b)
    assert "Smith" not in a + b
    assert name_a == name_b  # one person, one surrogate
    assert (day_b - day_a).days == 14  # the interval survives: one shift for the patient
    assert "warning" not in capsys.readouterr().err


def test_without_patient_ids_surrogates_differ_and_a_warning_says_so_once(
    tmp_path: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _two_files(tmp_path / "in")
    (src / "other.txt").write_text("Seen by Dr. Xalvi.\n")
    assert _deid(src, tmp_path / "out", key) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "--patient-id-from" in err and ".meta.json" in err
    assert "Smith" not in err and "John" not in err  # never note text
    a = _name_and_date((tmp_path / "out" / "1234-a.txt").read_text())[0]
    b = _name_and_date((tmp_path / "out" / "1234-b.txt").read_text())[0]
    assert a != b  # what the warning is about
    # tag mode draws nothing per patient: no warning
    assert main(["deid", str(src), "--model", "rules:default", "--out",
                 str(tmp_path / "tag")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_meta_json_sidecar_gives_the_patient_id_of_a_txt(tmp_path: Path, key: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = _two_files(tmp_path / "in", ("a.txt", "b.txt"))
    for stem in ("a", "b"):
        (src / f"{stem}.meta.json").write_text(json.dumps({"patient_id": "P7"}))
    assert _deid(src, tmp_path / "out", key) == 0
    assert "warning" not in capsys.readouterr().err
    a = _name_and_date((tmp_path / "out" / "a.txt").read_text())
    b = _name_and_date((tmp_path / "out" / "b.txt").read_text())
    assert a[0] == b[0] and (b[1] - a[1]).days == 14


def test_a_note_the_pattern_does_not_match_fails_alone(tmp_path: Path, key: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = _two_files(tmp_path / "in", ("1234-a.txt", "nopatient.txt"))
    code = _deid(src, tmp_path / "out", key, "--patient-id-from", r"^(\d+)-")
    assert code == EXIT_SOME_FAILED
    err = capsys.readouterr().err
    assert "nopatient.txt: --patient-id-from does not match" in err
    assert (tmp_path / "out" / "1234-a.txt").is_file()
    assert not (tmp_path / "out" / "nopatient.txt").exists()


def test_a_pattern_with_a_slash_reads_the_folder(tmp_path: Path, key: Path) -> None:
    src = tmp_path / "in"
    _two_files(src / "p42", ("x.txt", "y.txt"))
    assert _deid(src, tmp_path / "out", key, "--patient-id-from", r"^(p\d+)/") == 0
    x = _name_and_date((tmp_path / "out" / "p42" / "x.txt").read_text())
    y = _name_and_date((tmp_path / "out" / "p42" / "y.txt").read_text())
    assert x[0] == y[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "tagg"], "unknown --mode 'tagg'"),
        (["--mode", "surrogate"], "openssl rand -hex 32"),
        (["--mode", "surrogate", "--key-file", "{tmp}/missing.key"], "openssl rand -hex 32"),
        (["--patient-id-from", "(a)(b)"], "one group"),
        (["--patient-id-from", "("], "not a valid regular expression"),
    ],
)
@pytest.mark.parametrize("command", ["deid", "ensemble"])
def test_deid_arguments_are_checked_before_any_member_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    args: list[str], message: str, command: str,
) -> None:
    import dphub.ensemble.core as core

    def no_loading(*_a: object, **_k: object) -> None:
        raise AssertionError("a member was loaded before the arguments were checked")

    manifest = tmp_path / "dphub-ensemble.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(manifest)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(core, "build_ensemble", no_loading)
    monkeypatch.setattr(core, "member_from_entry", no_loading)
    src = _two_files(tmp_path / "in")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if command == "deid":
        argv = ["deid", str(src), "--model", "rules:default", *args]
    else:
        argv = ["ensemble", "deid", str(src), "-e", str(manifest), *args]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    # a missing input is named before anything loads, too
    missing = [str(tmp_path / "nowhere") if a == str(src) else a
               for a in argv[: len(argv) - len(args)]]
    assert main(missing) == 2
    assert "input not found" in capsys.readouterr().err


def test_a_broken_sidecar_fails_its_note_alone(tmp_path: Path, key: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    src = _two_files(tmp_path / "in", ("a.txt", "b.txt"))
    (src / "a.meta.json").write_text("{not json")
    assert _deid(src, tmp_path / "out", key) == EXIT_SOME_FAILED
    err = capsys.readouterr().err
    assert "a.txt: its .meta.json sidecar cannot be read" in err and "John" not in err
    assert (tmp_path / "out" / "b.txt").is_file()
