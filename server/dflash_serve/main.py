"""`dflash-serve` command line: settings from flags / DFLASH_* env / config file, logging, uvicorn."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from . import __version__
from .settings import ENV_PREFIX, Settings

log = logging.getLogger("dflash_serve")

# llama.cpp-style aliases next to the --long-names derived from the settings fields
ALIASES = {
    "model": ("-m",),
    "draft": ("-md", "--model-draft"),
    "n_ctx": ("-c", "--ctx-size"),
    "n_gpu_layers": ("-ngl",),
    "budget": ("--draft-budget",),
}
LOOPBACK = ("127.", "localhost", "::1")
GRACEFUL_S = 20  # on SIGTERM/SIGINT the running generation gets this long to finish


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-serve",
        description="OpenAI-compatible server for dflash speculative decoding.",
        epilog=f"Every option is also an environment variable {ENV_PREFIX}<NAME> (e.g. {ENV_PREFIX}N_CTX) "
        "and a key of the --config file; command line > environment > file.",
    )
    for name, field in Settings.model_fields.items():
        env = ENV_PREFIX + name.upper()
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        help_text = f"{field.description} [{env}; default: {default}]"
        if name == "spec_options":
            parser.add_argument(
                "--spec-option", dest=name, action="append", metavar="KEY=VALUE", default=argparse.SUPPRESS,
                help=f"{field.description}; repeatable [{env} as a JSON object]",
            )  # fmt: skip
        elif field.annotation is bool:
            parser.add_argument(
                f"--{name.replace('_', '-')}", dest=name, action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS, help=help_text,
            )  # fmt: skip
        else:
            flags = (f"--{name.replace('_', '-')}", *ALIASES.get(name, ()))
            parser.add_argument(
                *flags, dest=name, default=argparse.SUPPRESS, metavar=name.upper(), help=help_text
            )
    parser.add_argument("--print-config", action="store_true", help="print the resolved settings and exit")
    parser.add_argument("--version", action="version", version=f"dflash-serve {__version__}")
    return parser


def parse_spec_options(items: Sequence[str]) -> dict[str, Any]:
    """['budget=64', 'tree=true'] -> {'budget': 64, 'tree': True}; values are JSON when they parse."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--spec-option needs KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def load_settings(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    try:
        if "spec_options" in given:
            given["spec_options"] = parse_spec_options(given["spec_options"])
        return Settings(**given), args
    except (ValidationError, ValueError) as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings, args = load_settings(argv)
    if args.print_config:
        print(json.dumps(settings.public_dict(), indent=2, sort_keys=True))
        return 0
    configure_logging(settings.log_level)

    import uvicorn

    from .app import create_app
    from .engine_worker import State

    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    worker = app.state.worker

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            worker.begin_shutdown()  # queued requests get 503 at once; the running one may finish
            super().handle_exit(sig, frame)

    server = Server(config)
    app.state.on_fatal.append(lambda _exc: setattr(server, "should_exit", True))
    if not settings.host.startswith(LOOPBACK) and settings.api_key is None:
        log.warning("listening on %s without an API key", settings.host)
    log.info("dflash-serve %s: http://%s:%d", __version__, settings.host, settings.port)
    server.run()
    if worker.state is State.FAILED:
        log.error("exiting: the model could not be loaded: %s", worker.load_error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
