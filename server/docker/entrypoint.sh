#!/bin/sh
# dflash-serve container entrypoint.
#
#   entrypoint.sh [dflash-serve flags...]   run the server (the default)
#   entrypoint.sh healthcheck               exit 0 when GET /health answers 200 (used by HEALTHCHECK)
#   entrypoint.sh COMMAND [ARGS...]         run anything else (a shell, dflash, convert-draft)
#
# Configuration is the server's own: DFLASH_* variables (or flags). On top of that:
#   HOST, PORT       container conventions, used when DFLASH_HOST / DFLASH_PORT are unset
#   MODELS_DIR       where models are mounted read-only (default /models); relative paths in
#                    DFLASH_MODEL, DFLASH_DRAFT and DFLASH_CONFIG are taken inside it
set -eu

MODELS_DIR="${MODELS_DIR:-/models}"

if [ -z "${DFLASH_HOST:-}" ] && [ -n "${HOST:-}" ]; then export DFLASH_HOST="$HOST"; fi
if [ -z "${DFLASH_PORT:-}" ] && [ -n "${PORT:-}" ]; then export DFLASH_PORT="$PORT"; fi

in_models() {
    case "$1" in
        /*) printf '%s' "$1" ;;
        *) printf '%s/%s' "${MODELS_DIR%/}" "$1" ;;
    esac
}

for var in DFLASH_MODEL DFLASH_DRAFT DFLASH_CONFIG; do
    eval "value=\${$var:-}"
    if [ -n "$value" ]; then
        resolved="$(in_models "$value")"
        export "$var=$resolved"
    fi
done

case "${1:-}" in
    healthcheck)
        exec python3 -c 'import os, urllib.request
port = os.environ.get("DFLASH_PORT", "8080")
urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)'
        ;;
    "" | -*)
        exec dflash-serve "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
