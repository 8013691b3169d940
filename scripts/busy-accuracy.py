#!/usr/bin/env python3
"""How well a router's busy flags follow its engines' real queues.

Starts, on loopback only, 7 gpusim instances that run at most --max-num-seqs
requests each, one warmroute router in front of them and an open-loop chat
load, then samples every 50 ms, for --seconds, the router's busy flag of each
backend (/status) and the engine's own vllm:num_requests_waiting (/metrics),
and prints how often the two agree, how often the router calls a backend busy
that has no queue, and how often a queue goes unseen, followed by the load
test's report. Everything it starts is stopped when it ends (bounded by
--seconds plus a minute). docs/performance.md and ring/DESIGN.md quote it.

Usage: scripts/busy-accuracy.py [--bin bin/warmroute] [--rate 45]
       [--max-num-seqs 3] [--seconds 30] [--base-port 31000]
"""
import argparse, json, re, signal, subprocess, sys, tempfile, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="bin/warmroute")
ap.add_argument("--rate", default="45")
ap.add_argument("--max-num-seqs", default="3")
ap.add_argument("--seconds", type=int, default=30)
ap.add_argument("--base-port", type=int, default=31000)
a = ap.parse_args()
if not 5 <= a.seconds <= 600:
    sys.exit("--seconds must be within [5, 600]")

base, n_inst = a.base_port, 7
router, admin = base + 100, base + 101
logs = tempfile.mkdtemp(prefix="busy-accuracy-")
procs = []


def start(args, log):
    p = subprocess.Popen(args, stdout=open(f"{logs}/{log}", "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def get(url):
    return urllib.request.urlopen(url, timeout=2).read()


try:
    start([a.bin, "gpusim", "--instances", str(n_inst), "--max-num-seqs", a.max_num_seqs,
           "--kv-blocks", "6000", "--listen", f"127.0.0.1:{base}"], "gpusim.log")
    time.sleep(1)
    backends = ",".join(f"http://127.0.0.1:{base + i}" for i in range(n_inst))
    start([a.bin, "serve", "--listen", f"127.0.0.1:{router}", "--admin-listen", f"127.0.0.1:{admin}",
           "--backends", backends, "--concurrency-threshold", "32"], "router.log")
    time.sleep(2)
    load = start([a.bin, "loadtest", "--target", f"http://127.0.0.1:{router}", "--workload", "chat",
                  "--rate", a.rate, "--duration", f"{a.seconds}s", "--warmup", "5s"], "loadtest.log")
    time.sleep(6)
    n = agree = false_busy = missed = queued = 0
    end = time.time() + a.seconds - 2
    while time.time() < end:
        t0 = time.time()
        st = json.loads(get(f"http://127.0.0.1:{admin}/status"))
        busy = {b["addr"].replace("http://", ""): b["busy"] for b in st["backends"]}
        for i in range(n_inst):
            m = get(f"http://127.0.0.1:{base + i}/metrics").decode()
            w = float(re.search(r"^vllm:num_requests_waiting(?:\{[^}]*\})? (\S+)", m, re.M).group(1))
            truth, est = w > 0, busy.get(f"127.0.0.1:{base + i}", False)
            n += 1
            queued += truth
            if truth == est:
                agree += 1
            elif est:
                false_busy += 1
            else:
                missed += 1
        time.sleep(max(0, 0.05 - (time.time() - t0)))
    print(f"{a.bin} rate={a.rate} max-num-seqs={a.max_num_seqs}: {n} samples; engine queueing in "
          f"{queued / n:.1%}; busy flag agrees in {agree / n:.1%}, busy without a queue in "
          f"{false_busy / n:.1%}, queue not seen in {missed / n:.1%}")
    load.wait(timeout=a.seconds + 60)
    print(open(f"{logs}/loadtest.log").read().split("draining")[-1].split("\n", 1)[-1])
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
