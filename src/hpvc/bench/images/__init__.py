"""Image import against Podman, tar and umoci (``hpvc bench images``)."""
