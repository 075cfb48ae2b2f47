"""engine_env by allow-list, as a whole (issue 50, item 2).

Only the engine's own prefixes (VLLM_, SGLANG_/SGL_, LLAMA_ARG_) used to be checked: PYTHONPATH at the model's
directory ran a hub `sitecustomize.py` as root in the engine, and LD_PRELOAD, BASH_ENV, PYTHONSTARTUP,
PYTHONWARNINGS, NCCL_NET_PLUGIN, TORCHINDUCTOR_CACHE_DIR, HF_ENDPOINT, HF_HUB_OFFLINE=0 and MTMD_BACKEND_DEVICE (the
env form of an unreviewed llama.cpp flag) passed. Now a variable passes only when it is the pinned engine's reviewed
one, one of a few reviewed general ones (each value typed), or, where the inventory opts into the simulator, a knob of
its stand-in engines; each refusal is one line naming the host, the variable, why and the fix, from `plan` and the
deploy alike, before any host is touched."""

import pytest

from sparkfleet import cli
from sparkfleet.contract import engines
from sparkfleet.contract.formats import API_KEY_VARS
from sparkfleet.contract.settings import ADMIN_ENV, SettingsError
from sparkfleet.release import group
from sparkfleet.release.engines import ENGINE_CLASSES
from sparkfleet.release.engines.table import table_versions
from sparkfleet.release.plan import plan_hosts

from .helpers import host_data

SGLANG = dict(engine="sglang", engine_image="lmsysorg/sglang:spark", limit_mm_per_prompt=None,
              attention_backend=None, tool_call_parser="qwen3_coder", reasoning_parser="qwen3")
LLAMA = dict(engine="llamacpp", engine_image="ghcr.io/ggml-org/llama.cpp:server-cuda-b11669",
             model_repo="ggml-org/tiny-GGUF", model_files=["tiny-Q4_K_M.gguf"], served_model_name="tiny",
             max_model_len=4096, limit_mm_per_prompt=None, attention_backend=None, tool_call_parser=None,
             reasoning_parser=None, enable_auto_tool_choice=False)
ENGINE: dict[str, dict] = {"vllm": {}, "sglang": SGLANG, "llamacpp": LLAMA}
MODEL_DIR = "/var/lib/sparkfleet/models/Qwen--Qwen3.5-35B-A3B-FP8"  # where the hub's files land (model_root)
# The inventory of a simulated fleet (inventory/sim.py) opts into its stand-ins' knobs; a real one does not.
SIM = {"sim_engine_knobs": True}


def problems(**data) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("spark-x", host_data(**data))], resolve=False)
    return caught.value.problems


def accepted(**data):
    [plan] = plan_hosts([("spark-x", host_data(**data))], resolve=False)
    return plan


def the_line(found: list[str], var: str) -> str:
    """The one refusal that names `var`: one line, the host first, the fix after the reason."""
    lines = [p for p in found if f" {var}," in p or f" {var} " in p]
    assert len(lines) == 1, (var, found)
    line = lines[0]
    assert line.startswith(f"spark-x: engine_env sets {var}, ") and "\n" not in line, line
    return line


# The review's payloads: each loads code or bytes sparkfleet did not pin, or points the hub client elsewhere.
HOSTILE = [
    ("PYTHONPATH", MODEL_DIR, "import modules"),  # a hub sitecustomize.py, run as root at the interpreter's start
    ("LD_PRELOAD", f"{MODEL_DIR}/libx.so", "dynamic loader"),
    ("BASH_ENV", f"{MODEL_DIR}/x.sh", "shell"),
    ("PYTHONSTARTUP", f"{MODEL_DIR}/x.py", "Python"),
    ("PYTHONWARNINGS", "error::evilmod.Warning", "Python"),
    ("NCCL_NET_PLUGIN", f"{MODEL_DIR}/libnccl-net-x.so", "NCCL"),
    ("TORCHINDUCTOR_CACHE_DIR", f"{MODEL_DIR}/inductor", "PyTorch"),
    ("HF_ENDPOINT", "http://evil.example", "hub client"),
    ("HF_HUB_OFFLINE", "0", "hub client"),
    ("TRANSFORMERS_CACHE", MODEL_DIR, "hub client"),
    ("MY_SECRET", "s3cr3t-env", "not on sparkfleet's reviewed list"),
]


@pytest.mark.parametrize("engine", engines.ENGINES)
@pytest.mark.parametrize("var,value,why", HOSTILE, ids=[v for v, _, _ in HOSTILE])
def test_a_loader_or_hub_variable_is_refused_whichever_engine_runs(engine, var, value, why):
    line = the_line(problems(**ENGINE[engine], engine_env={var: value}), var)
    assert why in line and "not on sparkfleet's reviewed list" in line, line
    assert "remove it from engine_env" in line and "docs/settings.md" in line, line
    assert value not in line or len(value) < 3, line  # engine_env is a secret setting: its value never shown


def test_the_env_form_of_an_unreviewed_llamacpp_flag_is_refused_naming_the_flag():
    line = the_line(problems(**LLAMA, engine_env={"MTMD_BACKEND_DEVICE": "CUDA0"}), "MTMD_BACKEND_DEVICE")
    assert "`--mmproj-device`" in line and "not on sparkfleet's reviewed list for llama.cpp 11669" in line, line
    assert "remove it from engine_env" in line
    # on another engine it is no reviewed variable either (a llama.cpp service beside vLLM reads the same file)
    the_line(problems(engine_env={"MTMD_BACKEND_DEVICE": "CUDA0"}), "MTMD_BACKEND_DEVICE")


# The engines whose pinned table maps variables to flags (llama.cpp's LLAMA_ARG_*, MTMD_BACKEND_DEVICE, HF_TOKEN).
MAPPED = [name for name in engines.ENGINES
          if ENGINE_CLASSES[name].flag_table(table_versions(name)[-1]).flag_env()]


def test_a_pinned_table_maps_variables_to_flags():
    assert "llamacpp" in MAPPED


@pytest.mark.parametrize("name", MAPPED)
def test_every_env_form_of_a_flag_is_refused_unless_the_flag_is_reviewed(name):
    """Every variable the pinned table maps to a flag: refused (one line each) unless the flag is reviewed."""
    engine = ENGINE_CLASSES[name]
    table = engine.flag_table(table_versions(name)[-1])
    keyless = {var: flag for var, flag in table.flag_env().items() if var not in (*API_KEY_VARS, engine.key_var)}
    reviewed = {var for var, flag in keyless.items() if table.canonical(flag) in table.reviewed}
    unreviewed = sorted(set(keyless) - reviewed - set(ADMIN_ENV))
    assert "MTMD_BACKEND_DEVICE" in unreviewed or name != "llamacpp"
    found = problems(**ENGINE[name], engine_env=dict.fromkeys(unreviewed, "1"))
    for var in unreviewed:
        the_line(found, var)
    assert reviewed and all(v in table.reviewed_env() for v in reviewed)  # what reviewed_env passes, typed


def test_the_cli_plan_refuses_with_exit_2_and_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver",
                        lambda s: (None, None, "offline test: no hub is asked"))
    inventory = tmp_path / "fleet.py"
    inventory.write_text(f"sparks = [('spark-x', {{'engine_env': {{'PYTHONPATH': {MODEL_DIR!r}}}}})]\n")
    code = cli.main(["plan", str(inventory)])
    printed = capsys.readouterr()
    lines = [line for line in (printed.out + printed.err).splitlines() if "PYTHONPATH" in line]
    assert code == 2 and len(lines) == 1 and MODEL_DIR not in printed.out + printed.err, printed
    assert "spark-x: engine_env sets PYTHONPATH, which makes Python import modules" in lines[0], lines


def test_the_deploy_refuses_before_any_host_is_touched(tmp_path, monkeypatch):
    """deploy.py's plan (controller/inventory.py plan_for): DeployRefused, which pyinfra prints touching no host;
    no hub or registry is asked."""
    from pyinfra.api import Config, Inventory, State

    from sparkfleet.controller import inventory
    from sparkfleet.controller.inventory import DeployRefused, plan_for

    asked = []
    monkeypatch.setenv("SPARKFLEET_LOCK", str(tmp_path / "sparkfleet.lock"))
    monkeypatch.setattr(inventory, "hub_resolver", lambda s: asked.append("hub") or (None, None, "offline"))
    monkeypatch.setattr(inventory, "image_resolver", lambda s: asked.append("registry") or (None, "offline"))
    hosts = Inventory(([("spark-x", host_data(engine_env={"LD_PRELOAD": f"{MODEL_DIR}/libx.so"}))], {}))
    with pytest.raises(DeployRefused) as refused:
        plan_for(State(hosts, Config()), hosts.get_host("spark-x"))
    text = str(refused.value)
    assert "no host was changed" in text and "spark-x: engine_env sets LD_PRELOAD, which " in text, text
    assert "libx.so" not in text and not asked, (text, asked)


# a llama.cpp chat model beside the host's vLLM one (tests/unit/test_service_engines.py): both read engine.env
LLAMA_SERVICE = {"llama": {"recipe": "qwen3-8b-gguf", "model_repo": "sparkfleet-sim/Tiny-Llama-GGUF",
                           "model_files": ["Tiny-Llama-00001-of-00002.gguf", "Tiny-Llama-00002-of-00002.gguf"],
                           "engine_image": "ghcr.io/ggml-org/llama.cpp:server-cuda-b11669", "llamacpp_version": "11669",
                           "served_model_name": "tiny-llama", "max_model_len": 2048, "api_port": 8004}}


def test_engine_env_shared_by_a_hosts_engines_passes_each_ones_reviewed_variables_and_refuses_their_flags():
    """engine.env is read by every engine container of the host: a variable one engine's table reviews passes (the
    other does not read it); the env form of either's refused or unreviewed flag is refused, one line each."""
    env = {"VLLM_LOGGING_LEVEL": "DEBUG", "LLAMA_ARG_FLASH_ATTN": "on", "TZ": "UTC"}
    accepted(services=LLAMA_SERVICE, engine_env=env)
    found = problems(services=LLAMA_SERVICE, engine_env={"LLAMA_ARG_TOOLS": "all", "MTMD_BACKEND_DEVICE": "CUDA0",
                                                         "VLLM_TOOL_PARSER_PLUGIN": "p"})
    assert any(p.startswith("spark-x: service 'llama': engine_env sets LLAMA_ARG_TOOLS, which is llama.cpp's --tools")
               for p in found), found
    assert any(p.startswith("spark-x: service 'llama': engine_env sets MTMD_BACKEND_DEVICE, the environment form of "
                            "llama.cpp's `--mmproj-device`") for p in found), found
    assert any(p.startswith("spark-x: engine_env sets VLLM_TOOL_PARSER_PLUGIN, which is not on sparkfleet's reviewed "
                            "list for vLLM") for p in found), found
    assert not [p for p in found if "engine_env sets" not in p], found


# --- the reviewed general variables: accepted, each value typed ------------------------------------------------

GOOD_GENERAL = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                "NCCL_SOCKET_IFNAME": "enp1s0f0np0", "NCCL_IB_DISABLE": "1", "OMP_NUM_THREADS": "8",
                "TOKENIZERS_PARALLELISM": "false", "TZ": "Europe/Berlin"}


def test_the_general_list_is_short_and_each_of_its_variables_is_typed():
    from sparkfleet.release.engines.environment import GENERAL_ENV

    assert set(GENERAL_ENV) == set(GOOD_GENERAL)  # a new one is reviewed here, in docs/settings.md and its test


@pytest.mark.parametrize("engine", engines.ENGINES)
def test_the_reviewed_general_variables_pass_on_every_engine(engine):
    env = accepted(**ENGINE[engine], engine_env=GOOD_GENERAL).render_engine_env().splitlines()
    assert {f"{var}={value}" for var, value in GOOD_GENERAL.items()} <= set(env)
    accepted(**ENGINE[engine], engine_env={"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "^lo,docker0",
                                           "TZ": "UTC", "NCCL_DEBUG": "WARN"})


BAD_GENERAL = [
    ("CUDA_VISIBLE_DEVICES", "GPU-0;x"), ("CUDA_VISIBLE_DEVICES", "0 1"), ("CUDA_VISIBLE_DEVICES", ""),
    ("NCCL_DEBUG", "INFO,x"), ("NCCL_SOCKET_IFNAME", "eth0 ; x"), ("NCCL_SOCKET_IFNAME", "a-name-longer-than-15"),
    ("NCCL_IB_DISABLE", "2"), ("OMP_NUM_THREADS", "0"), ("OMP_NUM_THREADS", "1e9"),
    ("TOKENIZERS_PARALLELISM", "yes"), ("TZ", "/models/x/zone"), ("TZ", ":/etc/x"), ("TZ", "../../models/x"),
    ("NCCL_DEBUG_SUBSYS", "A B"),
]


@pytest.mark.parametrize("var,value", BAD_GENERAL, ids=[f"{v}={x!r}" for v, x in BAD_GENERAL])
def test_a_general_variables_value_out_of_its_kind_is_refused(var, value):
    line = the_line(problems(engine_env={var: value}), var)
    assert ", whose value " in line and "set another value or remove it" in line, line
    assert value not in line or len(value) < 3, line


def test_a_general_variable_sparkfleet_derives_on_a_group_member_is_refused_once():
    """NCCL_SOCKET_IFNAME is harmless on one host; on a member of a tensor-parallel group sparkfleet derives it from
    fabric_interface: group.py's line, not a second one."""
    member = dict(tensor_parallel_hosts=["spark-x", "spark-y"], tensor_parallel_size=2, fabric_address="10.0.0.1")
    found = problems(**member, engine_env={"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "RAY_ADDRESS": "10.0.0.9:6379"})
    assert len([p for p in found if "NCCL_SOCKET_IFNAME" in p]) == 1
    assert len([p for p in found if "RAY_ADDRESS" in p]) == 1
    assert any("which sparkfleet derives from fabric_interface" in p and "NCCL_SOCKET_IFNAME" in p for p in found)


def test_no_general_or_reviewed_variable_is_an_unreviewed_flags_env_form_in_any_pinned_table():
    """engine.env is shared by a host's engines (a llama.cpp service beside vLLM reads it): a variable one engine's
    review passes must not be another engine's unreviewed flag, nor an admin, key or fabric variable."""
    from sparkfleet.release.engines.environment import GENERAL_ENV

    tables = [ENGINE_CLASSES[name].flag_table(version) for name in engines.ENGINES for version in table_versions(name)]
    passed = set(GENERAL_ENV) | {var for table in tables for var in table.reviewed_env()}
    for table in tables:
        for flag, spec in table.flags.items():
            var = spec.get("env")
            if var in passed and table.canonical(flag) not in table.reviewed and not spec.get("negates"):
                pytest.fail(f"{var} passes, and is {table.label} {table.version}'s unreviewed {flag}")
    owned = {*ADMIN_ENV, *API_KEY_VARS, *group.FABRIC_ENV, *group.RAY_AUTH_OWNED, *group.UNPINNED_ENV}
    assert not set(GENERAL_ENV) & (owned - {"NCCL_SOCKET_IFNAME"})  # NCCL's interface: a single host's own choice
    assert not [var for var in GENERAL_ENV if var.startswith(("SIM_", "VLLM_", "SGLANG_", "SGL_", "LLAMA_"))]


# --- the simulator's knobs: only where the inventory opts into the simulator --------------------------------------

def test_a_real_inventory_cannot_set_a_simulator_knob():
    line = the_line(problems(engine_env={"SIM_TOKENS_PER_S": "50"}), "SIM_TOKENS_PER_S")
    assert "simulator" in line and "sim_engine_knobs" in line and "remove it from engine_env" in line, line


@pytest.mark.parametrize("engine", engines.ENGINES)
def test_the_simulators_inventory_sets_its_knobs(engine):
    """What inventory/sim.py and the e2e tests set (SIM_TOKENS_PER_S, SIM_FIRST_TOKEN_DELAY_MS, SIM_FAIL_HEALTH,
    SIM_LOAD_DELAY_S ...) passes there, and reaches engine.env."""
    knobs = {"SIM_TOKENS_PER_S": "30", "SIM_FIRST_TOKEN_DELAY_MS": "100", "SIM_FAIL_HEALTH": "1",
             "SIM_LOAD_DELAY_S": "0.5", "SIM_SPEC_ACCEPTANCE_RATE": "0.7"}
    env = accepted(**ENGINE[engine], **SIM, engine_env=knobs).render_engine_env().splitlines()
    assert {f"{var}={value}" for var, value in knobs.items()} <= set(env)


@pytest.mark.parametrize("var,value", [
    ("PYTHONPATH", MODEL_DIR), ("LD_PRELOAD", "/x.so"), ("HF_ENDPOINT", "http://evil.example"),
    ("SIM_KNOB_FILE", f"{MODEL_DIR}/knobs.json"), ("SIM_X", "http://evil.example"), ("SIM_X", "a" * 33),
    ("SIM_X", "a b"), ("SIM_X", "org/repo"), ("SIM_X", "--flag"),
])
def test_the_simulator_opt_in_passes_no_other_variable_and_no_untyped_value(var, value):
    """sim_engine_knobs opens SIM_* alone, each a short word or number: set on a real fleet, it passes nothing a
    real engine reads, and no path, URL or repository."""
    line = the_line(problems(**SIM, engine_env={var: value}), var)
    assert value not in line, line
