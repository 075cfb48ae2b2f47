"""Switch hosts back to their previous release (kept on disk: no download).

    pyinfra inventory/office.py rollback.py [--limit HOST]
    python -m sparkfleet rollback inventory/office.py [--limit HOST]
"""

from sparkfleet.tasks.rollback import rollback

rollback()
