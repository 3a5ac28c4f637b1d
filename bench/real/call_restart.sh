#!/bin/bash
# device call (carry .bundle2; part 1 parked by call1.sh, or the bundle already unpacked by a
# call2.sh on this warm machine): bench/real/vllm_restart_check.py, its results in $OUT.
# usage (repo root on the device): bash bench/real/call_restart.sh [BUDGET_S=560]
T0=$(date +%s); BUDGET=${1:-560}; SITE=/tmp/site
if [ ! -f $SITE/vllm/_C_stable_libtorch.abi3.so ]; then
  P1=/tmp/b1/site.part1; [ -f $P1 ] || { echo "COLD MACHINE: part1 missing"; exit 3; }
  rm -rf $SITE; mkdir -p $SITE; cat $P1 .bundle2/site.part2 | xz -d -T0 | tar -x -C $SITE || exit 4
fi
rm -rf /tmp/kvexp /tmp/vrc/state /tmp/vrc/rec.om*; cp -r .bundle2/kvexp /tmp/kvexp
export PYTHONPATH=$SITE KVO_PYTHONPATH=$SITE:/tmp/kvexp DEADLINE=$((T0 + BUDGET))
PYTHONPATH=$KVO_PYTHONPATH python3 -c 'import kvoffload.cli, kvoffload.sidecar.service, kvoffload.cli.webconfig; print("kvoffload serve imports ok")' || exit 4
cat /tmp/kvexp/COMMIT
cd bench/real && timeout $((BUDGET + 20)) python3 vllm_restart_check.py
echo "call total $(( $(date +%s) - T0 ))s"; ls -la $OUT
# few files come back from a call: everything in one archive
cd $OUT && tar -cJf /tmp/all.tar.xz . && rm -rf $OUT/* && mv /tmp/all.tar.xz $OUT/
