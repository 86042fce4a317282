"""How long the planner takes for a big cluster (``hpvc bench plan``)."""
