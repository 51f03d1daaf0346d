"""Server configuration: defaults < config file < DFLASH_* environment < command line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

ENV_PREFIX = "DFLASH_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="target GGUF (default: the package's embedded model)")
    draft: str | None = Field(None, description="drafter: GGUF file or safetensors directory")
    default_draft: bool = Field(
        True, description="with neither model nor draft given, also load the packaged drafter"
    )
    budget: int | None = Field(None, ge=1, description="DDTree node budget (engine option `budget`)")
    batch_invariant: bool = Field(
        False, description="greedy speculative output equal to decoding bit for bit on the GPU too (slower)"
    )
    spec_options: dict[str, Any] = Field(
        default_factory=dict, description="extra engine options, KEY=VALUE (JSON values allowed)"
    )
    kv_type: str = Field("f16", description="KV cache type (K and V)")
    kv_type_k: str | None = Field(None, description="K cache type, overrides kv_type")
    kv_type_v: str | None = Field(None, description="V cache type, overrides kv_type")
    n_ctx: int = Field(4096, ge=16, description="context size in tokens")
    n_gpu_layers: int = Field(-1, description="layers offloaded to the GPU (-1: all)")
    n_batch: int = Field(512, ge=1, description="prompt batch size")
    n_threads: int = Field(0, ge=0, description="CPU threads (0: automatic)")
    seed: int = Field(0, description="engine seed")
    host: str = Field("127.0.0.1", description="listen address")
    port: int = Field(8080, ge=0, le=65535, description="listen port (0: any free port)")
    api_key: SecretStr | None = Field(
        None, description="require 'Authorization: Bearer KEY' (not on /health)"
    )
    queue_size: int = Field(16, ge=0, description="requests allowed to wait for the engine; more get 429")
    model_alias: str | None = Field(None, description="model id reported by the API (default: file name)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    verbose: bool = Field(False, description="engine verbose logging")
    config: Path | None = Field(None, description="config file (.toml or .json) with these keys")

    @field_validator("model", "draft", "api_key", "model_alias", "kv_type_k", "kv_type_v", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: Any) -> Any:
        return None if v == "" else v  # DFLASH_MODEL= (empty) means the default, not a file named ""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        init_kwargs = getattr(init_settings, "init_kwargs", {})
        path = init_kwargs.get("config") or os.environ.get(ENV_PREFIX + "CONFIG")
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if path:
            sources += (config_file_source(settings_cls, Path(path)),)
        return sources

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `dflash.Engine`."""
        kwargs: dict[str, Any] = dict(self.spec_options)
        optional = {"budget": self.budget, "kv_type_k": self.kv_type_k, "kv_type_v": self.kv_type_v}
        kwargs.update({k: v for k, v in optional.items() if v is not None})
        if self.n_threads:
            kwargs["n_threads"] = self.n_threads
        kwargs.update(
            model_path=self.model,
            draft_path=self.draft,
            default_draft=self.default_draft,
            batch_invariant=self.batch_invariant,
            n_ctx=self.n_ctx,
            kv_type=self.kv_type,
            n_gpu_layers=self.n_gpu_layers,
            n_batch=self.n_batch,
            seed=self.seed,
            verbose=self.verbose,
        )
        return kwargs

    def public_dict(self) -> dict[str, Any]:
        """Settings as JSON-able data, the API key masked."""
        data = self.model_dump(mode="json")
        if self.api_key is not None:
            data["api_key"] = "***"
        return data


def config_file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return JsonConfigSettingsSource(settings_cls, json_file=path)
    if suffix == ".toml":
        return TomlConfigSettingsSource(settings_cls, toml_file=path)
    raise ValueError(f"config file must be .toml or .json: {path}")
