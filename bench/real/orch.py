#!/usr/bin/env python3
"""Device-side orchestrator: real vLLM 0.26.0 servers, with and without native CPU KV offloading,
each with the kvoffload sidecar (`kvoffload serve`) and a recording (`kvoffload record`) next to it.

Adapted from /work/shared/real-vllm/scripts/orch.py (which made ../reference/vllm-0.26-h200-ttft).
Runs detached (setsid) so that it outlives one device call. One configuration (CFG below): every
server of it is started together on the one GPU; the workload is then driven to ONE server at a
time (the others sit idle), the same token ids to each, so the TTFTs compare directly.

Per server, in order:
  1. 2 warm-up requests (random ids, not measured; before any kvoffload process starts);
  2. `kvoffload record` (1 s scrapes + KV events -> rec/<srv>.om, rec/<srv>.om.kvev) and
     `kvoffload serve` (the live sidecar, 1 s scrapes, 300 s window, KV events) are started;
     3 s later /metrics is saved (snapshots/<srv>/before.prom);
  3. the measured requests (workload `long`, `conc` clients, `max_tokens` output tokens);
  4. 3 s after the last response: the sidecar's /api/v1/status -> sidecar/<srv>.sidecar.json,
     its /metrics -> sidecar/<srv>.sidecar.prom, vLLM's /metrics -> snapshots/<srv>/final.prom;
  5. SIGINT to the recorder and the sidecar (the recorder then writes `# EOF` and exits).

Environment: DEADLINE (absolute unix time: everything packed by then), RESDIR (default /tmp/res),
KVO_PYTHONPATH (PYTHONPATH for the kvoffload processes), KVO_PY (python for them, default this
one; shlex-split), KVO_COMMIT (recorded only). Local dry run: FAKE=1 (fake_server.py instead of
vLLM), NREQ_MAX (fewer requests), ONLY (comma-separated server names), KV_TOPIC (default "kv").

Layout: $RESDIR/<cfg>/{commands.txt,requests.csv,servers.json,logs/,rec/,sidecar/,snapshots/}
        $RESDIR/<cfg>/common/{orch.log,env...}; packed to $RESDIR/out/<cfg>.tar.xz; $RESDIR/DONE.
"""

import contextlib
import csv
import gzip
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.environ.get("RESDIR", "/tmp/res")
DEADLINE = float(os.environ["DEADLINE"])  # absolute unix time: everything packed by then
PY = sys.executable
GIB = 1 << 30
FAKE = os.environ.get("FAKE") == "1"
ONLY = os.environ.get("ONLY")
KV_TOPIC = os.environ.get("KV_TOPIC", "kv")
KVO_PY = shlex.split(os.environ.get("KVO_PY", "")) or [PY]
KVO_PYTHONPATH = os.environ.get("KVO_PYTHONPATH", "")

# ------------------------------------------------------------------ the configuration
# CONFIG (environment) picks one: (common settings, [(name, CPU GiB, optional)]).
CONFIGS = {
    "qwen3-8b-long-cudagraph-kv5g": (
        dict(
            model="qwen3-8b",
            kv_gib=5.0,
            maxlen=8192,
            util=0.1,
            eager=False,
            wl="long",
            nreq=200,
            max_tokens=32,
            conc=4,
            cap_s=110,
            est_s=75,
        ),
        [("nooffload", None, False), ("cpu16", 16, False), ("cpu8", 8, True)],
    ),
    # Qwen3-0.6B with CUDA graphs on the RAG workload of the shared sets (which ran it eager):
    # does a small model pay the connector's cost without eager mode's launch overhead?
    "qwen3-0.6b-rag-cudagraph-kv1.5g": (
        dict(
            model="qwen3-0.6b",
            kv_gib=1.5,
            maxlen=2048,
            util=0.1,
            eager=False,
            wl="rag",
            nreq=400,
            max_tokens=64,
            conc=8,
            cap_s=110,
            est_s=40,
        ),
        [("nooffload", None, False), ("cpu4", 4, False), ("cpu2", 2, True)],
    ),
    # Round 3's longer runs (>= 90 s and >= 400 requests per server; the workload's order is
    # cycled with fresh suffixes, the same on every server): shapes the shared sets lack.
    # Qwen3-4B, RAG, 16 clients, 3 GiB GPU KV (~20k tokens: 16 requests in flight fill most of
    # it, so the GPU prefix cache evicts; 8 GiB of CPU holds all 40 documents).
    "qwen3-4b-rag-c16-kv3g": (
        dict(
            model="qwen3-4b",
            kv_gib=3.0,
            maxlen=2048,
            util=0.1,
            eager=False,
            wl="rag",
            nreq=100000,
            max_tokens=64,
            conc=16,
            cap_s=95,
            est_s=95,
        ),
        [("nooffload", None, False), ("cpu8", 8, False)],
    ),
    # Qwen3-14B shape, long documents (6,144 ids), 4 clients, 6 GiB GPU KV (~38k tokens: ~6
    # documents), 16 GiB of CPU (~16 of the 30 documents, most of the Zipf mass).
    "qwen3-14b-long-c4-kv6g": (
        dict(
            model="qwen3-14b",
            kv_gib=6.0,
            maxlen=8192,
            util=0.25,
            eager=False,
            wl="long",
            nreq=100000,
            max_tokens=32,
            conc=4,
            cap_s=95,
            est_s=95,
        ),
        [("nooffload", None, False), ("cpu16", 16, False)],
    ),
    # Issue #28 item 5: vLLM 0.26.0's two CPU-tier knobs on the same requests. On the earlier
    # 4B run's events a 4 GiB tier is where the policy matters (what-if: LRU 0.31, ARC 0.35);
    # store_threshold 2 is vLLM's smallest that changes anything (cpu/spec.py: "if
    # store_threshold >= 2"). Extras go to kv_connector_extra_config.
    "qwen3-4b-rag-c16-kv3g-knobs": (
        dict(
            model="qwen3-4b",
            kv_gib=3.0,
            maxlen=2048,
            util=0.1,
            eager=False,
            wl="rag",
            nreq=100000,
            max_tokens=64,
            conc=16,
            cap_s=92,
            est_s=92,
        ),
        [
            ("cpu4", 4, False),
            ("cpu4-arc", 4, False, {"eviction_policy": "arc"}),
            ("cpu4-thr2", 4, False, {"store_threshold": 2}),
            ("nooffload", None, True),  # the TTFT baseline, if the call's time allows
        ],
    ),
    # The same, second call: the TTFT baseline the first call had no time for, and a second run
    # of LRU and of store_threshold 2 for their run-to-run noise.
    "qwen3-4b-rag-c16-kv3g-knobs-2": (
        None,
        [
            ("nooffload", None, False),
            ("cpu4-thr2", 4, False, {"store_threshold": 2}),
            ("cpu4", 4, False),
            ("cpu4-arc", 4, True, {"eviction_policy": "arc"}),
        ],
    ),
}
# Session 36 (the earlier runs' results were lost with their machine): each call has its own
# no-offload baseline, as TTFT moved by ~30 ms between calls on the same configuration.
CONFIGS["qwen3-4b-rag-c16-kv3g-knobs-3"] = (
    CONFIGS["qwen3-4b-rag-c16-kv3g-knobs"][0],
    [
        ("nooffload", None, False),
        ("cpu4", 4, False),
        ("cpu4-arc", 4, False, {"eviction_policy": "arc"}),
        ("cpu4-thr2", 4, True, {"store_threshold": 2}),
    ],
)
CONFIGS["qwen3-4b-rag-c16-kv3g-knobs-4"] = (
    CONFIGS["qwen3-4b-rag-c16-kv3g-knobs"][0],
    [
        ("cpu4-thr2", 4, False, {"store_threshold": 2}),
        ("nooffload", None, False),
        ("cpu4-arc", 4, False, {"eviction_policy": "arc"}),
        ("cpu4", 4, True),
    ],
)
# Issue #28 item 1: vLLM 0.26.0's own tiering series, from a real server (a fixture capture, not a
# TTFT run): TieringOffloadingSpec with a file-system tier under the 1 GiB CPU tier, 45 s of RAG.
CONFIGS["qwen3-0.6b-rag-tiering-fs"] = (
    dict(CONFIGS["qwen3-0.6b-rag-cudagraph-kv1.5g"][0], eager=True, cap_s=45, est_s=45, nreq=3000),
    [
        (
            "cpu1-fs",
            1,
            False,
            {
                "spec_name": "TieringOffloadingSpec",
                "secondary_tiers": [{"type": "fs", "root_dir": "/tmp/kvoffload-fs-tier"}],
            },
        )
    ],
)


# Issue #28 item 5 for tiers: the same requests without offloading, with a 1 GiB CPU tier, and
# with a file-system tier under it (write-through, unbounded: tiering/manager.py cascades every
# stored chunk to all secondary tiers; ~15 GB a 95 s run). The tier's own KV events are on
# (fs/manager.py `enable_kv_events`), so the recording shows what it stored. Each fs server has
# its own root_dir, so no run finds another's files.
def _fs_tier(name):
    return {
        "spec_name": "TieringOffloadingSpec",
        "secondary_tiers": [
            {"type": "fs", "root_dir": f"/tmp/kvoffload-fs-{name}", "enable_kv_events": True}
        ],
    }


_TIER_AB = dict(
    CONFIGS["qwen3-0.6b-rag-cudagraph-kv1.5g"][0], eager=True, cap_s=95, est_s=95, nreq=100000
)
CONFIGS["qwen3-0.6b-rag-tiering-ab"] = (
    _TIER_AB,
    [("nooffload", None, False), ("cpu1", 1, False), ("cpu1-fs", 1, False, _fs_tier("cpu1-fs"))],
)
# The second call: the reverse order, for the run-to-run noise of each server's mean TTFT.
CONFIGS["qwen3-0.6b-rag-tiering-ab-2"] = (
    _TIER_AB,
    [("cpu1-fs", 1, False, _fs_tier("cpu1-fs")), ("cpu1", 1, False), ("nooffload", None, False)],
)
# Where the device time left cannot hold three servers: the tiered one first (its predictions
# need only its own events), then no offloading for the TTFT difference.
CONFIGS["qwen3-0.6b-rag-tiering-ab-short"] = (
    _TIER_AB,
    [("cpu1-fs", 1, False, _fs_tier("cpu1-fs")), ("nooffload", None, False)],
)
CONFIGS["qwen3-4b-rag-c16-kv3g-knobs-2"] = (
    CONFIGS["qwen3-4b-rag-c16-kv3g-knobs"][0],
    CONFIGS["qwen3-4b-rag-c16-kv3g-knobs-2"][1],
)
CFG = os.environ.get("CONFIG", "qwen3-8b-long-cudagraph-kv5g")
SERVED = {m: f"{m}-dummy" for m in ("qwen3-8b", "qwen3-0.6b", "qwen3-4b", "qwen3-14b")}
COMMON, _PLAN = CONFIGS[CFG]
SERVERS = {}


def mk(idx, name, cpu_gib, optional=False, extra=None):
    s = dict(
        COMMON,
        idx=idx,
        cfg=CFG,
        name=name,
        cpu_gib=cpu_gib,
        optional=optional,
        extra=extra or {},
        kv_bytes=int(COMMON["kv_gib"] * GIB),
        port=8100 + idx,
        zport=5600 + idx,
        rport=5700 + idx,
        sideport=9400 + idx,
    )
    SERVERS[name] = s


for _i, (_name, _gib, _optional, *_extra) in enumerate(_PLAN, start=1):
    # optional ones run last, only if time allows
    mk(_i, _name, _gib, optional=_optional, extra=_extra[0] if _extra else None)
ORDER = [row[0] for row in _PLAN]
if ONLY:
    ORDER = [n for n in ORDER if n in set(ONLY.split(","))]

CDIR = os.path.join(RES, CFG)
for _d in ("common", "logs", "rec", "sidecar", "snapshots"):
    os.makedirs(os.path.join(CDIR, _d), exist_ok=True)
os.makedirs(os.path.join(RES, "out"), exist_ok=True)
LOGF = open(os.path.join(CDIR, "common", "orch.log"), "a")  # noqa: SIM115

with gzip.open(os.path.join(HERE, f"wl_{COMMON['wl']}.json.gz"), "rt") as _f:
    WLS = {COMMON["wl"]: json.load(_f)}
if os.environ.get("NREQ_MAX"):  # local dry run only
    WLS[COMMON["wl"]]["order"] = WLS[COMMON["wl"]]["order"][: int(os.environ["NREQ_MAX"])]

INFO = {
    n: dict(
        cfg=s["cfg"],
        cpu_gib=s["cpu_gib"],
        extra=s["extra"],
        kv_gib=s["kv_gib"],
        port=s["port"],
        zport=s["zport"],
        rport=s["rport"],
        sideport=s["sideport"],
        conc=s["conc"],
        max_tokens=s["max_tokens"],
        maxlen=s["maxlen"],
        workload=s["wl"],
    )
    for n, s in SERVERS.items()
}
CMDS = {}


def now():
    return time.time()


def left():
    return DEADLINE - now()


def log(*a):
    line = f"[{time.strftime('%H:%M:%S')} {now():.3f} left={left():.0f}s] " + " ".join(
        str(x) for x in a
    )
    print(line, flush=True)
    LOGF.write(line + "\n")
    LOGF.flush()


def save(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)


def shq(c):
    return shlex.quote(c)


def note_cmd(tag, cmd, env_note):
    CMDS[tag] = cmd
    with open(os.path.join(CDIR, "commands.txt"), "a") as f:
        f.write(
            f"# {tag} launched t={now():.3f}  env: {env_note}\n"
            + " ".join(shq(c) for c in cmd)
            + "\n\n"
        )


def default_sigint():
    # A job started with `&` by a non-interactive shell has SIGINT ignored, and Python then keeps
    # it ignored: `kvoffload record` would never see our SIGINT (and SIGTERM leaves its recording
    # without `# EOF`). Give every child the default disposition back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ------------------------------------------------------------------ vLLM servers
def evcfg(s):
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{s['zport']}",
            "replay_endpoint": f"tcp://*:{s['rport']}",
            "topic": KV_TOPIC,
        }
    )


def server_cmd(s):
    if FAKE:  # local dry run only
        return [
            PY,
            os.path.join(HERE, "fake_server.py"),
            str(s["port"]),
            str(s["zport"]),
            str(s["rport"]),
        ]
    cmd = [
        PY,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        os.path.join(HERE, "models", s["model"]),
        "--served-model-name",
        SERVED[s["model"]],
        "--host",
        "127.0.0.1",
        "--port",
        str(s["port"]),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--max-model-len",
        str(s["maxlen"]),
        "--kv-cache-memory-bytes",
        str(s["kv_bytes"]),
        "--gpu-memory-utilization",
        str(s["util"]),
        "--enable-prompt-tokens-details",
        "--seed",
        "0",
        "--kv-events-config",
        evcfg(s),
    ]
    if s["cpu_gib"]:
        cmd += ["--kv-offloading-size", str(s["cpu_gib"]), "--kv-offloading-backend", "native"]
    if s["extra"]:
        # vLLM 0.26.0 (config/vllm.py, _post_init_kv_transfer_config) sets the connector and
        # cpu_bytes_to_use from --kv-offloading-size into this config's extra dict, keeping ours.
        transfer = {"kv_connector_extra_config": s["extra"]}
        cmd += ["--kv-transfer-config", json.dumps(transfer)]
    if s["eager"]:
        cmd += ["--enforce-eager"]
    return cmd


def spawn_server(s):
    cmd = server_cmd(s)
    env = os.environ.copy()
    env["VLLM_CACHE_ROOT"] = f"/tmp/vcache/{s['name']}"  # concurrent servers: own compile cache
    for k in ("DEADLINE", "KVO_PYTHONPATH", "KVO_PY"):
        env.pop(k, None)
    note_cmd(s["name"], cmd, f"VLLM_CACHE_ROOT={env['VLLM_CACHE_ROOT']} (+ common env, README)")
    logf = open(os.path.join(CDIR, "logs", f"{s['name']}.log"), "w")  # noqa: SIM115
    p = subprocess.Popen(
        cmd,
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        cwd="/tmp",
        preexec_fn=default_sigint,
    )
    log(f"spawned {s['name']} pid={p.pid}")
    return p


def killpg(p, sig):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


# ------------------------------------------------------------------ kvoffload processes
def kvo_env():
    env = os.environ.copy()
    for k in ("DEADLINE", "KVO_PY"):
        env.pop(k, None)
    env["PYTHONPATH"] = env.pop("KVO_PYTHONPATH", KVO_PYTHONPATH)
    return env


def kvo_cmds(s):
    metrics = f"http://127.0.0.1:{s['port']}/metrics"
    ev = [
        "--kv-events",
        f"tcp://127.0.0.1:{s['zport']}",
        "--kv-events-replay",
        f"tcp://127.0.0.1:{s['rport']}",
    ]
    rec = [
        *KVO_PY,
        "-m",
        "kvoffload",
        "record",
        "--target",
        metrics,
        "--interval",
        "1s",
        "--duration",
        "1200s",
        "-o",
        os.path.join(CDIR, "rec", f"{s['name']}.om"),
        *ev,
    ]
    # `record` has no --kv-events-topic: it subscribes to every topic (vLLM publishes on one).
    side = [
        *KVO_PY,
        "-m",
        "kvoffload",
        "serve",
        "--target",
        metrics,
        "--web.listen-address",
        f"127.0.0.1:{s['sideport']}",
        "--interval",
        "1s",
        "--window",
        "300s",
        *ev,
    ]
    if KV_TOPIC:
        side += ["--kv-events-topic", KV_TOPIC]
    side += ["--threshold", "min_window_seconds=10"]
    return rec, side


def start_kvo(s):
    rec, side = kvo_cmds(s)
    env = kvo_env()
    procs = {}
    for tag, cmd in (("record", rec), ("sidecar", side)):
        note_cmd(f"{s['name']}.{tag}", cmd, f"PYTHONPATH={env['PYTHONPATH']}")
        logf = open(  # noqa: SIM115
            os.path.join(CDIR, "logs", f"{s['name']}.{tag}.log"), "w"
        )
        procs[tag] = subprocess.Popen(
            cmd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd="/tmp",
            preexec_fn=default_sigint,
        )
        log(f"{s['name']}: kvoffload {tag} pid={procs[tag].pid}")
    # wait for the sidecar to answer (and the recorder to be alive)
    t0 = now()
    ok = False
    while now() < t0 + 30:
        if procs["record"].poll() is not None or procs["sidecar"].poll() is not None:
            break
        try:
            if requests.get(f"http://127.0.0.1:{s['sideport']}/healthz", timeout=1).ok:
                ok = True
                break
        except requests.RequestException:
            pass
        time.sleep(0.3)
    INFO[s["name"]]["kvo_start_s"] = round(now() - t0, 2)
    INFO[s["name"]]["kvo_ok"] = ok and all(p.poll() is None for p in procs.values())
    if not INFO[s["name"]]["kvo_ok"]:
        log(
            f"{s['name']}: kvoffload processes not up: record rc={procs['record'].poll()} "
            f"sidecar rc={procs['sidecar'].poll()} (see logs/)"
        )
    return procs


def stop_kvo(s, procs):
    for p in procs.values():
        if p.poll() is None:
            os.kill(p.pid, signal.SIGINT)
    for tag, p in procs.items():
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{s['name']}: kvoffload {tag} did not exit on SIGINT; SIGKILL")
            killpg(p, signal.SIGKILL)
            p.wait(timeout=5)
        INFO[s["name"]][f"{tag}_rc"] = p.returncode
    try:
        with open(os.path.join(CDIR, "logs", f"{s['name']}.record.log")) as f:
            tail = f.read()[-600:]
    except OSError:
        tail = ""
    INFO[s["name"]]["record_log_tail"] = tail
    om = os.path.join(CDIR, "rec", f"{s['name']}.om")
    try:
        with open(om, "rb") as f:
            f.seek(max(0, os.path.getsize(om) - 64))
            INFO[s["name"]]["record_eof"] = f.read().rstrip().endswith(b"# EOF")
        INFO[s["name"]]["record_bytes"] = os.path.getsize(om)
        INFO[s["name"]]["kvev_bytes"] = os.path.getsize(om + ".kvev")
    except OSError as e:
        INFO[s["name"]]["record_error"] = repr(e)
    last = tail.strip().splitlines()[-2:] if tail.strip() else ""
    log(
        f"{s['name']}: record rc={procs['record'].returncode} "
        f"eof={INFO[s['name']].get('record_eof')} {last}; sidecar rc={procs['sidecar'].returncode}"
    )


# ------------------------------------------------------------------ client
def one_request(sess, s, prompt, max_tokens):
    payload = {
        "model": SERVED[s["model"]],
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    t_first = None
    usage = None
    nchunks = 0
    buf = b""
    with sess.post(
        f"http://127.0.0.1:{s['port']}/v1/completions", json=payload, stream=True, timeout=180
    ) as r:
        r.raise_for_status()
        for chunk in r.iter_content(chunk_size=None):
            if not chunk:
                continue
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                ev = json.loads(data)
                if ev.get("choices"):
                    nchunks += 1
                    if t_first is None:
                        t_first = time.perf_counter()
                if ev.get("usage"):
                    usage = ev["usage"]
    t_end = time.perf_counter()
    return t0, t_first, t_end, usage, nchunks


def get(url, timeout=10):
    r = requests.get(url, timeout=timeout)
    r.raise_for_status()
    return r.text


ROWS = []
RKEYS = [
    "cfg",
    "server",
    "phase",
    "req",
    "doc",
    "slot",
    "t_send",
    "t_first",
    "t_done",
    "ttft_ms",
    "e2e_ms",
    "n_chunks",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "error",
]


def do_req(sess, s, prompt, max_tokens, meta):
    t_send = now()
    err = None
    t0 = t_first = t_end = None
    usage = None
    nch = 0
    try:
        t0, t_first, t_end, usage, nch = one_request(sess, s, prompt, max_tokens)
    except Exception as e:
        err = repr(e)[:300]
    d = (usage or {}).get("prompt_tokens_details") or {}
    ttft = None if (t_first is None or t0 is None) else (t_first - t0) * 1e3
    e2e = None if (t_end is None or t0 is None) else (t_end - t0) * 1e3
    if err is None and t_first is None:
        err = "no token chunk received"
    row = dict(
        cfg=s["cfg"],
        server=s["name"],
        t_send=round(t_send, 4),
        t_first=None if ttft is None else round(t_send + ttft / 1e3, 4),
        t_done=round(now(), 4),
        ttft_ms=None if ttft is None else round(ttft, 3),
        e2e_ms=None if e2e is None else round(e2e, 3),
        n_chunks=nch,
        prompt_tokens=(usage or {}).get("prompt_tokens"),
        completion_tokens=(usage or {}).get("completion_tokens"),
        cached_tokens=d.get("cached_tokens"),
        error=err,
    )
    row.update(meta)
    return row


def write_requests():
    with open(os.path.join(CDIR, "requests.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RKEYS)
        w.writeheader()
        for r in ROWS:
            w.writerow(r)


def cycled(order, n):
    """The workload's order repeated to n requests (a time cap ends the run first)."""
    return [order[i % len(order)] for i in range(n)]


def suffix(suffixes, idx):
    """Request idx's unique suffix: the workload's own, then fresh ids seeded by idx (the same
    on every server, so the servers still get identical requests)."""
    if idx < len(suffixes):
        return suffixes[idx]
    rng = random.Random(20261202 * 1000003 + idx)
    return [rng.randrange(1000, 150000) for _ in range(len(suffixes[0]))]


def run_server(s):
    n = s["name"]
    wl = WLS[s["wl"]]
    docs, suffixes = wl["docs"], wl["suffixes"]
    order = cycled(wl["order"], s["nreq"])
    info = INFO[n]
    sess = requests.Session()
    # 1. warm-up: sequential, random prompts of the same length, not part of the measurement
    info["t_warmup0"] = now()
    for i, p in enumerate(wl["warmup"]):
        ROWS.append(do_req(sess, s, p, 4, dict(phase="warmup", req=i, doc=-1, slot=0)))
    # 2. recorder + sidecar, then the baseline snapshot
    procs = start_kvo(s)
    info["t_kvo_started"] = now()
    time.sleep(3.0)
    sdir = os.path.join(CDIR, "snapshots", n)
    save(os.path.join(sdir, "before.prom"), get(f"http://127.0.0.1:{s['port']}/metrics"))
    info["t_before"] = now()
    # 3. measured requests
    lock = threading.Lock()
    nxt = [0]
    t_wl0 = now()
    t_cut = min(t_wl0 + s["cap_s"], DEADLINE - 75)
    info["t_cut"] = t_cut
    out = []

    def worker(slot):
        ws = requests.Session()
        while True:
            with lock:
                idx = nxt[0]
                if idx >= len(order) or now() > t_cut:
                    return
                nxt[0] += 1
            doc = order[idx]
            r = do_req(
                ws,
                s,
                docs[doc] + suffix(suffixes, idx),
                s["max_tokens"],
                dict(phase="measure", req=idx, doc=doc, slot=slot),
            )
            with lock:
                out.append(r)

    ths = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(s["conc"])]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=max(5.0, t_cut + 200 - now()))
    t_wl1 = now()
    # 4. 3 s after the last response: the sidecar's view, then vLLM's final /metrics
    time.sleep(3.0)
    for path, fn in (("/api/v1/status", f"{n}.sidecar.json"), ("/metrics", f"{n}.sidecar.prom")):
        try:
            save(
                os.path.join(CDIR, "sidecar", fn),
                get(f"http://127.0.0.1:{s['sideport']}{path}", timeout=15),
            )
        except Exception as e:
            log(f"{n}: sidecar {path} failed {e!r}")
            info[f"sidecar_{fn}_error"] = repr(e)
    info["t_sidecar_saved"] = now()
    try:
        save(os.path.join(sdir, "final.prom"), get(f"http://127.0.0.1:{s['port']}/metrics"))
    except Exception as e:
        log(f"{n} final metrics failed {e!r}")
    # 5. stop recorder and sidecar
    stop_kvo(s, procs)
    info["t_kvo_stopped"] = now()
    out.sort(key=lambda r: r["req"])
    ROWS.extend(out)
    ok = sorted(r["ttft_ms"] for r in out if r["error"] is None)
    errs = sum(1 for r in out if r["error"])
    mean = sum(ok) / len(ok) if ok else float("nan")
    p50 = ok[len(ok) // 2] if ok else float("nan")
    p90 = ok[min(len(ok) - 1, int(0.9 * len(ok)))] if ok else float("nan")
    cached = sum(r["cached_tokens"] or 0 for r in out)
    ptok = sum(r["prompt_tokens"] or 0 for r in out)
    info.update(
        t_wl0=t_wl0,
        t_wl1=t_wl1,
        workload_s=round(t_wl1 - t_wl0, 2),
        sent=len(out),
        errors=errs,
        planned=len(order),
        ttft_mean_ms=round(mean, 2),
        ttft_p50_ms=round(p50, 2),
        ttft_p90_ms=round(p90, 2),
        cached=cached,
        prompt=ptok,
        truncated=len(out) < len(order),
    )
    log(
        f"{n}: {len(out)}/{len(order)} req in {t_wl1 - t_wl0:.1f}s err={errs} TTFT mean={mean:.1f}"
        f" p50={p50:.1f} p90={p90:.1f} ms cached/prompt={cached}/{ptok}"
    )
    write_requests()


# ------------------------------------------------------------------ orchestration
def sysinfo(tag):
    try:
        out = subprocess.run(
            "date -u; nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu "
            "--format=csv; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; "
            "free -m",
            shell=True,
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except Exception as e:
        out = repr(e)
    save(os.path.join(CDIR, "common", f"sys-{tag}.txt"), out)
    return out


def wait_ready(procs, names, timeout):
    pending = set(names)
    hs = requests.Session()
    t0 = now()
    t_last = None
    while pending and now() < t0 + timeout and left() > 120:
        if t_last is not None and now() - t0 > 200 and now() - t_last > 60:
            log(f"giving up on {sorted(pending)}: 60 s since the last server became ready")
            break
        for n in sorted(pending):
            p = procs[n]
            if p.poll() is not None:
                INFO[n]["rc_before_ready"] = p.returncode
                log(f"{n} exited rc={p.returncode} before ready")
                pending.discard(n)
                continue
            try:
                if (
                    hs.get(f"http://127.0.0.1:{SERVERS[n]['port']}/health", timeout=1).status_code
                    == 200
                ):
                    INFO[n]["ready"] = True
                    INFO[n]["t_ready"] = now()
                    INFO[n]["startup_s"] = round(now() - INFO[n]["t_launch"], 1)
                    t_last = now()
                    log(f"{n} ready in {INFO[n]['startup_s']}s")
                    pending.discard(n)
            except requests.RequestException:
                pass
        time.sleep(0.5)
    for n in pending:
        INFO[n]["ready_timeout"] = True
        log(f"{n} NOT ready (timeout)")


def stop_all(procs):
    for n, p in procs.items():
        INFO[n]["alive_at_stop"] = p.poll() is None
        killpg(p, signal.SIGINT)
    t_end = now() + 20
    for n, p in procs.items():
        try:
            p.wait(timeout=max(0.5, t_end - now()))
        except subprocess.TimeoutExpired:
            log(f"{n} did not exit on SIGINT; SIGKILL")
        killpg(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
        INFO[n]["rc"] = p.returncode


def write_info():
    for n in INFO:
        INFO[n]["command"] = CMDS.get(n)
        INFO[n]["record_command"] = CMDS.get(f"{n}.record")
        INFO[n]["sidecar_command"] = CMDS.get(f"{n}.sidecar")
    meta = dict(
        cfg=CFG,
        kvoffload_commit=os.environ.get("KVO_COMMIT"),
        order=ORDER,
        common=COMMON,
        fake=FAKE,
    )
    save(
        os.path.join(CDIR, "servers.json"),
        json.dumps(dict(meta=meta, servers=INFO), indent=1, default=str),
    )


def pack():
    t0 = now()
    env = dict(os.environ, XZ_OPT="-6 -T12")
    dst = os.path.join(RES, "out", f"{CFG}.tar.xz")
    r = subprocess.run(
        ["tar", "-cJf", dst, "-C", RES, CFG], env=env, capture_output=True, text=True
    )
    log(
        f"packed {CFG}.tar.xz rc={r.returncode} {os.path.getsize(dst)} B in {now() - t0:.1f}s "
        f"{r.stderr[-200:]}"
    )


def main():
    default_sigint()
    log(
        f"orchestrator start, pid={os.getpid()} deadline in {left():.0f}s, cfg={CFG} "
        f"order={ORDER} fake={FAKE}"
    )
    sysinfo("start")
    procs = {}
    try:
        for n in ORDER:
            INFO[n]["t_launch"] = now()
            procs[n] = spawn_server(SERVERS[n])
            time.sleep(1.0)
        wait_ready(procs, ORDER, 330)
        log(sysinfo("ready"))
        write_info()
        for n in ORDER:
            s = SERVERS[n]
            if not INFO[n].get("ready"):
                INFO[n]["skipped"] = "not ready"
                log(f"{n} not ready: skipped")
                continue
            # an optional server needs time for its whole workload; the others run while at
            # least ~35 s of requests fit before t_cut (= DEADLINE - 75)
            need = s["est_s"] + 75 if s["optional"] else 110
            if left() < need:
                INFO[n]["skipped"] = f"time: left {left():.0f}s < {need}s"
                log(f"skip {n}: time (left {left():.0f}s, need {need}s)")
                continue
            try:
                run_server(s)
            except Exception as e:
                import traceback

                log(f"{n} error {e!r} {traceback.format_exc()}")
                INFO[n]["error"] = repr(e)
            write_info()
        log(sysinfo("end"))
    except Exception as e:
        import traceback

        log("FATAL", repr(e), traceback.format_exc())
    finally:
        stop_all(procs)
        write_info()
        write_requests()
        sysinfo("stopped")
        pack()
        save(os.path.join(RES, "DONE"), f"{now()}\n")
        log("DONE")


if __name__ == "__main__":
    main()
