#!/usr/bin/env bash
# Runs every test tier: unit, integration (real namespaces, real gVisor) and
# end-to-end through the built bin/moat. Needs root, like moat itself.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH=/usr/local/go/bin:$PATH
go vet ./...
# One built binary and one runsc shared by every end-to-end test.
export MOAT_BIN=$PWD/bin/moat MOAT_RUNSC=$PWD/bin/runsc
go test -count=1 -timeout 40m ./... 2>&1 | tee /tmp/moat-test.log
