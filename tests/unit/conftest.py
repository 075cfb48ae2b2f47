import os
from pathlib import Path

import pytest

from tests.tiers import needs

from tests.unit.no_backoff import sitecustomize as no_backoff  # noqa: F401  (installs itself: no client backoff here)

NO_BACKOFF = Path(no_backoff.__file__).parent

def pytest_configure(config):
    """Under `pytest -n`, keep the xdist worker waiting for its next test without gevent's LoopExit.

    Importing pyinfra_cli runs gevent's `monkey.patch_all()` (pyinfra's CLI does, and the product imports
    it), so the worker's main thread waits on a gevent lock for a test index that execnet's receiver, a
    native thread, hands it; with no greenlet or timer left in that thread's hub, gevent raises LoopExit
    ("This operation would block forever"). The patch is made here, once, before collection, as in a plain
    run; the worker's wait then goes in slices, so a timer keeps the hub blocked in its loop until the
    receiver's wake-up (gevent wakes a hub from another thread) or the next slice.
    """
    # patch_all first, as the product's imports do, in a plain run too: an https client made before it (urllib3's
    # ssl context) recurses in the stdlib's ssl module once a later test imports pyinfra_cli
    import pyinfra_cli  # noqa: F401
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor":  # xdist/remote.py, run by execnet (not imported)
            event = plugin.torun._has_items_event
            if not hasattr(event, "unsliced_wait"):  # tests/sim's conftest runs this hook too
                event.unsliced_wait = event.wait
                event.wait = lambda timeout=None: _sliced(event.unsliced_wait, timeout)


def _sliced(wait, timeout):
    """threading.Event.wait in 50 ms slices (each one a gevent timer): True once set, as the original."""
    if timeout is not None:
        return wait(timeout)
    while not wait(0.05):
        pass
    return True


@pytest.fixture(scope="session")
@needs("prometheus")
def sample_prometheus(tmp_path_factory):
    """The real Prometheus scraping the status page's sample fleet (tests/unit/status_page_fleet.py), started once
    for the tests that only query it (the page, and its screenshot through the front door): its URL."""
    from tests.unit import status_page_fleet

    with status_page_fleet.prometheus(tmp_path_factory.mktemp("prometheus")) as url:
        yield url


@pytest.fixture(autouse=True)
def _no_client_backoff(monkeypatch):
    """The helpers a test starts (sparkfleet-fetch, the sim hub, ...) load no_backoff/sitecustomize.py too."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(NO_BACKOFF), os.environ.get("PYTHONPATH")])))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Each unit test resolves manifests into its own cache, and plans from (and writes) a lock of its own."""
    monkeypatch.setenv("SPARKFLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPARKFLEET_LOCK", str(tmp_path / "sparkfleet.lock"))
    from sparkfleet.model import hubs

    hubs._resolve_manifest.cache_clear()
    hubs.read_model_config.cache_clear()
