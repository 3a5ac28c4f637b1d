#!/bin/bash
# device call 1 (carry .bundle1): park the first half of the vLLM bundle in /tmp/b1 (cheap, short).
# Call 2 must follow within ~30 s, or the machine is given back and /tmp/b1 is gone.
mkdir -p /tmp/b1 && cp .bundle1/site.part1 /tmp/b1/ && sha256sum /tmp/b1/site.part1
nvidia-smi -L; python3 -V; nproc; free -g | head -2; df -h /tmp | tail -1
