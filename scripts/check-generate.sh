#!/usr/bin/env bash
# check-generate.sh fails when `make generate` changes anything: generated
# code (bpf2go's Go files and eBPF objects) must be committed as the
# generators produce it (STYLE.md item 9). Run it in CI after `make deps`.
#
# It compares the working tree before and after, so it also works in a
# tree with unrelated uncommitted edits.
set -euo pipefail
cd "$(dirname "$0")/.."

state() {
	git diff HEAD --binary | sha256sum
	git ls-files --others --exclude-standard | sort | while read -r f; do sha256sum "$f"; done
}

before=$(state)
make -s generate
after=$(state)
if [[ $before != "$after" ]]; then
	echo "check-generate: make generate changed the tree; commit its output:" >&2
	git status --short >&2
	exit 1
fi
echo "check-generate: generated code is up to date"
