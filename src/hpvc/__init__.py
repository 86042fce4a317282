"""hpvc: High Performance Virtual Clusters."""

__version__ = "0.1.0"

# The state directory when $HPVC_STATE_DIR is not set (hpvc.paths); here so
# the resident hpvc's client (hpvc.resident) finds it without importing more.
DEFAULT_STATE_DIR = "/var/lib/hpvc"
