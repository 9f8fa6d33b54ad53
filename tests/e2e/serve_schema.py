#!/usr/bin/env python3
"""docs/openapi.yaml against a live `wan serve` (CTest serve_schema): schemathesis (pinned in
scripts/requirements-oracle.txt) generates requests for every operation from the document, valid and
invalid, and checks that no answer is a 5xx, every status code is one the document lists, and every body
and content type conforms to it. The server is the tiny random model on loopback with an API key; the
jobs valid requests queue are bounded by --max-queue 2 and a 5 s job limit, and the create request's
size, length and steps are narrowed to cheap values (cheap_spec), so generation stays cheap.
Bounded: a few examples per operation, a time limit, one worker. Afterwards the server must still be
healthy.
Usage: serve_schema.py WAN_BINARY WORK_DIR
"""
import os
import shutil
import subprocess
import sys
import time
import urllib.request

WAN, WORK = sys.argv[1], sys.argv[2]
KEY = "schema-key"
SPEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "openapi.yaml")


def cheap_spec():
    """The document with the create request's size, length and steps narrowed to cheap values, so the jobs
    that valid requests queue take a moment on the CPU (a documented example such as 1280x720 x 5 s would
    run for minutes); everything else is the document as written."""
    import yaml
    with open(SPEC) as f:
        doc = yaml.safe_load(f)
    cheap = {"size": {"type": "string", "enum": ["64x64", "32x32"]}, "seconds": {"type": "string", "enum": ["0.25"]},
             "num_frames": {"type": "string", "enum": ["1", "5"]}, "steps": {"type": "string", "enum": ["1"]}}
    for name in ("VideoCreateJson", "VideoCreateForm"):
        doc["components"]["schemas"][name]["properties"].update(cheap)
    path = os.path.join(WORK, "openapi-cheap.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    return path


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "loras"))
    subprocess.run([WAN, "make-lora", "--config", "tiny", "--rank", "2", "--output",
                    os.path.join(WORK, "loras", "style.safetensors")], check=True, capture_output=True)
    spec = cheap_spec()
    srv = subprocess.Popen([WAN, "serve", "--weights", "random", "--config", "tiny", "--port", "0", "--api-key", KEY,
                            "--output-dir", os.path.join(WORK, "out"), "--lora-dir", os.path.join(WORK, "loras"),
                            "--max-queue", "2", "--job-timeout", "5s", "--drain-timeout", "0", "--quiet"],
                           stdout=subprocess.PIPE, text=True)
    try:
        line = srv.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
        base = line.split("listening on ")[1].split()[0]
        t0 = time.time()
        st = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", spec, "--url", base, "-H", f"Authorization: Bearer {KEY}",
             "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
             "response_schema_conformance,response_headers_conformance",
             "--phases", "examples,coverage,fuzzing", "--max-examples", "15", "--max-time", "60", "--workers", "1",
             "--seed", "1", "--request-timeout", "30", "--generation-database", "none", "--no-color",
             "--suppress-health-check", "all", "--report", "junit", "--report-dir", os.path.join(WORK, "report")],
            capture_output=True, text=True, timeout=170)
        print(st.stdout[-6000:], st.stderr[-2000:])
        print(f"schemathesis: exit {st.returncode} in {time.time() - t0:.1f} s")
        assert st.returncode == 0, "schemathesis found a problem (see above)"
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            assert r.status == 200
        assert srv.poll() is None, "the server died"
        # Not a drain test (serve_e2e is): a job that negative cases planned large (num_frames past the
        # narrowed values) can sit in one long step, and cancellation waits for the step's end.
        srv.kill()
        srv.wait(30)
    finally:
        if srv.poll() is None:
            srv.kill()
    print("serve schema: passed")


if __name__ == "__main__":
    main()
