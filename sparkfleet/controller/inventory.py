"""Read a pyinfra inventory the way `pyinfra` does (group_data included), and plan it once per run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyinfra.api import State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state
from pyinfra_cli.exceptions import UnexpectedExternalError
from pyinfra_cli.inventory import make_inventory

import sparkfleet
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.host.run import Run, run_of
from sparkfleet.release.image import image_resolver
from sparkfleet.release.lock import Lock, LockError, Locking, parse_lock
from sparkfleet.release.plan import HostPlan, plan_hosts
from sparkfleet.contract.monitoring import is_service_host
from sparkfleet.contract.settings import GROUPS_KEY, USER_SET_KEY, SettingsError
from sparkfleet.refused import Refused
from sparkfleet.roles.pki import plans_ca
from sparkfleet.controller.checks import ROLE_GROUPS, check_inventory, duplicate_entries


def host_data(host) -> dict:
    """The host's merged data, plus (USER_SET_KEY) the keys that `--data`, its inventory entry or its groups set.

    The "all" layer (group_data/all.py and the inventory's all-data) is left out of that list: it holds the
    defaults, so there only a value that differs from the default counts as set (settings.user_set).
    """
    inventory = host.inventory
    named = {*host.data.override_datas, *inventory.get_override_data(), *inventory.get_host_data(host.name),
             *inventory.get_groups_data(host.groups)}
    return {**host.data.dict(), USER_SET_KEY: sorted(named), GROUPS_KEY: inventory_groups(host)}


def inventory_groups(host) -> list[str]:
    """The host's groups less the one pyinfra adds: it puts every host in a group named after the inventory file
    (inventory/office.py: `office`) unless the file defines one of that name, and that group says nothing of a
    host's role. It is not told apart by name (pyinfra keeps no file name), so one group holding every host, other
    than sparkfleet's own (front_door, monitoring, chat_ui: checks.ROLE_GROUPS), is left out: where the file has
    such a group of its own too, the host is still in it (a Spark). Only a file named after its own all-hosts
    group (sparks.py holding `sparks`) is misread."""
    inventory = host.inventory
    everyone = [g for g in sorted(host.groups)
                if g not in ROLE_GROUPS and len(inventory.groups.get(g, ())) == len(inventory)]
    return sorted(g for g in host.groups if g not in everyone[:1])


def spark_hosts(hosts: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The Sparks of [(host name, merged data)]: the service hosts (monitoring.is_service_host) left out, for the
    readers that ask engines (status, bench, testinfra's engine checks)."""
    return [(name, data) for name, data in hosts if not is_service_host(data.get(GROUPS_KEY, ()))]


class InventoryError(SettingsError):
    """The inventory's own code failed (a file it reads is missing, a typo): one line naming the inventory and
    the error, instead of pyinfra's `UnexpectedExternalError: <exception str() failed>`."""

    heading = None  # its one line says what it is: no "invalid settings" above it

    def __init__(self, inventory_path: str, exc: BaseException):
        if isinstance(exc, OSError) and exc.filename:
            why = f"{type(exc).__name__}: {exc.filename}: {exc.strerror}"
        else:
            why = f"{type(exc).__name__}: {exc}"
        super().__init__([f"inventory {inventory_path} failed to load: {why[:300]}: fix it, or create what it reads"])


class NotInInventory(Refused):
    """No inventory file at the path given, or no host or group of the name given in it: a refusal (exit 2)."""


def project_of(inventory_path: str | os.PathLike) -> Path:
    """The project an inventory belongs to, wherever the command runs from: the nearest folder holding group_data/
    or deploy.py, from the inventory's own folder up (a project of `init`: its folder; the checkout's
    inventory/sim.py: the checkout, whose group_data/ and deploy.py sit above inventory/), else the inventory's
    folder. Its group_data/ is the one read (pyinfra's cwd, and its own, handed to make_inventory), its deploy.py
    the one run (`fleet/converge.py` `deploy_path`), its sparkfleet.lock and .cache/ the ones used (`project_for`).
    The current directory plays no part: a stray group_data/ beside the command is never read."""
    folder = Path(os.path.abspath(inventory_path)).parent.resolve()  # as pyinfra names the inventory's folder
    for candidate in (folder, *folder.parents):
        if (candidate / "group_data").is_dir() or (candidate / "deploy.py").is_file():
            return candidate
    return folder


@contextmanager
def project_for(inventory_path: str | os.PathLike | None) -> Iterator[Path]:
    """While a command works on an inventory: `sparkfleet.PROJECT_ROOT` is its project (`project_of`), so the lock
    (`lock_path`), the controller's cache (`model/hubs.py` `cache_dir`) and the CA key's place check
    (`contract/private_files.py`) resolve there; put back after. Without an inventory it changes nothing."""
    before = sparkfleet.PROJECT_ROOT
    if inventory_path:
        sparkfleet.PROJECT_ROOT = project_of(inventory_path)
    try:
        yield sparkfleet.PROJECT_ROOT
    finally:
        sparkfleet.PROJECT_ROOT = before


def read_inventory(inventory_path: str, override_data: dict | None = None):
    """pyinfra's make_inventory in the inventory's project: sparkfleet's defaults (the package's group_data/, pyinfra's
    cwd slot: read first), then the project's group_data/ over them (`project_of`; pyinfra reads the inventory's
    folder's itself), the current directory's never. The defaults are beneath a checkout's and an installed copy's
    host data alike (contract/settings.py merges them again: a deploy run by plain pyinfra may lack them)."""
    defaults = sparkfleet.DEFAULTS_FILE.parent  # its group_data/ folder
    project = project_of(inventory_path)
    inventory_folder = Path(os.path.abspath(inventory_path)).parent.resolve()
    own = [] if project in (inventory_folder, defaults.parent) else [str(project / "group_data")]
    return make_inventory(os.path.abspath(inventory_path), cwd=str(defaults.parent), group_data_directories=own,
                          override_data=override_data or {})


def load_hosts(inventory_path: str, limit: str | None = None) -> list[tuple[str, dict]]:
    """[(host name, merged data)] in inventory order; `limit` is a host or group name. The group_data/ read is its
    project's (`project_of`), not the current directory's. An inventory that fails to load raises InventoryError;
    a missing file or an unknown `limit`, NotInInventory."""
    if not Path(inventory_path).exists():
        raise NotInInventory(f"no inventory file at {inventory_path}")
    try:
        with ctx_state.use(State()):
            inventory = read_inventory(inventory_path)
            duplicated = duplicate_entries(inventory_path)  # pyinfra merged them: the file read as written
    except UnexpectedExternalError as exc:  # the inventory's (or a group_data file's) code raised
        raise InventoryError(inventory_path, exc.exception) from None
    except SyntaxError as exc:  # pyinfra compiles it outside its wrapper
        raise InventoryError(inventory_path, exc) from None
    if duplicated:
        raise SettingsError(duplicated)
    hosts = [(h.name, host_data(h)) for h in inventory]
    if limit:
        hosts = [(n, d) for n, d in hosts if n == limit or limit in inventory.get_host(n).groups]
        if not hosts:
            raise NotInInventory(f"no host or group named {limit!r} in {inventory_path}")
    return hosts


def group_hosts(inventory_path: str, group: str) -> list[tuple[str, dict]]:
    """The hosts of the inventory's `group` [(name, merged data)] in inventory order; none without that group (or
    without the inventory: nothing to ask). The front doors and the monitoring hosts are found this way."""
    try:
        return load_hosts(inventory_path, limit=group)
    except NotInInventory:
        return []


class DeployRefused(PyinfraError):
    """Raised inside deploy.py: pyinfra prints the message, not a traceback, and touches no host."""


LOCK_ENV = "SPARKFLEET_LOCK"  # where the project's lock is, when not PROJECT_ROOT/sparkfleet.lock


def lock_path() -> Path:
    """The project's lock file: $SPARKFLEET_LOCK, else sparkfleet.lock in the project (beside deploy.py: the
    inventory's project while a command runs, `project_for`), read when asked, never at import."""
    return Path(os.environ.get(LOCK_ENV) or Path(sparkfleet.PROJECT_ROOT) / "sparkfleet.lock")


def read_lock(path: Path) -> Lock:
    """The lock at `path` (an empty one when there is none yet), or LockError: one line, the file and the fix."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Lock()
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(path, f"unreadable ({type(exc).__name__}: {getattr(exc, 'strerror', None) or exc})") from None
    return parse_lock(text, path)


def write_lock(path: Path, lock: Lock) -> None:
    """Atomically: a reader sees the old lock or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(lock.render())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@contextmanager
def locked(resolve, resolve_image):
    """The one way plans reach hubs and registries: resolvers answering from the project's lock, asking `resolve`
    / `resolve_image` only for what it lacks; what they added is written to the lock once the block succeeds."""
    path = lock_path()
    locking = Locking(read_lock(path), resolve, resolve_image)
    yield locking
    if locking.added.models or locking.added.images:
        write_lock(path, read_lock(path).merged(locking.added))  # read again: keep what another run wrote since


def shared_resolvers(run: Run, locking: Locking) -> tuple:
    """The locked resolvers, each asked once per run for one model (hub, repo, revision, where from) or one image:
    hosts and services of one model share the answer, so a revision or tag that moves mid-run cannot give two
    hosts two releases. The keys are the settings each resolver reads."""
    def model(s):
        key = (s.model_hub, s.model_repo, s.model_revision, s.controller_endpoint, s.hub_token)
        return run.once("hub", key, lambda: locking.model(s))

    def image(s):
        key = (s.engine_image, s.engine_image_archive, s.controller_registry_url)
        return run.once("image", key, lambda: locking.image(s))

    return model, image


def plans(state) -> dict[str, HostPlan]:
    """Every host's plan (host name -> plan), validated once per pyinfra run from the project's lock; the first
    host to ask plans the whole inventory while the others wait for it."""
    run = run_of(state)

    def plan_inventory():
        with locked(hub_resolver, image_resolver) as locking:
            resolve, resolve_image = shared_resolvers(run, locking)
            hosts = [(h.name, host_data(h)) for h in state.inventory]
            planned = plan_hosts(hosts, resolve=resolve, resolve_image=resolve_image)
            plans_ca(planned)  # the fleet CA's files checked once, before any host is touched
            check_inventory(hosts, planned)  # every check across hosts `plan` makes (controller/checks.py)
            return {p.name: p for p in planned}

    return run.once("plans", "inventory", plan_inventory)


def chat_ui_of(state) -> tuple:
    """The inventory's chat UI (roles/chat_ui.py, None without a group chat_ui) and its image pinned from the
    project's lock (asked of the registry, and added, only the first time), once per run."""
    from sparkfleet.contract.paths import CHAT_UI_GROUP
    from sparkfleet.roles.chat_ui import chat_ui_plan

    run = run_of(state)

    def resolve():
        names = [h.name for h in state.inventory.get_group(CHAT_UI_GROUP, [])]
        ui = chat_ui_plan(names, plans(state))
        if ui is None:
            return None, None
        s = ui.settings.model_copy(update={"engine_image": ui.settings.chat_ui_image, "engine_image_archive": None})
        with locked(hub_resolver, image_resolver) as locking:
            pin, error = locking.image(s)
        if pin is None:  # refusal: host-only: the image's digest is the registry's (the lock's once asked)
            raise SettingsError([f"{ui.host}: setting `chat_ui_image`: {error}"])
        return ui, pin

    try:
        return run.once("chat_ui", "inventory", resolve)
    except SettingsError as exc:  # refusal: planned (chat_ui_plan: controller/checks.py), the pin above aside
        raise DeployRefused(f"invalid chat UI settings; no host was changed:\n{exc}") from None


def plan_for(state, host) -> HostPlan:
    """This host's plan, from the run's one validation of the whole inventory (`plans`)."""
    try:
        plan = plans(state)[host.name]
        if plan.is_service:
            return plan
        # the manifest and the image's digest are the hub's and the registry's (`plan` shows them unresolved
        # offline, and names why online)
        if plan.manifest is None:  # refusal: host-only: the hub's answer
            raise SettingsError([f"{host.name}: {plan.hub_error}"])
        if plan.image_pin is None:  # refusal: host-only: the registry's answer
            raise SettingsError([f"{host.name}: {plan.image_error}"])
        unresolved = [f"{host.name}: service {svc.name!r}: {svc.hub_error}" for svc in plan.services
                      if not svc.manifest]
        unresolved += [f"{host.name}: service {svc.name!r}: {svc.image_error}" for svc in plan.services
                       if svc.image and not svc.image_pin]
        if unresolved:  # refusal: host-only: the hub's and the registry's answers for the services
            raise SettingsError(unresolved)
    except SettingsError as exc:  # refusal: planned (plans: plan_hosts, plans_ca, check_inventory), the hub's aside
        raise DeployRefused(f"invalid settings; no host was changed:\n{exc}") from None
    return plan


def parse_data(items: list[str]) -> dict:
    """`--data KEY=VALUE` items as pyinfra's --data reads them (a number, a bool, a list: Python's literal)."""
    from pyinfra_cli.util import parse_cli_arg

    return {k: parse_cli_arg(v) for k, _, v in (item.partition("=") for item in items)}


def with_data(hosts: list[tuple[str, dict]], items: list[str]) -> list[tuple[str, dict]]:
    """`--data KEY=VALUE` over each host's data, as pyinfra's --data does: the keys count as set by the user."""
    data = parse_data(items)
    return [(name, {**d, **data, USER_SET_KEY: sorted({*d.get(USER_SET_KEY, ()), *data})}) for name, d in hosts]


def locked_plans(hosts: list[tuple[str, dict]], images: bool = True) -> list[HostPlan]:
    """plan_hosts from the project's lock (what it lacks is resolved and added: `locked`); `images` False: no
    registry asked (a fetch needs only the models)."""
    with locked(hub_resolver, image_resolver) as lock:
        planned = plan_hosts(hosts, resolve=lock.model, resolve_image=lock.image if images else None)
    plans_ca(planned)  # the fleet CA's files checked, as a converge checks them
    return planned
