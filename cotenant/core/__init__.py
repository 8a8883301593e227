"""The base layer under every package: the exception tree, configuration keys, the periodic
worker, time specs, HTTP helpers, the reader contracts and the SLO type. It imports nothing of
cotenant's own."""
