import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Each unit test resolves manifests into its own cache."""
    monkeypatch.setenv("SPARKFLEET_CACHE", str(tmp_path / "cache"))
    from sparkfleet.model import hubs

    hubs._resolve_manifest.cache_clear()
    hubs.read_model_config.cache_clear()
