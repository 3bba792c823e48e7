"""Trace replay of Alibaba-style GPU cluster traces: the static FGD protocol (``trace``) and the
dynamic replay with arrivals and departures through the scheduler's queue (``dynamic``)."""
