#!/usr/bin/env bash
# The main job: set up a virtualenv (first run only), then start a writer and a query node
# on a local store (./demo-store, recreated), send sample messages, show each kind of
# lookup, stop both nodes and check the store.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${RMQSTORE_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# Install quietly; show pip's output only if it fails.
if ! { "$VENV/bin/pip" install --upgrade pip && "$VENV/bin/pip" install -e '.[test]'; } > "$VENV/install.log" 2>&1; then
    cat "$VENV/install.log" >&2
    exit 1
fi
exec "$VENV/bin/rmqstore" demo --store "${1:-demo-store}"
