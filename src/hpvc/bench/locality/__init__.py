"""MPI ping-pong: native, co-resident containers, isolated ones (``hpvc bench locality``)."""
