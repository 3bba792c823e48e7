"""The scheduler realised on a Ray cluster: plans become placement groups pinned to the chosen node
and GPUs (``realize.Realizer``), nodes are discovered from Ray, and ``start_local_cluster`` starts a
multi-raylet cluster on one machine (loopback, logical GPUs) for tests and local runs."""
