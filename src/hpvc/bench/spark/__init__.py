"""TeraSort on a Spark virtual cluster against native Spark (``hpvc bench spark``)."""
