from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from common.detokenizer import IncrementalDetokenizer

TEXTS = [
    "The answer is 42. Done here.",
    " café naïve über 😀👍🏽 日本語の文章です。 中文",
    "Ünïcödé at the start, then emoji at the end 🎉",
    "def f(x):\n    return x**2  # ok\n\n\tindented\ttabs",
    "  leading spaces,   runs   of spaces and trailing ones  ",
    "한국어 텍스트와 العربية and Ελληνικά — dashes… “quotes”",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> PreTrainedTokenizerBase:
    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(smollm2_path)
    return loaded


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    messages = [{"role": "user", "content": "Say something."}]
    ids: list[int] = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return ids


@dataclass
class Stream:
    deltas: list[str]
    stop_reasons: list[str | None]
    flushed: str
    detokenizer: IncrementalDetokenizer


def stream(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    chunk: int = 1,
    stop: Sequence[str] = (),
    **kwargs: bool,
) -> Stream:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, stop, **kwargs)
    steps = [detokenizer.update(output_ids[i : i + chunk]) for i in range(0, len(output_ids), chunk)]
    flushed = detokenizer.flush()
    return Stream([s.text_delta for s in steps], [s.stop_reason for s in steps], flushed, detokenizer)


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def token_end_offsets(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[int]:
    """Length of the decoded text after each token (for texts whose tokens end on characters)."""
    return [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_deltas_concatenate_to_full_decode(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], text: str, chunk: int
) -> None:
    output_ids = encode(tokenizer, text)
    result = stream(tokenizer, prompt_ids, output_ids, chunk)
    expected = tokenizer.decode(output_ids, skip_special_tokens=True)
    assert expected == text
    assert "".join(result.deltas) == expected
    assert result.flushed == ""
    assert result.detokenizer.output_text == expected
    assert all("\ufffd" not in delta for delta in result.deltas)
    assert result.stop_reasons == [None] * len(result.deltas)


def test_multibyte_character_waits_for_its_last_token(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]
) -> None:
    output_ids = encode(tokenizer, "a 😀 b")
    assert len(output_ids) == 4  # "a", " \xf0\x9f\x98" (partial), "\x80", " b"
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    deltas = [detokenizer.update([token_id]).text_delta for token_id in output_ids]
    assert deltas == ["a", "", " 😀", " b"]


def test_flush_releases_an_incomplete_trailing_character(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]
) -> None:
    output_ids = encode(tokenizer, "ok 😀")[:-1]
    result = stream(tokenizer, prompt_ids, output_ids)
    assert result.deltas == ["ok", ""]
    assert result.flushed == " \ufffd"
    assert result.detokenizer.output_text == tokenizer.decode(output_ids) == "ok \ufffd"


def test_special_tokens_skipped_or_kept(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
    output_ids = [*encode(tokenizer, "Hi there"), tokenizer.eos_token_id]
    assert tokenizer.eos_token == "<|im_end|>"
    skipped = stream(tokenizer, prompt_ids, output_ids)
    assert "".join(skipped.deltas) + skipped.flushed == "Hi there"
    kept = stream(tokenizer, prompt_ids, output_ids, skip_special_tokens=False)
    assert "".join(kept.deltas) + kept.flushed == "Hi there<|im_end|>"


def test_decodes_only_a_small_window(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    output_ids = encode(tokenizer, " ".join(TEXTS) * 3)
    assert len(output_ids) > 300
    window_sizes: list[int] = []
    decode = IncrementalDetokenizer._decode

    def spy(self: IncrementalDetokenizer, token_ids: list[int]) -> str:
        window_sizes.append(len(token_ids))
        return decode(self, token_ids)

    monkeypatch.setattr(IncrementalDetokenizer, "_decode", spy)
    result = stream(tokenizer, prompt_ids, output_ids)
    monkeypatch.undo()
    assert "".join(result.deltas) == tokenizer.decode(output_ids)
    assert max(window_sizes) <= 8


@pytest.mark.parametrize(
    ("stop", "num_tokens_spanned"),
    [(" 42.", 4), ("2. D", 3), ("swer is", 2), (". Done", 2)],
)
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_tokens(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], stop: str, num_tokens_spanned: int, include: bool
) -> None:
    text = "The answer is 42. Done here. More 42. text"
    output_ids = encode(tokenizer, text)
    ends = token_end_offsets(tokenizer, output_ids)
    start = text.index(stop)
    first_token = next(i for i, end in enumerate(ends) if end > start)
    last_token = next(i for i, end in enumerate(ends) if end >= start + len(stop))
    assert last_token - first_token + 1 == num_tokens_spanned

    result = stream(tokenizer, prompt_ids, output_ids, stop=[stop], include_stop_str_in_output=include)
    expected = text[: start + len(stop)] if include else text[:start]
    assert result.stop_reasons == [None] * last_token + [stop] + [None] * (len(output_ids) - last_token - 1)
    assert "".join(result.deltas) == expected
    assert result.detokenizer.output_text == expected
    assert result.flushed == ""
    assert result.deltas[last_token + 1 :] == [""] * (len(output_ids) - last_token - 1)
    if not include:
        assert all(stop[:2] not in delta for delta in result.deltas)


def test_text_that_may_start_a_stop_string_is_held_back(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]
) -> None:
    output_ids = encode(tokenizer, "Hello there, General Kenobi!")
    result = stream(tokenizer, prompt_ids, output_ids, stop=["there, Genius", "bi!?"])
    # Tokens: "Hello", " there", ",", " General", " Ken", "obi", "!".
    assert result.deltas == ["Hello", " ", "", "there, General", " Ken", "o", ""]
    assert result.flushed == "bi!"
    assert result.stop_reasons == [None] * 7
    assert result.detokenizer.output_text == "Hello there, General Kenobi!"


def test_earliest_completed_stop_wins(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
    text = "The quick brown fox jumps over the lazy dog"
    output_ids = encode(tokenizer, text)
    for chunk in (1, 2, len(output_ids)):
        by_position = stream(tokenizer, prompt_ids, output_ids, chunk, stop=["lazy", "brown fox", "jumps"])
        assert by_position.detokenizer.output_text == "The quick "
        assert [r for r in by_position.stop_reasons if r is not None] == ["brown fox"]
        # "jump" completes before "fox jumps" does, though it starts later.
        overlapping = stream(tokenizer, prompt_ids, output_ids, chunk, stop=["fox jumps", "jump"])
        assert overlapping.detokenizer.output_text == "The quick brown fox "
        assert [r for r in overlapping.stop_reasons if r is not None] == ["jump"]
        assert "".join(overlapping.deltas) + overlapping.flushed == "The quick brown fox "


def test_nothing_after_a_stop_is_emitted(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["STOP"])
    first = detokenizer.update(encode(tokenizer, "abc STOP and more"))
    assert (first.text_delta, first.stop_reason) == ("abc ", "STOP")
    later = detokenizer.update(encode(tokenizer, " even more text"))
    assert (later.text_delta, later.stop_reason) == ("", None)
    assert detokenizer.flush() == ""
    assert detokenizer.output_text == "abc "


def test_stop_at_the_very_start(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
    result = stream(tokenizer, prompt_ids, encode(tokenizer, "Sure! Here it is."), stop=["Sure"])
    assert "".join(result.deltas) + result.flushed == ""
    assert result.stop_reasons[0] == "Sure"


def test_stop_inside_an_incomplete_tail_found_at_flush(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]
) -> None:
    output_ids = encode(tokenizer, "go 😀")[:-1]
    result = stream(tokenizer, prompt_ids, output_ids, stop=[" \ufffd"])
    assert result.deltas == ["go", ""]
    assert result.flushed == ""
    assert result.detokenizer.output_text == "go"


def test_update_each_stops_at_the_token_that_completes_a_stop_string(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]
) -> None:
    ids = encode(tokenizer, "one two three four five six")
    ends = token_end_offsets(tokenizer, ids)
    text = tokenizer.decode(ids)
    stop = text[ends[2] - 2 : ends[3]]  # ends inside token 3 (0-based): tokens 4 and 5 must not count
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, (stop,))
    first, num_used_first = detokenizer.update_each(ids[:2])
    step, num_used = detokenizer.update_each(ids[2:])
    assert (num_used_first, num_used, step.stop_reason) == (2, 2, stop)
    assert first.text_delta + step.text_delta == detokenizer.output_text == text[: text.index(stop)]
