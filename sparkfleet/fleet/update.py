"""`sparkfleet update INVENTORY [--limit HOST] [--json]`: move the lock to what the hubs and registries serve now.

Plans and converges read the lock (`controller/inventory.py` `locked`), so a hub's new commit or a registry's moved tag
changes nothing until this command re-resolves the selected hosts' models and images, shows what moves (old ->
new, the files whose bytes differ, the hosts whose release changes and so restart) and writes the new lock; a
rollout then applies it, batch by batch. An entry is shared by every host naming the same coordinate, so the
hosts that restart are counted over the whole inventory, not only under `--limit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.controller import inventory
from sparkfleet.release.lock import Change, Lock, Locking, changes
from sparkfleet.release.plan import HostPlan, plan_hosts
from sparkfleet.tables import clean


class UpdateError(RuntimeError):
    """A hub or registry did not answer: nothing was written."""


@dataclass
class UpdateReport:
    lock: Path
    changes: list[Change]
    restart: dict[str, tuple[str | None, str | None]]  # host -> (release now, release after the rollout)
    written: bool
    added: list[str] = field(default_factory=list)  # entries the lock lacked (resolved and added, no move)

    def to_dict(self) -> dict:
        return {"lock": str(self.lock), "changes": [c.to_dict() for c in self.changes], "written": self.written,
                "restart": {h: {"old_release": old, "new_release": new} for h, (old, new) in self.restart.items()},
                "added": self.added}


def _unresolved(plans: list[HostPlan]) -> list[str]:
    """Each host's model, service model and image that its resolvers could not answer (their words quote a hub
    or a registry: clean, so the refusal stays one line)."""
    found = []
    for p in plans:
        if p.is_service:
            continue  # no model, no image
        found += [f"{p.name}: {p.hub_error}"] if p.manifest is None else []
        found += [f"{p.name}: {p.image_error}"] if p.image_pin is None else []
        found += [f"{p.name}: service {svc.name!r}: {svc.hub_error}" for svc in p.services if not svc.manifest]
        found += [f"{p.name}: service {svc.name!r}: {svc.image_error}" for svc in p.services
                  if svc.image and not svc.image_pin]
    return [clean(line) for line in found]


def _asked_nothing(s):
    return None, None, f"{s.model_repo}: not in the lock"


def _asked_no_image(s):
    return None, f"{s.engine_image}: not in the lock"


def lock_update(old: Lock, everyone: list[tuple[str, dict]], chosen: list[tuple[str, dict]],
                resolve, resolve_image) -> tuple[Lock, Lock, list[Change], dict]:
    """(the lock with what it lacked added, the updated lock, what moves, {host: (release, new release)}).

    The whole inventory is planned from the lock as a converge would, `chosen` again from `resolve` /
    `resolve_image` alone, then the whole inventory from the updated lock; raises UpdateError when any model or
    image cannot be resolved."""
    base = Locking(old, resolve, resolve_image)
    before = plan_hosts(everyone, resolve=base.model, resolve_image=base.image)
    fresh = Locking(Lock(), resolve, resolve_image)
    problems = _unresolved(before) + _unresolved(plan_hosts(chosen, resolve=fresh.model, resolve_image=fresh.image))
    if problems:
        raise UpdateError("; ".join(dict.fromkeys(problems)))
    completed = old.merged(base.added)
    new = completed.merged(fresh.added)
    after = Locking(new, _asked_nothing, _asked_no_image)
    releases = {p.name: p.release_id for p in plan_hosts(everyone, resolve=after.model, resolve_image=after.image)}
    restart = {p.name: (p.release_id, releases[p.name]) for p in before if p.release_id != releases[p.name]}
    return completed, new, changes(completed, new), restart


def update(inventory_path: str, limit: str | None = None) -> UpdateReport:
    """Re-resolve the hosts under `limit` (all by default) and write the lock when anything moved or was added."""
    path = inventory.lock_path()
    old = inventory.read_lock(path)
    everyone = inventory.load_hosts(inventory_path)
    chosen = inventory.load_hosts(inventory_path, limit) if limit else everyone
    completed, new, moved, restart = lock_update(old, everyone, chosen, inventory.hub_resolver,
                                                 inventory.image_resolver)
    added = sorted({*completed.models, *completed.images} - {*old.models, *old.images})
    written = bool(moved or added)
    if written:
        inventory.write_lock(path, new)
    return UpdateReport(path, moved, restart, written, added)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def change_lines(c: Change) -> list[str]:
    """A change in full (no commit or digest shortened: they are what a reviewer compares)."""
    if c.kind == "image":
        return [f"image {c.key}: {c.old or 'not locked'} -> {c.new} (pulled by digest)"]
    names = ", ".join(c.files[:5]) + (f" and {len(c.files) - 5} more" if len(c.files) > 5 else "")
    return [f"model {c.key}: {c.old or 'not locked'} -> {c.new}",
            f"  changed: {len(c.files)} file(s), {_size(c.changed_bytes)} ({names}); "
            f"the new model directory holds {_size(c.total_bytes)}"]
