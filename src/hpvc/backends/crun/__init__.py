"""The crun backend: container nodes (``backend.py``) and the crun and mount primitives it
uses (``container.py``).
"""
