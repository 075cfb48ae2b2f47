"""Switch each host back to its previous release, kept on disk (`sparkfleet.tasks.rollback`)."""

from sparkfleet.tasks.rollback import rollback

rollback()
