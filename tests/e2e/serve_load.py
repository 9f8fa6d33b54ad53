#!/usr/bin/env python3
"""Load test of `wan serve` on loopback (CTest serve_load): two rounds of 200 requests, 50 at a time, a
mix of valid jobs (tiny random model, 64x64, 5 frames, 1 step), malformed bodies, reads of unknown ids,
lists, and deletes of accepted jobs. Checks: every status is the one expected (a valid job 200 or 429 with
Retry-After), no accepted job is lost (each ends completed with its video, or was deleted and is gone),
the server stays healthy, and its resident memory does not keep growing from the first round to the
second (skipped under AddressSanitizer, whose quarantine holds freed memory on purpose).
Usage: serve_load.py WAN_BINARY WORK_DIR
"""
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

WAN, WORK = sys.argv[1], sys.argv[2]
VALID = {"prompt": "load", "size": "64x64", "seconds": "0.25", "steps": 1}
MALFORMED = [b"{not json", json.dumps({"prompt": "x", "steps": 0}).encode(),
             json.dumps({"prompt": "x", "path": "/etc/passwd"}).encode(),
             json.dumps({"prompt": "x", "size": "65x64"}).encode(), json.dumps({"size": "64x64"}).encode(),
             json.dumps(["prompt"]).encode()]


def call(base, method, path, body=None):
    req = urllib.request.Request(base + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def one_round(base, accepted, deleted, lock, rng):
    problems = []

    def request(i):
        kind = i % 5
        if kind == 0 or kind == 1:
            st, hdrs, raw = call(base, "POST", "/v1/videos", json.dumps(VALID).encode())
            if st == 200:
                with lock:
                    accepted.append(json.loads(raw)["id"])
            elif st != 429 or not hdrs.get("Retry-After"):
                problems.append(("valid", st, raw[:200]))
        elif kind == 2:
            st, _, raw = call(base, "POST", "/v1/videos", MALFORMED[i % len(MALFORMED)])
            if st != 400 or "error" not in json.loads(raw):
                problems.append(("malformed", st, raw[:200]))
        elif kind == 3:
            st, _, raw = call(base, "GET", "/v1/videos/video_%032x" % rng.getrandbits(128))
            st2, _, raw2 = call(base, "GET", "/v1/videos?limit=100")
            if st != 404 or st2 != 200:
                problems.append(("reads", st, st2))
        else:
            with lock:  # each accepted job is deleted at most once
                candidates = [a for a in accepted if a not in deleted]
                victim = candidates[rng.randrange(len(candidates))] if candidates and i % 20 == 4 else None
                if victim:
                    deleted.add(victim)
            st, _, raw = call(base, "DELETE", "/v1/videos/" + (victim or "video_unknown"))
            if st != (200 if victim else 404):
                problems.append(("delete", victim, st, raw[:200]))

    with ThreadPoolExecutor(50) as pool:
        list(pool.map(request, range(200)))
    assert not problems, problems[:10]


def settle(base, accepted, deleted):
    """Every accepted job ends completed with its video, or was deleted and is gone."""
    deadline = time.time() + 240
    for vid in accepted:
        while True:
            st, _, raw = call(base, "GET", "/v1/videos/" + vid)
            if vid in deleted:
                assert st == 404, (vid, st)
                break
            assert st == 200, (vid, st, raw)
            v = json.loads(raw)
            if v["status"] == "completed":
                st, _, body = call(base, "GET", f"/v1/videos/{vid}/content")
                assert st == 200 and len(body) > 100, (vid, st)
                break
            assert v["status"] in ("queued", "in_progress"), v  # never failed: nothing is lost
            assert time.time() < deadline, v
            time.sleep(0.05)


def main():
    out = os.path.join(WORK, "load")
    proc = subprocess.Popen([WAN, "serve", "--weights", "random", "--config", "tiny", "--port", "0",
                             "--output-dir", out, "--max-queue", "4", "--quiet"],
                            stdout=subprocess.PIPE, text=True)
    try:
        base = proc.stdout.readline().split("listening on ")[1].split()[0]
        accepted, deleted, lock, rng = [], set(), threading.Lock(), random.Random(1)
        rss = []
        for _ in range(2):
            one_round(base, accepted, deleted, lock, rng)
            settle(base, accepted, deleted)
            assert call(base, "GET", "/health")[0] == 200 and call(base, "GET", "/ready")[0] == 200
            rss.append(rss_kib(proc.pid))
        assert len(accepted) - len(deleted) >= 4, (accepted, deleted)  # jobs ran to the end, not only refusals
        metrics = call(base, "GET", "/metrics")[2].decode()
        done = len(accepted) - len(deleted)
        assert f'wan_jobs{{state="completed"}} {done}' in metrics, (done, metrics)
        assert 'wan_jobs{state="failed"} 0' in metrics, metrics
        if "ASAN_OPTIONS" not in os.environ:
            assert rss[1] - rss[0] < 64 * 1024, rss  # KiB: the second round must not keep what it used
        proc.send_signal(2)
        assert proc.wait(60) == 0
        print(f"serve load: {len(accepted)} accepted ({len(deleted)} deleted), rss {rss} KiB: passed")
    finally:
        if proc.poll() is None:
            proc.kill()


if __name__ == "__main__":
    main()
