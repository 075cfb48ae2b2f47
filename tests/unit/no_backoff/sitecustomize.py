"""The hub clients' retry backoffs at zero, in the test process and (on PYTHONPATH) in the helpers it starts.

A retry is what the tests look at, not its wait: ModelScope waits 1 s, 2 s, ... between attempts
(`_DownloadControl.sleep`), Hugging Face 1 s before a resume and exponentially in `http_backoff`. Each client
module is patched as it is imported (a finder on sys.meta_path), so a process that never imports one pays nothing.
"""

import importlib.abc
import importlib.util
import sys
import time
import types


def _checked_no_wait(self, seconds):
    """_DownloadControl.sleep without the wait: the deadline and cancel checks still run."""
    self.check()


NO_SLEEP = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("__")})
NO_SLEEP.sleep = lambda seconds: None

PATCHES = {
    "modelscope_hub._download_control": lambda m: setattr(m._DownloadControl, "sleep", _checked_no_wait),
    "huggingface_hub.file_download": lambda m: setattr(m, "time", NO_SLEEP),
    "huggingface_hub.utils._http": lambda m: setattr(m, "time", NO_SLEEP),
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install():
    """Patch the client modules already imported, and each one imported from now on."""
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


install()
