"""A converged host re-converged: nothing changes, and a managed file changed by hand is still found and restored,
each by the one operation that owns it (the batched read of sparkfleet/host/state.py decides, not a read per file)."""

from .conftest import HOSTS, converge, ssh

UNIT = "/etc/systemd/system/sparkfleet-vllm.service"
HELPER = "/opt/sparkfleet/bin/sparkfleet-health"
ENV = "/etc/sparkfleet/engine.env"


def test_three_drifts_on_one_host_each_restored_by_its_own_operation(converged_fleet):
    host = HOSTS[0]
    ssh(converged_fleet, host, f"echo '# edited by hand' >> {UNIT} && echo '# edited' >> {HELPER} && chmod 0644 {ENV}")
    done = converge("--limit", host)
    assert done.returncode == 0, done.output[-4000:]
    changed = done.changed[host]  # "<stage> | <operation>"
    assert {"Service | vLLM unit", "Service | Engine environment (root-only)"} <= set(changed), changed
    # the helpers are one operation: only the edited one is uploaded
    assert [name for name in changed if name.startswith("Model | Helpers ")] == \
        ["Model | Helpers sparkfleet-fetch, sparkfleet-health, sparkfleet-memcheck, sparkfleet-on-demand, "
         "sparkfleet-share and their package sparkfleet_host"], changed
    assert not [name for name in changed if name.startswith(("Guard", "Watchdog")) or "Release record" in name]
    assert ssh(converged_fleet, host, f"stat -c %a {ENV}; grep -c 'edited' {UNIT} {HELPER} || true") \
        .splitlines() == ["600", f"{UNIT}:0", f"{HELPER}:0"]
    again = converge("--limit", host)
    assert again.returncode == 0 and again.changed[host] == [], again.changed
