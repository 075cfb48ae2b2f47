"""`sparkfleet fetch INVENTORY`: the controller's verified copy of each host's model (model_source = "controller")."""

from __future__ import annotations

import json

from sparkfleet.commands import common
from sparkfleet.refused import FAILED, Refused

NAME = "fetch"
HELP = ("make the controller's verified copy of each host's model (for model_source = \"controller\": air-gapped "
        "offices)")


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    common.as_json(parser, "print the copies made as JSON")


def run(args) -> int:
    from sparkfleet.controller.copy import ControllerCopyError, controller_copy
    from sparkfleet.controller.inventory import load_hosts, locked_plans, spark_hosts

    plans = locked_plans(spark_hosts(load_hosts(args.inventory, args.limit)), images=False)
    done, copies = set(), []
    for plan in plans:
        s = plan.settings
        if plan.manifest is None:
            raise Refused(f"{plan.name}: {plan.hub_error}", FAILED)
        if plan.manifest.digest in done:
            continue
        try:
            path = controller_copy(plan.manifest, s.controller_model_dir, s.controller_endpoint, token=s.hub_token)
        except ControllerCopyError as exc:
            raise Refused(str(exc), FAILED) from exc
        done.add(plan.manifest.digest)
        copies.append({"repo": plan.manifest.repo, "pin": plan.manifest.pin, "files": len(plan.manifest.files),
                       "path": str(path)})
        if not args.json:
            print(f"{plan.manifest.repo}@{plan.manifest.pin}: {len(plan.manifest.files)} files verified in {path}")
    if args.json:
        print(json.dumps({"copies": copies}, indent=2))
    return 0
