"""The stand-in vLLM's side of vLLM's Ray executor (`--distributed-executor-backend ray`).

vLLM with `--tensor-parallel-size N` over Ray connects to the running cluster
(RAY_ADDRESS), asks for a placement group of N {"GPU": 1} bundles and waits for
it before it loads weights or binds its port; one GPU worker per bundle. While it
serves, a Ray node that dies takes its worker with it: the engine is dead
(/health 503, requests fail) until vLLM is restarted, even when the node comes
back. The stand-in does the same with real Ray: the placement group is spread
over N nodes (STRICT_SPREAD: one Spark, one GPU), and a watcher counts the alive
nodes with a GPU every few seconds.

Ray is imported here only: the stand-in imports this module only when given the
Ray backend, so its single-host path needs nothing but the standard library.
"""

from __future__ import annotations

import os
import threading
import time

CONNECT_RETRY_S = 2.0
WAIT_LOG_EVERY_S = 10.0


class RayStartupError(Exception):
    """A failure vLLM raises before serving: args are (exception type name, message)."""


def gpu_nodes(ray) -> list[dict]:
    """The cluster's alive nodes that have at least one GPU."""
    return [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1]


class RayCluster:
    """A connection to the Ray cluster holding N GPUs for one engine."""

    def __init__(self, size: int, log, wait_s: float, check_s: float):
        self.size, self.log, self.wait_s, self.check_s = size, log, wait_s, check_s
        self.address = os.environ.get("RAY_ADDRESS") or "auto"
        self.specs = [{"GPU": 1.0} for _ in range(size)]
        self.ray = None

    def _import(self):
        try:
            import ray
        except ImportError as e:
            raise RayStartupError("ValueError", "Failed to import Ray, please install Ray with "
                                                f"`pip install ray`. ({e})") from None
        return ray

    def start(self) -> None:
        """Connect, then hold N GPUs on N nodes (the placement group); RayStartupError after wait_s."""
        ray = self.ray = self._import()
        deadline = time.monotonic() + self.wait_s
        self.log(f"Connecting to existing Ray cluster at address: {self.address}.")
        while True:
            try:
                ray.init(address=self.address, namespace="vllm", log_to_driver=False,
                         logging_level="ERROR", configure_logging=False)
                break
            except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError... alike
                if time.monotonic() >= deadline:
                    raise RayStartupError("ConnectionError", f"Could not connect to the Ray cluster at "
                                                             f"{self.address}: {e}") from None
                self.log(f"Ray cluster at {self.address} not reachable yet ({type(e).__name__}); retrying",
                         "WARNING")
                time.sleep(CONNECT_RETRY_S)
        started, last_log = time.monotonic(), 0.0
        while len(gpu_nodes(ray)) < self.size:
            now = time.monotonic()
            if now >= deadline:
                self._give_up(started)
            if now - last_log >= WAIT_LOG_EVERY_S:
                last_log = now
                self.log(f"Waiting for creating a placement group of specs for {now - started:.0f} seconds. "
                         f"specs={self.specs}. Check `ray status` and `ray list nodes` to see if you have "
                         "enough resources, and make sure the IP addresses used by ray cluster are the same as "
                         "VLLM_HOST_IP environment variable specified in each node if you are running on a "
                         "multi-node.", "INFO")
            time.sleep(1.0)
        from ray.util.placement_group import placement_group

        self.group = placement_group(self.specs, strategy="STRICT_SPREAD")
        if not self.group.wait(max(1.0, deadline - time.monotonic())):
            self._give_up(started)
        nodes = gpu_nodes(ray)
        self.log(f"Ray placement group of {self.size} GPU bundles ready on nodes: "
                 f"{', '.join(sorted(n['NodeManagerAddress'] for n in nodes))} (STRICT_SPREAD)")

    def _give_up(self, started: float) -> None:
        have = len(gpu_nodes(self.ray))
        raise RayStartupError("ValueError", f"Cannot provide a placement group of placement_group_specs="
                                            f"{self.specs} within {self.wait_s:.0f} seconds (the cluster has "
                                            f"{have} alive node(s) with a GPU). See `ray status` and "
                                            "`ray list nodes` to make sure the cluster has enough resources.")

    def watch(self, on_lost) -> threading.Thread:
        """Check every check_s; call on_lost(message) once when fewer than N GPU nodes are alive."""
        def loop():
            while True:
                time.sleep(self.check_s)
                try:
                    have = len(gpu_nodes(self.ray))
                except Exception as e:  # noqa: BLE001 - the GCS itself gone (the head's Ray stopped)
                    on_lost(f"RayActorError: lost the Ray cluster at {self.address}: {type(e).__name__}: {e}")
                    return
                if have < self.size:
                    on_lost(f"ActorDiedError: The actor died unexpectedly before finishing this task. "
                            f"The actor is dead because its node has died ({have} of {self.size} GPU nodes "
                            "alive).")
                    return

        t = threading.Thread(target=loop, name="ray-node-watch", daemon=True)
        t.start()
        return t
