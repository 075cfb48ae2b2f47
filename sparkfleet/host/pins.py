"""Apt pins for the platform packages (platform_pins): apt's own way to keep a package at a version.

A pin priority above 1000 makes apt keep (or go back to) the pinned version whatever newer one a source offers, so
`apt upgrade` and unattended-upgrades leave the kernel, the driver or Docker where the fleet was proven on; changing
the pin is a setting, rolled out like any other. (`apt-mark hold` would also stop the toolkit stage's own pinned
install: a pin does not.)
"""

from __future__ import annotations

PIN_PRIORITY = 1001  # > 1000: kept even where a source offers a newer version (apt_preferences(5))


def render_pins(pins: dict[str, str]) -> str:
    """The preferences file for {package: version glob}, one stanza a package, sorted (same pins, same bytes);
    "" for none (the file is then removed). The values are typed settings (package names, version globs)."""
    stanzas = [f"Package: {package}\nPin: version {version}\nPin-Priority: {PIN_PRIORITY}\n"
               for package, version in sorted(pins.items())]
    header = "# sparkfleet: platform_pins (group_data); apt keeps these packages at these versions\n"
    return header + "\n".join(stanzas) if stanzas else ""
