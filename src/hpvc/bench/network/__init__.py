"""The cluster network across hosts against the fabric (``hpvc bench network``)."""
