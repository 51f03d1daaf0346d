"""Turning a growing list of token ids into text deltas: UTF-8 safe and stop-string aware."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """Accumulates tokens; `push` returns the text that is safe to emit now.

    Text is held back while it ends in an incomplete UTF-8 sequence or could still be the
    start of a stop string, so a stop string never leaks into the output.
    """

    def __init__(self, detokenize: Callable[[Sequence[int]], bytes], stop: Sequence[str] = ()) -> None:
        self._detok = detokenize
        self._stop = [s for s in stop if s]
        self._tokens: list[int] = []
        self._emitted = 0  # characters of the decoded text already returned
        self.stopped = False  # a stop string was found
        self.text = ""

    def push(self, token: int) -> str:
        self._tokens.append(token)
        raw = self._detok(self._tokens)
        # An incomplete trailing UTF-8 sequence is dropped now and appears once complete.
        text = raw.decode("utf-8", errors="ignore")
        self.text = text
        for s in self._stop:
            at = text.find(s)
            if at != -1:
                self.stopped = True
                self.text = text[:at]
                out = self.text[self._emitted :]
                self._emitted = len(self.text)
                return out
        safe = len(text)
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        out = text[self._emitted : safe]
        self._emitted = max(self._emitted, safe)
        return out

    def flush(self) -> str:
        """The held-back remainder at the end of generation (no stop string matched)."""
        out = self.text[self._emitted :]
        self._emitted = len(self.text)
        return out
