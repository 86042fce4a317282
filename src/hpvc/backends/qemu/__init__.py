"""The qemu backend: QEMU started directly (``backend.py``), its process, pinning and read-
back (``process.py``) and QMP sessions (``qmp.py``).
"""
