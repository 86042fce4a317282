"""The storage bandwidth coordinator, measured with fio (``hpvc bench coordinator``)."""
