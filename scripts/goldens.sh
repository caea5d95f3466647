#!/bin/sh
# Regenerates the golden values computed by real Go (the reference CLI's
# own code, copied into tests/golden/*/main.go): the idempotency keys of
# the personal stream's upstream subscriptions. Needs `go` (Debian:
# golang-go); CI does not: the tests read the committed goldens.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/tests/golden/idempotency"
go run main.go > goldens.json.tmp
mv goldens.json.tmp goldens.json
echo "wrote tests/golden/idempotency/goldens.json"
