#!/bin/bash
# device call (carry .bundle3, made by bench/real/prep.sh [OLD=rev]: deps.tar.xz + kvexp/ + kvold/; deps: pyzmq and msgspec for
# Python 3.12 taken from the vLLM bundle, which the image lacks):
# `kvoffload analyze` of the benchmark's 24 h and 6 h journals (and 6 h strict when time is
# left), timed on a quiet machine pinned to 2 CPUs like the project's machine (issue #16 item
# 1): this snapshot (kvexp) against an older one (kvold: the "before"). Results in $OUT.
# usage (repo root on the device): bash bench/real/analyze_call.sh [BUDGET_S=560]
T0=$(date +%s); BUDGET=${1:-560}; DEADLINE=$((T0 + BUDGET))
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
[ -f .bundle3/deps.tar.xz ] && [ -d .bundle3/kvexp/kvoffload ] && [ -d .bundle3/kvold/kvoffload ] || { echo "carry .bundle3 with deps.tar.xz, kvexp and kvold"; exit 3; }
SITE=/tmp/site; rm -rf $SITE; mkdir -p $SITE
tar -xJf .bundle3/deps.tar.xz -C $SITE || { echo UNPACK_FAIL; exit 4; }
echo "unpacked in $(( $(date +%s) - T0 ))s"; lscpu | grep -E 'Model name|^CPU\(s\)'; python3 -V
NEW=$SITE:$PWD/.bundle3/kvexp; OLD=$SITE:$PWD/.bundle3/kvold
echo "new $(cat .bundle3/kvexp/COMMIT) old $(cat .bundle3/kvold/COMMIT)"
# The compiled scan for this Python, as `pip install` would build it (setup.py: -O2).
SCAN=.bundle3/kvexp/kvoffload/recording/_scan.c
if [ -f $SCAN ]; then
  INC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  EXT=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  cc -O2 -shared -fPIC -I"$INC" $SCAN -o ${SCAN%.c}$EXT 2>&1 | tail -3 || echo "no compiled scan"
fi
PYTHONPATH=$NEW python3 -m kvoffload --version
PURE="KVOFFLOAD_PURE_PYTHON=1"
export KVO_BENCH_TMP=/tmp/kvb; mkdir -p $KVO_BENCH_TMP
(cd bench && PYTHONPATH=$NEW:. python3 -c '
import time; from analyze_bench import recording
for h in (24, 6):
    t = time.time(); p = recording(h, False); print(p, round(time.time() - t, 1), "s", flush=True)') || exit 4
D=$KVO_BENCH_TMP/kvoffload-bench; J24=$D/large-24h.journal.om; J6=$D/large-6h.journal.om
ls -la $D; echo "files in $(( $(date +%s) - T0 ))s"
cat $J24 > /dev/null; cat $J6 > /dev/null  # a warm-up read: the files in the page cache
taskset -c 2,3 python3 bench/real/analyze_runs.py $OUT/analyze-journal.json $((DEADLINE - 150)) \
  "new24=$NEW|$J24||5" "new24-pure=$NEW|$J24||3|$PURE" "new24-jobs1=$NEW|$J24|--jobs 1|2" \
  "old24=$OLD|$J24||2" "new6=$NEW|$J6||5" "new6-pure=$NEW|$J6||3|$PURE" "old6=$OLD|$J6||2" \
  "new24-window5m=$NEW|$J24|--window 5m|3"
echo "journal runs done at $(( $(date +%s) - T0 ))s"
if [ $(date +%s) -lt $((DEADLINE - 140)) ]; then
  (cd bench && timeout $((DEADLINE - $(date +%s) - 100)) env PYTHONPATH=$NEW:. python3 -c '
import time; from analyze_bench import recording
t = time.time(); p = recording(6, True); print(p, round(time.time() - t, 1), "s", flush=True)') && \
  taskset -c 2,3 python3 bench/real/analyze_runs.py $OUT/analyze-strict.json $((DEADLINE - 20)) \
    "new6strict=$NEW|$D/large-6h.strict.om||5" "new6strict-pure=$NEW|$D/large-6h.strict.om||3|$PURE" \
    "old6strict=$OLD|$D/large-6h.strict.om||3"
fi
echo "done in $(( $(date +%s) - T0 ))s"
