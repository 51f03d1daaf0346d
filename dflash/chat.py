"""Chat templates: the Jinja template stored in the GGUF, rendered with jinja2 in a sandbox
(as Hugging Face tokenizers do), with a ChatML fallback for files without one."""

from __future__ import annotations

from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dflash.errors import InvalidParameterError

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise(msg: str) -> None:
    raise InvalidParameterError(f"chat template: {msg}")


class ChatTemplate:
    def __init__(self, source: str, vocab: Any) -> None:
        self.source = source or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self._tmpl = env.from_string(self.source)
        except jinja2.TemplateError as e:
            raise InvalidParameterError(f"the model's chat template does not parse: {e}") from e
        self._bos = _piece(vocab, vocab.bos)
        self._eos = _piece(vocab, vocab.eos)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        if not isinstance(messages, list) or not messages:
            raise InvalidParameterError("messages must be a non-empty list")
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise InvalidParameterError("each message needs a 'role'")
        try:
            return self._tmpl.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
                **extra,
            )
        except jinja2.TemplateError as e:
            raise InvalidParameterError(f"chat template failed: {e}") from e


def _piece(vocab: Any, tok: int) -> str:
    if tok is None or tok < 0:
        return ""
    return vocab.token_to_piece(tok, True).decode("utf-8", errors="replace")
