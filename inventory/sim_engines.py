"""The simulated fleet with one engine per Spark behind the front door (inventory/sim_front_door.py's door-1):
spark-1 vLLM (the stand-in, the default recipe), spark-2 SGLang (the stand-in), spark-3 llama.cpp (Debian sid's
real llama-server on the hub's tiny GGUF chat model, on CPU). Each serves its own model name, so the front door
routes a request by the model it asks for.

    python -m sim up --hosts 3
    pyinfra inventory/sim_engines.py deploy.py

The engine images are the ones `sim up` pushed into the sim registry (state.json "engine_images").
"""

import runpy as _runpy
from pathlib import Path as _Path

_door = _runpy.run_path(str(_Path(__file__).resolve().parent / "sim_front_door.py"))
_state = _door["_state"]
_images = _state.get("engine_images")
_hub = _state["hub"]
if not _images or "gguf_repo" not in _hub:
    raise RuntimeError("the simulated fleet predates the SGLang and llama.cpp images: `python -m sim up` again")
_ENGINES = {
    "spark-2": {  # SGLang 0.5.23 (the vLLM stand-in's sglang mode) on the same checkpoint
        "engine": "sglang",
        "engine_image": _images["sglang"],
        "sglang_version": "0.5.23",
        "served_model_name": "Qwen3.5-35B-A3B-sglang",
        "attention_backend": None,  # vLLM's FLASH_ATTN is no SGLang name: SGLang picks its own
    },
    "spark-3": {  # the real llama-server; a GGUF model and none of vLLM's parsers or multimodal limits
        "engine": "llamacpp",
        "engine_image": _images["llamacpp"],
        "llamacpp_version": _images["llamacpp"].rpartition("-b")[2],  # ...:server-cuda-b<build>
        "model_repo": _hub["gguf_repo"],
        "model_files": list(_hub["gguf_files"]),
        "served_model_name": "tiny-llama",
        "max_model_len": 2048,
        "enable_auto_tool_choice": False,
        "tool_call_parser": None,
        "reasoning_parser": None,
        "attention_backend": None,
        "limit_mm_per_prompt": None,
        "engine_env": {},  # the SIM_* pace knobs are the stand-ins'; llama.cpp runs at its own speed
    },
}
_names = [name for name, _ in _door["sparks"]]
if _names[:3] != ["spark-1", "spark-2", "spark-3"]:
    raise RuntimeError(f"inventory/sim_engines.py needs spark-1..spark-3, the fleet has {_names}: "
                       "`python -m sim up --hosts 3`")

# spark-1 keeps the defaults (group_data/all.py): vLLM serving "Qwen3.5-35B-A3B"
sparks = [(name, {**data, **_ENGINES.get(name, {})}) for name, data in _door["sparks"][:3]]
front_door = _door["front_door"]
monitoring = _door["monitoring"]
