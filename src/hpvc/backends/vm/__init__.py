"""What both VM backends share: guest disks, readiness and configuration (``guest.py``) and
the shared directory over NFS (``guest_shared.py``).
"""
