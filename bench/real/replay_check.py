#!/usr/bin/env python3
"""Device-side check of KV-event replay against a real vLLM 0.26.0: the sidecar's recorder
starts LATE (after vLLM has published for a while) and must still hold every message from
sequence 0, recovered through vLLM's replay endpoint (4-frame replies).

Runs one Qwen3-0.6B server (dummy weights, eager, 2 GiB CPU tier, KV events with a replay
endpoint), sends 40 requests, then starts `kvoffload record --kv-events ... --kv-events-replay
...`, sends 20 more, stops the recorder with SIGTERM and checks the event file: sequence numbers
0..last with no hole, how many came by replay, and what `kvoffload analyze` says of the history.
Environment: PYTHONPATH has vLLM (the bundle); KVO_PYTHONPATH has kvoffload; OUT a folder.
usage: python3 bench/real/replay_check.py
"""

import json
import os
import signal
import subprocess
import sys
import time

from one_server import OneServer, log

OUT = os.environ.get("OUT", "/tmp/replay_check")
WORK = "/tmp/rc"
PORT, ZPORT, RPORT = 8131, 5631, 5731


def main() -> int:
    server = OneServer(WORK, OUT, PORT, ZPORT, RPORT)
    summary: dict[str, object] = {"cmd": " ".join(server.cmd)}
    try:
        ready = server.start()
        if ready is None:
            log("vLLM never became healthy")
            return 3
        summary["ready_s"] = ready
        log("ready in", ready, "s")
        server.send(0, 40)
        log("40 requests before the recorder starts")
        kvo_env = dict(os.environ, PYTHONPATH=os.environ["KVO_PYTHONPATH"])
        om = f"{WORK}/late.om"
        rec = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvoffload",
                "record",
                "--target",
                server.metrics_url,
                "--interval",
                "1s",
                "--duration",
                "10m",
                "-o",
                om,
                "--kv-events",
                f"tcp://127.0.0.1:{ZPORT}",
                "--kv-events-replay",
                f"tcp://127.0.0.1:{RPORT}",
            ],
            env=kvo_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd="/tmp",
        )
        time.sleep(3)
        server.send(40, 60)
        time.sleep(3)
        rec.send_signal(signal.SIGTERM)
        out, _ = rec.communicate(timeout=30)
        summary["record_output"] = out.decode()[-600:]
        sys.path.insert(0, os.environ["KVO_PYTHONPATH"].split(":")[-1])
        from kvoffload.kvevents.eventfile import read_event_file

        seqs = [m.seq for m in read_event_file(om + ".kvev")]
        summary["messages"] = len(seqs)
        summary["first_seq"] = seqs[0] if seqs else None
        summary["last_seq"] = seqs[-1] if seqs else None
        summary["complete_from_0"] = seqs == list(range(len(seqs)))
        an = subprocess.run(
            [sys.executable, "-m", "kvoffload", "analyze", om, "--events", om + ".kvev", "--json"],
            env=kvo_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if an.returncode == 0:
            group = next(g for g in json.loads(an.stdout)["groups"] if g["labels"]["model_name"])
            ev = group.get("kv_events", {})
            summary["analyze"] = {
                k: ev.get(k)
                for k in ("messages", "lost_messages", "unseen_before_start", "history_from_seq")
            }
            summary["warnings"] = group["recommendation"]["warnings"]
        else:
            summary["analyze_error"] = an.stderr[-600:]
        for name in ("late.om", "late.om.kvev"):
            subprocess.run(["xz", "-kf9", f"{WORK}/{name}"], check=False)
            if os.path.exists(f"{WORK}/{name}.xz"):
                subprocess.run(["cp", f"{WORK}/{name}.xz", OUT], check=False)
    finally:
        server.stop()
        with open(f"{OUT}/replay_check.json", "w") as fh:
            json.dump(summary, fh, indent=1)
        print(json.dumps(summary, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
