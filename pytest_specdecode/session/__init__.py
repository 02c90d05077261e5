"""One pytest session's work, in plain Python: what the plugin drives.

``orchestrator`` owns the session (its results, baseline updates, server counts, outputs and
warnings; attaching or launching through the pool); ``measurement`` is one test's data path
(server checks → baselines → warm-up and runs → metrics → a verdict at each look);
``runner`` sends the requests to a measured server and says what a failure means;
``baseline_launches`` records a baseline over several launches and decides whether it may
become one; ``machine_load`` notices a busy measuring machine; ``provenance`` is what the
session records about the machine (GPUs, hardware key, versions, environment).

What the plugin hands over as plain values: ``start`` (the process, its log directory, earlier
nights), ``collection`` (the collected tests planned), ``outcomes`` (what a verdict asks of a
test, an errored test's row), ``worker_relay`` (xdist workers' results on their way up),
``console`` (the terminal's text) and ``finish`` (the end of the session).

The face imports nothing, so that importing one of these modules does not load the others.
"""
