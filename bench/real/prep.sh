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
# the device image has no bcrypt (webconfig imports it for `serve`): the .venv's abi3 wheel
# (CPython >= 3.7, x86_64 manylinux) runs on the device's Python 3.12 too
cp -r .venv/lib/python3*/site-packages/bcrypt .bundle2/kvexp/
(cd .bundle1 && sha256sum site.part1) ; (cd .bundle2 && sha256sum site.part2); cat $B/SHA256SUMS
du -sh .bundle1 .bundle2
echo "kvoffload snapshot $(cat .bundle2/kvexp/COMMIT)"
echo "what travels besides the carried folder (untracked, not ignored):"; git ls-files -o --exclude-standard | xargs -r du -ch | tail -1
# For bench/real/analyze_call.sh (no vLLM server): .bundle3 = pyzmq and msgspec for the device's
# Python 3.12 (taken from the first half of the vLLM bundle: they are in it), kvexp = HEAD's
# kvoffload, kvold = ${OLD:-HEAD~1}'s (the "before" of the timings).
grep -qx '/.bundle3/' .git/info/exclude 2>/dev/null || printf '/.bundle3/\n' >> .git/info/exclude
rm -rf .bundle3 && mkdir -p .bundle3/deps .bundle3/kvexp .bundle3/kvold
xz -d < .bundle1/site.part1 2>/dev/null | tar -x -C .bundle3/deps --wildcards './zmq*' './pyzmq*' './msgspec*' 2>/dev/null || true  # half a stream: tar ends with an error
tar -C .bundle3/deps -cJf .bundle3/deps.tar.xz . && rm -rf .bundle3/deps
git archive HEAD exporter/kvoffload | tar -x -C .bundle3/kvexp --strip-components=1
git rev-parse --short HEAD > .bundle3/kvexp/COMMIT
git archive "${OLD:-HEAD~1}" exporter/kvoffload | tar -x -C .bundle3/kvold --strip-components=1
git rev-parse --short "${OLD:-HEAD~1}" > .bundle3/kvold/COMMIT
du -sh .bundle3
