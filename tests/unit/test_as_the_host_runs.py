"""Commands sparkfleet sends a host outside any operation (a door's runtime, the speed record, a Ray check, a
watch's poll) run with the host's own escalation: a Spark reached as a user with sudo (`_sudo`, docs/prepare-a-
spark.md) gets them under sudo, as pyinfra's facts and operations are."""

from __future__ import annotations

from pyinfra.api import Config, Inventory, State, StringCommand
from pyinfra.connectors.util import CommandOutput

from sparkfleet.host.run import as_the_host_runs

from .test_progress import ScriptedConnector


class Recording(ScriptedConnector):
    """Records each command and the connector arguments it was sent with."""

    sent: list

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        self.sent.append((command.get_raw_value(), print_output, arguments))
        return True, CommandOutput([])


def hosts(**data):
    inventory = Inventory(([("spark-a", data)], {}))
    State(inventory, Config())
    sent: list = []
    for host in inventory:
        host.connector = type("Connector", (Recording,), {"sent": sent})(host.state, host)
    return list(inventory), sent


def test_a_sudo_hosts_command_is_sent_with_sudo_and_a_root_hosts_without():
    [spark], sent = hosts(_sudo=True, _sudo_user="root")
    assert as_the_host_runs(spark, "cat /etc/sparkfleet/release.json")[0]
    command, printed, arguments = sent[-1]
    assert command == "cat /etc/sparkfleet/release.json" and not printed
    assert arguments["_sudo"] is True and arguments["_sudo_user"] == "root"
    [root], sent = hosts()
    as_the_host_runs(root, StringCommand("test", "-e", "/var/run/reboot-required"))
    assert not sent[-1][2].get("_sudo") and sent[-1][0] == "test -e /var/run/reboot-required"


def test_a_timeout_is_ours_and_no_stdin_or_retries_are_passed():
    [spark], sent = hosts(_sudo=True)
    as_the_host_runs(spark, "date", timeout=15)
    arguments = sent[-1][2]
    assert arguments["_timeout"] == 15 and arguments["_get_pty"] is False
    assert "_stdin" not in arguments and "_retries" not in arguments
