"""Tests of the simulator (sim/) and the tools (tools/), not of the product: the unit suite's hermetic setup."""

from tests.unit.conftest import _isolated_cache, _no_client_backoff, pytest_configure  # noqa: F401  (autouse fixtures; pytest -n)
