"""The recipe catalogue: reviewed, named releases (model, revision policy, engine flags, known facts).

One TOML file per recipe in `recipes/` (installed: `sparkfleet/recipes/`),
named `<name>.toml`. A recipe carries what `plan` needs when no hub answers
(the model's config.json facts and the exact weight bytes) and where its
numbers come from. Its `settings` are validated where they are applied (a
chat recipe by `parse_settings`, a service recipe by the service planner),
not here: this module only reads the files and checks their shape.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from sparkfleet import RECIPES_DIR
from sparkfleet.contract.engines import DEFAULT_ENGINE, DESCRIPTORS, ENGINES
from sparkfleet.refused import Refusal

__all__ = ["KINDS", "MODEL_SPECIFIC", "ModelFacts", "Recipe", "RecipeError", "catalogue", "known_model",
           "missing_notes", "neutral_settings", "recipe"]

KINDS = ("chat", "embedding", "reranker")


class RecipeError(ValueError, Refusal):
    """A recipe file that cannot be read or has the wrong shape, or a recipe name the catalogue lacks: one line
    naming the file (or the name) and what is wrong; a refusal (exit 2). A ValueError, as a setting's type refuses
    with one."""


_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")
# The setting that names each engine's version (its flag table); a recipe for that engine sets it.
VERSION_SETTING = {d.name: d.version_setting for d in DESCRIPTORS.values()}
# The image repositories each engine's own project publishes: a recipe whose image is another engine's is refused.
IMAGES = {d.name: d.images for d in DESCRIPTORS.values()}

# The settings that belong to one model, not to the fleet, at their neutral values: what a host serving a model
# no recipe describes gets (parse_settings), instead of the default recipe's Qwen3.5 parsers, attention backend,
# multimodal limits and speculative decoding. Written once here; group_data/all.py's defaults stay the default
# recipe's. max_model_len is not among them: the planner refuses one above the model's own maximum, naming it.
MODEL_SPECIFIC = {
    "tool_call_parser": None,
    "reasoning_parser": None,
    "enable_auto_tool_choice": False,  # needs a tool_call_parser
    "attention_backend": None,  # the engine's own choice
    "limit_mm_per_prompt": None,  # no --limit-mm-per-prompt: vLLM takes it for multimodal models only
    "speculative_method": None,
    "num_speculative_tokens": None,
}
_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def neutral_settings(model_repo: str) -> dict:
    """MODEL_SPECIFIC, and the served name the repository's own (OWNER/NAME -> NAME) rather than another model's."""
    name = model_repo.rsplit("/", 1)[-1]
    return {**MODEL_SPECIFIC, **({"served_model_name": name} if _SERVED.fullmatch(name) else {})}


@dataclass(frozen=True)
class ModelFacts:
    """What is known about a model without asking its hub."""

    repo: str
    weight_bytes: int  # sum of the *.safetensors file sizes the hub lists
    config: dict  # the config.json facts the planner reads (text_config nested as in the real file)


@dataclass(frozen=True)
class Recipe:
    name: str
    kind: str
    summary: str
    settings: dict
    model: ModelFacts
    measured: dict = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    # Where each figure comes from: "weight_bytes", "config.<key>" and "measured.<key>" -> a source, or
    # "estimate: ..." with how it was computed where no published figure confirms it.
    notes: dict = field(default_factory=dict)
    # The model runs its repository's own Python (vLLM's --trust-remote-code): allowed only with this and the
    # user's allow_trust_remote_code, since the hub's code then runs as root in the engine container.
    trust_remote_code: bool = False

    @property
    def engine(self) -> str:
        return self.settings.get("engine", DEFAULT_ENGINE)


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RecipeError(f"recipe file {path.name}: cannot be read: {exc}") from None


def _merged(path: Path, seen: tuple[str, ...] = ()) -> dict:
    """The file over the recipe it `extends` (same folder): [settings], [measured] and [notes] merged key by key,
    the model facts inherited when the file has none; `summary` and `sources` are the file's own. A file for
    another engine than its base's inherits no measured figure."""
    data = _read(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str) or not _NAME.fullmatch(parent) or parent in seen + (path.stem,):
        raise RecipeError(f"recipe file {path.name}: `extends` must name another recipe of the folder, without a cycle")
    if not (path.parent / f"{parent}.toml").is_file():
        raise RecipeError(f"recipe file {path.name}: `extends` names {parent!r}, which has no {parent}.toml")
    base = _merged(path.parent / f"{parent}.toml", seen + (path.stem,))
    engines = [d.get("settings", {}).get("engine", DEFAULT_ENGINE) if isinstance(d.get("settings", {}), dict)
               else None for d in (base, data)]
    if engines[0] != engines[1]:  # figures measured on one engine say nothing of another
        base = {**base, "measured": {}, "notes": {k: v for k, v in base.get("notes", {}).items()
                                                  if not str(k).startswith("measured.")}}
    for key in ("settings", "measured", "notes"):
        if isinstance(base.get(key, {}), dict) and isinstance(data.get(key, {}), dict):
            data[key] = {**base.get(key, {}), **data.get(key, {})}
    data.setdefault("model", base.get("model"))
    return {**{k: v for k, v in base.items() if k not in ("sources", "summary")}, **data}


def _parse(path: Path) -> Recipe:
    """One recipe file, or RecipeError naming the file and what is wrong with it.

    `extends = "<name>"` takes the other recipe's settings, measured figures and
    model facts, under this file's own (its `measured` replaces key by key).
    `neutral = [...]` sets those model-specific settings to MODEL_SPECIFIC's value (None, where TOML has no null).
    """
    where = f"recipe file {path.name}"
    data = _merged(path)
    name = data.get("name")
    if name != path.stem or not _NAME.fullmatch(name or ""):
        raise RecipeError(f"{where}: `name` must equal the file name ({path.stem!r}) and be lowercase [a-z0-9.-]")
    if data.get("kind") not in KINDS:
        raise RecipeError(f"{where}: `kind` must be one of {', '.join(KINDS)}")
    model = data.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("repo"), str):
        raise RecipeError(f"{where}: needs a [model] table with `repo`")
    weight_bytes = model.get("weight_bytes")
    if not isinstance(weight_bytes, int) or isinstance(weight_bytes, bool) or weight_bytes <= 0:
        raise RecipeError(f"{where}: [model] `weight_bytes` must be a positive integer (bytes of the *.safetensors)")
    for key, kind in (("settings", dict), ("measured", dict), ("notes", dict), ("sources", list), ("summary", str)):
        if not isinstance(data.get(key, kind()), kind):
            raise RecipeError(f"{where}: `{key}` must be a {kind.__name__}")
    if not isinstance(model.get("config", {}), dict):
        raise RecipeError(f"{where}: [model.config] must be a table")
    if not isinstance(data.get("trust_remote_code", False), bool):
        raise RecipeError(f"{where}: `trust_remote_code` must be true or false")
    if not all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in data.get("notes", {}).items()):
        raise RecipeError(f"{where}: [notes] maps a figure (weight_bytes, config.KEY, measured.KEY) to its source")
    neutral = data.get("neutral", [])
    if not isinstance(neutral, list) or not all(k in MODEL_SPECIFIC for k in neutral):
        raise RecipeError(f"{where}: `neutral` lists settings of {', '.join(MODEL_SPECIFIC)} that this recipe "
                         f"sets to their neutral value (TOML has no null)")
    data["settings"] = {**data.get("settings", {}), **{k: MODEL_SPECIFIC[k] for k in neutral}}
    _check_engine(where, data["settings"])
    return Recipe(
        name=name,
        kind=data["kind"],
        summary=data.get("summary", ""),
        settings=dict(data.get("settings", {})),
        model=ModelFacts(repo=model["repo"], weight_bytes=weight_bytes, config=dict(model.get("config", {}))),
        measured=dict(data.get("measured", {})),
        sources=list(data.get("sources", [])),
        notes=dict(data.get("notes", {})),
        trust_remote_code=data.get("trust_remote_code", False),
    )


def _check_engine(where: str, settings: dict) -> None:
    """A recipe's engine is one sparkfleet knows; one other than the default names its image and version."""
    engine = settings.get("engine", DEFAULT_ENGINE)
    if engine not in ENGINES:
        raise RecipeError(f"{where}: `engine` = {engine!r} is not one of {', '.join(ENGINES)}")
    if engine != DEFAULT_ENGINE and not all(settings.get(k) for k in ("engine_image", VERSION_SETTING[engine])):
        raise RecipeError(f"{where}: an {engine} recipe sets `engine_image` and `{VERSION_SETTING[engine]}`")
    image = str(settings.get("engine_image", "")).split("@")[0]
    repository, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    owner = next((e for e, names in IMAGES.items() if repository in names), engine)
    if owner != engine:
        raise RecipeError(f"{where}: `engine_image` = {image!r} is {owner}'s image, and this recipe's engine is "
                         f"{engine}: set an image of {IMAGES[engine][0]}")
    version, rule = settings.get(VERSION_SETTING[engine]), DESCRIPTORS[engine].version_tag
    if (rule and version and repository == IMAGES[engine][0] and tag.startswith(rule.split("{", 1)[0])
            and tag != rule.format(version=version)):
        raise RecipeError(f"{where}: `engine_image` tag {tag} is not `{VERSION_SETTING[engine]}` {version}: "
                         f"make them agree")


def missing_notes(r: Recipe) -> list[str]:
    """The figures of a recipe that no [notes] entry sources: weight_bytes and each measured value."""
    figures = ["weight_bytes"] + [f"measured.{k}" for k in r.measured if k != "source"]
    return [f for f in figures if f not in r.notes]


@lru_cache(maxsize=4)
def _load(directory: Path) -> dict[str, Recipe]:
    return {r.name: r for r in map(_parse, sorted(directory.glob("*.toml")))}


def catalogue(directory: Path = RECIPES_DIR) -> dict[str, Recipe]:
    """Every recipe by name (read once per directory)."""
    return dict(_load(Path(directory)))


def recipe(name: str, directory: Path = RECIPES_DIR) -> Recipe:
    """The named recipe, or RecipeError listing the catalogue."""
    known = catalogue(directory)
    if name not in known:
        raise RecipeError(f"no recipe named {name!r}; the catalogue has: {', '.join(sorted(known)) or 'nothing'}")
    return known[name]


def known_model(repo: str, directory: Path = RECIPES_DIR) -> ModelFacts | None:
    """The offline facts of a model repository: from the first recipe (by name) that serves it, preferring one
    that carries its config.json facts."""
    facts = [r.model for r in catalogue(directory).values() if r.model.repo == repo]
    return next((f for f in facts if f.config), facts[0] if facts else None)
