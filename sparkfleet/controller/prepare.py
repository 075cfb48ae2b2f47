"""What the controller makes ready for a host before its stages run: nothing here touches a host."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkfleet.controller.copy import controller_copy
from sparkfleet.controller.runtime import Bundle, build_bundle
from sparkfleet.host.preflight import HostFacts
from sparkfleet.release.plan import HostPlan


@dataclass(frozen=True)
class Prepared:
    bundle: Bundle  # the runtime bundle (hub and openai clients) for this host's CPU and Python, and its sha256
    model_copy: Path | None  # the controller's verified copy, when the model is pushed from here


def prepare(plan: HostPlan, facts: HostFacts) -> Prepared:
    s = plan.settings
    copy = controller_copy(plan.manifest, s.controller_model_dir, s.controller_endpoint, token=s.hub_token) \
        if plan.model_role == "controller" else None
    return Prepared(bundle=build_bundle(facts.arch, facts.python), model_copy=copy)
