"""Configuration: every flag is also a DFLASH_* variable and a config-file key; CLI > env > file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dflash_serve.main import build_parser, load_settings, main, parse_spec_options
from dflash_serve.settings import Settings

# field -> (command-line text, expected value)
SAMPLES: dict[str, tuple[str, Any]] = {
    "model": ("/models/target.gguf", "/models/target.gguf"),
    "draft": ("/models/drafter", "/models/drafter"),
    "budget": ("48", 48),
    "kv_type": ("q8_0", "q8_0"),
    "kv_type_k": ("q8_0", "q8_0"),
    "kv_type_v": ("q4_0", "q4_0"),
    "n_ctx": ("8192", 8192),
    "n_gpu_layers": ("20", 20),
    "n_batch": ("256", 256),
    "n_threads": ("3", 3),
    "seed": ("7", 7),
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("9001", 9001),
    "queue_size": ("3", 3),
    "model_alias": ("qwen", "qwen"),
    "log_level": ("debug", "debug"),
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("DFLASH_") and name != "DFLASH_SERVER_FAKE_ONLY":
            monkeypatch.delenv(name)


def test_every_field_has_a_flag_and_a_sample() -> None:
    dests = {a.dest for a in build_parser()._actions}
    assert set(Settings.model_fields) <= dests
    simple = set(Settings.model_fields) - {
        "spec_options",
        "api_key",
        "verbose",
        "default_draft",
        "batch_invariant",
        "config",
    }
    assert simple == set(SAMPLES)


@pytest.mark.parametrize("field", sorted(SAMPLES))
def test_env_and_flag(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text, want = SAMPLES[field]
    flag = "--" + field.replace("_", "-")
    assert getattr(load_settings([flag, text])[0], field) == want
    monkeypatch.setenv("DFLASH_" + field.upper(), text)
    assert getattr(load_settings([])[0], field) == want


def test_bool_secret_and_spec_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_VERBOSE", "true")
    monkeypatch.setenv("DFLASH_API_KEY", "k1")
    monkeypatch.setenv("DFLASH_SPEC_OPTIONS", '{"tree": true, "top_k": 8}')
    s, _ = load_settings([])
    assert s.verbose is True and s.api_key is not None and s.api_key.get_secret_value() == "k1"
    assert s.spec_options == {"tree": True, "top_k": 8}
    s, _ = load_settings(
        ["--no-verbose", "--api-key", "k2", "--spec-option", "top_k=4", "--spec-option", "mode=chain"]
    )
    assert s.verbose is False and s.api_key.get_secret_value() == "k2"  # type: ignore[union-attr]
    assert s.spec_options["top_k"] == 4 and s.spec_options["mode"] == "chain"
    assert parse_spec_options(["a=1", "b=x", "c=[1, 2]"]) == {"a": 1, "b": "x", "c": [1, 2]}
    with pytest.raises(ValueError):
        parse_spec_options(["novalue"])
    # the packaged drafter with the default model: on unless turned off
    assert load_settings([])[0].default_draft is True
    assert load_settings(["--no-default-draft"])[0].engine_kwargs()["default_draft"] is False
    monkeypatch.setenv("DFLASH_DEFAULT_DRAFT", "false")
    assert load_settings([])[0].default_draft is False


def test_precedence_cli_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text('n_ctx = 1024\nport = 7000\nhost = "127.0.0.2"\n[spec_options]\nbudget_hint = 3\n')
    monkeypatch.setenv("DFLASH_CONFIG", str(cfg))
    monkeypatch.setenv("DFLASH_PORT", "7001")
    s, _ = load_settings(["--host", "127.0.0.3"])
    assert (s.n_ctx, s.port, s.host) == (1024, 7001, "127.0.0.3")
    assert s.spec_options == {"budget_hint": 3}
    monkeypatch.delenv("DFLASH_CONFIG")
    js = tmp_path / "serve.json"
    js.write_text(json.dumps({"n_ctx": 2048, "model": "/m.gguf"}))
    s, _ = load_settings(["--config", str(js)])
    assert (s.n_ctx, s.model, s.port) == (2048, "/m.gguf", 7001)


def test_engine_kwargs() -> None:
    s = Settings(model="/m.gguf", budget=32, n_ctx=1024, kv_type="q8_0", spec_options={"tree": True})
    kw = s.engine_kwargs()
    assert kw["model_path"] == "/m.gguf" and kw["draft_path"] is None and kw["budget"] == 32
    assert kw["n_ctx"] == 1024 and kw["kv_type"] == "q8_0" and kw["tree"] is True
    assert "n_threads" not in kw and "kv_type_k" not in kw  # unset: the engine's defaults
    assert Settings().engine_kwargs()["model_path"] is None  # the embedded default model
    assert Settings().engine_kwargs()["batch_invariant"] is False
    assert load_settings(["--batch-invariant"])[0].engine_kwargs()["batch_invariant"] is True


@pytest.mark.parametrize(
    "argv",
    [["--n-ctx", "lots"], ["--port", "70000"], ["--log-level", "loud"], ["--config", "/nonexistent.toml"]],
)
def test_bad_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load_settings(argv)
    assert exc.value.code == 2
    assert "dflash-serve: error" in capsys.readouterr().err


def test_unknown_config_key_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text('{"n_ctxx": 5}')
    with pytest.raises(SystemExit):
        load_settings(["--config", str(cfg)])


def test_print_config_masks_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print-config", "--api-key", "secret", "-m", "/x.gguf", "-c", "333"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["api_key"] == "***" and out["model"] == "/x.gguf" and out["n_ctx"] == 333


def test_empty_values_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_MODEL", "")
    monkeypatch.setenv("DFLASH_API_KEY", "")
    s, _ = load_settings([])
    assert s.model is None and s.api_key is None
