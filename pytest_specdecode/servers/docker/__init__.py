"""The Docker launcher: servers as containers, through the Docker SDK.

``launcher`` starts, watches and removes one container; ``engine`` picks the Docker engine a
profile's host names and connects to it (its own TLS material, the socket probed first);
``container`` is what a container is asked for and named (labels, GPU requests, redacted
environment, the messages of a missing image or a failed start); ``recorded`` checks and stops
a container an earlier session recorded.
"""
