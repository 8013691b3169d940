#!/usr/bin/env bash
# Runs every Fuzz* target in the module for FUZZTIME each (default 5s).
#
# Go 1.26's fuzz coordinator can report a bare "context deadline exceeded"
# when -fuzztime expires while a worker is mid-call (golang/go#75804, fixed
# in Go 1.27). Such a run found nothing: it wrote no failing input and printed
# no panic or test error. A target whose run fails only that way is run once
# more; any other failure, or a second one, fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-5s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# deadline_only reports whether the log in $1 failed only by the coordinator's
# deadline race.
deadline_only() {
  grep -q 'context deadline exceeded' "$1" &&
    ! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:|fuzz: minimizing' "$1"
}

found=0
while IFS= read -r file; do
  dir=$(dirname "$file")
  for target in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/'); do
    found=1
    for attempt in 1 2; do
      echo "fuzz: ./$dir $target ($FUZZTIME)"
      if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "./$dir" 2>&1 | tee "$log"; then
        break
      fi
      if [ "$attempt" = 1 ] && deadline_only "$log"; then
        echo "fuzz: $target stopped on the -fuzztime deadline race (golang/go#75804), no input failed; running it again"
        continue
      fi
      exit 1
    done
  done
done < <(grep -rl --include='*_test.go' -E '^func Fuzz' . | sed 's|^\./||' | sort)
[ "$found" = 1 ] || echo "fuzz: no targets found"
