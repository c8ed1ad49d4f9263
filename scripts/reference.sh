#!/usr/bin/env bash
# Regenerates docs/commands/ (the command reference) from the commands' own
# help; internal/reference's TestReferenceCurrent fails when it is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
MOAT_UPDATE_REFERENCE=1 go test -count=1 -run '^TestReferenceCurrent$' ./internal/reference
