#!/usr/bin/env bash
# The main job: set up a virtualenv (first run only), then start a writer and a query node
# on a local store (./demo-store: new, empty, or an earlier demo's, which is recreated), send
# sample messages, show each kind of lookup, stop both nodes and check the store.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${RMQSTORE_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# The install is editable, so Python sources are read from here; only what the install
# builds (dependencies, the compiled protobuf stubs, the C codecs) goes stale. A stamp of
# those inputs, written after a successful install, lets a later run skip pip.
STAMP="$VENV/rmqstore-install.sha256"
current="$(find pyproject.toml setup.py protos/rmqstore common/codec/speedups_c -type f \( -name '*.proto' -o -name '*.c' -o -name '*.h' -o -name '*.toml' -o -name '*.py' \) -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
# What the install builds must still be there too (a `git clean` removes it).
built() { [ -d protos/gen/rmqstore/v1 ] && compgen -G 'common/codec/_speedups*.so' > /dev/null; }
if [ ! -x "$VENV/bin/rmqstore" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$current" ] || ! built; then
    # Install quietly; show pip's output only if it fails.
    if ! { "$VENV/bin/pip" install --upgrade pip && "$VENV/bin/pip" install -e '.[test]'; } > "$VENV/install.log" 2>&1; then
        cat "$VENV/install.log" >&2
        exit 1
    fi
    echo "$current" > "$STAMP"
fi
exec "$VENV/bin/rmqstore" demo --store "${1:-demo-store}"
