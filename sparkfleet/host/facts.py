"""Custom pyinfra facts: each reads one thing from a host and changes nothing."""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkfleet.host.nvidia_smi import GpuReport, parse_nvidia_smi


class NvidiaSmi(FactBase[GpuReport]):
    """GPU name, driver and CUDA version from the nvidia-smi table."""

    def command(self):
        return "command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 || echo 'nvidia-smi: not found or failed'"

    def process(self, output):
        return parse_nvidia_smi("\n".join(output))


class MemInfo(FactBase[dict]):
    """/proc/meminfo in kB: nvidia-smi reports no memory on unified-memory GB10."""

    def command(self):
        return "cat /proc/meminfo"

    def process(self, output):
        values = {}
        for line in output:
            key, _, rest = line.partition(":")
            if rest.strip():
                values[key] = int(rest.split()[0])
        return values


class FreeBytes(FactBase[int]):
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""

    def command(self, path):
        return StringCommand(
            "p=", QuoteString(path), '; while [ ! -e "$p" ]; do p=$(dirname "$p"); done;',
            "df -P -B1 \"$p\" | awk 'NR==2 {print $4}'",
        )

    def process(self, output):
        return int(output[0])


class DockerState(FactBase[dict]):
    """Whether the Docker CLI exists and docker.service is active."""

    def command(self):
        return ("printf 'installed=%s\\n' \"$(command -v docker >/dev/null && echo yes || echo no)\"; "
                "printf 'active=%s\\n' \"$(systemctl is-active docker 2>/dev/null || true)\"")

    def process(self, output):
        values = dict(line.split("=", 1) for line in output if "=" in line)
        return {"installed": values.get("installed") == "yes", "active": values.get("active") == "active"}


class JsonFile(FactBase):
    """A JSON file's content; None when absent; {"__invalid__": text} when not JSON."""

    def command(self, path):
        return StringCommand("cat", QuoteString(path), "2>/dev/null || true")

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return {"__invalid__": text}


class PythonVersion(FactBase[str]):
    """The host's python3 as "3.12": the runtime bundle is built for it."""

    def command(self):
        return "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null || echo none"

    def process(self, output):
        return None if output[0] == "none" else output[0]


class ModelFiles(FactBase[dict]):
    """A model directory's verified record and every file's size, mtime and inode."""

    def command(self, model_dir, record):
        quoted = QuoteString(model_dir)
        return StringCommand(
            "if [ -d", quoted, "]; then cat", QuoteString(f"{model_dir}/{record}"), "2>/dev/null; echo;",
            "echo @@files; find", quoted, "-type f ! -path '*/.staging/*' -printf '%s %T@ %i %P\\n'; fi",
        )

    @staticmethod
    def default():
        return {"record": {}, "files": {}}

    def process(self, output):
        text = "\n".join(output)
        record_text, _, listing = text.partition("@@files")
        try:
            record = json.loads(record_text) if record_text.strip() else {}
        except ValueError:
            record = {}
        files = {}
        for line in listing.strip().splitlines():
            size, mtime, ino, path = line.split(" ", 3)
            seconds, _, fraction = mtime.partition(".")
            files[path] = {"size": int(size), "mtime_ns": int(seconds) * 10**9 + int(fraction[:9].ljust(9, "0")),
                           "ino": int(ino)}
        return {"record": record, "files": files}


class KeyringFingerprints(FactBase[list]):
    """Fingerprints of the keys in an apt keyring file ([] when absent)."""

    @staticmethod
    def default():
        return []

    def command(self, path):
        return StringCommand(
            "[ -f", QuoteString(path), "] && gpg --show-keys --with-colons", QuoteString(path),
            "2>/dev/null | awk -F: '$1==\"fpr\" {print $10}' || true",
        )

    def process(self, output):
        return [line.strip().upper() for line in output if line.strip()]


class DockerImagePresent(FactBase[bool]):
    """Whether the host's Docker has this image (so the unit need not pull it)."""

    def command(self, image):
        return StringCommand("docker image inspect", QuoteString(image), ">/dev/null 2>&1 && echo yes || echo no")

    def process(self, output):
        return output[0] == "yes"


class ModelDirs(FactBase[list]):
    """sparkfleet's model directories (<org>--<name>@<pin>) under model_root."""

    @staticmethod
    def default():
        return []

    def command(self, model_root):
        return StringCommand("find", QuoteString(model_root), "-mindepth 1 -maxdepth 1 -type d -name '*@*' 2>/dev/null || true")

    def process(self, output):
        return sorted(line.strip() for line in output if line.strip())


class RuntimePath(FactBase[str]):
    """The newest runtime bundle unpacked on the host (the clients the helpers run with)."""

    def command(self):
        return "ls -dt /opt/sparkfleet/runtime/runtime-*/ 2>/dev/null | head -1"

    def process(self, output):
        return output[0].rstrip("/") if output else None
