"""Request and response models of the HTTP API (OpenAI-compatible, plus llama.cpp-style extras)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_TOKENS = 1 << 20
TOKEN_ID = Annotated[int, Field(ge=0, le=(1 << 31) - 1)]
TEXT = Annotated[str, Field(max_length=1 << 24)]
STOP_TEXT = Annotated[str, Field(max_length=1024)]
SEED_MOD = 1 << 32  # the engine gets seed % 2**32: any int64 from a client is accepted


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, protected_namespaces=())


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    model: str | None = Field(None, description="ignored: the server has one model")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2, description="0: greedy (deterministic)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=MAX_TOKENS, description="0: no top-k")
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 64) - 1)
    stop: STOP_TEXT | Annotated[list[STOP_TEXT], Field(max_length=16)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, description="only 1 is supported")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    def engine_kwargs(self) -> dict[str, Any]:
        """Sampling keyword arguments for the engine; unset values keep the engine's defaults."""
        kw: dict[str, Any] = {}
        if (n := self.max_new_tokens()) is not None:
            kw["max_tokens"] = n
        for name in ("temperature", "top_p", "top_k"):
            if (v := getattr(self, name)) is not None:
                kw[name] = v
        if self.seed is not None:
            kw["seed"] = self.seed % SEED_MOD
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        stops = [s for s in stops if s]
        if stops:
            kw["stop"] = stops
        return kw

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: (
        Annotated[str, Field(min_length=1, max_length=1 << 24)]
        | Annotated[list[TOKEN_ID], Field(min_length=1, max_length=MAX_TOKENS)]
        | Annotated[list[TEXT], Field(min_length=1, max_length=1)]
    ) = Field(..., description="text, token ids, or a list with one text")
    # not supported: only their "off" values are accepted (the schema says so too)
    echo: bool = Field(False, json_schema_extra={"enum": [False]})
    logprobs: int | None = Field(None, json_schema_extra={"maximum": 0})
    suffix: str | None = Field(None, json_schema_extra={"maxLength": 0})

    @field_validator("prompt", mode="before")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        if v == "" or v == [] or v == [""]:
            raise ValueError("prompt is empty")
        return v

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(v, list) and isinstance(v[0], str):
            return v[0]
        return v  # type: ignore[return-value]

    @field_validator("echo", "logprobs", "suffix")
    @classmethod
    def _unsupported(cls, v: Any) -> Any:
        if v:
            raise ValueError("not supported by this server")
        return v


class ContentPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        msg: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name:
            msg["name"] = self.name
        return msg


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: bool | None = Field(None, json_schema_extra={"enum": [False, None]})

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("not supported by this server")
        return v

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.as_dict() for m in self.messages]


class TokenizeRequest(_Request):
    content: TEXT
    add_special: bool = Field(False, description="add BOS/EOS as the model's tokenizer does")
    parse_special: bool = Field(True, description="parse special-token text such as <|im_start|>")


class TokenizeResponse(BaseModel):
    tokens: list[int]


class DetokenizeRequest(_Request):
    tokens: list[TOKEN_ID] = Field(..., max_length=MAX_TOKENS)


class DetokenizeResponse(BaseModel):
    content: str


# ---- response shapes, for the OpenAPI document (responses are passed through from the engine) ----
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Timings(_Open):
    prompt_n: int
    prompt_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    draft_n: int
    draft_n_accepted: int
    accepted_per_pos: list[int] = []


class CompletionResponse(_Open):
    id: str
    object: str
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage
    timings: Timings


class ModelCard(_Open):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dflash"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    code: int
    message: str
    type: str


class ErrorResponse(BaseModel):
    error: ErrorDetail
