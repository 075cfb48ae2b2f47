"""The ground floor: what hosts and controller agree on (paths, names, file formats, settings, recipes).

Every layer above imports it; it imports nothing of sparkfleet but the package root."""
