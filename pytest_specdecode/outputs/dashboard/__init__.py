"""The nightly history as a static site: ``report HISTORY --html DIR`` and ``--specdecode-html``.

``model`` turns history records into what the pages show (one series per test x profile x
hardware key, the nights' means and intervals, the baseline's band and the margin line, the
cross-night detector's state and the change points it found with what changed that night, and
what is *not* a change: gaps, renamed tests, a new hardware key, a baseline re-recorded);
``site`` writes the pages, with the data inlined and the small script and style sheet in
``assets/`` copied beside them: no server, no network, it opens from ``file://``.
"""
