"""``hpvc bench checkpoint``: checkpoint and restore of whole clusters (issue 28)."""
