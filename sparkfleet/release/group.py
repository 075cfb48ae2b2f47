"""Tensor-parallel groups: two or more Sparks serving one model with vLLM's multi-node path (Ray).

A group is written in the inventory as `tensor_parallel_hosts` in every member's data (an inventory group's
data is the usual place), the head first. The members must agree on everything their one release is made of,
so this module checks the whole inventory at once and names each disagreement with its fix; then it derives
what every member needs: the fabric environment and the `ray start` arguments. Pure: no host is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.contract import engines, paths
from sparkfleet.contract.settings import Settings

# Environment sparkfleet writes on every member, derived from the fabric settings (engine_env may not set them): the
# tensor-parallel engine's own host-address variable (its descriptor's host_ip_var), then the libraries' and Ray's.
FABRIC_ENV = (*engines.HOST_IP_VARS, "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES",
              "TP_SOCKET_IFNAME", "RAY_memory_monitor_refresh_ms", "RAY_ADDRESS", "MASTER_ADDR")
# Ray's token auth (Ray >= 2.52): every node and driver of the group's cluster presents the group's token, read
# from a file (never the value in an environment: `docker inspect` shows that). engine_env may not set these, nor
# RAY_AUTH_TOKEN (a token value, which Ray prefers to the file).
RAY_AUTH_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": paths.RAY_TOKEN}
RAY_AUTH_OWNED = (*RAY_AUTH_ENV, "RAY_AUTH_TOKEN")
# RoCE's GID index is reported to change across reboots: a pinned one breaks NCCL on the next boot, while NCCL
# picks the right one itself.
UNPINNED_ENV = {"NCCL_IB_GID_INDEX": "the RoCE GID index drifts across reboots, and NCCL picks the right one itself"}

# The settings every member must share: each feeds the group's one release (model, image, engine arguments,
# container options) or the Ray cluster the members form.
GROUP_KEYS = (
    "tensor_parallel_size", "model_hub", "model_repo", "model_revision", "model_root", "engine_image",
    *(d.version_setting for d in engines.able("tensor_parallel")),  # the group's engine's version: vllm_version
    "served_model_name", "api_host", "api_port", "max_model_len", "gpu_memory_utilization",
    "enable_prefix_caching", "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "attention_backend",
    "limit_mm_per_prompt", "kv_cache_dtype", "max_num_seqs", "speculative_method", "num_speculative_tokens",
    "extra_engine_args", "gpu_device_mode", "privileged", "seccomp_unconfined", "fabric_interface", "fabric_mtu",
    "ray_port", "ray_start_args",
)

# `ray start` flags sparkfleet sets itself: a second copy in ray_start_args would fight it.
RAY_OWNED_FLAGS = {
    "--head": "the first of tensor_parallel_hosts", "--address": "the head's fabric_address and ray_port",
    "--port": "ray_port", "--node-ip-address": "fabric_address", "--num-gpus": "one GPU per Spark",
    "--block": "the unit (Ray runs in the foreground under systemd)", "--temp-dir": "the unit's /tmp/ray volume",
    "--include-dashboard": "the unit (no dashboard)", "--disable-usage-stats": "the unit (no usage reports)",
}


@dataclass(frozen=True)
class TensorParallelGroup:
    """The members of one serving unit, head first, with their fabric addresses in the same order."""

    members: tuple[str, ...]
    addresses: tuple[str, ...]
    interface: str  # fabric_interface (every member's: they must agree)
    mtu: int
    ray_port: int

    @property
    def head(self) -> str:
        return self.members[0]

    @property
    def name(self) -> str:
        return "+".join(self.members)

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def ray_address(self) -> str:
        return f"{self.addresses[0]}:{self.ray_port}"

    def address_of(self, member: str) -> str:
        return self.addresses[self.members.index(member)]

    def role(self, member: str) -> str:
        return "head" if member == self.head else "worker"

    def env(self, member: str) -> dict[str, str]:
        """The member's fabric environment: NCCL, Gloo, UCX and PyTorch's TP on the fabric, Ray at the head with
        the group's token (its file's path). The Ray container's whole environment; the head's engine gets it too."""
        return {
            **dict.fromkeys(engines.HOST_IP_VARS, self.address_of(member)),
            **dict.fromkeys(("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME"),
                            self.interface),
            "RAY_memory_monitor_refresh_ms": "0",  # Ray's OOM killer would take the engine for a leak
            "RAY_ADDRESS": self.ray_address,
            "MASTER_ADDR": self.addresses[0],
            **RAY_AUTH_ENV,
        }

    def ray_start_args(self, member: str, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
        """`ray start ...` of the member's Ray node: the head opens the cluster, a worker joins it."""
        args = ["start", "--block", "--node-ip-address", self.address_of(member), "--num-gpus", "1",
                "--disable-usage-stats"]
        if member == self.head:
            args += ["--head", "--port", str(self.ray_port), "--include-dashboard", "false"]
        else:
            args += ["--address", self.ray_address]
        return args + list(extra)

    def to_dict(self) -> dict:
        return {"name": self.name, "head": self.head, "members": list(self.members),
                "addresses": list(self.addresses), "interface": self.interface, "mtu": self.mtu,
                "ray_port": self.ray_port}


def member_problems(name: str, s: Settings) -> list[str]:
    """What one host's own settings get wrong about its group (or its lack of one), each with the fix."""
    listed = s.tensor_parallel_hosts
    if not listed:
        if s.tensor_parallel_size > 1:
            return [f"{name}: tensor_parallel_size={s.tensor_parallel_size}: one Spark has one GPU: set "
                    f"tensor_parallel_hosts to the {s.tensor_parallel_size} hosts that serve this model together "
                    f"(the head first), or tensor_parallel_size = 1"]
        return []
    problems = []
    key = f"setting `tensor_parallel_hosts` = {listed!r}"
    if name not in listed:
        problems.append(f"{name}: {key} does not name {name}: list every member of the group, this host included "
                        f"(the head first)")
    twice = sorted({m for m in listed if listed.count(m) > 1})
    if twice:
        problems.append(f"{name}: {key} names {', '.join(twice)} more than once: list each member once")
    if len(listed) < 2:
        problems.append(f"{name}: {key} has one host: list 2 or more, or set tensor_parallel_hosts = [] "
                        f"for a single host")
    elif s.tensor_parallel_size != len(listed):
        problems.append(f"{name}: setting `tensor_parallel_size` = {s.tensor_parallel_size} but tensor_parallel_hosts "
                        f"lists {len(listed)} hosts: set tensor_parallel_size = {len(listed)}")
    if s.fabric_address is None:
        problems.append(f"{name}: setting `fabric_address` is missing: a member of {'+'.join(listed)} needs its "
                        f"IPv4 address on {s.fabric_interface}; set it in this host's inventory data")
    if s.docker_network != "host":
        problems.append(f"{name}: setting `docker_network` = {s.docker_network!r}: Ray and NCCL reach the other "
                        f"members from the host's network: set docker_network = \"host\"")
    if s.services:
        problems.append(f"{name}: setting `services` on a member of {'+'.join(listed)}: the group's model takes "
                        f"every member's GPU memory: move the services to a single host")
    for env, why in UNPINNED_ENV.items():
        if env in s.engine_env:
            problems.append(f"{name}: setting `engine_env` sets {env} on a member of a tensor-parallel group: {why}: "
                            f"remove it")
    owned = sorted(set(FABRIC_ENV) & set(s.engine_env))
    if owned:
        problems.append(f"{name}: setting `engine_env` sets {', '.join(owned)}, which sparkfleet derives from "
                        f"fabric_interface, fabric_address and ray_port: remove it (set those settings instead)")
    auth = sorted(set(RAY_AUTH_OWNED) & set(s.engine_env))
    if auth:
        problems.append(f"{name}: setting `engine_env` sets {', '.join(auth)} on a member of {'+'.join(listed)}: "
                        f"sparkfleet turns on Ray's token auth with the group's own token (made on the controller, "
                        f"shipped as {paths.RAY_TOKEN}): remove it")
    return problems


def ray_args_problems(name: str, s: Settings) -> list[str]:
    """Flags of ray_start_args that sparkfleet sets itself (flag names only, never values)."""
    return [f"{name}: setting `ray_start_args`: `{arg.split('=', 1)[0]}` is set by sparkfleet from "
            f"{RAY_OWNED_FLAGS[arg.split('=', 1)[0]]}: remove it"
            for arg in s.ray_start_args if arg.split("=", 1)[0] in RAY_OWNED_FLAGS]


def plan_groups(settings: dict[str, Settings]) -> tuple[dict[str, TensorParallelGroup], list[str]]:
    """Every host's group (by member name) from the inventory's settings, or the problems, one line each.

    `settings` holds every host of the run in inventory order. A group forms when each member lists the same
    hosts; a host is in one group at most (two lists that share a host cannot both be every member's).
    """
    problems: list[str] = []
    for name, s in settings.items():
        problems += member_problems(name, s) + ray_args_problems(name, s)
    groups: dict[str, TensorParallelGroup] = {}
    for name, s in settings.items():
        listed = s.tensor_parallel_hosts
        if not listed or name != listed[0]:
            continue
        found = _group_problems(listed, settings)
        problems += found
        addresses = () if found else tuple(a for a in (settings[m].fabric_address for m in listed) if a)
        if not found and len(addresses) == len(listed):  # every member known (found says who is not) and addressed
            group = TensorParallelGroup(tuple(listed), addresses, s.fabric_interface, s.fabric_mtu, s.ray_port)
            groups.update(dict.fromkeys(listed, group))
    for name, s in settings.items():  # a member whose head does not list it (the head's view misses it)
        listed = s.tensor_parallel_hosts
        if not listed or name == listed[0] or name not in listed:
            continue
        if listed[0] not in settings:
            problems.append(_not_planned(name, listed, listed[0]))
        elif name not in settings[listed[0]].tensor_parallel_hosts:
            problems.append(f"{name}: setting `tensor_parallel_hosts` = {listed!r} names {listed[0]} as the head, "
                            f"whose own list is {settings[listed[0]].tensor_parallel_hosts!r}: give every member "
                            f"the same list (a group's data is the usual place)")
    return groups, problems


def _not_planned(name: str, listed: list[str], other: str) -> str:
    return (f"{name}: setting `tensor_parallel_hosts` = {listed!r} names {other}, which is not among the hosts of "
            f"this run: add it to the inventory, or plan the whole group (--host/--limit the group, not one member)")


def _group_problems(listed: list[str], settings: dict[str, Settings]) -> list[str]:
    """The head's view: every member is planned, lists the same hosts, and shares the head's GROUP_KEYS."""
    head, name = listed[0], "+".join(listed)
    problems = []
    addresses: dict[str, str] = {}
    for member in listed[1:]:
        if member not in settings:
            problems.append(_not_planned(head, listed, member))
            continue
        other = settings[member]
        if other.tensor_parallel_hosts != listed:
            problems.append(f"{member}: setting `tensor_parallel_hosts` = {other.tensor_parallel_hosts!r}, but the "
                            f"head {head} lists {listed!r}: give every member the same list (a group's data is "
                            f"the usual place); a host is in one group at most")
            continue
        for key in GROUP_KEYS:
            mine, theirs = getattr(other, key), getattr(settings[head], key)
            if mine != theirs:
                problems.append(f"{member}: setting `{key}` = {mine!r} differs from the head {head}'s {theirs!r}: "
                                f"a tensor-parallel group serves one release: set the same `{key}` on every member "
                                f"of {name}")
    for member in listed:
        address = member in settings and settings[member].fabric_address
        if address and address in addresses.values():
            owner = next(m for m, a in addresses.items() if a == address)
            problems.append(f"{member}: setting `fabric_address` = {address!r} is also {owner}'s: give each member "
                            f"of {name} its own address on the fabric")
        elif address:
            addresses[member] = address
    return problems
