#!/bin/bash
# device call 2 for a one-server check (carry .bundle2; call1.sh first): unpack vLLM, then run
# bench/real/<NAME>_check.py (NAME: replay or restart) with kvoffload from the .bundle2/kvexp
# snapshot, results in $OUT.  usage: bash bench/real/check.sh restart
set -u
NAME=${1:?usage: check.sh replay|restart}
P1=/tmp/b1/site.part1; [ -f $P1 ] || { echo "COLD MACHINE: part1 missing"; exit 3; }
rm -rf /tmp/site; mkdir -p /tmp/site
cat $P1 .bundle2/site.part2 | xz -d -T0 | tar -x -C /tmp/site || { echo UNPACK_FAIL; exit 4; }
rm -rf /tmp/kvexp; cp -r .bundle2/kvexp /tmp/kvexp
export PYTHONPATH=/tmp/site KVO_PYTHONPATH=/tmp/site:/tmp/kvexp
echo "kvoffload $(cat /tmp/kvexp/COMMIT)"
timeout 520 python3 "bench/real/${NAME}_check.py"
