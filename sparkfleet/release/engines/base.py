"""The interface every engine module implements (engines/__init__.py picks one), and what they share."""

from __future__ import annotations

import re
from collections.abc import Callable

from sparkfleet.contract import engines
from sparkfleet.contract.engines import EngineDescriptor
from sparkfleet.contract.formats import API_KEY_VARS
from sparkfleet.contract.settings import Service, Settings
from sparkfleet.model.gguf import entry_file, is_gguf
from sparkfleet.release.engines import environment
from sparkfleet.release.engines.table import FlagTable, load_table, table_versions

TRUST_REMOTE_CODE = "--trust-remote-code"


def dashed(arg: str) -> str:
    """The flag an argument names as written (--flag=value is --flag)."""
    return arg.split("=", 1)[0]


def surface_problems(extra: list[str], remote_code: tuple[bool, bool], admin_flags: dict[str, str],
                     flag_name: Callable[[str], str] = dashed) -> list[str]:
    """Flags of extra_engine_args that open an admin surface or run the hub's code, each with why and the fix.

    `remote_code`: (the recipe says `trust_remote_code = true`, the user set `allow_trust_remote_code`);
    --trust-remote-code runs the model repository's Python as root in the container, so it needs both.
    """
    found = []
    for arg in extra:
        flag = flag_name(arg) if arg.startswith("-") else None
        if flag in admin_flags:
            found.append(f"`{flag}` {admin_flags[flag]}: remove it")
        elif flag == TRUST_REMOTE_CODE and not all(remote_code):
            missing = [what for what, ok in zip(("the recipe does not say `trust_remote_code = true`",
                                                 "`allow_trust_remote_code` is not True"), remote_code, strict=True)
                       if not ok]
            found.append(f"`{flag}` runs the model repository's Python as root in the engine container, and "
                         f"{' and '.join(missing)}: remove it, or serve a recipe that needs it and set "
                         f"allow_trust_remote_code = True to accept that risk")
    return found


def gguf_entry(s: Settings, manifest_paths: list[str] | None) -> str | None:
    """The .gguf file llama.cpp loads: from the manifest's files (model/gguf.py entry_file; ValueError when they
    hold several models), or offline the first literal .gguf name of model_files; None when there is none."""
    if manifest_paths is not None:
        return entry_file(manifest_paths)
    literal = [glob for glob in s.model_files or () if is_gguf(glob) and not re.search(r"[*?\[]", glob)]
    return literal[0] if literal else None


def is_gguf_model(s: Settings, manifest_paths: list[str] | None) -> bool | None:
    """Whether the model is GGUF: the manifest holds a .gguf file, or (offline) model_files names .gguf files;
    None offline with no model_files (unknown until the hub lists the files)."""
    if manifest_paths is not None:
        return any(is_gguf(p) for p in manifest_paths)
    if s.model_files is None:
        return None
    return any(is_gguf(glob) for glob in s.model_files)


def repository(image: str) -> str:
    """An image reference's repository without registry, tag or digest: vllm/vllm-openai, ggml-org/llama.cpp."""
    name = image.split("@", 1)[0]
    name = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    first, _, rest = name.partition("/")
    return rest if rest and ("." in first or ":" in first or first == "localhost") else name


def _labels(found: tuple[EngineDescriptor, ...]) -> str:
    return " or ".join(d.label for d in found)


class Engine:
    """One engine's behaviour: subclasses set the class attributes and write `args`; what the rest of sparkfleet
    knows of the engine (name, label, version setting, key variable, capabilities) is its descriptor's."""

    descriptor: EngineDescriptor  # contract/engines.py
    description: str  # the unit's Description, before the served name
    image: str  # the image a Spark runs it from (of descriptor.images[0]): what a refusal tells to set
    secret_flags: dict[str, str] = {}  # flags that carry a secret: {flag: the fix}
    admin_flags: dict[str, str] = {}  # flags that open an admin surface, run code or log users' text: {flag: why}
    owned_dests: dict[str, str] = {}  # {flag destination: the setting that sparkfleet sets it from}
    command: tuple[str, ...] = ()  # arguments before the flags (SGLang's `-m sglang.launch_server`)
    env_prefixes: tuple[str, ...] = ()  # its own engine_env variables: refused unless its flag table reviews them
    # A pooling engine's (descriptor.pooling) arguments that make a model serve each RAG kind ("embedding",
    # "reranker"), and the flag destinations a service's keys own: {destination: the key, as a refusal names it}
    pooling_args: dict[str, tuple[str, ...]] = {}
    service_dests: dict[str, str] = {}

    @property
    def name(self) -> str:  # settings `engine`
        return self.descriptor.name

    @property
    def label(self) -> str:  # as messages and the unit's Description name it
        return self.descriptor.label

    @property
    def version_setting(self) -> str:  # the setting that pins its flag table
        return self.descriptor.version_setting

    @property
    def model_format(self) -> str:  # "safetensors" or "gguf"
        return self.descriptor.model_format

    @property
    def key_var(self) -> str | None:  # engine.env's API key variable (None: the engine reads no key)
        return self.descriptor.key_var

    def flag_name(self, arg: str) -> str:
        """The flag an argument names, as this engine reads it."""
        return dashed(arg)

    def version(self, s: Settings) -> str:
        return getattr(s, self.version_setting)

    def flag_table(self, version: str) -> FlagTable:
        return load_table(self.name, version, self.label, self.version_setting)

    def supported_versions(self) -> list[str]:
        return table_versions(self.name)

    def args(self, s: Settings, model_dir: str, entry: str | None) -> list[str]:
        """The argument list after the image."""
        raise NotImplementedError

    def service_args(self, kind: str, service: Service, model_dir: str) -> list[str]:
        """A pooling engine's argument list after the image for one RAG service (release/services.py): the host's
        listen address, the service's own port, share and model, `pooling_args[kind]`, its extra_engine_args."""
        raise NotImplementedError(f"{self.label} runs no pooling model")

    def docker_options(self, s: Settings) -> list[str]:
        """`docker run` options this engine adds to the common ones (e.g. an --entrypoint)."""
        return []

    def engine_problems(self, name: str, s: Settings, table: FlagTable) -> list[str]:
        """This engine's own refusals beyond the common ones (parsers it lacks, settings it cannot honour)."""
        return []

    def extra_problems(self, table: FlagTable, extra: list[str]) -> list[str]:
        """Flags of extra_engine_args that carry a secret or that a setting owns, each with the fix (flag names
        only, never the values after them)."""
        found = []
        for arg in extra:
            if not arg.startswith("-"):
                continue
            flag = dashed(arg)
            spec = table.flags.get(flag, {})
            named = self.flag_name(arg)
            named = spec.get("alias_of", named) if named not in self.secret_flags else named
            owner = self.owned_dests.get(spec.get("dest"))
            if named in self.secret_flags:
                found.append(f"setting `extra_engine_args`: `{flag}` would put a secret in the world-readable unit: "
                             f"{self.secret_flags[named]}")
            elif owner:
                found.append(f"setting `extra_engine_args`: `{flag}` is set by sparkfleet from `{owner}`: "
                             f"set `{owner}` instead")
        return found

    def refuses(self, table: FlagTable, flag: str) -> bool:
        """Whether another check of this engine names `flag` already: a secret, an admin surface, a setting's."""
        spec = table.flags.get(flag, {})
        named, alias = self.flag_name(flag), spec.get("alias_of")
        return bool({named, alias} & (self.secret_flags.keys() | self.admin_flags.keys())
                    or spec.get("dest") in self.owned_dests)

    def env_problems(self, name: str, s: Settings, table: FlagTable) -> list[str]:
        """engine_env by allow-list, as a whole (release/engines/environment.py): the env form of a refused flag, and
        every variable that is neither reviewed by this engine's table nor a general one (the key variables are
        `problems`' own, the admin ones the settings', a group's derived ones release/group.py's)."""
        refused = {spec["env"]: table.canonical(flag) for flag, spec in table.flags.items()
                   if spec.get("env") and not spec.get("negates") and self.refuses(table, flag)}
        keys = set(API_KEY_VARS) | {self.key_var}
        problems = environment.env_problems(s.engine_env, table, self.label, self.env_prefixes, refused,
                                            lambda var: var in keys or var in engines.ADMIN_ENV, s, self.name)
        return [f"{name}: {p}" for p in problems]

    def problems(self, name: str, s: Settings, args: list[str], gguf: bool | None,
                 remote_code: tuple[bool, bool]) -> list[str]:
        """Every refusal of this engine for a host: the model's format, tensor parallelism, the key,
        extra_engine_args' flags, and each argument against the pinned flag table."""
        problems = []
        tensor_parallel, pooling = engines.able("tensor_parallel"), engines.able("pooling")
        if gguf and self.model_format != "gguf":
            problems.append(f"{name}: {s.model_repo} is a GGUF model, which {self.label} does not serve here: "
                            f"set {engines.names(engines.serving_format('gguf'))}")
        elif gguf is False and self.model_format == "gguf":
            problems.append(f"{name}: {s.model_repo} has no GGUF model file, and {self.label} serves only GGUF: set "
                            f"model_files to its .gguf files (e.g. [\"*Q4_K_M*.gguf\"]), or "
                            f"engine = \"{engines.DEFAULT_ENGINE}\"")
        if not self.descriptor.tensor_parallel and (s.tensor_parallel_hosts or s.tensor_parallel_size > 1):
            problems.append(f"{name}: tensor parallelism over Sparks runs on {_labels(tensor_parallel)}'s Ray path, "
                            f"and engine is {self.name!r}: set {engines.names(tensor_parallel)}, or remove "
                            f"tensor_parallel_hosts and set tensor_parallel_size = 1")
        if not self.descriptor.pooling and s.services:
            problems.append(f"{name}: services ({', '.join(s.services)}) are pooling models that run on "
                            f"{_labels(pooling)}, from the chat engine's image, and engine is {self.name!r}: set "
                            f"{engines.names(pooling)}, or remove services")
        for var in API_KEY_VARS:
            if var in s.engine_env:
                problems.append(f"{name}: engine_env sets {var}, which sparkfleet writes from `api_key`: "
                                f"set api_key instead")
        problems += [f"{name}: setting `extra_engine_args`: {p}"
                     for p in surface_problems(s.extra_engine_args, remote_code, self.admin_flags, self.flag_name)]
        try:
            table = self.flag_table(self.version(s))
        except ValueError as exc:
            return problems + [f"{name}: {self.version_setting}: {exc}"]
        found = table.problems(args[len(self.command):]) + self.extra_problems(table, s.extra_engine_args)
        found += [f"setting `extra_engine_args`: {p}"
                  for p in table.unreviewed(s.extra_engine_args, lambda flag: self.refuses(table, flag))]
        problems += [f"{name}: {p}" for p in found]
        return problems + self.env_problems(name, s, table) + self.engine_problems(name, s, table)
