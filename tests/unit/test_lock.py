"""The release lock (sparkfleet/release/lock.py, controller/inventory.py `locked`, `sparkfleet update`): plans answer
from it with no hub and no registry, add what it lacks once, and only `update` moves an entry."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sparkfleet.cli import main
from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.release.image import ImagePin
from sparkfleet.release.lock import Lock, LockError, Locking, changes, coordinate, parse_lock
from sparkfleet.release.plan import plan_hosts

from tests.conftest import free_port

from .helpers import host_data, qwen35_config, run_fetch

REPO = "Qwen/Qwen3.5-35B-A3B-FP8"
OLD, NEW = "1" * 40, "2" * 40
DIGEST = "sha256:" + "d" * 64


class Hub:
    """A hub whose branch is at `commit` (README.md's bytes differ per commit), counting each question."""

    def __init__(self, commit: str = OLD):
        self.commit, self.asked, self.images = commit, [], []
        self.digest, self.config = DIGEST, qwen35_config()

    def manifest(self, s) -> Manifest:
        commit = s.model_revision if len(s.model_revision) == 40 else self.commit
        files = (ManifestFile("config.json", 1200, sha256="c" * 64),
                 ManifestFile("README.md", 300 + int(commit[0]), blob_sha1=commit[0] * 40),
                 ManifestFile("model-00001-of-00001.safetensors", 35 * 10**9, sha256="e" * 64))
        return Manifest(s.model_hub, s.model_repo, s.model_revision, commit, files)

    def resolve(self, s):
        self.asked.append(coordinate(s.model_hub, s.model_repo, s.model_revision))
        return self.manifest(s), self.config, None

    def resolve_image(self, s):
        self.images.append(s.engine_image)
        return ImagePin(f"vllm/vllm-openai@{self.digest}", self.digest, "registry"), None


def down(s):
    raise AssertionError(f"the hub was asked for {s.model_repo}@{s.model_revision}")


def down_image(s):
    raise AssertionError(f"the registry was asked for {s.engine_image}")


@pytest.fixture
def hub(monkeypatch):
    """The resolvers every command reaches (the inventory's: commands, `update` and deploys plan through it)."""
    from sparkfleet.controller import inventory

    hub = Hub()
    for module in (inventory,):
        monkeypatch.setattr(module, "hub_resolver", lambda s: hub.resolve(s))
        monkeypatch.setattr(module, "image_resolver", lambda s: hub.resolve_image(s))
    return hub


def hub_down(monkeypatch):
    from sparkfleet.controller import inventory

    for module in (inventory,):
        monkeypatch.setattr(module, "hub_resolver", down)
        monkeypatch.setattr(module, "image_resolver", down_image)


def lock_file() -> Path:
    return Path(os.environ["SPARKFLEET_LOCK"])


def inventory(tmp_path, hosts: dict[str, dict] | None = None) -> str:
    hosts = hosts or {"spark-1": {}, "spark-2": {}, "spark-3": {}}
    path = tmp_path / f"fleet{len(list(tmp_path.glob('fleet*.py')))}.py"  # a new name: pyinfra keeps what it loaded
    path.write_text("sparks = [" + ", ".join(f"({n!r}, {{'ssh_hostname': '10.0.0.{i}', **{d!r}}})"
                                             for i, (n, d) in enumerate(hosts.items(), 1)) + "]\n")
    return str(path)


def plan_json(capsys, path: str) -> dict:
    assert main(["plan", path, "--json"]) == 0
    return {h["name"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}


# ---- the file --------------------------------------------------------------------------------------------------

def test_a_lock_round_trips_to_the_same_bytes_sorted_for_review():
    hub = Hub()
    locking = Locking(Lock(), hub.resolve, hub.resolve_image)
    [plan] = plan_hosts([("a", host_data())], resolve=locking.model, resolve_image=locking.image)
    text = locking.added.render()
    again = parse_lock(text, "sparkfleet.lock")
    assert again.render() == text and text.endswith("\n")
    body = json.loads(text)
    assert list(body) == sorted(body)
    entry = body["models"][f"modelscope:{REPO}@master"]
    assert entry["commit"] == OLD and entry["config"] == qwen35_config()
    assert [f["path"] for f in entry["files"]] == ["config.json", "README.md", "model-00001-of-00001.safetensors"]
    assert "blob_sha1" not in entry["files"][0]  # no nulls: what a reviewer reads is what the hub said
    assert body["images"] == {"vllm/vllm-openai:v0.33.0": {"digest": DIGEST}}
    # the locked manifest is the hub's: same digest, same release
    locked = Locking(again, down, down_image)
    [from_lock] = plan_hosts([("a", host_data())], resolve=locked.model, resolve_image=locked.image)
    assert from_lock.manifest == plan.manifest and from_lock.release_id == plan.release_id


def good_lock() -> dict:
    hub = Hub()
    locking = Locking(Lock(), hub.resolve, hub.resolve_image)
    plan_hosts([("a", host_data())], resolve=locking.model, resolve_image=locking.image)
    return json.loads(locking.added.render())


def _entry(body):
    return body["models"][f"modelscope:{REPO}@master"]


@pytest.mark.parametrize("damage,needle", [
    (lambda b: "{not json", "Invalid JSON"),
    (lambda b: b.update(version=2), "version"),
    (lambda b: b.update(extra=1), "extra"),
    (lambda b: _entry(b)["files"][0].update(size="1200"), "size"),
    (lambda b: _entry(b)["files"][0].update(size=-1), "size"),
    (lambda b: _entry(b)["files"][0].update(path="../../etc/passwd"), "passwd"),
    (lambda b: _entry(b)["files"][0].update(sha256="not-a-hash"), "not a hex digest"),
    (lambda b: _entry(b)["files"][2].update(sha256=None), "no hash"),
    (lambda b: _entry(b).update(commit="master"), "commit"),
    (lambda b: _entry(b).update(files=[]), "files"),
    (lambda b: _entry(b).update(revision="main"), "holds modelscope:Qwen/Qwen3.5-35B-A3B-FP8@main"),
    (lambda b: b["images"]["vllm/vllm-openai:v0.33.0"].update(digest="sha256:abc"), "digest"),
])
def test_a_malformed_lock_is_one_line_naming_the_file_and_the_fix(damage, needle):
    body = good_lock()
    text = damage(body) or json.dumps(body)
    with pytest.raises(LockError) as caught:
        parse_lock(text, "/srv/office/sparkfleet.lock")
    message = str(caught.value)
    assert "\n" not in message and needle in message
    assert message.startswith("lock file /srv/office/sparkfleet.lock: ") and "delete it" in message


def test_a_commit_pinned_coordinate_may_hold_the_manifest_its_branch_resolved():
    """`model_revision = <commit>` answers from the manifest cached when a branch resolved to that commit (its
    revision says the branch): the lock takes it under the commit's coordinate, and no other."""
    body = good_lock()
    entry = body["models"].pop(f"modelscope:{REPO}@master")
    body["models"][f"modelscope:{REPO}@{OLD}"] = entry
    assert parse_lock(json.dumps(body), "sparkfleet.lock").models[f"modelscope:{REPO}@{OLD}"].commit == OLD
    body["models"] = {f"modelscope:{REPO}@{'f' * 40}": entry}
    with pytest.raises(LockError):
        parse_lock(json.dumps(body), "sparkfleet.lock")


def test_a_command_given_a_malformed_lock_exits_2_with_that_line_and_touches_nothing(tmp_path, capsys, hub):
    lock_file().write_text('{"version": 1, "models": {"x": 1}}')
    assert main(["plan", inventory(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sparkfleet: lock file {lock_file()}: models.x") and err.count("\n") == 1
    assert hub.asked == [] and lock_file().read_text() == '{"version": 1, "models": {"x": 1}}'
    assert main(["update", inventory(tmp_path)]) == 2


# ---- plans -----------------------------------------------------------------------------------------------------

def test_the_first_plan_writes_the_lock_and_later_plans_ask_no_hub_and_no_registry(tmp_path, capsys, hub,
                                                                                  monkeypatch):
    path = inventory(tmp_path)
    first = plan_json(capsys, path)
    assert hub.asked == [f"modelscope:{REPO}@master"] and hub.images == ["vllm/vllm-openai:v0.33.0"]
    written = lock_file().read_text()
    hub.commit = NEW  # upstream moved; the lock holds
    hub_down(monkeypatch)
    again = plan_json(capsys, path)
    assert {n: h["release_id"] for n, h in again.items()} == {n: h["release_id"] for n, h in first.items()}
    assert again["spark-1"]["manifest"]["commit"] == OLD and lock_file().read_text() == written


def test_a_deploys_plan_answers_from_the_lock_with_the_hub_down(tmp_path, capsys, hub, monkeypatch):
    """What a converge plans (controller/inventory.py `plans`, once per pyinfra run), with hub and registry stopped."""
    from pyinfra.api import Config, Inventory, State

    from sparkfleet.controller import inventory as inventory_mod

    released = plan_json(capsys, inventory(tmp_path))["spark-1"]["release_id"]
    hub_down(monkeypatch)
    fleet = Inventory(([("spark-1", host_data(ssh_hostname="10.0.0.1"))], {}))
    state = State(fleet, Config())
    assert inventory_mod.plans(state)["spark-1"].release_id == released


def test_a_new_coordinate_is_resolved_once_and_added(tmp_path, capsys, hub):
    plan_json(capsys, inventory(tmp_path, {"spark-1": {}}))
    pinned = {"model_revision": NEW}  # a full commit id: the hub is asked only for its manifest, locked the same
    path = inventory(tmp_path, {"spark-1": {}, "spark-2": pinned, "spark-3": pinned})
    hosts = plan_json(capsys, path)
    assert hub.asked == [f"modelscope:{REPO}@master", f"modelscope:{REPO}@{NEW}"]
    assert hosts["spark-2"]["manifest"]["commit"] == NEW and hosts["spark-1"]["manifest"]["commit"] == OLD
    assert sorted(json.loads(lock_file().read_text())["models"]) == [f"modelscope:{REPO}@{NEW}",
                                                                    f"modelscope:{REPO}@master"]
    plan_json(capsys, path)
    assert len(hub.asked) == 2 and hub.images == ["vllm/vllm-openai:v0.33.0"]


def test_a_plan_refused_once_the_hub_answered_writes_no_lock(tmp_path, capsys, hub):
    hub.config["text_config"]["max_position_embeddings"] = 32768  # the hub's config.json: less than the recipe's
    assert main(["plan", inventory(tmp_path, {"spark-1": {"max_model_len": 65536}})]) == 2
    assert "maximum of 32768" in capsys.readouterr().err
    assert hub.asked and not lock_file().exists()


def test_an_image_pinned_by_digest_is_not_locked(tmp_path, capsys, monkeypatch):
    """It pins itself (image.py's resolver answers it with no registry): the lock holds only tags."""
    pinned = f"vllm/vllm-openai@{DIGEST}"
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", Hub().resolve)
    hosts = plan_json(capsys, inventory(tmp_path, {"spark-1": {"engine_image": pinned}}))
    assert hosts["spark-1"]["image_pinned"] == pinned and hosts["spark-1"]["image_source"] == "given"
    assert json.loads(lock_file().read_text())["images"] == {}


# ---- update ----------------------------------------------------------------------------------------------------

def test_update_shows_old_and_new_commit_the_changed_bytes_and_who_restarts(tmp_path, capsys, hub):
    path = inventory(tmp_path, {"spark-1": {}, "spark-2": {}, "spark-3": {"model_revision": OLD}})
    before = plan_json(capsys, path)
    assert main(["update", path]) == 0
    assert capsys.readouterr().out.startswith("up to date")
    hub.commit = NEW
    assert main(["update", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [change] = report["changes"]
    assert (change["key"], change["old"], change["new"]) == (f"modelscope:{REPO}@master", OLD, NEW)
    assert change["files"] == ["README.md"] and change["changed_bytes"] == 302
    assert change["total_bytes"] == 35 * 10**9 + 1200 + 302
    # spark-3 names the old commit itself: its release stays
    assert sorted(report["restart"]) == ["spark-1", "spark-2"] and report["written"]
    assert report["restart"]["spark-1"]["old_release"] == before["spark-1"]["release_id"]
    after = plan_json(capsys, path)
    assert after["spark-1"]["manifest"]["commit"] == NEW
    assert after["spark-1"]["release_id"] == report["restart"]["spark-1"]["new_release"]
    assert after["spark-3"]["release_id"] == before["spark-3"]["release_id"]


def test_update_prints_the_rollout_to_apply_it(tmp_path, capsys, hub):
    path = inventory(tmp_path)
    plan_json(capsys, path)
    hub.commit, hub.digest = NEW, "sha256:" + "f" * 64
    assert main(["update", path]) == 0
    out = capsys.readouterr().out
    assert f"model modelscope:{REPO}@master: {OLD} -> {NEW}\n" in out
    assert "changed: 1 file(s), 302 B (README.md); the new model directory holds 35.0 GB" in out
    assert f"image vllm/vllm-openai:v0.33.0: {DIGEST} -> sha256:{'f' * 64}" in out
    assert all(f"spark-{n} " in out for n in (1, 2, 3))
    assert f"apply it with `sparkfleet rollout {path} --batch 1`" in out


def test_update_under_a_limit_counts_every_host_sharing_the_coordinate(tmp_path, capsys, hub):
    """One entry per coordinate: re-resolving spark-1's moves spark-2 too; spark-3 names another revision."""
    path = inventory(tmp_path, {"spark-1": {}, "spark-2": {}, "spark-3": {"model_revision": "v1"}})
    plan_json(capsys, path)
    hub.commit = NEW
    assert main(["update", path, "--limit", "spark-1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["key"] for c in report["changes"]] == [f"modelscope:{REPO}@master"]
    assert sorted(report["restart"]) == ["spark-1", "spark-2"]
    assert hub.asked.count(f"modelscope:{REPO}@v1") == 1  # asked once, by the first plan


def test_update_with_the_hub_down_writes_nothing_and_exits_1(tmp_path, capsys, hub, monkeypatch):
    path = inventory(tmp_path)
    plan_json(capsys, path)
    written = lock_file().read_text()
    from sparkfleet.controller import inventory as inventory_mod

    monkeypatch.setattr(inventory_mod, "hub_resolver", lambda s: (None, None, "cannot resolve: hub down"))
    assert main(["update", path]) == 1
    assert "cannot resolve: hub down" in capsys.readouterr().err and lock_file().read_text() == written


def test_changes_compare_files_by_their_bytes():
    hub = Hub()
    old = Locking(Lock(), hub.resolve, hub.resolve_image)
    plan_hosts([("a", host_data())], resolve=old.model, resolve_image=old.image)
    assert changes(old.added, old.added) == []
    hub.commit = NEW
    new = Locking(Lock(), hub.resolve, hub.resolve_image)
    plan_hosts([("a", host_data())], resolve=new.model, resolve_image=new.image)
    [change] = changes(old.added, new.added)
    assert (change.kind, change.files, change.changed_bytes) == ("model", ("README.md",), 302)
    [added] = changes(Lock(), new.added)[:1]
    assert added.old is None and len(added.files) == 3


# ---- the hosts, with the hub down --------------------------------------------------------------------------------

def test_a_damaged_file_with_no_hub_and_no_peer_names_what_is_needed(tmp_path):
    """A locked release plans with the hub down; a host missing a verified file still needs a source for it."""
    data = b'{"model_type": "qwen3"}\n'
    manifest = Manifest("huggingface", REPO, "main", OLD,
                        (ManifestFile("config.json", len(data), sha256=hashlib.sha256(data).hexdigest()),))
    model_dir = tmp_path / "models" / manifest.dir_name
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_bytes(b"X" + data[1:])  # damaged: same size, other bytes
    job = tmp_path / "job.json"
    closed = f"http://127.0.0.1:{free_port()}"
    job.write_text(json.dumps({"manifest": manifest.to_dict(), "model_dir": str(model_dir),
                               "staging_dir": str(tmp_path / "models/.staging/x"), "endpoint": closed,
                               "peers": [f"{closed}/{manifest.dir_name}"]}))
    rc, stderr = run_fetch(job)
    assert rc == 3 and "the hub (or a peer) is needed to repair config.json" in stderr
    assert not (model_dir / "config.json").exists()  # the damaged bytes are not kept as if verified
