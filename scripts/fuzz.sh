#!/usr/bin/env bash
# fuzz.sh runs every fuzz target of the module for $FUZZTIME each (go test
# -fuzz takes one target per run). Targets are found by grep, so new ones
# join without editing this script. New failing inputs land where go puts
# them, in the package's testdata/fuzz/<Target>/, and fail the run.
#
# Environment:
#   FUZZTIME  budget per target (default 5s), as go test -fuzztime takes it
#   GO        go binary (default go)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-5s}
GO=${GO:-go}

mapfile -t targets < <(grep -r -H -o --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*(' . | sed 's/($//; s/:func /\t/' | sort)
((${#targets[@]})) || { echo "fuzz: no fuzz targets found" >&2; exit 1; }

failed=()
for t in "${targets[@]}"; do
	file=${t%%$'\t'*}
	name=${t#*$'\t'}
	pkg=$(dirname "$file")
	echo "fuzz: $pkg $name for $FUZZTIME"
	# -run '^$': the package's other tests run in make test already.
	corpus="$pkg/testdata/fuzz/$name"
	before=$(ls "$corpus" 2>/dev/null | sort || true)
	if ! out=$("$GO" test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1); then
		after=$(ls "$corpus" 2>/dev/null | sort || true)
		# Go before 1.27 can end a duration -fuzztime with a bare "context
		# deadline exceeded" and no failing input, when a worker is busy as
		# the deadline fires (golang/go#75804, a race in its coordinator).
		# A real failure always writes its input to testdata/fuzz/<Target>/.
		if [[ "$before" == "$after" ]] && grep -q '^    context deadline exceeded$' <<<"$out" && ! grep -q -e 'panic:' -e 'Failing input written' <<<"$out"; then
			echo "fuzz: $name: go's end-of-fuzztime race (golang/go#75804), no failing input: not counted as a failure"
			continue
		fi
		printf '%s\n' "$out"
		failed+=("$pkg $name")
	else
		tail -n1 <<<"$out"
	fi
done
echo "fuzz: ${#targets[@]} targets, ${#failed[@]} failed"
if ((${#failed[@]})); then
	printf 'fuzz: FAIL %s\n' "${failed[@]}" >&2
	exit 1
fi
