#!/usr/bin/python3
"""PID 1 of the sparkfleet-services container: runs the model hub, the static
apt repository server and the image registry, restarting any that exits.

Ports (inside the sim network): hub :8080 (alias sparkfleet-hub), apt :8081
(alias sparkfleet-apt), registry :5000 (alias sparkfleet-registry).
"""
import os
import signal
import subprocess
import sys
import time

HUB_REPO = os.environ.get("SPARKFLEET_HUB_REPO", "Qwen/Qwen3.5-35B-A3B-FP8")
HUB_DATA = os.environ.get("SPARKFLEET_HUB_DATA", "/var/lib/sparkfleet-hub")
HUB_EXTRA = os.environ.get("SPARKFLEET_HUB_ARGS", "").split()

SERVICES = {
    "hub": ["python3", "/opt/sparkfleet-sim/hub/server.py", "--host", "0.0.0.0",
            "--port", "8080", "--data", HUB_DATA, "--generate", HUB_REPO, *HUB_EXTRA,
            # the RAG services' small models (recipes/qwen3-embedding-0.6b.toml, qwen3-reranker-0.6b.toml)
            "--generate", "Qwen/Qwen3-Embedding-0.6B", "--generate", "Qwen/Qwen3-Reranker-0.6B"],
    "apt": ["python3", "-m", "http.server", "8081", "--bind", "0.0.0.0",
            "--directory", "/srv/apt"],
    "registry": ["docker-registry", "serve", "/etc/docker/registry/sparkfleet.yml"],
}

procs = {}
stopping = False


def start(name):
    cmd = SERVICES[name]
    print(f"supervise: starting {name}: {' '.join(cmd)}", flush=True)
    procs[name] = subprocess.Popen(cmd)


def stop(*_):
    global stopping
    stopping = True
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 5
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
    sys.exit(0)


def main():
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    os.makedirs(HUB_DATA, exist_ok=True)
    if not os.path.exists(SERVICES["hub"][1]):
        print("supervise: hub server missing from the image; hub not started", flush=True)
        del SERVICES["hub"]
    for name in SERVICES:
        start(name)
    while not stopping:
        time.sleep(1)
        for name, p in list(procs.items()):
            if p.poll() is not None and not stopping:
                print(f"supervise: {name} exited with {p.returncode}; restarting", flush=True)
                time.sleep(1)
                start(name)


if __name__ == "__main__":
    main()
