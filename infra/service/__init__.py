"""The scheduler service: one detached Ray actor per cluster (``actor``), its client (``client``),
its command line (``cli``) and its write-ahead journal (``journal``).

``python -m infra.service start|status|stop|reset`` manages the actor;
``python -m infra.service.cli status|queue|gangs|events|cancel`` shows and acts on its state.
"""
