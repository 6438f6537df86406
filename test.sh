#!/usr/bin/env bash
# The test suite: set up a virtualenv with the test extras, then run pytest (arguments
# are passed on, e.g. `bash test.sh -k fixture`).
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
exec "$VENV/bin/python" -m pytest "$@"
