"""python -m sim.fleet ... (also `python -m sim ...`)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ._util import SimError


def parse_faults(specs: list[str]) -> dict[str, dict]:
    """["spark-2:driver=550.54.14,present=false"] -> {"spark-2": {"driver": "550.54.14", "present": False}}"""
    faults: dict[str, dict] = {}
    for spec in specs:
        host, sep, knobs = spec.partition(":")
        if not sep or not knobs:
            raise SimError(f"bad --fault {spec!r}: expected HOST:KEY=VALUE[,KEY=VALUE]")
        for kv in knobs.split(","):
            k, eq, v = kv.partition("=")
            if not eq:
                raise SimError(f"bad --fault {spec!r}: {kv!r} is not KEY=VALUE")
            faults.setdefault(host.strip(), {})[k.strip()] = _value(v.strip())
    return faults


def parse_fabric(changes: list[str]) -> dict:
    """["down", "mtu=1500"] -> {"up": False, "mtu": "1500"} (set_fabric checks the number)."""
    out: dict = {}
    for ch in changes:
        if ch in ("up", "down"):
            out["up"] = ch == "up"
        elif ch.startswith("mtu="):
            out["mtu"] = ch[4:]
        else:
            raise SimError(f"bad fabric change {ch!r}: use up, down or mtu=N")
    return out


def _value(v: str):
    low = v.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    return v


def _print_status(st: dict) -> None:
    if not st["dockerd"]:
        print("dockerd: not running (the fleet is down)")
        return
    if not st["state"]:
        print("the simulated fleet is not up")
        return
    s = st["state"]
    svc = st["services"] or {}
    print(f"services: {svc.get('status')}  hub={s['hub']['controller_url']} ({'ok' if svc.get('hub') else 'DOWN'})"
          f"  registry={s['registry']['controller']} ({'ok' if svc.get('registry') else 'DOWN'})")
    print(f"{'HOST':<10} {'CONTAINER':<24} {'STATUS':<9} {'SYSTEMD':<10} {'SSH':>6} {'API':>6}  GPU")
    for h in [*st["hosts"], *st.get("service_hosts", [])]:
        g = h.get("gpu") or {}
        gpu = "-" if not g else (f"{g.get('name')} driver {g.get('driver')}" if g.get("present", True)
                                 else "absent (driver not loaded)")
        print(f"{h['name']:<10} {h['container']:<24} {h['status']:<9} {str(h['system']):<10} "
              f"{h['ssh_port']:>6} {h.get('api_port') or '-':>6}  {gpu if 'api_port' in h else 'service host'}")
    print(f"ssh: ssh -i {s['ssh_key']} -p PORT -o UserKnownHostsFile={Path(s['ssh_key']).parent / 'known_hosts'} "
          f"root@127.0.0.1")


def main(argv: list[str] | None = None) -> int:
    from . import fleet

    ap = argparse.ArgumentParser(prog="python -m sim.fleet", description="the simulated DGX Spark fleet")
    ap.add_argument("--fleet", metavar="NAME", help="a fleet beside the default one, e.g. --fleet b: sparkfleet-b-* "
                                                 "containers, state in .sim/fleets/b/ (also SPARKFLEET_SIM_FLEET)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="build what is missing and start the fleet (idempotent)")
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--service-hosts", type=int, default=1, metavar="N",
                   help="service hosts door-1..N beside the Sparks (a front door / monitoring box, no GPU)")
    p.add_argument("--fault", action="append", default=[], metavar="HOST:KEY=VALUE[,KEY=VALUE]",
                   help="simulated GPU knobs, e.g. spark-2:driver=550.54.14 or spark-3:present=false")
    p.add_argument("--json", action="store_true", help="print state.json")
    sub.add_parser("down", help="remove containers, volumes and network (image caches stay)")
    p = sub.add_parser("status", help="what is running")
    p.add_argument("--json", action="store_true")
    for name, hlp in (("reboot", "docker restart a host (systemd boots again)"),
                      ("stop-host", "power a host off"), ("start-host", "power a host on")):
        p = sub.add_parser(name, help=hlp)
        p.add_argument("host")
    p = sub.add_parser("set-gpu", help="change a host's simulated GPU, e.g. set-gpu spark-1 driver=550.54.14")
    p.add_argument("host")
    p.add_argument("knobs", nargs="+", metavar="KEY=VALUE")
    p = sub.add_parser("engine", help="stand-in engine fault knobs, e.g. engine spark-1 fault=hang --live, "
                                      "engine spark-2 crash_on_start=true, engine spark-3 load_delay_s=40, "
                                      "engine spark-1 spec_acceptance_rate=0.6 --live (speculative decoding)")
    p.add_argument("host")
    p.add_argument("knobs", nargs="+", metavar="KEY=VALUE")
    p.add_argument("--live", action="store_true",
                   help="change the running engine container only (a restart clears it)")
    p = sub.add_parser("lose-gpu", help="the running engine container loses the GPU (a restart heals it)")
    p.add_argument("host")
    p = sub.add_parser("fabric", help="the host's fabric link (enp1s0f0np0): show it, or fault it, e.g. "
                                      "fabric spark-2 down, fabric spark-2 mtu=1500, fabric spark-2 up mtu=9000")
    p.add_argument("host")
    p.add_argument("changes", nargs="*", metavar="up|down|mtu=N")
    p = sub.add_parser("publish-driver", help="a newer stand-in NVIDIA driver in the DGX OS repository, e.g. "
                                              "publish-driver 580.95.99 (hosts get it by apt upgrade, then reboot)")
    p.add_argument("version")
    p = sub.add_parser("reset-driver", help="the DGX OS repository back to the original driver, and the hosts (or one) "
                                            "on it without a reboot")
    p.add_argument("host", nargs="?")
    p = sub.add_parser("driver", help="a host's driver package, the driver nvidia-smi reports, a pending reboot")
    p.add_argument("host")
    sub.add_parser("stop-services", help="stop the hub/apt/registry container (outage)")
    sub.add_parser("start-services", help="start it again")
    sub.add_parser("build", help="build the images only")
    p = sub.add_parser("chat-ui", help="build Open WebUI's image from its PyPI release (minutes, ~3 GB; `up` never "
                                       "does) and push it into the registry; prints its pinned reference")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--background", action="store_true",
                     help="only start building it, in a process of its own (needs no fleet; `chat-ui` waits for it)")
    how.add_argument("--build-only", action="store_true", help="build it, push nothing (needs no fleet)")
    sub.add_parser("sign-in-url", help="where a browser here reaches the chat UI (inventory/sim_chat_ui.py)")

    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        if args.cmd == "up":
            state = fleet.up(hosts=args.hosts, faults=parse_faults(args.fault), service_hosts=args.service_hosts)
            if args.json:
                print(json.dumps(state, indent=2))
            else:
                _print_status(fleet.status())
        elif args.cmd == "down":
            fleet.down()
        elif args.cmd == "status":
            st = fleet.status()
            print(json.dumps(st, indent=2)) if args.json else _print_status(st)
            return 0 if st["up"] else 3
        elif args.cmd == "reboot":
            print(f"{args.host} rebooted in {fleet.reboot(args.host):.1f}s")
        elif args.cmd == "stop-host":
            fleet.stop_host(args.host)
        elif args.cmd == "start-host":
            print(f"{args.host} started in {fleet.start_host(args.host):.1f}s")
        elif args.cmd == "set-gpu":
            knobs = parse_faults([f"{args.host}:{','.join(args.knobs)}"])[args.host]
            print(json.dumps(fleet.set_gpu(args.host, **knobs), sort_keys=True))
        elif args.cmd == "engine":
            knobs = parse_faults([f"{args.host}:{','.join(args.knobs)}"])[args.host]
            print(json.dumps(fleet.set_engine(args.host, live=args.live, **knobs), sort_keys=True))
        elif args.cmd == "fabric":
            print(json.dumps(fleet.set_fabric(args.host, **parse_fabric(args.changes)), sort_keys=True))
        elif args.cmd == "lose-gpu":
            fleet.lose_container_gpu(args.host)
        elif args.cmd == "publish-driver":
            print(" ".join(fleet.publish_driver(args.version)))
        elif args.cmd == "reset-driver":
            print(f"on {fleet.driver.DRIVER_VERSION}: {', '.join(fleet.reset_driver(args.host))}")
        elif args.cmd == "driver":
            print(json.dumps(fleet.driver_state(args.host), sort_keys=True))
        elif args.cmd == "stop-services":
            fleet.stop_services()
        elif args.cmd == "start-services":
            fleet.start_services()
        elif args.cmd == "chat-ui" and args.background:
            print(f"building Open WebUI's image in the background (log: {fleet.build_chat_ui_in_background()})")
        elif args.cmd == "chat-ui" and args.build_only:
            fleet.build_chat_ui()
        elif args.cmd == "chat-ui":
            print(fleet.chat_ui_image())
        elif args.cmd == "sign-in-url":
            print(fleet.sign_in_url())
        elif args.cmd == "build":
            from . import apt_repo, images
            fleet.bootstrap()
            images.ensure_all()
            apt_repo.ensure_repo()
    except SimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.cmd not in ("status", "set-gpu", "engine", "fabric", "driver", "sign-in-url"):
        print(f"({args.cmd}: {time.monotonic() - t0:.1f}s)", file=sys.stderr)
    return 0
