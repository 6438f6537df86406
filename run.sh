#!/usr/bin/env bash
# The main job: set up a virtualenv (first run only), then inspect and check the Apache
# RocketMQ 4.9.4 store that ships in tests/fixtures, and show its first records.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${RMQSTORE_VENV:-.venv}"
if [ ! -x "$VENV/bin/rmqstore" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet -e '.[test]'
fi
STORE="${1:-tests/fixtures/rocketmq-4.9.4-dev/store-clean}"
SIZES=(--index-slots "${INDEX_SLOTS:-500}" --index-entries "${INDEX_ENTRIES:-1500}")
echo "== rmqstore inspect $STORE"
"$VENV/bin/rmqstore" inspect "$STORE" "${SIZES[@]}"
echo
echo "== rmqstore check $STORE"
"$VENV/bin/rmqstore" check "$STORE" "${SIZES[@]}"
echo
echo "== rmqstore dump commitlog $STORE (first 3 records)"
"$VENV/bin/rmqstore" dump commitlog "$STORE" | head -n 3
