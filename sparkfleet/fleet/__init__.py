"""The fleet commands: they plan an inventory and run deploys through pyinfra's CLI machinery.

pyinfra's CLI package monkey-patches the standard library with gevent when it is imported; imported here, first,
the patch comes before anything below imports ssl (requests, the hub clients), as pyinfra itself orders it, so a
command neither risks gevent's known ssl faults nor prints its MonkeyPatchWarning on every run.
"""

import pyinfra_cli  # noqa: F401  (gevent's patch_all, before ssl is imported)
