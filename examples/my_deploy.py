"""An existing pyinfra project that adds Spark serving to its own deploy, with sparkfleet installed.

    pip install sparkfleet          (or `pip install .` from a sparkfleet checkout)
    pyinfra inventory.py my_deploy.py

The project's own operations run first, then `converge()` runs sparkfleet's whole stage sequence on the host
(`sparkfleet.tasks`, the way pyinfra's deploy packages are used), the front door included on hosts of the group
`front_door`. sparkfleet's settings go in the hosts' data (inventory or group_data/), and its defaults (the
package's group_data/all.py) fill in the rest.
"""

from pyinfra.operations import files

from sparkfleet.tasks import converge

files.directory(name="The project's own operations run as before", path="/srv/my-project")

converge()
