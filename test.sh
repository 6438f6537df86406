#!/usr/bin/env bash
# The test suite: set up a virtualenv with the test extras, then run pytest (arguments
# are passed on, e.g. `bash test.sh -k fixture`).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${RMQSTORE_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet -e '.[test]'
exec "$VENV/bin/python" -m pytest "$@"
