#!/bin/bash
# Local, around device calls: a call carries the working tree and one bundle half, 64 MiB in all,
# and bench/real/results (the runs' recordings) would push it over. `park` moves it out of the
# tree (it does not travel while absent), `back` returns it. usage: bash bench/real/park.sh park|back
P=${PARKED:-../.kvoffload-parked-results}
case "$1" in
  park) [ -e "$P" ] && { echo "$P exists: 'back' first"; exit 1; }; mv bench/real/results "$P" && echo "parked in $P";;
  back) [ -e bench/real/results ] && { echo "bench/real/results exists"; exit 1; }; mv "$P" bench/real/results && echo back;;
  *) echo "usage: $0 park|back"; exit 2;;
esac
