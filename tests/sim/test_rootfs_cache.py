"""The tarball cache under .sim/rootfs/ has one builder per name across processes: `make demo` builds Open
WebUI's image in the background while `up` builds the fleet's, and both need the "engine" rootfs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILDER = """
import sys, time
from pathlib import Path
from sim.fleet import rootfs
rootfs.SIM_DIR = Path(sys.argv[1])
def build(work):
    with open(Path(sys.argv[1]) / "builds", "a") as f:
        f.write("built\\n")
    time.sleep(1.0)  # long enough that the other builder arrives while this one builds
    (work / "usr").mkdir()
    (work / "usr" / "marker").write_text("built once\\n")
    return work, "usr"
print(rootfs._cached_tarball("engine", "k1", build, "test"))
"""


def test_two_processes_building_one_name_build_it_once_and_both_get_it(tmp_path):
    builders = [subprocess.Popen([sys.executable, "-c", BUILDER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [b.communicate(timeout=60) for b in builders]
    assert [b.returncode for b in builders] == [0, 0], outs
    assert (tmp_path / "builds").read_text() == "built\n"
    tarball = tmp_path / "rootfs" / "engine-k1.tar"
    assert [out.strip().splitlines()[-1] for out, _ in outs] == [str(tarball)] * 2 and tarball.stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "rootfs").iterdir()) == ["engine-k1.tar", "engine.lock"]
