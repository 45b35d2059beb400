"""Integrations with frameworks, each an optional module that imports its framework
(installed with the matching extra): `axa_queue.contrib.django`."""
