#!/usr/bin/env bash
# Cross-checks ckpt-audit's signed checkpoints and inclusion proofs with an implementation no one
# on this project wrote: Go's golang.org/x/mod/sumdb/note (note.Open) and sumdb/tlog
# (tlog.CheckRecord), from Debian's golang-go and golang-golang-x-mod-dev
# (tests/interop/go/tlogcheck). Builds a small log with the real CLI, exports a proof of every
# entry and has Go verify each; tampered proofs and a wrong key must fail in Go too.
# Usage: go_crosscheck.sh CKPT_AUDIT_BINARY TEST_DATA_DIR. Exit 77 (ctest: skipped) only when
# `go` is not installed.
set -euo pipefail
CLI=$1
DATA=$2
HERE="$(cd "$(dirname "$0")" && pwd)"
if ! command -v go >/dev/null 2>&1; then
  echo "SKIPPED: go is not installed (deploy/install-deps.sh installs golang-go and golang-golang-x-mod-dev)"
  exit 77
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$WORK/gocache"
export XDG_DATA_HOME="$WORK/xdg"
(cd "$HERE/go/tlogcheck" && go build -o "$WORK/tlogcheck" .)

"$CLI" keys generate --out "$WORK/key.pem" --trust "$WORK/trusted" >/dev/null
for _ in 1 2 3; do  # each audit logs a record and its test result: 6 entries
  "$CLI" audit "$DATA/mini-kimi-mxfp4" --db "$WORK/log.db" --key "$WORK/key.pem" >/dev/null
done
VKEY=$("$CLI" keys show --key "$WORK/key.pem" --db "$WORK/log.db" --json |
       sed -n 's/.*"note_verifier_key": "\(.*\)".*/\1/p')
[ -n "$VKEY" ] || { echo "FAIL: no note verifier key"; exit 1; }
echo "vkey $VKEY"

fail() { echo "FAIL: $*"; exit 1; }
for id in 0 1 2 3 4 5; do
  "$CLI" proof --db "$WORK/log.db" --id "$id" --out "$WORK/$id.proof" 2>/dev/null
  "$WORK/tlogcheck" "$VKEY" "$WORK/$id.proof" || fail "Go rejects the proof of entry $id"
  "$CLI" verify-proof "$WORK/$id.proof" --vkey "$VKEY" >/dev/null ||
    fail "ckpt-audit rejects the proof of entry $id"
done

# Negative controls: each must be rejected by Go.
expect_go_rejects() {  # NAME FILE [VKEY]
  if "$WORK/tlogcheck" "${3:-$VKEY}" "$2" >"$WORK/out" 2>&1; then
    fail "Go accepted $1: $(cat "$WORK/out")"
  fi
  echo "rejected as expected ($1): $(cat "$WORK/out")"
}
sed 's/^index 2$/index 3/' "$WORK/2.proof" >"$WORK/wrong-index.proof"
expect_go_rejects "another index" "$WORK/wrong-index.proof"
awk 'NR==4 { $0 = (substr($0,1,1) == "A" ? "B" : "A") substr($0,2) } { print }' \
  "$WORK/2.proof" >"$WORK/wrong-hash.proof"
expect_go_rejects "a changed path hash" "$WORK/wrong-hash.proof"
# The checkpoint's signature line is the last line; flip one base64 character near its end.
awk '{ lines[NR] = $0 } END { for (i = 1; i <= NR; i++) { l = lines[i];
  if (i == NR) { c = substr(l, length(l) - 3, 1); l = substr(l, 1, length(l) - 4) (c == "A" ? "B" : "A") substr(l, length(l) - 2) }
  print l } }' "$WORK/2.proof" >"$WORK/wrong-sig.proof"
expect_go_rejects "a changed checkpoint signature" "$WORK/wrong-sig.proof"
"$CLI" keys generate --out "$WORK/other.pem" >/dev/null
"$CLI" audit "$DATA/mini-kimi-mxfp4" --db "$WORK/other.db" --key "$WORK/other.pem" >/dev/null
OTHER=$("$CLI" keys show --key "$WORK/other.pem" --db "$WORK/other.db" --json |
        sed -n 's/.*"note_verifier_key": "\(.*\)".*/\1/p')
expect_go_rejects "another log's key" "$WORK/2.proof" "$OTHER"
echo "PASS: Go's sumdb/note and sumdb/tlog verify all 6 checkpoints and inclusion proofs"
