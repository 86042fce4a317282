"""Block-I/O limits of container nodes, fio: throttles, weights, overhead (``hpvc bench io``)."""
