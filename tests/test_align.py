"""Tests for dphub.align: tokenization offsets, windows, BIOES round trips, window merging."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from dphub.align import (
    NoteTokens,
    bucket_by_length,
    collate,
    collate_labels,
    make_windows,
    merge_windows,
    spans_to_tags,
    special_layout,
    tags_to_ids,
    tags_to_spans,
    tokenize,
    windows_by_note,
)
from dphub.encoders import embedded_model_dir
from dphub.errors import ConfigError, ModelError
from dphub.labels import CATEGORIES, get_schema
from dphub.notes import Span

TOKENIZER = AutoTokenizer.from_pretrained(embedded_model_dir())
HIPAA = get_schema("hipaa")
PROPS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Words, clinical-looking tokens, whitespace/control characters and non-ASCII text.
PIECES = st.sampled_from(
    [
        "Mr.", "Smith", "7/22/2094", "BP", "120/80", "pt", "tolerated", "well", "Dr", "O'Neil",
        "café", "Zürich", "東京", "👍", "naïve", "MRN:", "123-45-6789", "x", "(", ")", "--",
        "\u200b", "\x00", "\x7f", "왈", "ﬁle",
    ]
)
SEPS = st.sampled_from([" ", "  ", "\n", "\t", "\r\n", " \n\n ", "\xa0", ""])
TEXTS = st.lists(st.tuples(PIECES, SEPS), max_size=60).map(
    lambda parts: "".join(p + s for p, s in parts)
)


def _check_windows(tokens: list[NoteTokens], max_length: int, stride: int) -> None:
    windows = make_windows(tokens, TOKENIZER, max_length=max_length, stride=stride)
    groups = windows_by_note(windows)
    assert sorted(groups) == list(range(len(tokens)))  # every note has at least one window
    prefix, suffix = special_layout(TOKENIZER)
    for note_index, nt in enumerate(tokens):
        ws = [windows[i] for i in groups[note_index]]
        owners = np.zeros(len(nt), dtype=int)
        covered = np.zeros(len(nt), dtype=bool)
        for k, w in enumerate(ws):
            assert len(w.input_ids) <= max_length
            assert w.input_ids[: len(prefix)] == prefix
            assert w.input_ids[len(w.input_ids) - len(suffix) :] == suffix
            assert w.input_ids[w.content_slice] == nt.ids[w.token_start : w.token_end].tolist()
            assert w.attention_mask == [1] * len(w.input_ids)
            a, b = w.owned
            assert w.token_start <= a <= b <= w.token_end
            owners[a:b] += 1
            covered[w.token_start : w.token_end] = True
            if k:
                assert w.token_start == ws[k - 1].token_end - stride  # exact overlap
        assert (owners == 1).all()
        assert covered.all()


@PROPS
@given(texts=st.lists(TEXTS, min_size=1, max_size=3))
def test_tokenize_offsets_point_at_text_and_never_truncate(texts: list[str]) -> None:
    for text, nt in zip(texts, tokenize(TOKENIZER, texts), strict=True):
        assert nt.offsets.shape == (len(nt), 2)
        assert (nt.offsets[:, 1] > nt.offsets[:, 0]).all()
        assert (nt.offsets[:, 1] <= len(text)).all()
        assert (np.diff(nt.offsets[:, 0]) >= 0).all()
        # every non-space printable character lies inside some piece (nothing dropped)
        inside = np.zeros(len(text), dtype=bool)
        for a, b in nt.offsets:
            inside[a:b] = True
        for i, ch in enumerate(text):
            if ch.isalnum():
                assert inside[i], f"char {i} not covered"


def test_tokenize_very_long_note_is_not_truncated() -> None:
    text = "Patient John Smith seen on 7/22. " * 400
    (nt,) = tokenize(TOKENIZER, [text])
    assert len(nt) > 2000
    assert nt.offsets[-1, 1] == len(text.rstrip())


def test_tokenize_empty_and_whitespace_notes() -> None:
    out = tokenize(TOKENIZER, ["", "   \n\t", "\u200b"])
    assert [len(nt) for nt in out] == [0, 0, 0]
    assert out[0].offsets.shape == (0, 2)
    assert tokenize(TOKENIZER, []) == []


def test_slow_tokenizer_is_refused() -> None:
    class Slow:
        is_fast = False

    with pytest.raises(ModelError):
        tokenize(Slow(), ["x"])


@PROPS
@given(
    texts=st.lists(TEXTS, min_size=1, max_size=3),
    max_length=st.integers(min_value=3, max_value=24),
    stride_frac=st.floats(min_value=0.0, max_value=0.95),
)
def test_windows_cover_every_token_and_each_is_owned_once(
    texts: list[str], max_length: int, stride_frac: float
) -> None:
    content = max_length - 2
    stride = min(int(stride_frac * content), content - 1)
    _check_windows(tokenize(TOKENIZER, texts), max_length, stride)


def test_windows_of_a_long_note_cover_all_characters() -> None:
    text = "Seen by Dr. O'Neil at Zürich clinic on 07/22/2094, café 👍.\n" * 100
    (nt,) = tokenize(TOKENIZER, [text])
    windows = make_windows([nt], TOKENIZER, max_length=128, stride=32)
    assert len(windows) > 10
    _check_windows([nt], 128, 32)
    inside = np.zeros(len(text), dtype=bool)
    for w in windows:
        for a, b in nt.offsets[w.token_start : w.token_end]:
            inside[a:b] = True
    assert all(inside[i] for i, ch in enumerate(text) if not ch.isspace())


def test_empty_note_gets_one_window_owning_nothing() -> None:
    windows = make_windows(tokenize(TOKENIZER, [""]), TOKENIZER, max_length=16, stride=4)
    assert len(windows) == 1
    w = windows[0]
    assert (w.token_start, w.token_end, w.owned) == (0, 0, (0, 0))
    assert w.input_ids == [TOKENIZER.cls_token_id, TOKENIZER.sep_token_id]
    merged = merge_windows(windows, [np.zeros((0, 3))], 0)
    assert merged.shape == (0, 3)


@pytest.mark.parametrize(("max_length", "stride"), [(2, 0), (10, 8), (10, -1)])
def test_bad_window_settings_are_config_errors(max_length: int, stride: int) -> None:
    with pytest.raises(ConfigError):
        make_windows(tokenize(TOKENIZER, ["a b c"]), TOKENIZER, max_length=max_length,
                     stride=stride)


@st.composite
def text_with_token_aligned_spans(draw: st.DrawFn) -> tuple[np.ndarray, list[Span]]:
    text = draw(TEXTS)
    (nt,) = tokenize(TOKENIZER, [text])
    n = len(nt)
    spans: list[Span] = []
    i = 0
    while i < n:
        if draw(st.booleans()):
            j = draw(st.integers(min_value=i, max_value=min(n - 1, i + 4)))
            # pieces sharing one character (decomposed Hangul) can only go together
            while j + 1 < n and nt.offsets[j + 1, 0] < nt.offsets[j, 1]:
                j += 1
            label = draw(st.sampled_from(CATEGORIES))
            if not spans or nt.offsets[i, 0] >= spans[-1].end:
                spans.append(Span(int(nt.offsets[i, 0]), int(nt.offsets[j, 1]), label))
            i = j + 1
        else:
            i += 1
    return nt.offsets, spans


@PROPS
@given(case=text_with_token_aligned_spans())
def test_spans_tags_spans_round_trip(case: tuple[np.ndarray, list[Span]]) -> None:
    offsets, spans = case
    tags = spans_to_tags(offsets, spans, HIPAA)
    assert len(tags) == offsets.shape[0]
    assert set(tags) <= set(HIPAA.bioes_tags())
    assert tags_to_spans(offsets, tags) == spans


def test_spans_to_tags_maps_labels_and_widens_partial_pieces() -> None:
    text = "Seen by JohnSmithson on 2094-07-22."
    (nt,) = tokenize(TOKENIZER, [text])
    start = text.index("Smith")  # starts inside the piece "johnsmithson"
    spans = [Span(start, start + 5, "HCPName"), Span(24, 34, "DateYear")]
    tags = spans_to_tags(nt.offsets, spans, HIPAA)
    got = tags_to_spans(nt.offsets, tags)
    assert [s.label for s in got] == ["NAME", "DATE"]
    name = got[0]
    assert name.start <= start and name.end >= start + 5  # whole piece(s) tagged
    assert text[got[1].start : got[1].end] == "2094-07-22"


def test_spans_to_tags_whitespace_only_span_yields_nothing() -> None:
    text = "a    b"
    (nt,) = tokenize(TOKENIZER, [text])
    assert spans_to_tags(nt.offsets, [Span(2, 4, "NAME")], HIPAA) == ["O", "O"]


def test_tags_to_spans_tolerates_invalid_sequences() -> None:
    offsets = np.array([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13]])
    tags = ["I-NAME", "I-NAME", "B-DATE", "I-NAME", "E-NAME", "NAME", "U-AGE"]
    assert tags_to_spans(offsets, tags) == [
        Span(0, 3, "NAME"),
        Span(4, 5, "DATE"),
        Span(6, 9, "NAME"),
        Span(10, 11, "NAME"),
        Span(12, 13, "AGE"),
    ]
    assert tags_to_spans(offsets[:2], ["E-ID", "S-ID"]) == [Span(0, 1, "ID"), Span(2, 3, "ID")]
    # B- always starts a new entity, even inside an open one of the same label
    assert tags_to_spans(offsets[:3], ["B-ID", "I-ID", "B-ID"]) == [
        Span(0, 3, "ID"),
        Span(4, 5, "ID"),
    ]
    with pytest.raises(ValueError):
        tags_to_spans(offsets, ["O"])


def test_tags_to_ids() -> None:
    vocab = {t: i for i, t in enumerate(HIPAA.bioes_tags())}
    assert tags_to_ids(["O", "B-NAME"], vocab).tolist() == [0, 1]
    with pytest.raises(ValueError):
        tags_to_ids(["B-FOO"], vocab)


@PROPS
@given(
    texts=st.lists(TEXTS, min_size=1, max_size=3),
    max_length=st.integers(min_value=3, max_value=20),
    stride=st.integers(min_value=0, max_value=17),
    width=st.integers(min_value=1, max_value=3),
)
def test_merge_windows_reproduces_a_per_token_function(
    texts: list[str], max_length: int, stride: int, width: int
) -> None:
    stride = min(stride, max_length - 3)
    tokens = tokenize(TOKENIZER, texts)
    windows = make_windows(tokens, TOKENIZER, max_length=max_length, stride=stride)
    for note_index, idx in windows_by_note(windows).items():
        nt = tokens[note_index]
        truth = np.stack([nt.ids * (k + 1) + nt.offsets[:, 0] for k in range(width)], axis=1)
        ws = [windows[i] for i in idx]
        # a non-owning window disagrees on its borrowed tokens: merging must ignore those rows
        outs = []
        for w in ws:
            rows = truth[w.token_start : w.token_end].copy()
            a, b = w.owned
            rows[: a - w.token_start] = -1
            rows[b - w.token_start :] = -1
            outs.append(rows)
        assert np.array_equal(merge_windows(ws, outs, len(nt)), truth)


def test_merge_windows_rejects_incomplete_or_mismatched_outputs() -> None:
    (nt,) = tokenize(TOKENIZER, ["one two three four five six seven eight nine ten"])
    ws = make_windows([nt], TOKENIZER, max_length=6, stride=2)
    outs = [np.zeros(w.n_tokens) for w in ws]
    with pytest.raises(ValueError):
        merge_windows(ws[:-1], outs[:-1], len(nt))
    with pytest.raises(ValueError):
        merge_windows(ws, [np.zeros(w.n_tokens + 1) for w in ws], len(nt))


def test_collate_is_batch_shaped_and_padded() -> None:
    tokens = tokenize(TOKENIZER, ["short", "a much longer note about the patient today", ""])
    windows = make_windows(tokens, TOKENIZER, max_length=8, stride=2)
    batch = collate(windows, TOKENIZER.pad_token_id)
    b, length = len(windows), max(len(w.input_ids) for w in windows)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "position_ids"}
    for t in batch.values():
        assert t.shape == (b, length) and t.dtype == torch.long and t.is_contiguous()
        assert t.stride() == (length, 1)  # materialised, not a broadcast view
    assert batch["position_ids"][-1].tolist() == list(range(length))
    for i, w in enumerate(windows):
        n = len(w.input_ids)
        assert batch["input_ids"][i, :n].tolist() == w.input_ids
        assert (batch["input_ids"][i, n:] == TOKENIZER.pad_token_id).all()
        assert batch["attention_mask"][i].sum().item() == n


def test_collate_pads_lengths_up_to_a_multiple() -> None:
    tokens = tokenize(TOKENIZER, ["short", "a much longer note about the patient today"])
    windows = make_windows(tokens, TOKENIZER, max_length=8, stride=2)
    longest = max(len(w.input_ids) for w in windows)
    assert longest % 5
    batch = collate(windows, TOKENIZER.pad_token_id, multiple=5)
    length = -(-longest // 5) * 5
    for t in batch.values():
        assert t.shape == (len(windows), length) and t.is_contiguous()
    assert batch["position_ids"][0].tolist() == list(range(length))
    for i, w in enumerate(windows):
        n = len(w.input_ids)
        assert batch["input_ids"][i, :n].tolist() == w.input_ids
        assert (batch["input_ids"][i, n:] == TOKENIZER.pad_token_id).all()
        assert batch["attention_mask"][i].sum().item() == n
    assert collate(windows, 0, multiple=longest)["input_ids"].shape[1] == longest
    with pytest.raises(ValueError, match="multiple"):
        collate(windows, 0, multiple=0)


def test_collate_labels_aligns_with_content() -> None:
    text = "Seen by John Smith on 7/22 at Boston General"
    tokens = tokenize(TOKENIZER, [text])
    windows = make_windows(tokens, TOKENIZER, max_length=6, stride=1)
    vocab = {t: i for i, t in enumerate(HIPAA.bioes_tags())}
    spans = [Span(8, 18, "NAME"), Span(22, 26, "DATE")]
    ids = tags_to_ids(spans_to_tags(tokens[0].offsets, spans, HIPAA), vocab)
    labels, mask = collate_labels(windows, [ids])
    for i, w in enumerate(windows):
        assert labels[i][mask[i]].tolist() == ids[w.token_start : w.token_end].tolist()
        assert (labels[i][~mask[i]] == -100).all()
        assert not mask[i, 0]  # [CLS]


def test_bucket_by_length_is_deterministic_partition() -> None:
    tokens = tokenize(TOKENIZER, ["a b c d e f g h", "a", "a b c", "", "a b c d e"])
    windows = make_windows(tokens, TOKENIZER, max_length=5, stride=1)
    buckets = bucket_by_length(windows, 3)
    assert buckets == bucket_by_length(windows, 3)
    assert sorted(i for b in buckets for i in b) == list(range(len(windows)))
    assert all(len(b) <= 3 for b in buckets)
    lengths = [len(windows[i].input_ids) for b in buckets for i in b]
    assert lengths == sorted(lengths, reverse=True)
    with pytest.raises(ConfigError):
        bucket_by_length(windows, 0)


def test_collate_output_feeds_a_bert_encoder() -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=16, max_position_embeddings=32)
    model = BertModel(config).eval()
    tokens = tokenize(TOKENIZER, ["John Smith was seen today", "ok"])
    windows = make_windows(tokens, TOKENIZER, max_length=6, stride=1)
    batch = collate(windows, TOKENIZER.pad_token_id)
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    assert hidden.shape == (*batch["input_ids"].shape, 8)
    # the first window alone gives the same states for its real tokens as inside the batch
    with torch.inference_mode():
        alone = model(**collate(windows[:1], TOKENIZER.pad_token_id)).last_hidden_state
    sl = windows[0].content_slice
    assert torch.allclose(alone[0, sl], hidden[0, sl], atol=1e-5)
