"""Every fact parser, on what a good host prints and on what a hostile or broken one does:
output a parser does not understand is an `Unreadable` naming its source, never a guess."""

import pytest

from sparkfleet.host.facts import (
    DockerServerVersion,
    DockerState,
    JsonFile,
    JsonObject,
    KeyringKeys,
    RuntimePath,
    Unreadable,
    history_problem,
    json_object,
    parse_docker_version,
    parse_free_bytes,
    parse_meminfo,
    parse_model_dirs,
    parse_model_files,
    parse_python_version,
    primary_fingerprints,
    release_problem,
)

RECORD = "/etc/sparkfleet/release.json"


def test_json_file_tells_an_empty_file_from_an_absent_one():
    assert JsonFile().process([]) is None
    assert JsonFile().process(["@@sparkfleet-file"]) == ""
    assert JsonFile().process(["@@sparkfleet-file", '{"a":', " 1}"]) == '{"a":\n 1}'


def test_json_object_reads_an_object_and_an_absent_file():
    assert json_object(RECORD, '{"release_id": "abc"}') == JsonObject(RECORD, {"release_id": "abc"})
    assert json_object(RECORD, None).absent


@pytest.mark.parametrize("text, problem", [
    ("{ truncated", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 3 (char 2))"),
    ("", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ('"a string"', "holds a JSON str, not an object"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ("null", "holds a JSON NoneType, not an object"),
])
def test_json_that_is_not_an_object_is_unreadable_never_absent(text, problem):
    parsed = json_object(RECORD, text)
    assert not parsed.absent and parsed.value is None
    assert parsed.unreadable == Unreadable(RECORD, problem)
    assert parsed.unreadable.line("spark-1") == (
        f"spark-1: {RECORD}: {problem}: fix or remove it by hand; sparkfleet changes nothing on doubt")


GATE = {"release_id": "abc", "model_dir": "/m/Q@a", "served_model_name": "Q", "api_host": "10.0.0.9",
        "api_port": 8000, "engine_port": 18000, "health_timeout_s": 120, "tools": False}


def test_release_record_for_a_rollback_needs_every_gate_key_of_its_type():
    assert release_problem(GATE, "prev") is None
    assert release_problem({**GATE, "api_port": "8000", "tools": None}, "prev").problem == (
        "the release record lacks api_port, tools (written by an older sparkfleet?)")
    assert release_problem({**GATE, "health_timeout_s": True}, "prev").problem.startswith(
        "the release record lacks health_timeout_s")
    assert release_problem({"release_id": "abc"}, "prev").problem == (
        "the release record lacks model_dir, served_model_name, api_host, api_port, engine_port, health_timeout_s, "
        "tools (written by an older sparkfleet?)")


def test_a_release_kept_from_before_the_guard_is_not_rolled_back_to():
    """Its unit binds the API port itself, where the guard listens now: restoring it would take the host down."""
    older = {k: v for k, v in GATE.items() if k != "engine_port"}
    assert "predates the guard" in release_problem(older, "prev").problem


def test_model_history_must_be_a_list_of_directories():
    assert history_problem(JsonObject(RECORD, {"model_history": ["/m/a"], "previous": {"model_dir": "/m/b"}})) is None
    assert history_problem(JsonObject(RECORD)) is None
    assert history_problem(JsonObject(RECORD, {"model_history": "/m/a"})) == Unreadable(
        RECORD, "`model_history` is not a list of directories")
    assert history_problem(JsonObject(RECORD, {"previous": ["x"]})) == Unreadable(
        RECORD, "`previous` is not a release record with a model_dir")


def test_meminfo():
    assert parse_meminfo(["MemTotal:       127535836 kB", "MemAvailable:   119000000 kB", "HugePages_Total:       0",
                          "Active(anon):     1234 kB"]) == {
        "MemTotal": 127535836, "MemAvailable": 119000000, "HugePages_Total": 0, "Active(anon)": 1234}


@pytest.mark.parametrize("lines, problem", [
    (["MemTotal:       - kB"], "line 'MemTotal:       - kB' is not `Key: <number> kB`"),
    (["MemTotal"], "line 'MemTotal' is not `Key: <number> kB`"),
    (["MemAvailable:   1 kB"], "no MemTotal line"),
    ([], "no MemTotal line"),
])
def test_meminfo_hostile(lines, problem):
    assert parse_meminfo(lines) == Unreadable("/proc/meminfo", problem)


def test_free_bytes():
    assert parse_free_bytes(["536870912000"], "/var/lib/sparkfleet/models") == 536870912000


@pytest.mark.parametrize("lines, shown", [(["-"], "'-'"), ([], "''"), (["12.5G"], "'12.5G'"), (["-1"], "'-1'")])
def test_free_bytes_hostile(lines, shown):
    assert parse_free_bytes(lines, "/models") == Unreadable("df /models", f"free bytes read {shown}, not a number")


def test_free_bytes_asks_df_about_the_model_roots_nearest_existing_parent(tmp_path):
    """Not about the login directory: a model root on its own disk must be measured there, even before it exists."""
    import subprocess

    from sparkfleet.host.facts import FreeBytes

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "df").write_text('#!/bin/sh\nprintf "Filesystem x\\nfs 1 2 %s\\n" "$3"\n')  # $4 = the path asked
    (bin_dir / "df").chmod(0o755)
    (tmp_path / "disk-it's-on").mkdir()
    root = tmp_path / "disk-it's-on" / "models" / "not yet"
    command = FreeBytes().command(str(root))
    out = subprocess.run(["sh", "-c", command], cwd="/", capture_output=True, text=True, check=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.stdout.strip() == str(tmp_path / "disk-it's-on") and out.stderr == ""


def test_python_version():
    assert parse_python_version(["3.12"]) == "3.12"
    assert parse_python_version(["none"]) is None
    assert parse_python_version(["Python 3.12.3"]) == Unreadable("python3 --version", "reads 'Python 3.12.3', not 3.N")


MODEL_DIR = "/var/lib/sparkfleet/models/Q--M@abc"


def test_model_files_record_and_listing():
    text = ('{"config.json": {"size": 2, "mtime_ns": 1, "ino": 3, "hash": "x"}}\n\n@@files\n'
            "f 2 1700000000.5 11 config.json\0f 4096 1700000001.0000000001 12 sub dir/model.safetensors\0")
    assert parse_model_files(text, MODEL_DIR) == {
        "record": {"config.json": {"size": 2, "mtime_ns": 1, "ino": 3, "hash": "x"}},
        "files": {"config.json": {"size": 2, "mtime_ns": 1_700_000_000_500_000_000, "ino": 11},
                  "sub dir/model.safetensors": {"size": 4096, "mtime_ns": 1_700_000_001_000_000_000, "ino": 12}},
        "others": {},
    }


def test_model_files_name_with_a_newline_stays_one_name():
    text = "\n@@files\nf 5 1700000000 11 evil\nconfig.json\0f 2 1700000000 12 config.json\0"
    files = parse_model_files(text, MODEL_DIR)["files"]
    assert sorted(files) == ["config.json", "evil\nconfig.json"]
    assert files["config.json"]["size"] == 2


def test_model_files_unreadable_record_vouches_for_nothing_and_absent_dir_is_empty():
    assert parse_model_files("{ truncated\n@@files\n", MODEL_DIR) == {"record": {}, "files": {}, "others": {}}
    assert parse_model_files("", MODEL_DIR) == {"record": {}, "files": {}}


def test_model_files_hostile_listing():
    assert parse_model_files("\n@@files\nf x 1 2 config.json\0", MODEL_DIR) == Unreadable(
        f"find {MODEL_DIR}", "listing entry 'f x 1 2 config.json' is not `size mtime inode name`")


MODELS = "/var/lib/sparkfleet/models"


def test_model_dirs_are_nul_separated_direct_children():
    text = f"{MODELS}/Q--M@b\0{MODELS}/Q--M@a\0{MODELS}/odd\nname@x\0"
    assert parse_model_dirs(text, MODELS) == [f"{MODELS}/Q--M@a", f"{MODELS}/Q--M@b", f"{MODELS}/odd\nname@x"]
    assert parse_model_dirs("", MODELS) == []


@pytest.mark.parametrize("entry", ["/etc@x", f"{MODELS}/a@b/c", f"{MODELS}2/a@b"])
def test_model_dirs_outside_the_root_stop_the_cleanup(entry):
    assert parse_model_dirs(f"{MODELS}/Q--M@a\0{entry}\0", MODELS) == Unreadable(
        f"find {MODELS}", f"listed {entry!r}, not a directory directly under it")


# `gpg --show-keys --with-colons` of a file holding two keys, the first with a subkey.
TWO_KEYS = """\
pub:u:255:22:E5CA2BA084E837F4:1796054288:::u:::scESC:::::ed25519:::0:
fpr:::::::::66454BDFDA545C0B21EDC8D3E5CA2BA084E837F4:
uid:u::::1796054288::C66C6A56132B2A259986DA55CF4456026F4707A4::Test A <a@x>::::::::::0:
sub:u:255:18:AEAEF3067232BCA9:1796054462::::::e:::::cv25519::
fpr:::::::::C773F4A249689ED4566AA232AEAEF3067232BCA9:
pub:u:2048:1:812C3E80CED1F3FF:1796054288:::u:::scSC::::::23::0:
fpr:::::::::599798331E477973215A4709812C3E80CED1F3FF:
uid:u::::1796054288::BD70C97E4C4CF371D58FC10862CA867D487E67F1::Test B <b@x>::::::::::0:
""".splitlines()


def test_keyring_primary_keys_not_subkeys():
    keys = KeyringKeys().process(TWO_KEYS)
    assert keys["E5CA2BA084E837F4"]["subkeys"]["AEAEF3067232BCA9"]["fingerprint"] == (
        "C773F4A249689ED4566AA232AEAEF3067232BCA9")
    assert primary_fingerprints(keys) == ["599798331E477973215A4709812C3E80CED1F3FF",
                                          "66454BDFDA545C0B21EDC8D3E5CA2BA084E837F4"]
    assert primary_fingerprints(KeyringKeys().process(TWO_KEYS[:5])) == ["66454BDFDA545C0B21EDC8D3E5CA2BA084E837F4"]


def test_keyring_unreadable_is_empty_so_it_is_replaced():
    assert KeyringKeys().process(["pub:u:not-a-length:22:E5CA2BA084E837F4"]) == {}
    assert KeyringKeys.default() == {}


def test_docker_state_reads_anything_unexpected_as_no():
    assert DockerState().process(["installed=yes", "active=active"]) == {"installed": True, "active": True}
    assert DockerState().process(["installed=yes", "active=activating"]) == {"installed": True, "active": False}
    assert DockerState().process(["garbage"]) == {"installed": False, "active": False}


def test_docker_version_is_the_daemons_major_and_minor():
    assert DockerServerVersion().command() == "docker version --format '{{.Server.Version}}' 2>&1 || true"
    assert DockerServerVersion().process(["28.1.1"]) == (28, 1)
    assert parse_docker_version(["20.10.24+dfsg1"]) == (20, 10)  # Debian 12's Docker package
    assert parse_docker_version(["25.0.0-rc.1"]) == (25, 0)
    assert parse_docker_version(["28.2.2"]) == (28, 2)


@pytest.mark.parametrize("lines, shown", [
    ([], "''"),
    (["Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"],
     "'Cannot connect to the Docker daemon at unix:///var/run/docke'"),
    (["28"], "'28'"),
    (["28.1.1; rm -rf /"], "'28.1.1; rm -rf /'"),
])
def test_docker_version_unreadable(lines, shown):
    assert parse_docker_version(lines) == Unreadable("docker version (the daemon's)", f"reads {shown}, not a version")


def test_runtime_path():
    assert RuntimePath().process(["/opt/sparkfleet/runtime/runtime-x"]) == "/opt/sparkfleet/runtime/runtime-x"
    assert RuntimePath().process([]) is None
