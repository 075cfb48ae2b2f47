"""Stage 2: the NVIDIA Container Toolkit from its signed apt repository, wired into Docker (the
runtime hook, or a CDI spec kept current for the driver and a Docker that takes CDI devices);
before a first start, a container started like the engine must see the GPU."""

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from sparkfleet import TEMPLATES_DIR
from sparkfleet.contract import paths
from sparkfleet.host.facts import NvidiaSmi
from sparkfleet.host.managed import managed_file, managed_packages, managed_template, managed_unit
from sparkfleet.host.operations import apt_keyring
from sparkfleet.host.toolkit import (
    CDI_GENERATE,
    CDI_STAMP,
    CDI_UNIT,
    cdi_spec_current,
    container_sees_gpu,
    docker_nvidia_runtime,
    docker_takes_cdi_devices,
    toolkit_at_least,
)
from sparkfleet.release.plan import GPU_OPTIONS, HostPlan

DEB_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}


@deploy("NVIDIA Container Toolkit")
def container_toolkit(plan: HostPlan, arch: str):
    s = plan.settings
    apt_keyring(
        name="Toolkit signing key (fingerprint checked)",
        src=s.toolkit_key_url, dest=paths.TOOLKIT_KEYRING, fingerprint=s.toolkit_key_fingerprint,
    )
    repo_url = s.toolkit_repo_url.format(arch=DEB_ARCH.get(arch, arch))
    source = managed_file(name="Toolkit apt source", content=f"deb [signed-by={paths.TOOLKIT_KEYRING}] {repo_url} /\n",
                          dest=paths.TOOLKIT_SOURCE, mode="0644")
    if source.will_change:
        server.shell(
            name="Refresh apt lists of the toolkit source only",
            commands=[(f"apt-get update -o Dir::Etc::sourcelist={paths.TOOLKIT_SOURCE} "
                       "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")],
        )
    if s.toolkit_version:
        managed_packages(
            name=f"Toolkit packages at {s.toolkit_version}",
            packages=[f"{package}={s.toolkit_version}" for package in paths.TOOLKIT_PACKAGES],
            update=False, extra_install_args="--allow-downgrades",
        )
    else:
        toolkit_at_least(name=f"Toolkit packages at {s.min_toolkit_version} or newer (an installed one kept)",
                         minimum=s.min_toolkit_version)
    runtime = docker_nvidia_runtime(name="Docker knows the nvidia runtime")
    changed = [runtime]
    if s.gpu_device_mode == "cdi":
        changed.append(docker_takes_cdi_devices(name="Docker takes CDI devices (features.cdi before 28.2)"))
    managed_unit(
        name="Docker restarted only if daemon.json changed",
        service="docker.service", running=True, enabled=True, restarted=any(op.will_change for op in changed),
    )
    if s.gpu_device_mode == "cdi":
        unit = managed_template(name="CDI spec unit (at boot, after the driver)",
                                src=str(TEMPLATES_DIR / "sparkfleet-cdi.service.j2"),
                                dest=paths.unit_path(CDI_UNIT), unit=paths.UNIT_NAME, generate=CDI_GENERATE,
                                stamp=CDI_STAMP)
        managed_unit(name="CDI spec unit enabled", service=CDI_UNIT, enabled=True,
                     daemon_reload=unit.will_change)
        cdi_spec_current(name="CDI spec current for the loaded driver", driver=host.get_fact(NvidiaSmi).driver)
    container_sees_gpu(name="A container started like the engine sees the GPU", image=plan.engine_ref,
                       gpu_options=GPU_OPTIONS[s.gpu_device_mode], pull=not s.engine_image_archive)
