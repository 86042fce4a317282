"""``hpvc doctor`` through the cluster API: what this host offers and lacks.

The checks live with the host readers (``hpvc.host.doctor``); the CLI reaches
them here, as it reaches everything on the host through ``hpvc.cluster``.
"""

from __future__ import annotations

from hpvc.host.doctor import Report as Report
from hpvc.host.doctor import run_checks as run_checks
