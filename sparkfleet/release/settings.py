"""Typed, validated settings: what a host's data must look like.

pyinfra merges `--data` > host > group > all; this module checks the merged
result before any host is touched, and names the host, the problem and the fix.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Keys owned by pyinfra's connectors, not by sparkfleet.
CONNECTION_PREFIXES = ("ssh_", "winrm_", "chroot_", "docker_identifier", "local_", "fake_", "_")


class SettingsError(ValueError):
    """One or more hosts have settings that cannot work; each line names a fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class Settings(BaseModel):
    """Every setting sparkfleet reads; defaults live in group_data/all.py."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    expected_arch: str = "aarch64"
    expected_gpu_name: str = "NVIDIA GB10"
    min_driver_version: str = "580.95.05"
    min_cuda_version: str = "13.0"
    min_memory_gib: float = Field(100, ge=0)

    toolkit_repo_url: str
    toolkit_key_url: str
    toolkit_key_fingerprint: str
    toolkit_version: str

    model_hub: Literal["modelscope", "huggingface"] = "modelscope"
    model_repo: str
    model_revision: str = "master"
    hub_endpoint: str | None = None
    controller_hub_endpoint: str | None = None
    hub_token: str | None = None
    model_root: str = "/var/lib/sparkfleet/models"
    full_verify: bool = False
    model_source: Literal["hub", "peer", "controller"] = "peer"
    peer_port: int = Field(8090, ge=1, le=65535)
    lan_address: str | None = None
    keep_releases: int = Field(2, ge=2)
    controller_model_dir: str | None = None
    engine_image_archive: str | None = None

    engine_image: str
    vllm_version: str
    served_model_name: str
    api_host: str = "127.0.0.1"
    api_port: int = Field(8000, ge=1, le=65535)
    api_key: str | None = None
    allow_unauthenticated_api: bool = False
    controller_api_url: str | None = None
    max_model_len: int = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    enable_prefix_caching: bool = True
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    attention_backend: str | None = None
    limit_mm_per_prompt: dict[str, int] | None = None
    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    extra_engine_args: list[str] = []
    engine_env: dict[str, str] = {}

    host_memory_gb: float = Field(128, gt=0)
    memory_bandwidth_gbs: float = Field(273, gt=0)

    container_name: str = "vllm"
    docker_network: str = "host"
    privileged: bool = False
    seccomp_unconfined: bool = False
    start_timeout_s: int = Field(1800, gt=0)
    health_timeout_s: int = Field(900, gt=0)

    @field_validator("toolkit_key_fingerprint")
    @classmethod
    def _fingerprint(cls, value: str) -> str:
        compact = value.replace(" ", "").upper()
        if not re.fullmatch(r"[0-9A-F]{40}", compact):
            raise ValueError("must be a 40-hex-digit OpenPGP fingerprint (gpg --show-keys prints it)")
        return compact

    @field_validator("container_name")
    @classmethod
    def _container_name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", value):
            raise ValueError("must be a valid Docker container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")
        return value

    @property
    def api_is_loopback(self) -> bool:
        if self.api_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.api_host).is_loopback
        except ValueError:
            return False

    @property
    def controller_endpoint(self) -> str | None:
        """The hub URL the controller uses; hosts use hub_endpoint."""
        return self.controller_hub_endpoint or self.hub_endpoint


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key, Settings.model_fields, n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else "see group_data/all.py for the known settings"


def _is_connection_key(key: str) -> bool:
    return key.startswith(CONNECTION_PREFIXES)


def parse_settings(host_name: str, data: dict[str, Any]) -> Settings:
    """Build one host's Settings from its merged pyinfra data, or raise SettingsError."""
    own = {k: v for k, v in data.items() if not _is_connection_key(k)}
    try:
        return Settings(**own)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"{host_name}: unknown setting `{key}`: {_did_you_mean(key)}")
            elif err["type"] == "missing":
                problems.append(f"{host_name}: setting `{key}` is missing: set it in group_data/all.py")
            else:
                got = err.get("input")
                problems.append(
                    f"{host_name}: setting `{key}` = {got!r} is invalid: {err['msg']}; "
                    f"fix it in the inventory or group_data"
                )
        raise SettingsError(problems) from None
