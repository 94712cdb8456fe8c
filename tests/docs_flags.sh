#!/bin/sh
# docs/flags.md says what the binaries' --help says: regenerated from BUILD_DIR, it must be the
# committed page byte for byte (a flag added, removed or reworded without the page fails here,
# naming the first difference). Usage: docs_flags.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1
src=$2
now=$(mktemp)
trap 'rm -f "$now"' EXIT
sh "$src/scripts/flags-doc.sh" "$build" >"$now"
if ! cmp -s "$now" "$src/docs/flags.md"; then
    echo "FAIL: docs/flags.md is not what the binaries' --help prints now:" >&2
    diff "$src/docs/flags.md" "$now" | head -20 >&2
    echo "regenerate it: scripts/flags-doc.sh $build > docs/flags.md" >&2
    exit 1
fi
n=$(grep -c -E '^  --' "$src/docs/flags.md")
echo "ok: docs/flags.md matches the --help of 7 binaries ($n flag lines)"
