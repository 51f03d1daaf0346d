"""Turning generated token ids into text deltas: UTF-8 safe, stop-string aware, O(1) per token."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextStream:
    """Accumulates tokens; `push` returns the text that is safe to emit now.

    `piece(token)` gives a token's bytes (for byte-level BPE the text of a sequence is the
    concatenation of its pieces). An incremental UTF-8 decoder holds back a character split
    across tokens, and text is held back while it could still be the start of a stop string,
    so a stop string never leaks into the output.
    """

    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._stop = [s for s in stop if s]
        self._longest = max((len(s) for s in self._stop), default=0)
        self._emitted = 0  # characters of self.text already returned
        self.stopped = False  # a stop string was found
        self.text = ""

    def push(self, token: int) -> str:
        new = self._decoder.decode(self._piece(token))
        if not new:
            return ""
        # A stop string can only end inside the new text: search from just before it.
        search_from = max(0, len(self.text) - self._longest + 1)
        self.text += new
        found = [at for s in self._stop if (at := self.text.find(s, search_from)) != -1]
        if found:
            self.stopped = True
            self.text = self.text[: min(found)]
            return self._take(len(self.text))
        safe = len(self.text)
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    safe = min(safe, len(self.text) - k)
                    break
        return self._take(safe)

    def flush(self) -> str:
        """The held-back remainder at the end of generation (no stop string matched)."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        out = self.text[self._emitted : upto] if upto > self._emitted else ""
        self._emitted = max(self._emitted, upto)
        return out
