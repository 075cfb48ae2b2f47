"""`plan` shows the front door as its stage builds it (users by name, TLS, the HAProxy config) and refuses what
the stage would; an inventory whose own code fails is one line naming it, for every command that loads one."""

from __future__ import annotations

import json

from sparkfleet.roles.front_door.address import door_set

import pytest

from sparkfleet import cli
from sparkfleet.fleet.front_door import commands as fd_commands, runtime as fd_runtime
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.release.plan import plan_hosts

from .helpers import KEY, host_data

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"


def write_inventory(tmp_path, door: dict | None = None, **serving) -> str:
    """Three Sparks on the LAN with one key, the first two in group `front_door`."""
    data = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": ALICE, "bob": BOB},
            "front_door_allow_http": True, "backend_key_in_clear": True, **serving, **(door or {})}
    path = tmp_path / "office.py"
    path.write_text(f"_d = {data!r}\n"
                    "sparks = [(f'spark-{n}', {**_d, 'ssh_hostname': f'10.0.0.{n}'}) for n in (1, 2, 3)]\n"
                    "front_door = sparks[:2]\n")
    return str(path)


def plan(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(["plan", *argv, "--offline"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_shows_each_front_door_with_users_by_name_and_no_key(tmp_path, capsys):
    rc, out, err = plan(capsys, write_inventory(tmp_path), "--verbose")  # the door's config: rendered files
    assert rc == 0, err
    assert "spark-1: front door" in out and "spark-2: front door" in out and "spark-3: front door" not in out
    assert "alice, bob" in out and "plain http" in out and "server spark-3 10.0.0.3:8000" in out
    assert ALICE not in out and BOB not in out and KEY not in out


def test_plan_json_holds_the_config_the_stage_writes(tmp_path, capsys):
    inventory = write_inventory(tmp_path)
    rc, out, err = plan(capsys, inventory, "--json")
    doors = json.loads(out)["front_doors"]
    assert rc == 0 and [d["host"] for d in doors] == ["spark-1", "spark-2"], err
    assert doors[0]["users"] == ["alice", "bob"] and doors[0]["tls"] is False
    assert [b["target"] for b in doors[0]["backends"]] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    data = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": ALICE, "bob": BOB},
            "front_door_allow_http": True}
    plans = {p.name: p for p in plan_hosts([(f"spark-{n}", host_data(**data, ssh_hostname=f"10.0.0.{n}"))
                                            for n in (1, 2, 3)])}
    shared = door_set(["spark-1", "spark-2"], plans)  # two doors: the usage table shared through peers
    assert doors[0]["config"] == fd_plan.front_door_plan("spark-1", plans, doors=shared).config()
    assert ALICE not in out and BOB not in out and KEY not in out


def test_plan_limited_to_a_door_shows_every_engine_behind_it(tmp_path, capsys):
    inventory = write_inventory(tmp_path)
    rc, out, err = plan(capsys, inventory, "--json", "--host", "spark-2")
    [door] = json.loads(out)["front_doors"]
    assert rc == 0 and [h["name"] for h in json.loads(out)["hosts"]] == ["spark-2"], err
    assert [b["host"] for b in door["backends"]] == ["spark-1", "spark-2", "spark-3"]
    rc, out, err = plan(capsys, inventory, "--json", "--host", "spark-3")
    assert rc == 0 and "front_doors" not in json.loads(out)


def test_plan_names_tls_files_when_they_are_there(tmp_path, capsys):
    (tmp_path / "llm.crt").write_text("CERT\n")
    (tmp_path / "llm.key").write_text("KEY\n")
    tls = {"front_door_tls_cert": str(tmp_path / "llm.crt"), "front_door_tls_key": str(tmp_path / "llm.key")}
    rc, out, err = plan(capsys, write_inventory(tmp_path, tls), "--json")
    door = json.loads(out)["front_doors"][0]
    assert rc == 0 and door["tls"] is True and door["tls_cert"] == tls["front_door_tls_cert"], err
    assert "ssl crt" in door["config"] and "KEY\n" not in out and "CERT" not in out


def test_missing_tls_files_are_one_line_each_naming_the_file_the_doors_and_the_fix(tmp_path, capsys):
    tls = {"front_door_tls_cert": str(tmp_path / "gone.crt"), "front_door_tls_key": str(tmp_path / "gone.key")}
    rc, out, err = plan(capsys, write_inventory(tmp_path, tls))
    assert (rc, out) == (2, "")
    problems = [line for line in err.splitlines()[1:] if line.strip()]
    assert len(problems) == 2 and all("give a readable PEM file" in line for line in problems), err
    assert f"spark-1, spark-2: setting `front_door_tls_cert`: cannot read {tmp_path / 'gone.crt'}" in err
    assert f"spark-1, spark-2: setting `front_door_tls_key`: cannot read {tmp_path / 'gone.key'}" in err


def test_plan_refuses_a_door_the_stage_would_refuse(tmp_path, capsys):
    """Engines on loopback are out of a front door's reach: plan says so now, not the converge later."""
    rc, out, err = plan(capsys, write_inventory(tmp_path, api_host="127.0.0.1"))
    assert (rc, out) == (2, "") and "api_host 127.0.0.1 is loopback" in err


def test_a_door_without_users_says_nobody_gets_in(tmp_path, capsys):
    rc, out, err = plan(capsys, write_inventory(tmp_path, {"front_door_users": {}, "front_door_allow_http": False}))
    assert rc == 0 and "no key opens it" in out, err


# --- an inventory whose own code fails -------------------------------------------------------------------------


@pytest.fixture
def failing_inventory(tmp_path):
    """inventory/office_front_door.py's shape: its keys file read at load time, and that file missing."""
    path = tmp_path / "office.py"
    missing = tmp_path / "office-keys.json"
    path.write_text("import json, pathlib\n"
                    f"_secrets = json.loads(pathlib.Path({str(missing)!r}).read_text())\n"
                    "sparks = [('spark-1', {'api_key': _secrets['api_key']})]\n")
    return str(path), str(missing)


@pytest.mark.parametrize("argv", [["plan"], ["plan", "--offline"], ["status"], ["rollout"], ["rollback"], ["fetch"]])
def test_a_failing_inventory_is_one_line_and_exit_2(failing_inventory, capsys, argv):
    inventory, missing = failing_inventory
    assert cli.main([argv[0], inventory, *argv[1:]]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"sparkfleet: inventory {inventory} failed to load: FileNotFoundError: "
                                         f"{missing}: No such file or directory: fix it, or create what it reads\n")


def test_bench_names_a_failing_inventory_too(failing_inventory, capsys):
    inventory, missing = failing_inventory
    assert cli.main(["bench", inventory]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sparkfleet: inventory {inventory} failed to load: FileNotFoundError: {missing}")


def test_an_inventory_that_does_not_compile_is_one_line(tmp_path, capsys):
    path = tmp_path / "typo.py"
    path.write_text("sparks = [('spark-1', {)]\n")
    assert cli.main(["plan", str(path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"sparkfleet: inventory {path} failed to load: SyntaxError: ")


def test_status_trusts_the_self_signed_front_door_init_made_and_nothing_else(tmp_path, monkeypatch):
    """`sparkfleet init` makes a self-signed certificate and names it controller_front_door_ca: status's https
    check of the front door trusts that file; without it, the same door is not trusted (DOWN)."""
    import http.server
    import ssl
    import threading

    from sparkfleet.fleet.project import self_signed

    crt, key = tmp_path / "door.crt", tmp_path / "door.key"
    assert self_signed(crt, key, ["127.0.0.1"])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_port}"
    door = host_data(api_key=KEY, api_host="0.0.0.0", front_door_users={"alice": "a" * 24},
                     controller_front_door_url=url,
                     front_door_tls_cert=str(crt), front_door_tls_key=str(key))
    monkeypatch.setattr(fd_runtime.FrontDoorRuntime, "survey",
                        lambda self: fd_runtime.DoorSurvey({"spark-1": {}}, {}, None))
    try:
        up = {}
        for ca in (str(crt), None):
            monkeypatch.setattr(fd_runtime.FrontDoorRuntime, "of", classmethod(
                lambda cls, inventory, ca=ca: cls(inventory, [("spark-1", {**door, "controller_front_door_ca": ca})])))
            up[ca] = fd_commands.front_door_status("inventory.py")["up"]
    finally:
        server.shutdown()
    assert up == {str(crt): True, None: False}


def test_a_host_leaving_the_group_front_door_keeps_none_of_a_doors_files_or_units():
    """Every file the contract puts in the door's directory (the users' keys, the engines' key among them) and every
    unit of a door is what `no_front_door` removes from a host outside the group."""
    from sparkfleet.contract import monitoring, paths
    from sparkfleet.roles.front_door.desired import DOOR_FILES, DOOR_UNITS, no_door_state

    in_door_dir = {value for module in (paths, monitoring) for name, value in vars(module).items()
                   if name.isupper() and isinstance(value, str) and value.startswith(paths.FRONT_DOOR_DIR + "/")}
    assert in_door_dir and in_door_dir == set(DOOR_FILES)
    assert set(DOOR_UNITS) == {paths.FRONT_DOOR_UNIT_NAME, paths.DOOR_ADDRESS_UNIT_NAME, paths.USAGE_SAVE_UNIT,
                               paths.USAGE_SAVE_TIMER}
    gone = no_door_state()  # what the stage no_front_door ensures
    assert set(gone.absent) == set(DOOR_FILES) and set(gone.removed_units) == set(DOOR_UNITS)
    assert not gone.files and not gone.units
