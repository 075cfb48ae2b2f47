"""`python -m sim hub publish`'s server side (/_sim/publish): a new commit on the branch with README.md changed,
older commits still served by their id, the same id on every hub, kept across a restart; over 127.0.0.1 only."""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.hub.model import generate_repo  # noqa: E402
from sim.hub.server import make_server, server_url  # noqa: E402

REPO = "Qwen/Qwen3.5-35B-A3B-FP8"


@contextmanager
def serving(data: Path):
    server = make_server(data, "127.0.0.1", 0, log=False)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server_url(server)
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read()


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)


def hf_sha(hub: str, revision: str) -> str:
    return json.loads(get(f"{hub}/api/models/{REPO}/revision/{revision}"))["sha"]


def ms_listing(hub: str, revision: str) -> dict[str, str]:
    body = json.loads(get(f"{hub}/api/v1/models/{REPO}/repo/files?Revision={revision}&Recursive=true"))
    return {f["Path"]: f["Sha256"] for f in body["Data"]["Files"]}


@pytest.fixture
def data(tmp_path):
    generate_repo(tmp_path / "hub" / REPO, shards=2, shard_mb=0.25)
    return tmp_path / "hub"


def test_publish_moves_the_branch_and_the_old_commit_is_still_served(data):
    with serving(data) as hub:
        old = hf_sha(hub, "main")
        readme = get(f"{hub}/{REPO}/resolve/main/README.md")
        answer = post(f"{hub}/_sim/publish", {"repo": REPO})
        new = answer["commit"]
        assert answer["previous"] == old and new != old and len(new) == 40
        assert hf_sha(hub, "main") == new and hf_sha(hub, old) == old and hf_sha(hub, new) == new
        ms = json.loads(get(f"{hub}/api/v1/models/{REPO}/revisions"))["Data"]["RevisionMap"]["Branches"]
        assert [b["CommitId"] for b in ms if b["Revision"] == "master"] == [new]
        # one file changed, README.md: no weight, no config
        before, after = ms_listing(hub, old), ms_listing(hub, "master")
        assert [p for p in after if after[p] != before.get(p)] == ["README.md"] and set(after) == set(before)
        assert get(f"{hub}/{REPO}/resolve/{old}/README.md") == readme
        assert get(f"{hub}/api/v1/models/{REPO}/repo?Revision={old}&FilePath=README.md") == readme
        published = get(f"{hub}/{REPO}/resolve/{new}/README.md")
        assert published.startswith(readme) and published != readme
        assert json.loads(get(f"{hub}/_sim/repos"))[REPO]["commits"] == [old, new]


def test_every_hub_publishing_as_often_agrees_on_the_ids_and_a_restart_keeps_them(data, tmp_path):
    other = tmp_path / "other"
    generate_repo(other / REPO, shards=2, shard_mb=0.25)
    with serving(data) as hub, serving(other) as twin:
        ids = [post(f"{hub}/_sim/publish", {"repo": REPO})["commit"] for _ in range(2)]
        assert [post(f"{twin}/_sim/publish", {"repo": REPO})["commit"] for _ in range(2)] == ids
        first = json.loads(get(f"{hub}/_sim/repos"))[REPO]["commits"][0]
    with serving(data) as hub:  # the hub's container restarted: same branch, same commits
        assert hf_sha(hub, "main") == ids[1] and hf_sha(hub, ids[0]) == ids[0] and hf_sha(hub, first) == first


def test_unpublish_puts_the_branch_back_and_a_bad_request_is_refused(data):
    with serving(data) as hub:
        old = hf_sha(hub, "main")
        new = post(f"{hub}/_sim/publish", {"repo": REPO})["commit"]
        assert post(f"{hub}/_sim/unpublish", {"repo": REPO}) == {"repo": REPO, "commit": old, "previous": new}
        assert hf_sha(hub, "main") == old
        with pytest.raises(urllib.error.HTTPError) as gone:
            get(f"{hub}/api/models/{REPO}/revision/{new}")
        assert gone.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(f"{hub}/_sim/publish", {"repo": "Acme/None"})
        assert refused.value.code == 400 and REPO in refused.value.read().decode()
    with serving(data) as hub:
        assert hf_sha(hub, "main") == old
