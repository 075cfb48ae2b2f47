"""The batched read of a host's managed files, run by a real shell on a scratch tree: modes, owners and sha256,
directories and links told apart, a secret's hash but never its bytes, and nothing deeper than one level."""

import getpass
import hashlib
import os
import subprocess

import pytest

from sparkfleet.host.state import glob_word, parse_state, state_command

SECRET = b"VLLM_API_KEY=sk-never-printed\n"


def read(globs, packages=()):
    out = subprocess.run(["sh", "-c", state_command(globs, [], packages)], capture_output=True, text=True, check=True)
    return out.stdout, parse_state(out.stdout.splitlines())


def test_files_directories_and_links_each_with_mode_owner_and_hash(tmp_path):
    (tmp_path / "etc").mkdir(mode=0o700)
    env = tmp_path / "etc" / "engine.env"
    env.write_bytes(SECRET)
    env.chmod(0o600)
    (tmp_path / "etc" / "link").symlink_to(env)
    (tmp_path / "etc" / "deep").mkdir()
    (tmp_path / "etc" / "deep" / "shard").write_bytes(b"x")
    text, state = read([str(tmp_path / "etc"), f"{tmp_path}/etc/*", f"{tmp_path}/absent/*"])
    user = getpass.getuser()
    files = state["files"]
    assert files[str(env)] == {"type": "file", "mode": 0o600, "user": user, "group": files[str(env)]["group"],
                               "sha256": hashlib.sha256(SECRET).hexdigest()}
    assert files[str(tmp_path / "etc")]["type"] == "dir" and files[str(tmp_path / "etc")]["mode"] == 0o700
    assert files[str(tmp_path / "etc" / "link")]["type"] == "link"
    assert str(tmp_path / "etc" / "deep" / "shard") not in files  # depth 1 only
    assert b"sk-never-printed" not in text.encode()


def test_a_path_with_a_space_or_quote_stays_one_word(tmp_path):
    odd = tmp_path / "it's here"
    odd.mkdir()
    (odd / "a.cfg").write_text("x")
    (odd / "empty.cfg").write_text("")
    _, state = read([f"{odd}/*.cfg"])
    assert sorted(state["files"]) == [f"{odd}/a.cfg", f"{odd}/empty.cfg"]
    assert state["files"][f"{odd}/a.cfg"]["sha256"] == hashlib.sha256(b"x").hexdigest()
    assert state["files"][f"{odd}/empty.cfg"]["sha256"] == hashlib.sha256(b"").hexdigest()


def test_a_name_holding_a_newline_never_reads_as_current(tmp_path):
    """sha256sum escapes such a name and stat splits it: the file reads as absent or unhashed, so it is put again."""
    (tmp_path / "a\nb.cfg").write_text("x")
    _, state = read([f"{tmp_path}/*.cfg"])
    assert all(found["sha256"] is None for found in state["files"].values())


def test_a_wildcard_above_the_last_component_is_refused():
    with pytest.raises(ValueError, match="only the last component"):
        glob_word("/etc/*/x.cfg")


def test_lines_the_parser_does_not_understand_are_left_out():
    state = parse_state(["S regular file|99x root root /etc/y", "S fifo|644 root root /etc/p", "junk",
                         "S regular file|644 root root relative/z", "H notahash  /etc/x",
                         "S regular file|600 root root /etc/x", "H " + "a" * 64 + "  /etc/unlisted",
                         "P haproxy 2.6.12-1 ii ", "P socat 1.7 rc "])
    assert state["files"] == {"/etc/x": {"type": "file", "mode": 0o600, "user": "root", "group": "root",
                                         "sha256": None}}  # no hash read: it reads as other bytes, put again
    assert state["packages"] == {"haproxy": "2.6.12-1"}


@pytest.mark.skipif(not os.path.exists("/usr/bin/dpkg-query"), reason="no dpkg here")
def test_packages_are_read_with_dpkg_query(tmp_path):
    _, state = read([], ["dpkg", "no-such-package-here"])
    assert "dpkg" in state["packages"] and "no-such-package-here" not in state["packages"]


class LocalHost:
    """A host that is this machine: each fact's command run by sh, as pyinfra would read it over SSH."""

    def __init__(self):
        self.reads = 0

    def get_fact(self, cls, **kwargs):
        self.reads += 1
        fact = cls()
        command = fact.command(**kwargs)
        command = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        lines = out.stdout.splitlines()
        return fact.process(lines) if out.returncode == 0 and lines else fact.default()


def test_preflights_facts_read_in_one_round_trip_equal_each_read_on_its_own(tmp_path):
    from pyinfra.facts.server import Arch

    from sparkfleet.host.facts import DockerState, FreeBytes, JsonFile, MemInfo, ModelFiles, NvidiaSmi, PythonVersion
    from sparkfleet.host.state import read_facts

    (tmp_path / "release.json").write_text('{"release_id": "abc"}\n')
    (tmp_path / "empty.json").write_text("")
    model = tmp_path / "models" / "Q--M@a"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    wanted = {"arch": (Arch, {}), "gpu": (NvidiaSmi, {}), "docker": (DockerState, {}), "python": (PythonVersion, {}),
              "release": (JsonFile, {"path": str(tmp_path / "release.json")}),
              "empty": (JsonFile, {"path": str(tmp_path / "empty.json")}),
              "absent": (JsonFile, {"path": str(tmp_path / "none.json")}),
              "model": (ModelFiles, {"model_dir": str(model), "record": ".sparkfleet-verified.json"}),
              "meminfo": (MemInfo, {}), "free": (FreeBytes, {"path": str(tmp_path)})}
    host = LocalHost()
    together = read_facts(host, wanted)
    assert host.reads == 1
    alone = {name: host.get_fact(cls, **kwargs) for name, (cls, kwargs) in wanted.items()}
    for name in ("arch", "gpu", "docker", "python", "release", "empty", "absent", "model"):
        assert together[name] == alone[name], name
    assert together["release"] == '{"release_id": "abc"}' and together["empty"] == "" and together["absent"] is None
    assert type(together["meminfo"]) is type(alone["meminfo"]) and type(together["free"]) is type(alone["free"])


def test_a_fact_whose_command_fails_in_the_batch_is_read_on_its_own():
    from pyinfra.api import FactBase

    from sparkfleet.host.state import read_facts

    class Failing(FactBase):
        def command(self):
            return "echo partial; exit 3"

    host = LocalHost()
    assert read_facts(host, {"x": (Failing, {})}) == {"x": None} and host.reads == 2


def test_a_managed_users_passwd_entry_is_read_and_an_odd_line_left_out():
    out = subprocess.run(["sh", "-c", state_command([], [], users=["root", "no-such-user-here"])],
                         capture_output=True, text=True, check=True)
    users = parse_state(out.stdout.splitlines())["users"]
    assert list(users) == ["root"] and users["root"]["uid"] == 0
    odd = parse_state(["W share:x:998:998::/nonexistent:/usr/sbin/nologin", "W share:x:abc:1::/h:/bin/sh",
                       "W Bad Name:x:1:1::/h:/bin/sh"])["users"]
    assert odd == {"share": {"uid": 998, "home": "/nonexistent", "shell": "/usr/sbin/nologin"}}


def test_a_fact_read_in_the_batch_is_held_until_the_host_changes():
    """preflight's round trip answers the later stages' reads: no second read of the same fact and kwargs."""
    from sparkfleet.host.facts import JsonFile
    from sparkfleet.host.state import fact, read_facts

    host = LocalHost()
    read_facts(host, {"release": (JsonFile, {"path": "/nonexistent/release.json"})})
    assert fact(host, JsonFile, path="/nonexistent/release.json") is None and host.reads == 1
    fact(host, JsonFile, path="/nonexistent/other.json")
    assert host.reads == 2


def test_a_fact_that_needs_a_missing_binary_reads_as_its_default_in_the_batch():
    from pyinfra.api import FactBase

    from sparkfleet.host.state import read_facts

    class NeedsTool(FactBase):
        @staticmethod
        def default():
            return "no tool"

        def requires_command(self):
            return "no-such-tool-here"

        def command(self):
            return "no-such-tool-here --print"

    host = LocalHost()
    assert read_facts(host, {"x": (NeedsTool, {})}) == {"x": "no tool"} and host.reads == 1


def test_an_absent_path_outside_the_batch_reads_as_absent(tmp_path):
    from sparkfleet.host.state import PathState

    host = LocalHost()
    assert host.get_fact(PathState, path=str(tmp_path / "models"))["files"] == {}


def test_the_helpers_and_their_package_are_read_in_the_batch_as_uploaded(tmp_path):
    """The helper scripts and each module of their package (files/sparkfleet_host/) are one managed file each, and
    the batched read (paths.MANAGED_GLOBS, run by a real shell on a scratch tree) covers every one: absent on a
    bare host (uploaded), then found with the sha256 and mode the upload gave it, which is what makes the managed
    files' operation yield nothing on a second run (host/managed.py: same hash, same mode, no command)."""
    import hashlib
    from pathlib import Path

    from sparkfleet.contract import paths
    from sparkfleet.contract.shared import PACKAGE_DIR, package_files
    from sparkfleet.host import state
    from sparkfleet.tasks.model import helper_files

    files = helper_files()
    dests = {dest for _, dest, _ in files}
    assert {f"{paths.HOST_MODULE}/{name}" for name in ("__init__.py", "__main__.py", "eviction.py")} <= dests
    assert len(package_files()) == len(list(PACKAGE_DIR.glob("*.py"))) and all(state._covered(d) for d in dests)
    globs = [f"{tmp_path}{g}" for g in paths.MANAGED_GLOBS if g.startswith(paths.BIN_DIR)]
    assert not read(globs)[1]["files"]  # a bare host: nothing there, each one is uploaded
    for src, dest, mode in files:  # as the upload leaves them
        target = Path(f"{tmp_path}{dest}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(src).read_bytes())
        target.chmod(int(mode, 8))
    found = read(globs)[1]["files"]
    assert {dest: (found[f"{tmp_path}{dest}"]["sha256"], found[f"{tmp_path}{dest}"]["mode"]) for dest in dests} == {
        dest: (hashlib.sha256(Path(src).read_bytes()).hexdigest(), int(mode, 8)) for src, dest, mode in files}
