#!/bin/bash
# device call 2 (carry .bundle2 = site.part2 + kvexp/, the kvoffload snapshot): unpack the vLLM
# bundle, start orch.py detached (setsid), follow it until DONE or T0+LIMIT, return what is packed.
# usage (repo root on the device): bash bench/real/call2.sh [LIMIT_S=570] [BUDGET_S=545]
T0=$(date +%s); LIMIT=${1:-570}; BUDGET=${2:-545}; R=/tmp/res
P1=/tmp/b1/site.part1; [ -f $P1 ] || P1=.bundle1/site.part1
if [ ! -f $P1 ]; then echo "COLD MACHINE: part1 missing"; nvidia-smi -L; exit 3; fi
[ -f .bundle2/site.part2 ] && [ -d .bundle2/kvexp/kvoffload ] || { echo "carry .bundle2"; exit 3; }
if [ -f $R/orch.pid ] && kill -0 "$(cat $R/orch.pid)" 2>/dev/null; then echo "orch already running"; exit 5; fi
SITE=${SITE:-/tmp/site}  # SITE + SKIP_UNPACK=1: local dry run only (with FAKE=1)
if [ -z "$SKIP_UNPACK" ]; then
rm -rf $SITE; mkdir -p $SITE
cat $P1 .bundle2/site.part2 | xz -d -T0 | tar -x -C $SITE || { echo UNPACK_FAIL; exit 4; }
[ -f $SITE/vllm/_C_stable_libtorch.abi3.so ] || { echo "NO _C"; exit 4; }
echo "unpacked in $(( $(date +%s) - T0 ))s"
python3 -m compileall -q -j 16 $SITE > /dev/null 2>&1
fi
rm -rf /tmp/b3 /tmp/kvexp; cp -r bench/real /tmp/b3; rm -rf /tmp/b3/results; cp -r .bundle2/kvexp /tmp/kvexp
rm -rf $R /tmp/vcache; mkdir -p $R
export PYTHONPATH=$SITE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONHASHSEED=0
export DEADLINE=$((T0 + BUDGET)) RESDIR=$R KVO_PYTHONPATH=$SITE:/tmp/kvexp KVO_COMMIT=$(cat /tmp/kvexp/COMMIT)
# kvoffload from the snapshot, with only the image's packages + the bundle's pyzmq/msgspec
PYTHONPATH=$KVO_PYTHONPATH python3 -c 'import sys, kvoffload.cli, kvoffload.recording.loop, kvoffload.sidecar.service, kvoffload.sidecar.http, kvoffload.cli.webconfig, kvoffload.analysis.analyze, kvoffload.kvevents.replay; print("kvoffload imports ok; grafanalib imported:", "grafanalib" in sys.modules)' || echo "KVOFFLOAD IMPORT FAILED"
echo "prep done in $(( $(date +%s) - T0 ))s; deadline in $BUDGET s; kvoffload $KVO_COMMIT"
( cd /tmp && setsid nohup python3 /tmp/b3/orch.py > $R/orch.out 2>&1 < /dev/null & echo $! > $R/orch.pid )
CD=$R/${CONFIG:-qwen3-8b-long-cudagraph-kv5g}/common; mkdir -p $CD
{ date -u; nvidia-smi; python3 -V; which python3; python3 -c 'import torch,numpy,zmq,msgspec,requests,aiohttp,click,prometheus_client,yaml;print("torch",torch.__version__,"cuda",torch.version.cuda,"numpy",numpy.__version__,"pyzmq",zmq.__version__,"msgspec",msgspec.__version__,"requests",requests.__version__,"aiohttp",aiohttp.__version__,"click",click.__version__,"prometheus_client",prometheus_client.__version__ if hasattr(prometheus_client,"__version__") else "?")'; ls $SITE | grep -i -E '^(vllm|pyzmq|msgspec)-.*dist-info'; uname -a; nproc; free -g; df -h /tmp; env | grep -E '^(VLLM|PYTHON|NCCL|TORCH|CUDA|HF_|TRANSFORMERS|DO_NOT|DEADLINE|RESDIR|KVO)' | sort; } > $CD/env.txt 2>&1
python3 -m pip list --format=freeze > $CD/pip-freeze.txt 2>&1
while [ $(date +%s) -lt $((T0 + LIMIT)) ] && [ ! -e $R/DONE ]; do sleep 3; done
grep -v -E '^ |^Mem:|^Swap:|^$|^ *total' $CD/orch.log | cut -c1-300 | tail -60; tail -5 $R/orch.out
ls -la $R/out
cd $R && { ls out/*.tar.xz >/dev/null 2>&1 && tar -cf - out | split -b 15M - $OUT/packed.tar.part-; }
if [ ! -e $R/DONE ]; then XZ_OPT="-3 -T8" tar --warning=no-file-changed --exclude=./out --exclude='*.kvev' -cJf $OUT/partial.tar.xz -C $R . ; fi
ls -la $OUT; echo "call2 total $(( $(date +%s) - T0 ))s"
