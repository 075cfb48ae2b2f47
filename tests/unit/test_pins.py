"""platform_pins as apt preferences: one stanza a package, a priority above 1000, nothing for none."""

import pytest

from sparkfleet.contract.settings import SettingsError, parse_settings
from sparkfleet.host.pins import render_pins

from .helpers import host_data


def test_each_pinned_package_is_one_stanza_above_1000_in_a_stable_order():
    text = render_pins({"nvidia-driver-580-open": "580.95.05*", "linux-image-nvidia-hwe-24.04": "6.17.0-1032*"})
    assert text == ("# sparkfleet: platform_pins (group_data); apt keeps these packages at these versions\n"
                    "Package: linux-image-nvidia-hwe-24.04\nPin: version 6.17.0-1032*\nPin-Priority: 1001\n\n"
                    "Package: nvidia-driver-580-open\nPin: version 580.95.05*\nPin-Priority: 1001\n")
    assert "Pin: version 5:27.*\n" in render_pins({"docker-ce": "5:27.*"})  # an epoch
    assert render_pins({}) == ""  # none pinned: the stage removes the file


@pytest.mark.parametrize("pins", [
    {"nvidia-driver\nPackage: *": "1"},  # a second stanza smuggled in the name
    {"docker-ce": "5:27.*\nPin-Priority: -1"},  # or in the version
    {"Docker": "27.*"},  # not a Debian package name
    {"docker-ce": "27 .*"},
])
def test_a_pin_that_is_no_package_name_or_version_glob_is_refused(pins):
    with pytest.raises(SettingsError, match="platform_pins"):
        parse_settings("spark-a", host_data(platform_pins=pins))
