"""The simulated fleet: systemd containers standing in for DGX Sparks, plus a
services container (model hub, signed apt repository, image registry).

    from sim import fleet
    state = fleet.up(hosts=3, faults={"spark-2": {"driver": "550.54.14"}})
    fleet.reboot("spark-1"); fleet.set_fabric("spark-2", up=False, mtu=1500); fleet.down()

CLI: python -m sim.fleet up [--hosts N] [--fault spark-2:driver=550.54.14] | down | status [--json] | ...
"""
from ._util import SimError
from .cli import main
from .fleet import (chat_ui_image, sign_in_url, down, driver_state, publish_driver, reset_driver, fabric_link, install_toolkit, load_state, lose_container_gpu, reboot, remove_host,
                    remove_toolkit, set_engine, set_fabric, set_gpu, start_host, start_scratch_host, start_services,
                    status, stop_host, stop_services, up, wait_host_ready)

__all__ = ["up", "down", "status", "set_gpu", "reboot", "stop_host", "start_host", "stop_services",
           "start_services", "start_scratch_host", "remove_host", "load_state", "wait_host_ready", "main",
           "SimError", "set_engine", "lose_container_gpu", "set_fabric", "fabric_link",
           "install_toolkit", "remove_toolkit", "publish_driver", "reset_driver", "driver_state",
           "chat_ui_image", "sign_in_url"]
