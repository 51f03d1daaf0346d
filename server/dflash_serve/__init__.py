"""dflash-serve: an OpenAI-compatible HTTP daemon around the public `dflash` Python API."""

__version__ = "0.1.0"
