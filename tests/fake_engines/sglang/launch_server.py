"""``python -m sglang.launch_server`` look-alike that fails the way real engines fail (FAKE_ENGINE_MODE)."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("FAKE_ENGINE_MODE", "ok")


def say(*lines):
    for line in lines:
        print(line, flush=True)


def parse():
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--max-running-requests", type=int)
    if MODE == "bad_flag":
        return p.parse_args(sys.argv[1:] + ["--not-in-this-version", "1"])
    return p.parse_args()


def start_workers(n, escape):
    """Child processes like SGLang's scheduler and detokenizer (sleeping forever)."""
    sleeper = [sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"]
    procs = [subprocess.Popen(sleeper) for _ in range(n)]
    if escape:
        procs.append(subprocess.Popen(sleeper, start_new_session=True))
    say("workers: " + " ".join(str(p.pid) for p in procs))


def main():
    args = parse()
    say(f"[fake sglang] server_args=model_path={args.model_path} port={args.port} mode={MODE}")
    if MODE == "oom":
        say("[2026-11-30 10:00:01] Load weight begin. avail mem=79.10 GB",
            "Traceback (most recent call last):",
            '  File "sglang/srt/model_executor/model_runner.py", line 412, in init_memory_pool',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity "
            "of 79.10 GiB of which 1.20 GiB is free.")
        sys.exit(1)
    if MODE == "model_missing":
        say(f"OSError: {args.model_path} does not appear to have a file named config.json.")
        sys.exit(1)
    if MODE == "ignore_term":
        signal.signal(signal.SIGTERM, lambda *_: say("SIGTERM ignored"))
    gpu_gib = float(os.environ.get("FAKE_ENGINE_GPU_GIB", "0"))
    if gpu_gib:  # hold GPU memory like a loaded model would (the teardown must give it back)
        import torch

        held = torch.empty(int(gpu_gib * 2**30), dtype=torch.uint8, device="cuda")
        held.fill_(1)
        say(f"holding {gpu_gib:g} GiB on {torch.cuda.get_device_name()}")
    workers = int(os.environ.get("FAKE_ENGINE_WORKERS", "0"))
    if workers or os.environ.get("FAKE_ENGINE_ESCAPE"):
        start_workers(workers, bool(os.environ.get("FAKE_ENGINE_ESCAPE")))
    ready_at = time.monotonic() + float(os.environ.get("FAKE_ENGINE_LOAD_S", "0.2"))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                ready = MODE != "never_ready" and time.monotonic() >= ready_at
                self._send(200 if ready else 503, {"ready": ready})
            elif self.path == "/server_info":
                self._send(200, {"model_path": args.model_path, "port": args.port, "version": "fake",
                                 "max_running_requests": args.max_running_requests, "api_key": "secret-key"})
            else:
                self._send(404, {})

        def do_POST(self):
            if MODE == "die_mid":
                say("Fatal error in scheduler: simulated crash mid-trial")
                os._exit(3)
            self._send(200, {"text": "ok", "meta_info": {"completion_tokens": 1}})

    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler, bind_and_activate=False)
        server.allow_reuse_address = MODE != "port_in_use"
        server.server_bind()
        server.server_activate()
    except OSError as exc:
        say(f"ERROR: {exc}")
        sys.exit(1)
    say(f"The server is fired up and ready to roll! (port {args.port})")
    server.serve_forever()


if __name__ == "__main__":
    main()
