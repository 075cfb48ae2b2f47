"""engine_env by allow-list, as a whole: which variables reach the engine's container, each value typed.

A variable passes only when it is
- one the pinned engine's flag table reviews (its `reviewed` variables, and the env form of each reviewed flag:
  llama.cpp's LLAMA_ARG_*), its value of the kind the table gives it; or one another engine's pinned table reviews
  (engine.env is shared by the host's engines: a llama.cpp chat service beside vLLM reads it too; an engine reads
  only its own), unless it is an env form of this engine's flags or one of its own variables;
- one of GENERAL_ENV below, read by the libraries under every engine and harmless whatever its value of its kind;
- in the simulator alone (settings `sim_engine_knobs`, which only its inventories set), a knob of its stand-in
  engines: SIM_*, its value a short number or word.
Anything else is refused, one line each, naming the variable, why and the fix: Python's, the dynamic loader's, the
shell's, NCCL's and PyTorch's plugin and cache variables, the hub clients' (where the engine downloads from, whether it
may), and any variable a pinned flag table maps to a flag that is not reviewed (llama.cpp's MTMD_BACKEND_DEVICE is
its --mmproj-device) each load code or bytes sparkfleet neither pinned nor verified.

Refused elsewhere, each by its owner and skipped here: the admin-surface variables (contract/settings.py ADMIN_ENV,
at parse time), the key variables (Engine.problems: sparkfleet writes them from `api_key`), the variables sparkfleet
derives on a tensor-parallel group's member (release/group.py). engine.env is shared by the host's engines (a chat
service on llama.cpp beside vLLM reads it too): no general variable and no engine's reviewed one is another pinned
table's unreviewed flag (tests/unit/test_engine_env_allowlist.py holds them to it).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sparkfleet.contract import engines
from sparkfleet.contract.settings import Settings
from sparkfleet.release import group
from sparkfleet.release.engines.table import REVIEW_FIX, FlagTable, load_table, value_problem

# The reviewed general variables: {variable: (its value's kind of table.KINDS, its choices)}. Each is read by a library
# under every engine and is harmless whatever its value of that kind: it narrows, tunes or logs, and names no file,
# library, module or host.
GENERAL_ENV: dict[str, tuple[str, tuple[str, ...]]] = {
    "CUDA_VISIBLE_DEVICES": ("indexes", ()),  # hides GPUs from the engine (a Spark has one, 0); indexes only
    "NCCL_DEBUG": ("choice", ("VERSION", "WARN", "INFO", "TRACE")),  # NCCL's log level, to the journal
    "NCCL_DEBUG_SUBSYS": ("words", ()),  # which NCCL subsystems log (INIT,NET,...)
    # which interfaces NCCL's sockets use; on a group member sparkfleet derives it (release/group.py refuses it there)
    "NCCL_SOCKET_IFNAME": ("interfaces", ()),
    "NCCL_IB_DISABLE": ("choice", ("0", "1")),  # 1: NCCL leaves InfiniBand/RoCE for its sockets
    "OMP_NUM_THREADS": ("count", ()),  # OpenMP's threads per process
    "TOKENIZERS_PARALLELISM": ("choice", ("true", "false")),  # the tokenizers library's thread pool
    "TZ": ("zone", ()),  # the log lines' time zone: a zone's name, never a path (no / first, no . or :)
}
SIM_PREFIX = "SIM_"  # the simulator's stand-in engines' knobs (sim/engine/standin_vllm.py): nothing else reads them
SIM_KIND = "knob"
TABLE_FIX = REVIEW_FIX.replace("remove it", "remove it from engine_env")  # the engine's own: its table's review
ENV_FIX = ("remove it from engine_env, or ask for it to be reviewed and added (docs/settings.md, \"Engine environment "
           "by allow-list\")")
# Why a variable off the list is refused, by family (the first whose pattern matches the whole name); else UNREVIEWED.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("PYTHONPATH", "makes Python import modules from the directories it names (a sitecustomize.py among the model's "
                   "files would run as root in the engine)"),
    (r"PYTHON\w*", "Python reads at start-up to import or run what it names (a file, a module, a warning's class)"),
    (r"LD_\w*", "the dynamic loader reads to load the libraries it names into every process of the engine"),
    (r"BASH_ENV|ENV", "names a file that a shell runs when it starts"),
    (r"NCCL_\w*", "NCCL reads (some of its variables load a plugin library or write files)"),
    (r"(?:TORCH|PYTORCH|TORCHINDUCTOR|TRITON|CUDA_CACHE)\w*",
     "PyTorch, Triton or CUDA reads (some of their variables load compiled code from a directory they name)"),
    (r"(?:HF|HUGGINGFACE|TRANSFORMERS|MODELSCOPE)_\w*",
     "a hub client reads (where the engine downloads from, whether it may: it serves only the files sparkfleet "
     "fetched and verified)"),
    (r"(?:HTTPS?|FTP|ALL|NO)_PROXY", "sends the engine's connections through another host"),
)
UNREVIEWED = "is not on sparkfleet's reviewed list of engine variables"


def _why(var: str) -> str:
    return next((f"{why}, and {UNREVIEWED}" for pattern, why in FAMILIES
                 if re.fullmatch(pattern, var)), UNREVIEWED)


def reviewed_elsewhere(s: Settings, engine: str) -> dict[str, tuple[str, list[str]]]:
    """{variable: (kind, choices)} that the other engines' flag tables review, at the versions `s` pins: engine.env is
    shared by the host's engines (a llama.cpp chat service beside vLLM), and each reads only its own variables."""
    found: dict[str, tuple[str, list[str]]] = {}
    for d in engines.DESCRIPTORS.values():
        if d.name == engine:
            continue
        try:
            table = load_table(d.name, getattr(s, d.version_setting), d.label, d.version_setting)
        except ValueError:  # a version with no table: that engine's own check names it, where it runs
            continue
        found = {**table.reviewed_env(), **found}
    return found


def env_problems(env: dict[str, str], table: FlagTable, label: str, own_prefixes: tuple[str, ...],
                 refused_flags: dict[str, str], skip: Callable[[str], bool], s: Settings,
                 engine: str) -> list[str]:
    """Each variable of `env` that the allow-list refuses, one line each (never its value).

    `table`: the pinned flag table of `engine`, the engine this check is for (the host's, or a chat service's);
    `own_prefixes`: that engine's own variables (Engine.env_prefixes); `refused_flags`: {variable: flag} of the
    table's flags another check refuses (a secret, an admin surface, a setting's); `skip(var)`: another check names
    it already. `s.sim_engine_knobs` opens the simulator's knobs; on a tensor-parallel group's member
    (`s.tensor_parallel_hosts`) release/group.py names the variables sparkfleet derives."""
    owned = {*group.UNPINNED_ENV, *group.FABRIC_ENV, *group.RAY_AUTH_OWNED} if s.tensor_parallel_hosts else set()
    reviewed, forms, found = table.reviewed_env(), table.flag_env(), []
    elsewhere = reviewed_elsewhere(s, engine)
    for var, value in env.items():
        if skip(var) or var in owned:
            continue
        kind: tuple[str, tuple[str, ...] | list[str]] | None = None
        if var in refused_flags:
            found.append(f"engine_env sets {var}, which is {label}'s {refused_flags[var]}: remove it from engine_env")
        elif var in reviewed:
            kind = reviewed[var]
        elif var in forms:
            found.append(f"engine_env sets {var}, the environment form of {label}'s `{forms[var]}`, which is not on "
                         f"sparkfleet's reviewed list for {label} {table.version}: {TABLE_FIX}")
        elif var.startswith(own_prefixes):
            found.append(f"engine_env sets {var}, which is not on sparkfleet's reviewed list for {label} "
                         f"{table.version}: {TABLE_FIX}")
        elif var in GENERAL_ENV:
            kind = GENERAL_ENV[var]
        elif var in elsewhere:
            kind = elsewhere[var]
        elif var.startswith(SIM_PREFIX) and s.sim_engine_knobs:
            kind = (SIM_KIND, ())
        elif var.startswith(SIM_PREFIX):
            found.append(f"engine_env sets {var}, a knob of the simulator's stand-in engines (sim/), which no real "
                         f"engine reads: remove it from engine_env (only the simulator's inventories set "
                         f"sim_engine_knobs = True)")
        else:
            found.append(f"engine_env sets {var}, which {_why(var)}: {ENV_FIX}")
        if kind is not None and (why := value_problem(value, kind[0], kind[1])):
            found.append(f"engine_env sets {var}, whose value {why}: set another value or remove it")
    return found
