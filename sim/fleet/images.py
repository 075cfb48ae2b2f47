"""Images of the simulated fleet, rebuilt only when their inputs change.

Each image carries the label sparkfleet.sim.hash = hash of its inputs (the
files that go into it, its package list, its parent's hash); a build is
skipped when an image with that name and hash exists.

  sparkfleet-sim/base            docker import of a debootstrap rootfs (systemd, sshd, docker.io...)
  sparkfleet-sim/spark           FROM base: a simulated DGX Spark (sim/images/spark)
  sparkfleet-sim/service-host-root  docker import of a rootfs with systemd, sshd, HAProxy, Prometheus (no Docker)
  sparkfleet-sim/service-host    FROM service-host-root: a front door / monitoring box (sim/images/service-host)
  sparkfleet-sim/services-root   docker import of a rootfs with python3 + docker-registry
  sparkfleet-sim/services        FROM services-root: hub + apt server + registry (sim/images/services)
  ENGINE_IMAGE                   one-layer import: rootfs with python3 + Ray (pip) + the stand-in vLLM
  SGLANG_IMAGE                   FROM ENGINE_IMAGE (its layer shared: no extra pull): the stand-in in SGLang's mode,
                                 `python3 -m sglang.launch_server` (no entrypoint, as SGLang's images)
  LLAMACPP_IMAGE                 one-layer import of a Debian sid rootfs: the real llama-server (CPU backends)
  CHAT_UI_IMAGE                  one-layer import: rootfs with python3 + the genuine Open WebUI release from its
                                 PyPI wheel and every pinned dependency (torch: the CPU build); ~3 GB, built only
                                 when a test or `python -m sim chat-ui` asks for it, never by `build`/`up`

The services image carries the hub's GGUF repository, generated here on the controller (gguf + numpy).
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import rootfs
from ._util import HASH_LABEL, IMAGES_DIR, REPO_ROOT, SIM_DIR, SimError, docker, hash_paths, log, sha256_bytes

BASE_IMAGE = "sparkfleet-sim/base"
SPARK_IMAGE = "sparkfleet-sim/spark"
SERVICE_HOST_ROOT_IMAGE = "sparkfleet-sim/service-host-root"
SERVICE_HOST_IMAGE = "sparkfleet-sim/service-host"
SSH_FILES = ["etc/ssh/sshd_config.d", "etc/systemd/system/ssh.service.d"]  # the Spark image's, on a service host too
SERVICES_ROOT_IMAGE = "sparkfleet-sim/services-root"
SERVICES_IMAGE = "sparkfleet-sim/services"
ENGINE_REPO = "vllm/vllm-openai"
ENGINE_TAG = "v0.33.0"
REGISTRY_HOST = "sparkfleet-registry:5000"
ENGINE_IMAGE = f"{REGISTRY_HOST}/{ENGINE_REPO}:{ENGINE_TAG}"
# NVIDIA's Spark playbook runs lmsysorg/sglang:spark (a moving tag; a plan pins it by digest).
SGLANG_REPO, SGLANG_TAG, SGLANG_VERSION = "lmsysorg/sglang", "spark", "0.5.23"
SGLANG_IMAGE = f"{REGISTRY_HOST}/{SGLANG_REPO}:{SGLANG_TAG}"
# llama.cpp's own server image for CUDA, by build number; the sim's is Debian sid's llama.cpp-tools of that build
# (CPU only). sid moves: a new build fails the image build naming the number to put here.
LLAMACPP_BUILD = "11669"
LLAMACPP_REPO, LLAMACPP_TAG = "ggml-org/llama.cpp", f"server-cuda-b{LLAMACPP_BUILD}"
LLAMACPP_IMAGE = f"{REGISTRY_HOST}/{LLAMACPP_REPO}:{LLAMACPP_TAG}"
LLAMACPP_ENTRYPOINT = ["/usr/bin/llama-server"]
# Open WebUI: its official image (ghcr.io/open-webui/open-webui) cannot be pulled here, so the sim builds one from
# the same release's PyPI wheel, laid out as the official image runs it (WORKDIR /app/backend, data in ./data).
CHAT_UI_VERSION = "0.12.4"
CHAT_UI_REPO, CHAT_UI_TAG = "open-webui/open-webui", f"v{CHAT_UI_VERSION}"
CHAT_UI_IMAGE = f"{REGISTRY_HOST}/{CHAT_UI_REPO}:{CHAT_UI_TAG}"
# A second "version" for a version change and its rollback: the same release under another tag and image id (a label
# of its own; no layer more). It proves what sparkfleet does around a version change (the database kept, put back),
# not Open WebUI's own migrations between two releases.
CHAT_UI_NEXT_TAG = f"{CHAT_UI_TAG}-next"
CHAT_UI_NEXT_IMAGE = f"{REGISTRY_HOST}/{CHAT_UI_REPO}:{CHAT_UI_NEXT_TAG}"
# torch: the CPU build (what the official image carries; pip's default on x86_64 is a CUDA build of several GB)
# async-timeout: redis needs it below Python 3.11.3 (bookworm's 3.11.2), a marker pip judges by the controller's
CHAT_UI_PIP = ["torch==2.13.0", f"open-webui=={CHAT_UI_VERSION}", "async-timeout==5.0.1"]
CHAT_UI_CHANGES = ["WORKDIR /app/backend", "ENV DATA_DIR=/app/backend/data", "ENV PYTHONUNBUFFERED=1",
                   # the wheel's built frontend (the official image's is /app/build, its default)
                   f"ENV FRONTEND_BUILD_DIR=/{rootfs.SITE_DIR}/open_webui/frontend",
                   'CMD ["python3", "-m", "uvicorn", "open_webui.main:app", "--host", "0.0.0.0", "--port", "8080"]',
                   "EXPOSE 8080"]
# What `up` pushes into the sim registry: (repository, tag, local image name).
REGISTRY_IMAGES = [(ENGINE_REPO, ENGINE_TAG, ENGINE_IMAGE), (SGLANG_REPO, SGLANG_TAG, SGLANG_IMAGE),
                   (LLAMACPP_REPO, LLAMACPP_TAG, LLAMACPP_IMAGE)]

HUB_DIR = REPO_ROOT / "sim" / "hub"
ENGINE_SCRIPT = REPO_ROOT / "sim" / "engine" / "standin_vllm.py"
ENGINE_FLAGS = REPO_ROOT / "sparkfleet" / "release" / "engines" / "vllm-0.33.0.json"
PLACEHOLDER_ENGINE = IMAGES_DIR / "engine" / "placeholder_vllm.py"
ENGINE_ENTRYPOINT = ["python3", "/opt/standin/standin_vllm.py", "--flags-file", "/opt/standin/vllm-flags.json"]
SGLANG_FLAGS = REPO_ROOT / "sparkfleet" / "release" / "engines" / f"sglang-{SGLANG_VERSION}.json"
SGLANG_MODULE = IMAGES_DIR / "engine" / "sglang"  # sglang/launch_server.py: runs the stand-in in SGLang's mode

_BUILD_ENV = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the classic builder: no buildx plugin needed


def image_hash(name: str) -> str | None:
    cp = docker("image", "inspect", name, "--format", "{{json .Config.Labels}}", check=False)
    if cp.returncode != 0:
        return None
    labels = json.loads(cp.stdout.strip() or "null") or {}
    return labels.get(HASH_LABEL)


def _import(name: str, tarballs: list[Path], h: str, extra: dict[str, tuple[bytes, int]] | None = None,
            changes: list[str] | None = None) -> None:
    """docker import rootfs tarballs (laid one over the other) plus extra files as one layer."""
    cmd = ["docker", "import", "--change", f"LABEL {HASH_LABEL}={h}"]
    for c in changes or []:
        cmd += ["--change", c]
    cmd += ["-", name]
    errf = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errf)
    try:
        if len(tarballs) == 1 and not extra:
            with open(tarballs[0], "rb") as f:
                shutil.copyfileobj(f, proc.stdin, 1 << 20)
        else:
            with tarfile.open(fileobj=proc.stdin, mode="w|") as dst:
                dirs_done: set[str] = set()
                for tarball in tarballs:
                    with tarfile.open(tarball, "r:") as src:
                        for m in src:
                            m.name = "./" + m.name.removeprefix("./").strip("/")
                            if m.isdir() and m.name in dirs_done:
                                continue  # the first tarball's directory (the rootfs's) keeps its mode
                            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
                            dirs_done.add(m.name)
                for path, (data, mode) in sorted((extra or {}).items()):
                    parts = path.strip("/").split("/")
                    for i in range(1, len(parts)):
                        d = "./" + "/".join(parts[:i])
                        if d not in dirs_done:
                            dirs_done.add(d)
                            ti = tarfile.TarInfo(d)
                            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                            dst.addfile(ti)
                    ti = tarfile.TarInfo("./" + path.strip("/"))
                    ti.size, ti.mode, ti.mtime = len(data), mode, int(time.time())
                    dst.addfile(ti, io.BytesIO(data))
        proc.stdin.close()
    except BrokenPipeError:
        pass
    except BaseException:
        proc.kill()  # never let docker import take a partial stream for a whole image (it carries the hash)
        proc.wait()
        raise
    if proc.wait() != 0:
        errf.seek(0)
        raise SimError(f"docker import {name} failed: {errf.read().decode(errors='replace')[-2000:]}")
    errf.close()


def _build(name: str, context: Path, h: str, base: str) -> None:
    cp = subprocess.run(
        ["docker", "build", "-q", "--label", f"{HASH_LABEL}={h}", "--build-arg", f"BASE={base}",
         "-t", name, str(context)], env=_BUILD_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if cp.returncode != 0:
        raise SimError(f"docker build {name} failed:\n{cp.stdout.decode()[-4000:]}")


def _ensure_imported(name: str, rootfs_name: str, packages: list[str]) -> str:
    h = sha256_bytes("import-v1", rootfs.rootfs_key(packages))
    if image_hash(name) != h:
        t0 = time.monotonic()
        tar = rootfs.rootfs_tarball(rootfs_name, packages)
        _import(name, [tar], h)
        log(f"imported {name} in {time.monotonic() - t0:.0f}s")
    return h


def ensure_base() -> str:
    return _ensure_imported(BASE_IMAGE, "base", rootfs.BASE_PACKAGES)


def ensure_service_host_root() -> str:
    return _ensure_imported(SERVICE_HOST_ROOT_IMAGE, "service-host", rootfs.SERVICE_HOST_PACKAGES)


def ensure_service_host(root_hash: str) -> str:
    """The service host image: its Dockerfile, with the Spark image's SSH files as its rootfs/."""
    ctx_src, ssh_src = IMAGES_DIR / "service-host", IMAGES_DIR / "spark" / "rootfs"
    h = sha256_bytes("service-host-v1", root_hash, hash_paths([ctx_src, *(ssh_src / p for p in SSH_FILES)],
                                                              IMAGES_DIR))
    if image_hash(SERVICE_HOST_IMAGE) != h:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=SIM_DIR) as d:
            ctx = Path(d) / "ctx"
            shutil.copytree(ctx_src, ctx)
            for p in SSH_FILES:
                shutil.copytree(ssh_src / p, ctx / "rootfs" / p)
            _build(SERVICE_HOST_IMAGE, ctx, h, SERVICE_HOST_ROOT_IMAGE)
        log(f"built {SERVICE_HOST_IMAGE} in {time.monotonic() - t0:.0f}s")
    return h


def ensure_services_root() -> str:
    return _ensure_imported(SERVICES_ROOT_IMAGE, "services", rootfs.SERVICES_PACKAGES)


def ensure_spark(base_hash: str) -> str:
    ctx = IMAGES_DIR / "spark"
    h = sha256_bytes("spark-v1", base_hash, hash_paths([ctx], IMAGES_DIR))
    if image_hash(SPARK_IMAGE) != h:
        t0 = time.monotonic()
        _build(SPARK_IMAGE, ctx, h, BASE_IMAGE)
        log(f"built {SPARK_IMAGE} in {time.monotonic() - t0:.0f}s")
    return h


def ensure_services(root_hash: str) -> str:
    ctx_src = IMAGES_DIR / "services"
    hub_files = [HUB_DIR] if HUB_DIR.exists() else []
    h = sha256_bytes("services-v2", root_hash, hash_paths([ctx_src], IMAGES_DIR),
                     hash_paths(hub_files, REPO_ROOT), _gguf_version())
    if image_hash(SERVICES_IMAGE) != h:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=SIM_DIR) as d:
            ctx = Path(d) / "ctx"
            shutil.copytree(ctx_src, ctx)
            (ctx / "hub").mkdir()
            if HUB_DIR.exists():
                shutil.copytree(HUB_DIR, ctx / "hub", dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            from sim.hub.gguf_model import GGUF_REPO_ID, generate_gguf_repo
            generate_gguf_repo(ctx / "hub-data" / GGUF_REPO_ID)  # the hub serves every repo under its data dir
            _build(SERVICES_IMAGE, ctx, h, SERVICES_ROOT_IMAGE)
        log(f"built {SERVICES_IMAGE} in {time.monotonic() - t0:.0f}s")
    return h


def _gguf_version() -> str:
    """The gguf package's version (its writer makes the hub's GGUF bytes); one line naming the fix if missing."""
    try:
        import importlib.metadata
        importlib.import_module("gguf")  # its own dependencies' import errors show here, not mid-build
        return importlib.metadata.version("gguf")
    except ImportError as e:
        raise SimError(f"the sim hub's GGUF model needs the gguf package ({e}): "
                       f".venv/bin/pip install -r requirements.txt") from None


def engine_files() -> dict[str, tuple[bytes, int]]:
    script = ENGINE_SCRIPT if ENGINE_SCRIPT.exists() else PLACEHOLDER_ENGINE
    if script == PLACEHOLDER_ENGINE:
        log(f"warning: {ENGINE_SCRIPT.relative_to(REPO_ROOT)} is missing: the engine image gets a placeholder")
    flags = ENGINE_FLAGS.read_bytes() if ENGINE_FLAGS.exists() else b"{}\n"
    files = {"opt/standin/standin_vllm.py": (script.read_bytes(), 0o755),
             "opt/standin/vllm-flags.json": (flags, 0o644)}
    # helper modules next to the stand-in (if any) travel with it
    if ENGINE_SCRIPT.exists():
        for extra in sorted(ENGINE_SCRIPT.parent.glob("*.py")):
            if extra != ENGINE_SCRIPT and extra.name != "__init__.py":
                files[f"opt/standin/{extra.name}"] = (extra.read_bytes(), 0o644)
    return files


def ensure_engine() -> str:
    files = engine_files()
    h = sha256_bytes("engine-v2", rootfs.rootfs_key(rootfs.ENGINE_PACKAGES), rootfs.pip_key(rootfs.ENGINE_PIP),
                     json.dumps(ENGINE_ENTRYPOINT),
                     *[p + ":" + str(m) for p, (_, m) in sorted(files.items())],
                     *[d for _, (d, _) in sorted(files.items())])
    if image_hash(ENGINE_IMAGE) != h:
        t0 = time.monotonic()
        tars = [rootfs.rootfs_tarball("engine", rootfs.ENGINE_PACKAGES),
                rootfs.pip_tarball("engine", rootfs.ENGINE_PIP)]
        _import(ENGINE_IMAGE, tars, h, extra=files,
                changes=[f"ENTRYPOINT {json.dumps(ENGINE_ENTRYPOINT)}", "CMD []",
                         "ENV PYTHONUNBUFFERED=1", "EXPOSE 8000"])
        log(f"built {ENGINE_IMAGE} in {time.monotonic() - t0:.0f}s")
    return h


def sglang_files() -> dict[str, tuple[bytes, int]]:
    """The SGLang stand-in's additions to the vLLM stand-in's image: its flag table and the sglang package."""
    if not SGLANG_FLAGS.exists():
        log(f"warning: {SGLANG_FLAGS.relative_to(REPO_ROOT)} is missing: the SGLang stand-in accepts no flag")
    flags = SGLANG_FLAGS.read_bytes() if SGLANG_FLAGS.exists() else b'{"flags": {}}\n'
    files = {"opt/standin/sglang-flags.json": (flags, 0o644)}
    for f in sorted(SGLANG_MODULE.glob("*.py")):
        files[f"{rootfs.SITE_DIR}/sglang/{f.name}"] = (f.read_bytes(), 0o644)
    return files


def ensure_sglang(engine_hash: str) -> str:
    """The stand-in SGLang: a layer over the vLLM stand-in's image, so a host that pulled one has most of both."""
    files = sglang_files()
    h = sha256_bytes("sglang-v1", engine_hash, *[p + ":" + str(m) + ":" + sha256_bytes(d)
                                                 for p, (d, m) in sorted(files.items())])
    if image_hash(SGLANG_IMAGE) != h:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=SIM_DIR) as d:
            ctx = Path(d)
            for rel, (data, mode) in files.items():
                (ctx / "add" / rel).parent.mkdir(parents=True, exist_ok=True)
                (ctx / "add" / rel).write_bytes(data)
                (ctx / "add" / rel).chmod(mode)
            # No entrypoint, as SGLang's images: sparkfleet runs `--entrypoint python3 IMAGE -m sglang.launch_server`
            (ctx / "Dockerfile").write_text('ARG BASE\nFROM ${BASE}\nCOPY add/ /\nENTRYPOINT []\n'
                                            'CMD ["python3", "-m", "sglang.launch_server", "--help"]\n'
                                            'EXPOSE 30000\n')
            _build(SGLANG_IMAGE, ctx, h, ENGINE_IMAGE)
        log(f"built {SGLANG_IMAGE} in {time.monotonic() - t0:.0f}s")
    return h


def ensure_llamacpp() -> str:
    """The real llama-server from Debian sid, its build checked against LLAMACPP_BUILD (the tag says it)."""
    key = rootfs.rootfs_key(rootfs.LLAMACPP_PACKAGES, suite=rootfs.LLAMACPP_SUITE, drop=rootfs.LLAMACPP_DROP)
    h = sha256_bytes("llamacpp-v1", key, json.dumps(LLAMACPP_ENTRYPOINT))
    if image_hash(LLAMACPP_IMAGE) != h:
        t0 = time.monotonic()
        tar = rootfs.rootfs_tarball("llamacpp", rootfs.LLAMACPP_PACKAGES, suite=rootfs.LLAMACPP_SUITE,
                                    drop=rootfs.LLAMACPP_DROP)
        _import(LLAMACPP_IMAGE, [tar], h, changes=[f"ENTRYPOINT {json.dumps(LLAMACPP_ENTRYPOINT)}", "CMD []",
                                                   "EXPOSE 8080"])
        out = docker("run", "--rm", LLAMACPP_IMAGE, "--version", check=False)
        build = llamacpp_build(out.stdout + out.stderr)
        if build != LLAMACPP_BUILD:
            docker("rmi", LLAMACPP_IMAGE, check=False)
            raise SimError(f"Debian sid's llama-server is build {build}, the sim expects {LLAMACPP_BUILD}: set "
                           f"LLAMACPP_BUILD in sim/fleet/images.py (and add that build's flag table)")
        log(f"built {LLAMACPP_IMAGE} (llama.cpp build {build}) in {time.monotonic() - t0:.0f}s")
    return h


def ensure_chat_ui() -> str:
    """The Open WebUI image, from its PyPI release (minutes the first time; the pip tarball is cached)."""
    key = rootfs.rootfs_key(rootfs.ENGINE_PACKAGES)
    h = sha256_bytes("chat-ui-v1", key, rootfs.pip_key(CHAT_UI_PIP), json.dumps(CHAT_UI_CHANGES))
    if image_hash(CHAT_UI_IMAGE) != h:
        t0 = time.monotonic()
        pip = rootfs.pip_tarball("chat-ui", CHAT_UI_PIP)  # first: it needs no rootfs, and is the long part
        tars = [rootfs.rootfs_tarball("engine", rootfs.ENGINE_PACKAGES), pip]
        _import(CHAT_UI_IMAGE, tars, h, changes=CHAT_UI_CHANGES,
                extra={"app/backend/data/.sim": (b"the data directory: sparkfleet mounts the host's over it\n", 0o644)})
        log(f"built {CHAT_UI_IMAGE} in {time.monotonic() - t0:.0f}s")
    return h


def ensure_chat_ui_next(base_hash: str) -> str:
    """CHAT_UI_NEXT_IMAGE: CHAT_UI_IMAGE with a label of its own (seconds: no layer is added)."""
    h = sha256_bytes("chat-ui-next-v1", base_hash)
    if image_hash(CHAT_UI_NEXT_IMAGE) != h:
        with tempfile.TemporaryDirectory(dir=SIM_DIR) as d:
            (Path(d) / "Dockerfile").write_text('ARG BASE\nFROM ${BASE}\nLABEL sparkfleet.sim.chat-ui=next\n')
            _build(CHAT_UI_NEXT_IMAGE, Path(d), h, CHAT_UI_IMAGE)
    return h


def llamacpp_build(version_output: str) -> str | None:
    """The build number in `llama-server --version` output ("version: 0.7.0 (build 11669, commit Debian)")."""
    m = re.search(r"\(build (\d+)|version: (\d+) \(", version_output)
    return (m.group(1) or m.group(2)) if m else None


def ensure_all() -> dict[str, str]:
    """Build what is missing or stale; rootfs debootstraps run in parallel."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(5) as ex:
        f_base = ex.submit(ensure_base)
        f_sroot = ex.submit(ensure_services_root)
        f_engine = ex.submit(ensure_engine)
        f_hroot = ex.submit(ensure_service_host_root)
        f_llama = ex.submit(ensure_llamacpp)
        base_h, sroot_h, engine_h, hroot_h = f_base.result(), f_sroot.result(), f_engine.result(), f_hroot.result()
        llama_h = f_llama.result()
    hashes = {"base": base_h, "services-root": sroot_h, "engine": engine_h, "service-host-root": hroot_h,
              "sglang": ensure_sglang(engine_h), "llamacpp": llama_h,
              "spark": ensure_spark(base_h), "services": ensure_services(sroot_h),
              "service-host": ensure_service_host(hroot_h)}
    log(f"images ready in {time.monotonic() - t0:.1f}s")
    return hashes
