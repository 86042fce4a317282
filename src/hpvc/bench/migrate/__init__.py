"""``hpvc bench migrate``: live migration of VM nodes (issue 27)."""
