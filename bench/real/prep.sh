#!/bin/bash
# Local, before the device calls (repo root): the two bundle halves into git-ignored folders, and a
# snapshot of kvoffload (git HEAD's exporter/kvoffload, so a half-edited working tree can't break
# the run) into .bundle2/kvexp with its commit in .bundle2/kvexp/COMMIT.
set -e
B=${BUNDLE:-/work/shared/real-vllm/bundle}
grep -qx '/.bundle1/' .git/info/exclude 2>/dev/null || printf '/.bundle1/\n/.bundle2/\n' >> .git/info/exclude
mkdir -p .bundle1 .bundle2
cmp -s $B/site.part1 .bundle1/site.part1 || cp $B/site.part1 .bundle1/
cmp -s $B/site.part2 .bundle2/site.part2 || cp $B/site.part2 .bundle2/
rm -rf .bundle2/kvexp; mkdir -p .bundle2/kvexp
git archive HEAD exporter/kvoffload | tar -x -C .bundle2/kvexp --strip-components=1
git rev-parse HEAD > .bundle2/kvexp/COMMIT
(cd .bundle1 && sha256sum site.part1) ; (cd .bundle2 && sha256sum site.part2); cat $B/SHA256SUMS
du -sh .bundle1 .bundle2
echo "kvoffload snapshot $(cat .bundle2/kvexp/COMMIT)"
echo "what travels besides the carried folder (untracked, not ignored):"; git ls-files -o --exclude-standard | xargs -r du -ch | tail -1
