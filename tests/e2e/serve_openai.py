#!/usr/bin/env python3
"""End-to-end test of `wan serve` on loopback with the tiny random model (CTest serve_e2e).

1. The official `openai` package: videos.create (multipart, extensions through extra_body) ->
   retrieve polling -> download_content (checked with ffprobe when present) -> list -> delete.
2. urllib: each error status with OpenAI's error object (400, 401, 404, 413, 429 + Retry-After, 503
   while draining), JSON bodies, Range requests, /health, /ready, /metrics.
3. TI2V (tiny-ti2v) with input_reference uploaded through the SDK; a t2v server refuses an image.
4. SIGTERM mid-job: the job finishes within --drain-timeout, the exit code is 0, and a restart lists it;
   with --drain-timeout 0 the running job is cancelled, and a restart shows it failed with the reason.
5. LoRAs by name under --lora-dir (a `wan make-lora` file), as JSON objects and through the SDK's
   multipart form; names that leave the folder or do not exist, and a server without --lora-dir, get 400.
6. GET /v1/videos/{id}/events: server-sent events with the video object until the job ends.
7. Slow clients: connections that send headers (or part of them) and stall get 400 (or nothing) within
   --request-timeout and are closed after at most one more keep-alive interval, while other clients are
   served at once.
Usage: serve_openai.py WAN_BINARY WORK_DIR
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings

warnings.filterwarnings("ignore", category=DeprecationWarning)  # the SDK's notice about OpenAI's own service

WAN, WORK = sys.argv[1], sys.argv[2]
KEY = "test-key-123"
TINY = {"size": "64x64", "seconds": "0.25"}  # 5 frames at 16 fps


class Server:
    def __init__(self, out_dir, *extra):
        self.proc = subprocess.Popen(
            [WAN, "serve", "--weights", "random", "--config", "tiny", "--port", "0", "--api-key", KEY,
             "--output-dir", out_dir, "--quiet", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, (line, self.proc.stderr.read())
        self.base = line.split("listening on ")[1].split()[0]

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        return rc


def call(srv, method, path, body=None, headers=None, key=KEY):
    h = dict(headers or {})
    if key:
        h["Authorization"] = "Bearer " + key
    data = body
    if isinstance(body, dict):
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(srv.base + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def expect_error(srv, status, method, path, body=None, headers=None, key=KEY, param=None):
    got, hdrs, raw = call(srv, method, path, body, headers, key)
    assert got == status, (method, path, got, raw)
    err = json.loads(raw)["error"]
    assert err["message"] and err["type"], err
    if param is not None:
        assert err["param"] == param, err
    return hdrs, err


def wait_status(srv, vid, want, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        st, _, raw = call(srv, "GET", "/v1/videos/" + vid)
        assert st == 200, raw
        v = json.loads(raw)
        if v["status"] in want:
            return v
        time.sleep(0.05)
    raise AssertionError(f"{vid} never reached {want}")


def check_mp4(path, frames):
    if not shutil.which("ffprobe"):
        return
    out = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-show_entries",
                          "stream=width,height,nb_read_frames", "-of", "json", path],
                         capture_output=True, text=True, check=True).stdout
    s = json.loads(out)["streams"][0]
    assert (s["width"], s["height"], int(s["nb_read_frames"])) == (64, 64, frames), s


def sdk_flow(srv):
    import openai
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    video = client.videos.create(model="wan2.2-t2v-A14B", prompt="a red fox", seconds="0.25", size="64x64",
                                 extra_body={"steps": 2, "seed": 3, "guidance_scale": "3,4", "sampler": "euler"})
    assert video.status in ("queued", "in_progress"), video
    while video.status in ("queued", "in_progress"):
        time.sleep(0.05)
        video = client.videos.retrieve(video.id)
        assert 0 <= video.progress <= 100
    assert video.status == "completed", video
    assert video.progress == 100 and video.size == "64x64" and video.seconds == "0.25", video
    assert video.completed_at and video.expires_at > video.completed_at
    content = client.videos.download_content(video.id)
    path = os.path.join(WORK, "sdk.mp4")
    content.write_to_file(path)
    assert os.path.getsize(path) > 100
    check_mp4(path, 5)
    ids = [v.id for v in client.videos.list(limit=10)]
    assert video.id in ids, ids
    try:
        client.videos.create(prompt="x", size="64x64", extra_body={"steps": 0})
        raise AssertionError("steps 0 accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "steps", e.body
    bad = openai.OpenAI(base_url=srv.base + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.videos.list()
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError:
        pass
    deleted = client.videos.delete(video.id)
    assert deleted.deleted and deleted.id == video.id
    try:
        client.videos.retrieve(video.id)
        raise AssertionError("deleted video still there")
    except openai.NotFoundError:
        pass
    return path


def http_cases(srv):
    st, _, raw = call(srv, "GET", "/health", key=None)
    assert st == 200 and json.loads(raw)["status"] == "ok"
    assert call(srv, "GET", "/ready", key=None)[0] == 200
    expect_error(srv, 401, "GET", "/v1/videos", key=None)
    expect_error(srv, 401, "GET", "/v1/models", key="nope")
    expect_error(srv, 401, "GET", "/metrics", key=None)
    expect_error(srv, 400, "POST", "/v1/videos", {"prompt": "x", "size": "65x64"}, param="size")
    expect_error(srv, 400, "POST", "/v1/videos", {"prompt": "x", "model": "sora-2"}, param="model")
    expect_error(srv, 400, "POST", "/v1/videos", {"prompt": "x", "image": "/etc/passwd"}, param="image")
    expect_error(srv, 400, "POST", "/v1/videos", b"{oops", {"Content-Type": "application/json"})
    expect_error(srv, 400, "POST", "/v1/videos", b"prompt=x", {"Content-Type": "text/plain"})
    expect_error(srv, 400, "POST", "/v1/videos", b'--zz\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nhi',
                 {"Content-Type": "multipart/form-data; boundary=zz"})  # never closed
    expect_error(srv, 400, "POST", "/v1/videos", {"prompt": "x", "size": "64x64", "seconds": "3600"}, param="seconds")
    expect_error(srv, 400, "GET", "/v1/videos?limit=0", param="limit")
    expect_error(srv, 404, "GET", "/v1/videos/video_doesnotexist")
    expect_error(srv, 404, "GET", "/v1/videos/..%2f..%2fetc")
    expect_error(srv, 404, "DELETE", "/v1/videos/video_doesnotexist")
    expect_error(srv, 404, "GET", "/v1/nothing")
    expect_error(srv, 413, "POST", "/v1/videos", b"x" * (2 << 20), {"Content-Type": "application/json"})
    # A JSON request, then Range on its content.
    st, _, raw = call(srv, "POST", "/v1/videos", {"prompt": "json", "steps": 2, **TINY})
    assert st == 200, raw
    vid = json.loads(raw)["id"]
    wait_status(srv, vid, ("completed",))
    t = json.loads(call(srv, "GET", f"/v1/videos/{vid}")[2])["timings"]  # the extension: where the time went
    assert 0 <= t["queue_s"] <= t["first_step_s"] <= t["queue_s"] + t["run_s"] and t["write_s"] >= 0, t
    st, hdrs, whole = call(srv, "GET", f"/v1/videos/{vid}/content")
    assert st == 200 and hdrs["Content-Type"] in ("video/mp4", "video/x-yuv4mpeg"), hdrs
    st, hdrs, part = call(srv, "GET", f"/v1/videos/{vid}/content", headers={"Range": "bytes=4-11"})
    assert st == 206 and part == whole[4:12], (st, hdrs)
    # 429: one job runs, one waits (--max-queue 1), the rest are refused with Retry-After.
    codes = []
    for _ in range(4):
        st, hdrs, raw = call(srv, "POST", "/v1/videos", {"prompt": "q", "steps": 2, **TINY})
        codes.append(st)
        if st == 429:
            assert hdrs.get("Retry-After") and json.loads(raw)["error"]["code"] == "queue_full"
    assert codes[0] == 200 and 429 in codes, codes
    metrics = call(srv, "GET", "/metrics")[2].decode()
    assert 'wan_jobs{state="completed"}' in metrics and "wan_queue_depth" in metrics, metrics
    assert "wan_jobs_rejected_total" in metrics and "wan_job_seconds_count" in metrics
    assert int(metrics.split("\nwan_host_memory_rss_bytes ")[1].split()[0]) > 1 << 20, metrics  # CPU: host RSS
    assert int(metrics.split("wan_step_seconds_count ")[1].split()[0]) >= 4, metrics  # 2 jobs of 2 steps
    # Resident models: the jobs of equal settings after the first reuse its text encoder, DiT and VAE.
    assert int(metrics.split("\nwan_models_reused_total ")[1].split()[0]) >= 3, metrics
    for v in json.loads(call(srv, "GET", "/v1/videos?order=asc&limit=100")[2])["data"]:
        wait_status(srv, v["id"], ("completed", "failed"))
    return vid


def png_bytes():
    """A 64x64 RGB PNG (stored zlib blocks), without an imaging package."""
    import struct, zlib
    raw = b"".join(b"\x00" + bytes([200, 30, 30]) * 64 for _ in range(64))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def image_cases():
    """TI2V with input_reference through the SDK; a t2v server refuses an image, nothing stays behind."""
    import openai
    png = os.path.join(WORK, "in.png")
    with open(png, "wb") as f:
        f.write(png_bytes())
    out = os.path.join(WORK, "ti2v")
    srv = Server(out, "--config", "tiny-ti2v")
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    with open(png, "rb") as f:
        v = client.videos.create(prompt="a fox", input_reference=f, size="64x64", extra_body={"num_frames": 5, "steps": 2})
    assert v.model == "wan2.2-ti2v-5B", v
    v = wait_status(srv, v.id, ("completed", "failed"))
    assert v["status"] == "completed", v
    path = os.path.join(WORK, "ti2v.mp4")
    client.videos.download_content(v["id"]).write_to_file(path)
    check_mp4(path, 5)
    try:
        client.videos.create(prompt="x", input_reference=("notes.txt", b"hello", "text/plain"))
        raise AssertionError("a text file was taken as an image")
    except openai.BadRequestError as e:
        assert e.body["param"] == "input_reference", e.body
    assert srv.stop() == 0
    assert not [n for n in os.listdir(out) if ".input" in n], os.listdir(out)
    i2v = Server(os.path.join(WORK, "i2v"), "--config", "tiny-i2v")  # starts although its plan needs an image
    assert json.loads(call(i2v, "GET", "/v1/models")[2])["data"][0]["id"] == "wan2.2-i2v-A14B"
    expect_error(i2v, 400, "POST", "/v1/videos", {"prompt": "x", "size": "64x64"}, param="input_reference")
    _, err = expect_error(i2v, 400, "POST", "/v1/videos", {"prompt": "x", "loras": "a.safetensors:1"}, param="loras")
    assert err["code"] == "loras_not_enabled", err  # started without --lora-dir
    assert i2v.stop(signal.SIGINT) == 0


def t2v_refuses_image(srv):
    import openai
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    try:
        client.videos.create(prompt="x", size="64x64", input_reference=("in.png", png_bytes(), "image/png"))
        raise AssertionError("t2v took an image")
    except openai.BadRequestError as e:
        assert e.body["param"] == "input_reference" and "takes no image" in e.body["message"], e.body


def sigterm_cases():
    out = os.path.join(WORK, "drain")
    srv = Server(out, "--drain-timeout", "60")
    # Enough steps that the job is still running when the late POST arrives (the drain waits for it).
    st, _, raw = call(srv, "POST", "/v1/videos", {"prompt": "drain", "steps": 40, **TINY})
    vid = json.loads(raw)["id"]
    wait_status(srv, vid, ("in_progress",))
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    expect_error(srv, 503, "POST", "/v1/videos", {"prompt": "late", **TINY})
    assert call(srv, "GET", "/ready", key=None)[0] == 503
    assert srv.proc.wait(60) == 0
    again = Server(out, "--drain-timeout", "0")  # restart: the drained job is there, completed
    v = wait_status(again, vid, ("completed", "failed"))
    assert v["status"] == "completed", v
    assert call(again, "GET", f"/v1/videos/{vid}/content")[0] == 200
    st, _, raw = call(again, "POST", "/v1/videos", {"prompt": "cut", "steps": 40, **TINY})
    cut = json.loads(raw)["id"]
    wait_status(again, cut, ("in_progress",))
    again.proc.send_signal(signal.SIGTERM)
    assert again.proc.wait(60) == 0
    third = Server(out)
    v = wait_status(third, cut, ("completed", "failed"))
    assert v["status"] == "failed" and v["error"]["code"] == "server_shutdown", v
    assert call(third, "GET", f"/v1/videos/{cut}/content")[0] == 400
    assert third.stop(signal.SIGINT) == 0


def make_loras():
    folder = os.path.join(WORK, "loras")
    os.makedirs(folder, exist_ok=True)
    subprocess.run([WAN, "make-lora", "--config", "tiny", "--rank", "2", "--output",
                    os.path.join(folder, "style.safetensors")], check=True, capture_output=True)
    with open(os.path.join(WORK, "secret.safetensors"), "wb") as f:
        f.write(b"outside the LoRA folder")
    link = os.path.join(folder, "escape.safetensors")
    if not os.path.lexists(link):
        os.symlink(os.path.join(WORK, "secret.safetensors"), link)
    return folder


def lora_cases(srv):
    import openai
    st, _, raw = call(srv, "POST", "/v1/videos", {"prompt": "lora", "steps": 2, **TINY,
                                                  "loras": [{"name": "style.safetensors", "scale": 0.8, "expert": "both"}]})
    assert st == 200, raw
    assert wait_status(srv, json.loads(raw)["id"], ("completed", "failed"))["status"] == "completed"
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    v = client.videos.create(prompt="lora", size="64x64", seconds="0.25",  # multipart: "loras[]" fields
                             extra_body={"steps": 2, "loras": ["style.safetensors:0.5"]})
    assert wait_status(srv, v.id, ("completed", "failed"))["status"] == "completed"
    for name, code in (("../secret.safetensors", "invalid_value"), ("/etc/passwd", "invalid_value"),
                       ("escape.safetensors", "invalid_value"), ("none.safetensors", "lora_not_found")):
        _, err = expect_error(srv, 400, "POST", "/v1/videos", {"prompt": "x", **TINY, "loras": [{"name": name}]},
                              param="loras")
        assert err["code"] == code and WORK not in err["message"], err
    expect_error(srv, 400, "POST", "/v1/videos", {"prompt": "x", **TINY, "loras": [{"name": "style.safetensors",
                                                                                    "expert": "middle"}]}, param="loras")


def read_events(srv, vid, timeout=60):
    """The events of /v1/videos/{vid}/events until the server ends the stream: [(event, data)]."""
    req = urllib.request.Request(f"{srv.base}/v1/videos/{vid}/events", headers={"Authorization": "Bearer " + KEY})
    events, kind, data = [], "message", []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif not line and data:
                events.append((kind, json.loads("\n".join(data))))
                kind, data = "message", []
    return events


def sse_cases(srv):
    st, _, raw = call(srv, "POST", "/v1/videos", {"prompt": "events", "steps": 4, **TINY})
    assert st == 200, raw
    vid = json.loads(raw)["id"]
    events = read_events(srv, vid)  # returns only once the server ends the stream
    objs = [d for k, d in events if k == "message"]
    assert len(objs) >= 2 and all(o["id"] == vid and o["object"] == "video" for o in objs), events
    progress = [o["progress"] for o in objs]
    assert progress == sorted(progress) and objs[-1]["status"] == "completed" and progress[-1] == 100, objs
    assert len(set((o["status"], o["progress"]) for o in objs)) == len(objs), objs  # one event per change
    again = read_events(srv, vid)  # a finished job: its object once, then the end
    assert len(again) == 1 and again[0][1]["status"] == "completed", again
    expect_error(srv, 404, "GET", "/v1/videos/video_doesnotexist/events")


def slow_client_case(srv, timeout_s):
    """Stalled requests hold a thread each: past --request-timeout they get 400 (or nothing), and the
    connection closes after at most one more keep-alive interval (min(5 s, the timeout))."""
    host, port = srv.base.split("//")[1].split(":")
    stalled = []
    for head in (b"POST /v1/videos HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
                 b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"GET /hea", b""):
        s = socket.create_connection((host, int(port)))
        s.sendall(head)
        s.settimeout(3 * timeout_s + 10)
        stalled.append(s)
    t0, seen = time.time(), {}

    def watch(i, s):  # (first bytes, time of the first answer, time the server closed the connection)
        first = s.recv(65536)
        answered = time.time() - t0
        while s.recv(65536):
            pass
        seen[i] = (first, answered, time.time() - t0)
        s.close()

    watchers = [threading.Thread(target=watch, args=(i, s)) for i, s in enumerate(stalled)]
    for w in watchers:
        w.start()
    for _ in range(3):  # the stalled connections hold threads; others are served at once
        t = time.time()
        assert call(srv, "GET", "/health", key=None)[0] == 200
        assert time.time() - t < 1.0
    for w in watchers:
        w.join()
    for first, answered, closed in seen.values():
        assert not first or first.startswith(b"HTTP/1.1 400"), first
        assert (answered < timeout_s + 1.5 or not first) and closed < 2 * timeout_s + 1.5, seen
    assert call(srv, "GET", "/ready", key=None)[0] == 200


def main():
    os.makedirs(WORK, exist_ok=True)
    srv = Server(os.path.join(WORK, "main"), "--max-queue", "1", "--max-body-mb", "1", "--lora-dir", make_loras(),
                 "--request-timeout", "2")
    try:
        port = srv.base.rsplit(":", 1)[1]  # a second server on a port in use: exit 2, one line
        dup = subprocess.run([WAN, "serve", "--weights", "random", "--config", "tiny", "--port", port, "--output-dir",
                              os.path.join(WORK, "dup")], capture_output=True, text=True, timeout=60)
        assert dup.returncode == 2 and "cannot listen" in dup.stderr, (dup.returncode, dup.stderr)
        sdk_flow(srv)
        t2v_refuses_image(srv)
        http_cases(srv)
        lora_cases(srv)
        sse_cases(srv)
        slow_client_case(srv, 2)
        assert srv.stop() == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    image_cases()
    sigterm_cases()
    print("serve e2e: all cases passed")


if __name__ == "__main__":
    main()
