#!/bin/bash
# device call (carry .bundle2; part 1 parked by call1.sh, or the bundle already unpacked on this
# warm machine): bench/real/host_memory_sidecar.py, its results in $OUT.
# usage (repo root on the device): bash bench/real/call_memory_sidecar.sh [BUDGET_S=540]
T0=$(date +%s); BUDGET=${1:-540}; SITE=/tmp/site
if [ ! -f $SITE/vllm/_C_stable_libtorch.abi3.so ]; then
  P1=/tmp/b1/site.part1; [ -f $P1 ] || { echo "COLD MACHINE: part1 missing"; exit 3; }
  rm -rf $SITE; mkdir -p $SITE; cat $P1 .bundle2/site.part2 | xz -d -T0 | tar -x -C $SITE || exit 4
  echo "unpacked in $(( $(date +%s) - T0 ))s"
fi
rm -rf /tmp/kvexp; cp -r .bundle2/kvexp /tmp/kvexp; cat /tmp/kvexp/COMMIT
cat /proc/self/cgroup; ls /sys/fs/cgroup | head -30; mount | grep -E 'cgroup|shm'
export PYTHONPATH=$SITE KVO_PYTHONPATH=$SITE:/tmp/kvexp DEADLINE=$((T0 + BUDGET))
PYTHONPATH=$KVO_PYTHONPATH python3 -c "import kvoffload.cli, kvoffload.sidecar.service, kvoffload.cli.webconfig, kvoffload.ingest.hostmemory; print(\"kvoffload serve imports ok\")" || exit 4
cd bench/real && timeout $((BUDGET + 20)) python3 host_memory_sidecar.py
echo "call total $(( $(date +%s) - T0 ))s"
cd $OUT && tar -cJf /tmp/all.tar.xz . && rm -rf $OUT/* && mv /tmp/all.tar.xz $OUT/
