"""Custom pyinfra operations: each ensures one thing, and yields nothing when it holds."""

from __future__ import annotations

import functools
import hashlib
import io
import secrets
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import (
    OperationError,
    OperationValueError,
    QuoteString,
    StringCommand,
    operation,
)
from pyinfra.api.command import FileUploadCommand
from pyinfra.operations import files

from sparkfleet.contract import paths
from sparkfleet.host.facts import (
    KeyringKeys,
    ModelDirs,
    Unreadable,
    docker_image,
    primary_fingerprints,
    read_json_object,
    release_problem,
)
from sparkfleet.host.run import run_of
from sparkfleet.host.state import fact, file_state, unit_files
from sparkfleet.release.group import FABRIC_ENV
from sparkfleet.host.drift import only_on_drift

_INSTALL_ONE_KEY = (
    'set -e; tmp=$(mktemp -d); trap \'gpgconf --homedir "$tmp" --kill all 2>/dev/null; rm -rf "$tmp"\' EXIT; '
    'curl -fsSL --retry 3 --max-filesize 1048576 "$SRC" -o "$tmp/download"; '
    'gpg --homedir "$tmp" --batch --quiet --import "$tmp/download" 2>/dev/null || true; '
    'gpg --homedir "$tmp" --batch --export "$FPR" > "$tmp/key.gpg"; '
    'found=$(gpg --show-keys --with-colons "$tmp/key.gpg" 2>/dev/null'
    ' | awk -F: \'$1 == "pub" {p = 1; next} $1 == "fpr" && p {print $10} {p = 0}\'); '
    '[ "$found" = "$FPR" ] || { echo "the key file at $SRC holds no primary key $FPR:'
    ' check toolkit_key_url and toolkit_key_fingerprint" >&2; exit 1; }; '
    'install -D -m 0644 "$tmp/key.gpg" "$DEST.new" && mv -f "$DEST.new" "$DEST"'
)


@operation()
def fleet_point(what: str):
    """Changes nothing. pyinfra runs the operations of all hosts in an order that keeps each host's sequence (a
    graph of them), so an operation every host calls at one place is a point they meet at: what a host does after
    it runs after what every host did before it."""
    host.noop(what)
    yield from ()


@only_on_drift
@operation()
def apt_keyring(src: str, dest: str, fingerprint: str):
    """A keyring at dest holding exactly one key: the primary key with this fingerprint.

    The download may hold other keys (a mirror's, say): it is imported into a
    throw-away keyring and only the configured key is exported and installed,
    so apt trusts nothing else for the toolkit repository. A keyring holding
    anything else, or nothing readable, is replaced.
    """
    fingerprint = fingerprint.upper()
    if primary_fingerprints(fact(host, KeyringKeys, path=dest)) == [fingerprint]:
        host.noop(f"{dest} holds exactly key {fingerprint}")
        return
    yield StringCommand(
        "SRC=" + shlex.quote(src), "FPR=" + shlex.quote(fingerprint), "DEST=" + shlex.quote(dest),
        "sh -c", QuoteString(_INSTALL_ONE_KEY),
    )


_PULL_PINNED = (
    'docker pull -q "$REF" >/dev/null 2>&1 || { echo "engine image $IMAGE: the registry did not serve'
    ' $DIGEST (the tag moved to other bytes, or the registry lost them): refused, the running release is left'
    ' as it was: re-plan (the controller resolves the tag again) or pin engine_image with @sha256:" >&2; exit 1; }; '
    'got=$(docker image inspect --format "{{range .RepoDigests}}{{.}} {{end}}" "$REF"); '
    'case " $got " in *" $REF "*) ;; *) echo "engine image $IMAGE: pulled as $REF, its digests are $got, not'
    ' $DIGEST: refused" >&2; exit 1;; esac'
)
_LOAD_PINNED = (
    'loaded=$(docker load -q -i "$UPLOAD" 2>&1); rm -f "$UPLOAD"; '
    'got=$(docker image inspect --format "{{.Id}}" "$IMAGE" 2>/dev/null); '
    '[ "$got" = "$DIGEST" ] || { echo "engine image $IMAGE: engine_image_archive loaded image ${got:-none}'
    ' ($loaded), not the planned $DIGEST: refused, the running release is left as it was: re-plan with the'
    ' archive you mean" >&2; exit 1; }'
)


def pinned_present(found: list | None, ref: str, digest: str) -> bool:
    """Whether `docker image inspect <ref>` shows the pinned bytes: the ref among RepoDigests, or the id itself."""
    image = (found or [{}])[0]
    return ref in (image.get("RepoDigests") or []) or image.get("Id") == digest == ref


@only_on_drift
@operation()
def image_pinned(image: str, ref: str, digest: str, archive: str | None = None):
    """The engine image with the planned digest present in the host's Docker, checked after the pull or load.

    `ref` is what the units run: `name@<manifest digest>` (pulled by digest; its RepoDigests must hold it)
    or, with an archive, the image id (loaded; the loaded image's Id must equal it). Other bytes are refused
    with one line naming the image and both digests, before any unit changes.
    """
    if pinned_present(docker_image(host, ref), ref, digest):
        host.noop(f"{image} present as {ref}")
        return
    env = ["IMAGE=" + shlex.quote(image), "REF=" + shlex.quote(ref), "DIGEST=" + shlex.quote(digest)]
    if archive is None:
        yield StringCommand(*env, "sh -c", QuoteString(_PULL_PINNED))
        return
    upload = f"{paths.STATE_DIR}/{Path(archive).name}"
    yield from files.put._inner(src=archive, dest=upload)
    yield StringCommand(*env, "UPLOAD=" + shlex.quote(upload), "sh -c", QuoteString(_LOAD_PINNED))


def _stop(what: Unreadable, then: str) -> OperationError:
    return OperationError(f"{host.name}: {what.source}: {what.problem}: {then}")


@only_on_drift
@operation()
def old_models_removed(model_root: str, keep: list[str]):
    """Model directories beyond the kept releases removed (never one in `keep`).

    Nothing is removed on doubt: a release record that is not a readable JSON
    object, or a listing that is not plain directories under model_root, stops here.
    """
    record = read_json_object(host, paths.RELEASE_FILE)
    if record.unreadable:
        raise _stop(record.unreadable, "no model directory was removed; repair or remove the file by hand")
    present = fact(host, ModelDirs, model_root=model_root)
    if isinstance(present, Unreadable):
        raise _stop(present, "no model directory was removed")
    stale = [d for d in present if d not in keep]
    if not stale:
        host.noop(f"{len(present)} model directories, all kept")
        return
    for directory in stale:
        yield StringCommand("rm -rf", QuoteString(directory))


def named(op):
    """An operation refused when called without `name=`, at the call (pyinfra prints an unnamed operation's
    arguments): the refusal holds whether or not the operation would change anything, and its generator, which
    only_on_drift and pyinfra both ask, does not look at how it was called."""

    @functools.wraps(op)
    def call(*args, **kwargs):
        if not kwargs.get("name"):
            dest = kwargs.get("dest", args[0] if args else "?")
            raise OperationValueError(f"{op.__name__}({dest}) needs name=: pyinfra would print its arguments")
        return op(*args, **kwargs)

    call._inner = op._inner
    return call


@named
@only_on_drift
@operation()
def secret_file(dest: str, content: str):
    """A root-only (0600) file with this content; the content never appears in a command, a log
    or `pyinfra --diff`, and a change is seen by its sha256, not by a diff.

    The bytes land in an empty 0600 file made first in dest's directory (SFTP
    keeps an existing file's mode), which is then renamed over dest: no moment
    where the secret is readable by others, and no half-written file. Call it
    with `name=` (`named`): pyinfra prints an unnamed operation's arguments.
    """
    want = hashlib.sha256(content.encode()).hexdigest()
    found = file_state(host, dest) or {}
    if found.get("sha256") == want and found.get("mode") == 0o600:
        host.noop(f"{dest} is current (0600)")
        return
    if found.get("sha256") == want:
        yield StringCommand("chmod 0600", QuoteString(dest))
        return
    staged = f"{dest}.sparkfleet-new"
    yield StringCommand("mkdir -p", QuoteString(str(Path(dest).parent)), "&& rm -f", QuoteString(staged),
                        "&& ( umask 077 && : >", QuoteString(staged), ")")
    private = _private_staging(dest)
    if private is None:
        yield FileUploadCommand(io.StringIO(content), staged)
    else:
        yield StringCommand("( umask 077 && mkdir", QuoteString(private), ")", **_AS_LOGIN_USER)
        yield FileUploadCommand(io.StringIO(content), staged, remote_temp_filename=f"{private}/secret")
        yield StringCommand("rm -rf", QuoteString(private), **_AS_LOGIN_USER)
    yield StringCommand("mv -f", QuoteString(staged), QuoteString(dest))


# pyinfra's escalation arguments; with one, an upload goes by SFTP (as the login user) to a temporary file, then a
# `cp` under the escalation puts it in place (pyinfra/connectors/ssh.py, put_file).
_ESCALATION = ("_sudo", "_doas", "_dzdo", "_su_user")
_TARGET_USERS = ("_sudo_user", "_doas_user", "_dzdo_user", "_su_user")
_AS_LOGIN_USER = {"_sudo": False, "_doas": False, "_dzdo": False, "_su_user": None}


def _private_staging(dest: str) -> str | None:
    """Where a secret waits between SFTP and the escalated `cp`: None without escalation (the bytes go straight
    into the 0600 staged file), else a new directory of an unpredictable name, made 0700 by the login user, that
    no other user can enter. pyinfra's own choice, /tmp/pyinfra-<sha1 of the path>, is predictable and takes
    the login user's umask (0644: readable by every user of the host while it waits).

    An escalation to a user other than root is refused: that user could not enter the directory either."""
    arguments = host.current_op_global_arguments or {}
    if not any(arguments.get(key) for key in _ESCALATION):
        return None
    target = next((arguments[key] for key in _TARGET_USERS if arguments.get(key)), "root")
    if target != "root":
        raise OperationValueError(f"secret_file({dest}): cannot hand a secret to {target!r} through a temporary "
                                  f"file: connect as root, or escalate to root (_sudo without _sudo_user)")
    return host.get_temp_filename(secrets.token_hex(16))


def env_command(action: str, live: str = paths.ENGINE_ENV, kept: str = paths.PREVIOUS_ENGINE_ENV,
                module: str = paths.HOST_MODULE) -> str:
    """A rollback's edit of the engine environment, made by the owner of its format (the host module's `env-keep`
    or `env-restore`, which read and write the root-only files themselves: no secret on the command line).
    env-keep sets the running release's aside: its fabric lines and the names of its engine_env (a secret
    setting), never their values nor its API key. env-restore writes the kept release's from today's file: today's
    API key and today's values of the kept names, then the kept fabric lines; the running one is kept in turn, so a
    second rollback returns. An older (leaked, rotated) key or value never comes back. The API key's variable is
    the serving file's (`api_key_var`, the engine's own), which the module reads there."""
    return " ".join(shlex.quote(arg) for arg in ("python3", module, action, live, kept, ",".join(FABRIC_ENV),
                                                 paths.SERVING_FILE))


@only_on_drift
@operation()
def release_kept_for_rollback(installed_release: str | None, new_release: str):
    """Before a new release replaces the running one, keep the running one's units (every unit of a release it runs:
    the vLLM unit, a member's Ray unit, each service's), its fabric environment, the names of its engine_env and its
    record aside (rollback needs no download). Its API key and engine_env values are not kept: a rollback takes
    today's, never an older one.

    Where the kept record already is the running release's, an earlier run of this release kept it (and may have
    replaced some of its units since): the kept copy is not overwritten with the new release's units."""
    if installed_release in (None, new_release):
        host.noop("no running release is being replaced")
        return
    if (read_json_object(host, paths.PREVIOUS_RELEASE_FILE).value or {}).get("release_id") == installed_release:
        host.noop(f"release {installed_release} is kept already (an earlier run of {new_release} kept it)")
        return
    live = [paths.unit_path(unit) for unit in unit_files(host) if paths.release_unit(unit)]
    yield StringCommand(
        "mkdir -p", paths.PREVIOUS_DIR, "&& rm -f", f"{paths.PREVIOUS_DIR}/sparkfleet-*.service", "&& cp -p", *live,
        paths.RELEASE_FILE, paths.PREVIOUS_DIR + "/",
        "&&", env_command("env-keep"),
    )


@operation()
def previous_release_restored(previous: dict, current: dict):
    """Swap the kept release with the running one (so a second rollback returns), then restart.

    A kept record that names its units gets exactly those back (release_units_restored); an older one, its role's
    (units_restored: the services' units stay as they are). The engine environment swapped in holds today's API key
    and engine_env values, never an older one (env_command).
    """
    if previous["release_id"] == current.get("release_id"):
        host.noop(f"release {current.get('release_id')} is already the running one")
        return
    gone = f"{host.name}: the previous model directory {previous['model_dir']} is gone: roll forward instead"
    yield StringCommand("test -d", QuoteString(previous["model_dir"]), "|| { echo", QuoteString(gone),
                        ">&2; exit 1; }")
    live = paths.RELEASE_FILE
    kept = f"{paths.PREVIOUS_DIR}/{Path(live).name}"
    yield f"cp -p {live} {kept}.swap && cp -p {kept} {live} && mv {kept}.swap {kept}"
    if "units" in previous:
        yield from release_units_restored(previous["units"], [u for u in unit_files(host) if paths.release_unit(u)],
                                          host.name)
        return
    yield env_command("env-restore")
    yield from units_restored(previous.get("role", "single"), host.name)


# The units a release of each role runs, in start order: a member's Ray node before the head's engine.
ROLE_UNITS = {"single": (paths.UNIT_NAME,), "head": (paths.RAY_UNIT_NAME, paths.UNIT_NAME),
              "worker": (paths.RAY_UNIT_NAME,)}


def _swapped_in(unit: str, name: str) -> str:
    """The kept file of `unit` swapped with the live one (which may be absent: the newer release did not run it)."""
    live, kept = paths.unit_path(unit), f"{paths.PREVIOUS_DIR}/{unit}"
    missing = shlex.quote(f"{name}: {kept} is missing: nothing to roll back to; roll forward instead")
    return (f"{{ [ -e {kept} ] || {{ echo {missing} >&2; exit 1; }}; }} && "
            f"{{ [ ! -e {live} ] || mv -f {live} {kept}.swap; }} && mv -f {kept} {live} && "
            f"{{ [ ! -e {kept}.swap ] || mv -f {kept}.swap {kept}; }}")


def _set_aside(unit: str) -> str:
    """A unit the kept release does not run: stopped, disabled and its file kept (a second rollback returns it)."""
    live = paths.unit_path(unit)
    return f"if [ -e {live} ]; then systemctl disable --now {unit} && mv -f {live} {paths.PREVIOUS_DIR}/{unit}; fi"


def units_restored(role: str, name: str) -> list[str]:
    """Commands putting back the units of a kept release of `role` ("single", "head" or "worker") whose record names
    no units (written before records did): a kept unit file swaps with the live one; a unit the kept release does not
    run is set aside; the others restart."""
    wanted = ROLE_UNITS[role]
    commands = [_swapped_in(unit, name) if unit in wanted else _set_aside(unit)
                for unit in (paths.RAY_UNIT_NAME, paths.UNIT_NAME)]
    return commands + ["systemctl daemon-reload",
                       *(f"systemctl enable {u} && {{ systemctl reset-failed {u} 2>/dev/null; systemctl restart {u}; }}"
                         for u in wanted)]


def release_units_restored(units: list[str], live: list[str], name: str) -> list[str]:
    """Commands putting back every unit of a kept release that names them (its record's `units`, in start order):
    each kept file swaps with the live one, and every live unit of a release it does not name (a service or a Ray
    node a newer release added) is set aside. Then the engine env (today's secrets) and, in the same shell, the
    restarts: a unit restarts when its file changed back, when the engine env changed, or when it is not running
    (its start limit reset first: the failed release may have left it crash-looping); one the newer release left
    untouched keeps running."""
    swaps = [_swapped_in(unit, name) for unit in units] + [_set_aside(unit) for unit in live if unit not in units]
    env = paths.ENGINE_ENV
    restarts = [f"systemctl enable {unit} && {{ [ -n \"$same_env\" ] && cmp -s {paths.PREVIOUS_DIR}/{unit} "
                f"{paths.unit_path(unit)} && systemctl is-active -q {unit} || "
                f"{{ systemctl reset-failed {unit} 2>/dev/null; systemctl restart {unit}; }}; }}"
                for unit in units]
    return [*swaps, "systemctl daemon-reload",
            " && ".join([f"before=$(sha256sum < {env}) && {env_command('env-restore')}",
                         f"{{ same_env=; [ \"$before\" != \"$(sha256sum < {env})\" ] || same_env=1; }}",
                         *restarts])]


def rollback_problem(previous: dict | None, source: str) -> Unreadable | None:
    """Why a kept release cannot be rolled back to (None when it can)."""
    if previous is None:
        return Unreadable(paths.PREVIOUS_DIR, "no previous release kept: nothing to roll back to")
    return release_problem(previous, source) or units_problem(previous, source)


def units_problem(previous: dict, source: str) -> Unreadable | None:
    """A kept record's `units` (read back from the host: checked, not trusted) must be release units, each once,
    and each service's entry what its gate needs; a record without `units` (an older one) is rolled back by role."""
    units = previous.get("units")
    if units is None:
        return None
    if not (isinstance(units, list) and units and all(isinstance(u, str) and paths.release_unit(u) for u in units)
            and len(set(units)) == len(units)):
        return Unreadable(source, "`units` is not a list of sparkfleet release units, each once")
    services = previous.get("services") or {}
    if not isinstance(services, dict):
        return Unreadable(source, "`services` is not an object of services")
    for svc_name, svc in services.items():
        unit = paths.service_unit(svc_name)
        if not (isinstance(svc, dict) and svc.get("unit") == unit and unit in units
                and svc.get("container") == paths.service_container(svc_name)
                and isinstance(svc.get("served_model_name"), str)
                and isinstance(svc.get("kind"), str) and type(svc.get("api_port")) is int):
            return Unreadable(source, f"service {str(svc_name)[:40]!r} is not one of its `units` with a container, "
                                      "served_model_name, kind and api_port")
    return None


def health_command(served_name: str, port: int, kind: str, container: str, runtime: str, wait: list) -> StringCommand:
    """sparkfleet-health asking the engine behind API port `port`: the gate (`wait`: --timeout S ...) or one probe
    (--once). `runtime` is the shell word of the runtime bundle's path."""
    return StringCommand(
        f"PYTHONPATH={runtime}", "python3", f"{paths.BIN_DIR}/sparkfleet-health", "--serving", paths.SERVING_FILE,
        "--host", paths.ENGINE_HOST, "--port", str(paths.engine_port(port)),
        "--served-name", QuoteString(served_name), "--kind", QuoteString(kind),
        "--env-file", paths.ENGINE_ENV, "--container", QuoteString(container), *wait,
    )


@operation(is_idempotent=False)
def health_gate(served_name: str, port: int, tools: bool, timeout_s: int, runtime: str, container: str,
                kind: str = "chat", unit: str = paths.UNIT_NAME):
    """The service behind API port `port` answers the probes of the serving file (contract/serving.py): health,
    the models listing, its kind's request and, with `tools`, a tool call, asked of its engine on loopback
    within `timeout_s`. Else the journal. Only `container`'s listener gets the key."""
    check = health_command(served_name, port, kind, container, runtime=shlex.quote(runtime),
                           wait=["--timeout", str(timeout_s), "--unit", QuoteString(unit),
                                 *(["--tools"] if tools else [])])
    yield StringCommand(check, f"|| {{ echo '--- last 50 lines of {unit}:' >&2; "
                        f"journalctl -u {shlex.quote(unit)} -n 50 --no-pager >&2; exit 1; }}")


def record_health_gate(state, host_name: str, gate) -> None:
    """Remember a host's health gate operation in the run (host/run.py), so a rollout judges the gate by its
    result, not by an operation's display name. A host may have several (the gate after a change, the
    serving check when nothing changed): the ones that ran count, a failed one first."""
    run_of(state).health_gates.setdefault(host_name, []).append(gate)


def health_gate_results(state) -> dict[str, str]:
    """host -> "passed" | "failed" for each host whose health gate ran in this run."""
    results = {}
    for name, gates in run_of(state).health_gates.items():
        ran = [gate for gate in gates if gate.is_complete() and (gate.executed or not gate.did_succeed())]
        if ran:
            results[name] = "passed" if all(gate.did_succeed() for gate in ran) else "failed"
    return results


def http_wait_command(url: str, timeout_s: int, max_time_s: int, failure: str, insecure: bool = False,
                      unix_socket: str | None = None) -> str:
    """The shell loop of `http_wait`: curl asks `url` (on `unix_socket`, where given) once a second, at most
    `timeout_s` times, each ask given `max_time_s`; 0 at the first 2xx or 3xx, else (no sleep after the last)
    `failure` and curl's last error on stderr, and 1. Every value is one quoted word."""
    on_socket = ["--unix-socket", unix_socket] if unix_socket else []
    curl = shlex.join(["curl", "-fsSk" if insecure else "-fsS", "--max-time", str(int(max_time_s)), *on_socket,
                       "-o", "/dev/null", url])
    tries = int(timeout_s)
    return (f"for i in $(seq {tries}); do err=$({curl} 2>&1) && exit 0; [ $i -lt {tries} ] && sleep 1; done; "
            f"printf '%s (%s)\\n' {shlex.quote(failure)} \"$err\" >&2; exit 1")


@operation(is_idempotent=False)
def http_wait(url: str, timeout_s: int, max_time_s: int, failure: str, insecure: bool = False,
              unix_socket: str | None = None):
    """Wait until a service on the host answers `url` (a stage calls it only after the service (re)started): the
    front door's /health, Prometheus's readiness, the chat UI's /health on its socket (http_wait_command)."""
    yield http_wait_command(url, timeout_s, max_time_s, failure, insecure, unix_socket)
