#!/usr/bin/env python3
"""The server's overhead per job and a warm request's time to its first denoising step (issue 26).

Starts `wan serve` (random weights at the real size, models preloaded for --size/--frames), sends one
warm-up job, then --jobs timed jobs one after another, each through the HTTP API as a client would:
POST /v1/videos, the events stream (server-sent events) until the job ends, GET .../content.
Per job, from the video object's `timings` extension (seconds):
  stages_s     the pipeline's own work (text encode, warm-up, denoise, decode: what any run does)
  write_s      the video file written after the decode
  first_step_s request arrival -> its first denoising step (parsing, planning, queue, text encode)
and from the client's clock:
  client_s     POST sent -> content downloaded
  overhead_s   client_s - stages_s - write_s: HTTP, checking and planning, the queue, the cache lookups,
               the events and the download: what the server adds to the work itself
Writes JSON (--json) with every job and the medians. Usage:
  bench/serve_overhead.py --wan build/wan --size 832x480 --frames 81 --steps 4 --jobs 3 --json out.json
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def gpu_names():
    """The GPUs' names as nvidia-smi gives them ([] without it): the device every figure was measured on."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        return [l.strip() for l in out.stdout.splitlines() if l.strip()] if out.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        return []


def request(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def wait_done(port, vid):
    """Reads the events stream until the job ends; returns the last video object."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("GET", f"/v1/videos/{vid}/events")
    r = c.getresponse()
    last = None
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            last = json.loads(line[5:])
            if last["status"] in ("completed", "failed"):
                break
    c.close()
    return last


def one_job(port, body):
    t0 = time.perf_counter()
    st, raw = request(port, "POST", "/v1/videos", json.dumps(body), {"Content-Type": "application/json"})
    posted = time.perf_counter()
    assert st == 200, raw
    vid = json.loads(raw)["id"]
    obj = wait_done(port, vid)
    assert obj and obj["status"] == "completed", obj
    st, video = request(port, "GET", f"/v1/videos/{vid}/content")
    t1 = time.perf_counter()
    assert st == 200 and len(video) > 1000, st
    obj = json.loads(request(port, "GET", f"/v1/videos/{vid}")[1])
    t = obj["timings"]
    client = t1 - t0
    return {"id": vid, "client_s": client, "post_s": posted - t0, "video_bytes": len(video), **t,
            "overhead_s": client - t["stages_s"] - t["write_s"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wan", default="build/wan")
    ap.add_argument("--task", default="t2v-A14B")
    ap.add_argument("--size", default="832x480")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    ap.add_argument("serve_args", nargs="*", help="more `wan serve` options (after --)")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="wan_serve_bench_")
    cmd = [a.wan, "serve", "--weights", "random", "--task", a.task, "--device", a.device, "--size", a.size,
           "--frames", str(a.frames), "--port", "0", "--output-dir", out, *a.serve_args]
    t_start = time.perf_counter()
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    try:
        line = srv.stdout.readline()
        assert "listening on http://" in line, line
        port = int(line.split("listening on http://")[1].split()[0].rsplit(":", 1)[1])
        ready_s = time.perf_counter() - t_start
        body = {"prompt": "a fox runs through the snow", "steps": a.steps, "size": a.size, "num_frames": a.frames,
                "seed": 1}
        warm = one_job(port, body)
        jobs = [one_job(port, dict(body, seed=2 + i)) for i in range(a.jobs)]
        metrics = request(port, "GET", "/metrics")[1].decode()
    finally:
        srv.terminate()
        srv.wait(timeout=120)
        shutil.rmtree(out, ignore_errors=True)
    med = {k: statistics.median(j[k] for j in jobs) for k in ("client_s", "stages_s", "write_s", "first_step_s",
                                                             "queue_s", "run_s", "overhead_s", "post_s")}
    med["overhead_fraction"] = med["overhead_s"] / (med["stages_s"] + med["write_s"])
    built = int(float(metrics.split("\nwan_models_built_total ")[1].split()[0]))
    reused = int(float(metrics.split("\nwan_models_reused_total ")[1].split()[0]))
    res = {"what": "wan serve overhead per job and warm request -> first step", "task": a.task, "size": a.size,
           "frames": a.frames, "steps": a.steps, "server_ready_s": ready_s, "warm_up_job": warm, "jobs": jobs,
           "median": med, "models_built": built, "models_reused": reused,
           "commit": os.environ.get("WAN_COMMIT", ""), "date": time.strftime("%Y-%m-%d"), "device": gpu_names()}
    print(json.dumps(med, indent=1))
    gauges = [l for l in metrics.splitlines() if l.startswith("wan_device_memory_used_bytes")]
    res["device_memory_used"] = gauges
    print(f"server ready {ready_s:.1f} s; models built {built}, reused {reused}; " + "; ".join(gauges))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
