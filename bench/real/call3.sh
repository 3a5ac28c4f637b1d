#!/bin/bash
# device call 3 (only if call 2 returned before DONE): follow orch.py until DONE or T0+LIMIT,
# then return everything packed.  usage: bash bench/real/call3.sh [LIMIT_S=300]
T0=$(date +%s); LIMIT=${1:-300}; R=/tmp/res; CD=$R/${CONFIG:-qwen3-8b-long-cudagraph-kv5g}/common
[ -d $R ] || { echo "NO RESULTS: fresh machine"; exit 3; }
while [ $(date +%s) -lt $((T0 + LIMIT)) ] && [ ! -e $R/DONE ]; do sleep 3; done
grep -v -E '^ |^Mem:|^Swap:|^$|^ *total' $CD/orch.log | cut -c1-300 | tail -40
ls -la $R/out
cd $R && { ls out/*.tar.xz >/dev/null 2>&1 && tar -cf - out | split -b 15M - $OUT/packed.tar.part-; }
if [ ! -e $R/DONE ]; then XZ_OPT="-3 -T8" tar --warning=no-file-changed --exclude=./out --exclude='*.kvev' -cJf $OUT/partial.tar.xz -C $R . ; fi
ls -la $OUT; echo "call3 total $(( $(date +%s) - T0 ))s"
