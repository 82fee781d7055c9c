"""Every malformed corpus under tests/malformed/ fails cleanly: FormatError, exit 2, one line.

Each fixture holds one defect; its notes contain the canary word ``Quixotella`` so that a message
quoting note text is caught. The table pairs each fixture with the format to force (None: detect)
and a fragment the message must contain, so a fixture failing for the wrong reason fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dphub import formats
from dphub.cli.main import main
from dphub.errors import DphubError, FormatError

MALFORMED = Path(__file__).parent / "malformed"
CANARY = "Quixotella"

# fixture path (relative to tests/malformed) -> (format or None, expected message fragment)
CASES: dict[str, tuple[str | None, str]] = {
    "physionet_offset_out_of_range": (None, "outside the text"),
    "physionet_text_mismatch": (None, "does not match"),
    "physionet_no_end_marker": (None, "END_OF_RECORD"),
    "physionet_bad_header": (None, "START_OF_RECORD=P||||N||||"),
    "physionet_unknown_note": (None, "note 2-7 is not in"),
    "physionet_missing_fields": (None, "6 fields"),
    "physionet_duplicate_note": (None, "duplicate note id '1-1'"),
    "physionet_unknown_label": (None, "unknown PHI label"),
    "physionet_deid_zero_length": (None, "empty or reversed"),
    "deidpl_without_text/run.phi": (None, "carry no note text"),
    "deidpl_bad_line/run.phi": (None, "expected 'Patient P  Note N'"),
    "i2b2_doctype.xml": (None, "DOCTYPE"),
    "i2b2_text_mismatch.xml": (None, "does not match"),
    "i2b2_not_wellformed.xml": (None, "not well-formed"),
    "i2b2_no_text_element.xml": (None, "no <TEXT>"),
    "i2b2_category_mismatch.xml": (None, "not a subcategory of <NAME>"),
    "i2b2_offset_not_integer.xml": (None, "start must be an integer"),
    "brat_discontinuous": (None, "discontinuous"),
    "brat_missing_ann": (None, "no matching annotation file note.ann"),
    "brat_reversed_span": (None, "empty or reversed"),
    "brat_unknown_label": (None, "unknown PHI label"),
    "jsonl_bad_json.jsonl": (None, ":2: invalid JSON"),
    "jsonl_missing_text.jsonl": (None, "missing field 'text'"),
    "jsonl_overlap.jsonl": (None, "overlaps"),
    "jsonl_zero_length.jsonl": (None, "empty or reversed"),
    "jsonl_duplicate_ids.jsonl": (None, "duplicate note id 'n1'"),
    "jsonl_non_utf8.jsonl": (None, "not valid UTF-8"),
    "jsonl_empty.jsonl": (None, "file is empty"),
    "jsonl_offset_not_integer.jsonl": (None, "start must be an integer"),
    "jsonl_missing_label.jsonl": (None, "missing field 'label'"),
    "jsonl_not_an_object.jsonl": (None, "expected a JSON object"),
    "conll_bad_tag.conll": (None, "tag must be O or"),
    "conll_unknown_label.conll": (None, "unknown PHI label"),
    "conll_one_column.conll": (None, "two columns"),
    "text_no_notes": ("text", "no notes found"),
    "text_non_utf8": (None, "not valid UTF-8"),
    "text_empty_file": (None, "file is empty"),
    "unknown_format_dir": (None, "cannot detect the corpus format"),
}


def test_fixture_table_covers_every_fixture() -> None:
    on_disk = {p.name for p in MALFORMED.iterdir()}
    in_table = {name.split("/")[0] for name in CASES}
    assert on_disk == in_table
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", sorted(CASES))
def test_library_raises_format_error(name: str) -> None:
    fmt, fragment = CASES[name]
    path = MALFORMED / name
    with pytest.raises(FormatError) as info:
        list(formats.read(path, format=fmt))
    message = info.value.message
    assert fragment in message
    assert name.split("/")[0] in message
    assert CANARY not in message and "Celebrity" not in message  # values from the data
    assert "\n" not in message


@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_data_stats_exits_2_with_one_error_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fmt, fragment = CASES[name]
    path = MALFORMED / name
    args = ["data", "stats", str(path)] + (["--format", fmt] if fmt else [])
    code = main(args)
    captured = capsys.readouterr()
    assert code == 2
    err_lines = captured.err.strip().splitlines()
    assert len(err_lines) == 1, captured.err
    assert err_lines[0].startswith("error: ")
    assert name.split("/")[0] in err_lines[0]
    assert fragment in err_lines[0]
    assert "Traceback" not in captured.out + captured.err
    assert CANARY not in captured.out + captured.err
    assert "Celebrity" not in captured.out + captured.err


def test_count_fails_the_same_way() -> None:
    with pytest.raises(DphubError, match="overlaps"):
        formats.count(MALFORMED / "jsonl_overlap.jsonl")
