"""The libvirt backend: nodes as libvirt domains (``backend.py``), the binding
(``domain.py``) and the pure read-back of domain XML (``domain_xml.py``).
"""
