"""The scheduler service: one detached Ray actor per cluster (``actor``), its client (``client``),
its command line (``cli``) and its write-ahead journal (``journal``).

``python -m infra.service start|stop|reset`` manages the actor and ``python -m infra.service
status|queue|gangs|events|cancel|prune|token`` shows and acts on its state: one command line
(``infra.service.cli``, also ``python -m infra.service.cli``).
"""
