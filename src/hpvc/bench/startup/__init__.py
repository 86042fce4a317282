"""How long ``hpvc up``, ``down`` and the quick commands take, against Podman."""
