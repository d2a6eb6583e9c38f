"""Incremental detokenization of one request's output, with stop strings.

Each step decodes only a small window of token ids (the prefix-offset / read-offset scheme of vLLM
and TGI): `decode(window)` minus `decode(window[:read])` is the new text. A step whose decode ends in
U+FFFD (a token that stops inside a multi-byte UTF-8 character) emits nothing and waits for the next
token. The window starts on the prompt's last few tokens, so leading spaces come out right.

Stop strings are matched on the text, across token boundaries. Trailing characters that could still
begin a stop string are held back until they cannot, so text that a stop later cuts is never emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

# NOTE: as in vLLM; enough prompt context for SentencePiece/BPE spacing of the first output token.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


@dataclass(slots=True, frozen=True)
class DetokenizerStep:
    """New text safe to emit now, and the stop string that ended the request, if one matched."""

    text_delta: str
    stop_reason: str | None


class IncrementalDetokenizer:
    """Turns a stream of output token ids into a stream of text deltas for one request.

    The concatenation of every `update(...).text_delta` and the final `flush()` equals
    `output_text`. After a stop string matched (`stop_reason` set) or after `flush()`, updates
    return empty steps.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        # NOTE: the Rust tokenizer's decode where transformers' would only add its Python overhead (it also cleans up
        # spaces before punctuation when the tokenizer asks for that: then its decode it is).
        if getattr(tokenizer, "clean_up_tokenization_spaces", False):
            self._decode_ids = lambda ids: str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
        else:
            backend = tokenizer.backend_tokenizer
            self._decode_ids = lambda ids: str(backend.decode(ids, skip_special_tokens=skip_special_tokens))
        self._stop = tuple(stop)
        self._max_held = max((len(s) for s in self._stop), default=1) - 1
        self._include_stop_str_in_output = include_stop_str_in_output
        # NOTE: _token_ids holds only the window from the prefix offset on (earlier ids are dropped);
        # its first _read_offset ids are already in the text, the rest are not yet.
        self._token_ids = list(prompt_token_ids[max(0, len(prompt_token_ids) - _PROMPT_CONTEXT_TOKENS) :])
        self._read_offset = len(self._token_ids)
        self._text = ""
        self._num_emitted = 0
        self._finished = False

    @property
    def output_text(self) -> str:
        """Output text so far: cut before a matched stop string (after it when it is included)."""
        return self._text

    def update(self, new_token_ids: Sequence[int]) -> DetokenizerStep:
        """Add newly generated token ids; return the text now safe to emit and any matched stop."""
        if self._finished:
            return DetokenizerStep("", None)
        self._token_ids.extend(new_token_ids)
        stop_reason = self._append(self._decode_ready())
        if stop_reason is not None:
            self._finished = True
            return DetokenizerStep(self._take(len(self._text)), stop_reason)
        return DetokenizerStep(self._take(len(self._text) - self._num_held()), None)

    def update_each(self, new_token_ids: Sequence[int]) -> tuple[DetokenizerStep, int]:
        """`update` with the ids one at a time (several tokens of one step, or merged steps), stopping at the one that
        completes a stop string: the combined step, and how many of the ids it used (those after a stop are not part
        of the output, as if the tokens had come one per step). Without stop strings, all of them at once."""
        if len(new_token_ids) == 1 or not self._stop:
            return self.update(new_token_ids), len(new_token_ids)
        text = ""
        for num_used, token_id in enumerate(new_token_ids, start=1):
            step = self.update((token_id,))
            text += step.text_delta
            if step.stop_reason is not None:
                return DetokenizerStep(text, step.stop_reason), num_used
        return DetokenizerStep(text, None), len(new_token_ids)

    def flush(self) -> str:
        """At finish, return the text still held back, incomplete trailing characters included."""
        if self._finished:
            return ""
        self._finished = True
        prefix_text = self._decode(self._token_ids[: self._read_offset])
        self._append(self._decode(self._token_ids)[len(prefix_text) :])
        return self._take(len(self._text))

    def _decode(self, token_ids: list[int]) -> str:
        return self._decode_ids(token_ids)

    def _decode_ready(self) -> str:
        """New text of the ids past read_offset, or "" while it ends inside a character."""
        prefix_text = self._decode(self._token_ids[: self._read_offset])
        new_text = self._decode(self._token_ids)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        # NOTE: the prefix offset moves to the read offset, and the read offset to the end.
        del self._token_ids[: self._read_offset]
        self._read_offset = len(self._token_ids)
        return new_text[len(prefix_text) :]

    def _append(self, new_text: str) -> str | None:
        """Append new text; on a stop match, cut the text there and return the stop string.

        The match that completes first in the text wins (on a tie, the one that starts first), so
        the outcome does not depend on how the text was split into steps.
        """
        old_length = len(self._text)
        self._text += new_text
        best: tuple[int, int, str] | None = None
        for stop_str in self._stop:
            start = self._text.find(stop_str, max(0, old_length - len(stop_str) + 1))
            if start != -1:
                match = (start + len(stop_str), start, stop_str)
                best = match if best is None else min(best, match)
        if best is None:
            return None
        end, start, stop_str = best
        self._text = self._text[: end if self._include_stop_str_in_output else start]
        return stop_str

    def _num_held(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        for length in range(min(self._max_held, len(self._text) - self._num_emitted), 0, -1):
            tail = self._text[-length:]
            if any(stop_str.startswith(tail) for stop_str in self._stop):
                return length
        return 0

    def _take(self, end: int) -> str:
        delta = self._text[self._num_emitted : end]
        self._num_emitted = end
        return delta
